"""Planning and dispatch over a fleet of registered simulated devices, with real Redis and a
real control worker: how fast jobs go from submission to their `finetune` task leaving, how
long `status()` and `fleet()` take, and what Redis holds per device and per job.

The devices are registered in the fleet (heartbeats from this process) with a stored table for
each device type and the job's relation vector, so jobs go straight to selection; every device
has its own queue, where the dispatched `finetune` messages wait (no device worker consumes
them: what is measured is planning and dispatch, not training).

- paced: one single-device job per device, submitted at `--rate` jobs per second;
- burst: one job over every device at once (planned in pages by the control worker's pool).

Latency = the `selected` event (the fine-tune dispatched) minus the job's submission time.

    python bench/fleet_load.py [--devices 500] [--rate 25] [--control-concurrency 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from edgetrain.common.devices.twin_spec import builtin_twins
from edgetrain.common.jobs import EventKind, JobStatus
from edgetrain.common.keys import table_id, vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.profiling import software_versions
from edgetrain.common.schemas import PAPER_BATCH_SIZES, DeviceInfo, JobSpec, ProfileTable, RelationVector
from edgetrain.common.store import Store
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.cluster import LocalCluster

TWINS = ["jetson-nano", "jetson-tx2-nx", "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"]
SHAPE = [1, 28, 28]  # smallcnn


def fleet_infos(count: int) -> list[DeviceInfo]:
    """`count` simulated devices, the built-in twins in turn."""
    twins = builtin_twins()
    infos = []
    for i in range(count):
        spec = twins[TWINS[i % len(TWINS)]]
        infos.append(DeviceInfo(
            device_id=f"dev-{i:04d}", device_type=spec.device_type, backend="sim", frequencies_hz=spec.frequencies_hz,
            memory_bytes=spec.memory_bytes, simulated=True, power_envelope_w=spec.full_load_power_w, software=software_versions(),
        ))  # fmt: skip
    return infos


def synthetic_table(info: DeviceInfo, rng: random.Random) -> ProfileTable:
    """A monotone table over the twin's frequencies: power rises with b and f, time falls with f."""
    freqs, b_max = info.frequencies_hz, PAPER_BATCH_SIZES[-1]
    peak = info.power_envelope_w or [5.0] * len(freqs)
    time_s = [[(1 + 8 / b) * freqs[-1] / f * rng.uniform(0.9, 1.1) for f in freqs] for b in PAPER_BATCH_SIZES]
    power = [[peak[0] + (p - peak[0]) * (0.4 + 0.6 * b / b_max) for p in peak] for b in PAPER_BATCH_SIZES]
    return ProfileTable(
        batch_sizes=PAPER_BATCH_SIZES, frequencies_hz=freqs, samples=1024, time_s=time_s, peak_power_w=power,
        max_batch_size=b_max, device_type=info.device_type, model="smallcnn", input_shape=SHAPE, simulated=True,
        produced_by=software_versions(), points_measured=len(freqs) * len(PAPER_BATCH_SIZES),
    )  # fmt: skip


class Heartbeats(threading.Thread):
    """Keeps every device of the fleet registered, as their workers would."""

    def __init__(self, store: Store, infos: list[DeviceInfo]):
        super().__init__(daemon=True)
        self.store, self.infos, self.stopped = store, infos, threading.Event()

    def beat(self) -> None:
        for info in self.infos:
            self.store.fleet.register(info, 30.0, f"bench:{info.device_id}")

    def run(self) -> None:
        while not self.stopped.wait(5.0):
            self.beat()


def cap_w(info: DeviceInfo) -> float:
    """A cap half way up the device type's full-load power: some configurations fit, not all."""
    envelope = info.power_envelope_w or [5.0]
    return round((envelope[0] + envelope[-1]) / 2, 2)


def job_spec(devices: list[DeviceInfo]) -> dict:
    return quick_job([{"device_id": d.device_id, "power_cap_w": cap_w(d)} for d in devices])


def dispatch_latencies_s(status: JobStatus) -> list[float]:
    """Per device: the `selected` event's time minus the job's submission (s)."""
    return [(e.at - status.created_at).total_seconds() for e in status.events if e.kind == EventKind.selected]


def wait_dispatched(client: EdgeTrainClient, job_ids: list[str], expected: int, timeout_s: float = 600) -> list[JobStatus]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = [client.store.jobs.status(j) for j in job_ids]
        if sum(len(dispatch_latencies_s(s)) for s in statuses) >= expected:
            return statuses
        time.sleep(0.5)
        failed = [p.reason for s in statuses for p in s.parts.values() if p.reason]
        if failed:
            raise RuntimeError(f"{len(failed)} parts failed, e.g. {failed[0]}")
    raise TimeoutError(f"not every fine-tune was dispatched within {timeout_s} s")


def timed_ms(call, repeat: int = 50) -> tuple[float, float]:
    """(median, p99) of `repeat` calls (ms)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times), percentile(times, 99)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def used_memory(store: Store) -> int:
    return int(store._redis.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--rate", type=float, default=25.0, help="paced submissions per second")
    parser.add_argument("--control-concurrency", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), server_workers=0, control_concurrency=args.control_concurrency) as cluster,
    ):
        store, client = cluster.store(), EdgeTrainClient(cluster.url)
        infos = fleet_infos(args.devices)
        empty = used_memory(store)
        heartbeats = Heartbeats(store, infos)
        heartbeats.beat()
        heartbeats.start()
        fleet_bytes = used_memory(store) - empty
        rng = random.Random(0)
        for info in {i.device_type: i for i in infos}.values():
            store.resources.put_table(synthetic_table(info, rng))
        request = JobSpec.model_validate(job_spec([infos[0]])).estimation_request()
        ratios = [0.3, 0.4, 0.5, 0.7, 0.85, 1.0]
        store.resources.put_vector(RelationVector(batch_sizes=PAPER_BATCH_SIZES, ratios=ratios, key=vector_key(request)))
        assert all(store.resources.table(table_id(t, "smallcnn", SHAPE)) for t in {i.device_type for i in infos})

        before_jobs = used_memory(store)
        started = time.perf_counter()
        paced = []
        for k, info in enumerate(infos):
            time.sleep(max(0.0, started + k / args.rate - time.perf_counter()))
            paced.append(client.submit(job_spec([info])))
        submitted_s = time.perf_counter() - started
        statuses = wait_dispatched(client, paced, len(infos))
        paced_s = time.perf_counter() - started
        paced_latency = [x for s in statuses for x in dispatch_latencies_s(s)]
        per_job_bytes = (used_memory(store) - before_jobs) / len(paced)

        started = time.perf_counter()
        burst = client.submit(job_spec(infos))
        (status,) = wait_dispatched(client, [burst], len(infos))
        burst_s = time.perf_counter() - started
        burst_latency = dispatch_latencies_s(status)

        status_ms = timed_ms(lambda: client.status(burst))
        fleet_ms = timed_ms(client.fleet)
        heartbeats.stopped.set()

    result = {
        "devices": args.devices, "control_processes": args.control_concurrency, "rate_per_s": args.rate,
        "paced_submit_s": submitted_s, "paced_all_dispatched_s": paced_s, "paced_throughput_per_s": len(infos) / paced_s,
        "paced_latency_ms": {"median": statistics.median(paced_latency) * 1e3, "p99": percentile(paced_latency, 99) * 1e3},
        "burst_all_dispatched_s": burst_s, "burst_throughput_per_s": len(infos) / burst_s,
        "burst_latency_ms": {"median": statistics.median(burst_latency) * 1e3, "p99": percentile(burst_latency, 99) * 1e3},
        "status_ms": {"median": status_ms[0], "p99": status_ms[1]}, "fleet_ms": {"median": fleet_ms[0], "p99": fleet_ms[1]},
        "redis_bytes_per_device": fleet_bytes / args.devices, "redis_bytes_per_job": per_job_bytes,
    }  # fmt: skip
    print(f"{args.devices} simulated devices ({', '.join(TWINS)}), one real Redis, "
          f"a control worker of {args.control_concurrency} processes")
    print(f"paced, {args.rate:g} single-device jobs/s: all {args.devices} dispatched {paced_s:.1f} s after the first submission "
          f"({result['paced_throughput_per_s']:.0f}/s); latency median {result['paced_latency_ms']['median']:.0f} ms, "
          f"p99 {result['paced_latency_ms']['p99']:.0f} ms")
    print(f"burst, one job over every device: all dispatched in {burst_s:.2f} s ({result['burst_throughput_per_s']:.0f}/s); "
          f"latency median {result['burst_latency_ms']['median']:.0f} ms, p99 {result['burst_latency_ms']['p99']:.0f} ms")
    print(f"status() of the {args.devices}-device job: median {status_ms[0]:.1f} ms, p99 {status_ms[1]:.1f} ms; "
          f"fleet() of {args.devices} devices: median {fleet_ms[0]:.1f} ms, p99 {fleet_ms[1]:.1f} ms")
    print(f"Redis: {result['redis_bytes_per_device']:.0f} bytes per registered device, "
          f"{per_job_bytes:.0f} bytes per single-device job (record, part, events and its queued fine-tune message)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
