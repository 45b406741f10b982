"""Redis keys and (de)serialisation of every stored record.

    edgetrain:fleet:ids                          set of device ids
    edgetrain:fleet:device:<id>                  DeviceInfo JSON, expires without heartbeat
    edgetrain:table:<type>:<model>:<shape>       ProfileTable JSON
    edgetrain:vector:<key>                       RelationVector JSON
    edgetrain:vector-parts:<key>                 hash "<b>:<seed>" -> TrainingOutcome JSON
    edgetrain:claim:<resource>                   who started producing a table or vector
    edgetrain:waiters:<resource>                 jobs to advance when it is ready
    edgetrain:failed:<resource>                  why producing it failed (expires)
    edgetrain:jobs                               zset of job ids by submit time
    edgetrain:job:<id>                           {"spec":..., "created_at":...}
    edgetrain:job:<id>:part:<device>             DevicePart JSON
    edgetrain:job:<id>:progress:<device>         hash of the fine-tune's progress
    edgetrain:job:<id>:events                    list of "<iso time> <text>"
"""

from __future__ import annotations

import json
from datetime import datetime

import redis

from .schemas import (
    DeviceInfo,
    DevicePart,
    JobSpec,
    JobStatus,
    ProfileTable,
    RelationVector,
    TrainingOutcome,
    job_state,
    utc_now,
)

PREFIX = "edgetrain"
CLAIM_TTL_S = 6 * 3600
FAILURE_TTL_S = 3600


def connect(url: str) -> redis.Redis:
    """A Redis client for redis://, rediss:// or unix:// URLs (strings decoded)."""
    return redis.Redis.from_url(url, decode_responses=True)


def table_id(device_type: str, model: str, input_shape: list[int] | tuple[int, ...]) -> str:
    return f"{device_type}:{model}:{'x'.join(map(str, input_shape))}"


class Store:
    def __init__(self, client: redis.Redis):
        self.r = client

    @classmethod
    def from_url(cls, url: str) -> "Store":
        return cls(connect(url))

    # ------------------------------------------------------------------ fleet

    def register_device(self, info: DeviceInfo, ttl_s: float) -> None:
        info = info.model_copy(update={"heartbeat_at": utc_now()})
        with self.r.pipeline() as p:
            p.sadd(f"{PREFIX}:fleet:ids", info.device_id)
            p.set(f"{PREFIX}:fleet:device:{info.device_id}", info.model_dump_json(), px=int(ttl_s * 1000))
            p.execute()

    def unregister_device(self, device_id: str) -> None:
        with self.r.pipeline() as p:
            p.srem(f"{PREFIX}:fleet:ids", device_id)
            p.delete(f"{PREFIX}:fleet:device:{device_id}")
            p.execute()

    def device(self, device_id: str) -> DeviceInfo | None:
        raw = self.r.get(f"{PREFIX}:fleet:device:{device_id}")
        return DeviceInfo.model_validate_json(raw) if raw else None

    def fleet(self) -> list[DeviceInfo]:
        """Devices with a live heartbeat, by id; ids whose heartbeat expired are dropped."""
        devices = []
        for device_id in sorted(self.r.smembers(f"{PREFIX}:fleet:ids")):
            info = self.device(device_id)
            if info is None:
                self.r.srem(f"{PREFIX}:fleet:ids", device_id)
            else:
                devices.append(info)
        return devices

    # ------------------------------------------------------------------ tables and vectors

    def put_table(self, table: ProfileTable) -> str:
        tid = table_id(table.device_type, table.model, table.input_shape)
        self.r.set(f"{PREFIX}:table:{tid}", table.model_dump_json())
        return tid

    def table(self, tid: str) -> ProfileTable | None:
        raw = self.r.get(f"{PREFIX}:table:{tid}")
        return ProfileTable.model_validate_json(raw) if raw else None

    def tables(self, device_type: str | None = None) -> list[ProfileTable]:
        pattern = f"{PREFIX}:table:{device_type + ':' if device_type else ''}*"
        return [ProfileTable.model_validate_json(self.r.get(k)) for k in sorted(self.r.scan_iter(pattern))]

    def put_vector(self, vector: RelationVector) -> None:
        self.r.set(f"{PREFIX}:vector:{vector.key}", vector.model_dump_json())

    def vector(self, key: str) -> RelationVector | None:
        raw = self.r.get(f"{PREFIX}:vector:{key}")
        return RelationVector.model_validate_json(raw) if raw else None

    def put_vector_part(self, key: str, outcome: TrainingOutcome) -> int:
        """Record one (batch size, seed) outcome; returns how many parts are in."""
        name = f"{PREFIX}:vector-parts:{key}"
        with self.r.pipeline() as p:
            p.hset(name, f"{outcome.batch_size}:{outcome.seed}", outcome.model_dump_json())
            p.hlen(name)
            return p.execute()[1]

    def vector_parts(self, key: str) -> list[TrainingOutcome]:
        return [TrainingOutcome.model_validate_json(v) for v in self.r.hvals(f"{PREFIX}:vector-parts:{key}")]

    # ------------------------------------------------------------------ claims and waiters

    def claim(self, resource: str, owner: str) -> bool:
        """True for the first caller only: it must produce the resource."""
        return bool(self.r.set(f"{PREFIX}:claim:{resource}", owner, nx=True, ex=CLAIM_TTL_S))

    def release(self, resource: str) -> None:
        self.r.delete(f"{PREFIX}:claim:{resource}")

    def fail(self, resource: str, reason: str) -> None:
        """Record why a table or vector could not be produced, and free its claim."""
        with self.r.pipeline() as p:
            p.set(f"{PREFIX}:failed:{resource}", reason, ex=FAILURE_TTL_S)
            p.delete(f"{PREFIX}:claim:{resource}")
            p.execute()

    def failure(self, resource: str) -> str | None:
        return self.r.get(f"{PREFIX}:failed:{resource}")

    def add_waiter(self, resource: str, job_id: str) -> None:
        self.r.sadd(f"{PREFIX}:waiters:{resource}", job_id)

    def take_waiters(self, resource: str) -> list[str]:
        name = f"{PREFIX}:waiters:{resource}"
        with self.r.pipeline() as p:
            p.smembers(name)
            p.delete(name)
            return sorted(p.execute()[0])

    # ------------------------------------------------------------------ jobs

    def create_job(self, job_id: str, spec: JobSpec) -> None:
        record = {"spec": spec.model_dump(mode="json"), "created_at": utc_now().isoformat()}
        parts = [DevicePart(device_id=d.device_id, power_cap_w=d.power_cap_w) for d in spec.devices]
        with self.r.pipeline() as p:
            p.set(f"{PREFIX}:job:{job_id}", json.dumps(record))
            for part in parts:
                p.set(f"{PREFIX}:job:{job_id}:part:{part.device_id}", part.model_dump_json())
            p.zadd(f"{PREFIX}:jobs", {job_id: utc_now().timestamp()})
            p.execute()
        self.event(job_id, "submitted")

    def job_created_at(self, job_id: str) -> datetime:
        return datetime.fromisoformat(json.loads(self.r.get(f"{PREFIX}:job:{job_id}"))["created_at"])

    def job_spec(self, job_id: str) -> JobSpec | None:
        raw = self.r.get(f"{PREFIX}:job:{job_id}")
        return JobSpec.model_validate(json.loads(raw)["spec"]) if raw else None

    def part(self, job_id: str, device_id: str) -> DevicePart:
        raw = self.r.get(f"{PREFIX}:job:{job_id}:part:{device_id}")
        if raw is None:
            raise KeyError(f"job {job_id} has no device {device_id}")
        return DevicePart.model_validate_json(raw)

    def put_part(self, job_id: str, part: DevicePart) -> None:
        part = part.model_copy(update={"updated_at": utc_now()})
        self.r.set(f"{PREFIX}:job:{job_id}:part:{part.device_id}", part.model_dump_json())

    def set_progress(self, job_id: str, device_id: str, **values: float) -> None:
        self.r.hset(f"{PREFIX}:job:{job_id}:progress:{device_id}", mapping={k: str(v) for k, v in values.items()})

    def event(self, job_id: str, text: str) -> None:
        self.r.rpush(f"{PREFIX}:job:{job_id}:events", f"{utc_now().isoformat(timespec='seconds')} {text}")

    def job_ids(self) -> list[str]:
        return list(self.r.zrange(f"{PREFIX}:jobs", 0, -1))

    def status(self, job_id: str) -> JobStatus | None:
        raw = self.r.get(f"{PREFIX}:job:{job_id}")
        if raw is None:
            return None
        record = json.loads(raw)
        spec = JobSpec.model_validate(record["spec"])
        parts = {d.device_id: self.part(job_id, d.device_id) for d in spec.devices}
        progress = {
            d: {k: float(v) for k, v in self.r.hgetall(f"{PREFIX}:job:{job_id}:progress:{d}").items()} for d in parts
        }
        return JobStatus(
            job_id=job_id,
            state=job_state(list(parts.values())),
            spec=spec,
            parts=parts,
            progress={d: p for d, p in progress.items() if p},
            created_at=datetime.fromisoformat(record["created_at"]),
            events=self.r.lrange(f"{PREFIX}:job:{job_id}:events", 0, -1),
        )
