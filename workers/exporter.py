"""`edgetrain exporter`: the fleet's figures for Prometheus, read from Redis at each scrape.

It is a process of its own, not part of the control worker: a scrape reads Redis only (no
PyTorch is imported, no training process is asked anything, so no step waits on it), one
exporter serves however many control workers run (each would otherwise report the same
fleet), and it needs only the read-only `monitor` Redis user. The figures come from what the
workers already store: the fleet and worker registries, task leases, job parts, the progress
each fine-tune reports at its evaluations, fine-tune attempts, the counters of tasks handed
on and retried, the broker's queues and Redis's INFO. Every device and part figure carries
`simulated="true"` when a twin produced it.

Jobs reported: the newest `EDGETRAIN_METRICS_JOBS` (100) and every older one with an
unfinished part."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs import TERMINAL, DevicePart, FinetuneProgress, JobState, PartState, job_state
from edgetrain.common.settings import Settings
from edgetrain.common.store import JobView, Store
from edgetrain.tasks.contract import CONTROL_QUEUE, HANDED_ON, RETRIES, ROLES, SERVER_QUEUE, device_queue, queue_role

logger = logging.getLogger(__name__)

WAITING_REASONS = ("no_worker", "paused", "planning", "table", "vector", "device_queue")
DEVICE_LABELS = ["device", "simulated"]
PART_LABELS = ["job_id", "device", "simulated"]  # "job" is the label Prometheus gives the scrape job


def _flag(simulated: bool | None) -> str:
    return "unknown" if simulated is None else str(simulated).lower()


def waiting_reason(part: DevicePart, progress: FinetuneProgress | None, consumed: set[str]) -> str | None:
    """Why an unfinished part waits, None when it runs (a fine-tune reporting progress):
    `no_worker` (no live worker consumes the queue it needs), `paused` (no configuration
    meets the cap), `planning` (pending), `table` (profiling), `vector` (estimating),
    `device_queue` (its fine-tune waits its turn on the device)."""
    needs = {PartState.pending: CONTROL_QUEUE, PartState.estimating: SERVER_QUEUE}.get(part.state, device_queue(part.device_id))
    if needs not in consumed:
        return "no_worker"
    if part.state == PartState.finetuning:
        return None if progress is None or progress.paused is None else "paused"
    return {PartState.pending: "planning", PartState.profiling: "table", PartState.estimating: "vector"}[part.state]


class FleetCollector(Collector):
    """Yields the fleet's metrics from one read of the store at each scrape."""

    def __init__(self, store: Store, settings: Settings):
        self.store, self.settings = store, settings

    def collect(self) -> Iterable[Metric]:
        """The metrics of the fleet now; `edgetrain_redis_up 0` alone when Redis cannot be read."""
        started = time.perf_counter()
        up = GaugeMetricFamily("edgetrain_redis_up", "1 when the exporter could read Redis at this scrape")
        try:
            families = list(self._families())
        except redis.RedisError as exc:
            logger.warning("scrape: cannot read Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families
        yield GaugeMetricFamily("edgetrain_exporter_scrape_duration_seconds", "time this scrape took to read Redis",
                                value=time.perf_counter() - started)  # fmt: skip

    def _families(self) -> Iterator[Metric]:
        s = self.store
        yield from self._redis_info()
        workers = s.liveness.workers(self.settings.heartbeat_ttl_s)
        consumed = {q for w in workers for q in w.queues}
        yield from self._roles(workers)
        jobs = s.monitoring.jobs(s.monitoring.job_ids(self.settings.metrics_jobs))
        last_seen = s.monitoring.last_seen()
        yield from self._devices(jobs, last_seen)
        yield from self._parts(jobs, consumed)
        queues = [CONTROL_QUEUE, SERVER_QUEUE, *(device_queue(d) for d in sorted(last_seen))]
        depth = GaugeMetricFamily("edgetrain_queue_messages", "messages waiting in a broker queue", labels=["queue", "role"])
        for queue, length in s.monitoring.queue_lengths(queues).items():
            depth.add_metric([queue, queue_role(queue)], length)
        yield depth

    def _redis_info(self) -> Iterator[Metric]:
        facts = self.store.redis_facts()
        yield GaugeMetricFamily("edgetrain_redis_memory_used_bytes", "memory Redis uses", value=facts.used_memory_bytes)
        yield GaugeMetricFamily("edgetrain_redis_memory_max_bytes", "Redis's maxmemory (0: no limit)", value=facts.maxmemory_bytes)
        policy = GaugeMetricFamily("edgetrain_redis_maxmemory_policy_info", "Redis's maxmemory-policy (edgetrain needs noeviction)",
                                   labels=["policy"])  # fmt: skip
        policy.add_metric([facts.maxmemory_policy], 1)
        yield policy
        yield GaugeMetricFamily("edgetrain_redis_aof_enabled", "1 when Redis keeps an append-only file", value=int(facts.aof_enabled))

    def _roles(self, workers: list) -> Iterator[Metric]:
        s = self.store
        live = GaugeMetricFamily("edgetrain_workers", "live workers (heartbeat within the TTL)", labels=["role"])
        by_role = Counter(w.role for w in workers)
        running = GaugeMetricFamily("edgetrain_tasks_running", "tasks whose lease is held now", labels=["role"])
        leases = Counter(queue_role(lease.queue) for lease in s.liveness.running())
        handed_on = CounterMetricFamily("edgetrain_tasks_handed_on", "tasks of lost workers handed on by the reaper", labels=["role"])
        retries = CounterMetricFamily("edgetrain_task_retries", "redelivered tasks run again after their worker died", labels=["role"])
        handed, retried = s.monitoring.counts(HANDED_ON), s.monitoring.counts(RETRIES)
        for role in ROLES:
            live.add_metric([role], by_role[role])
            running.add_metric([role], leases[role])
            handed_on.add_metric([role], handed.get(role, 0))
            retries.add_metric([role], retried.get(role, 0))
        yield from (live, running, handed_on, retries)

    def _devices(self, jobs: list[JobView], last_seen: dict[str, float]) -> Iterator[Metric]:
        s = self.store
        devices = {d.device_id: d for d in s.fleet.devices()}
        up = GaugeMetricFamily("edgetrain_device_up", "1 for a device with a live heartbeat",
                               labels=["device", "device_type", "backend", "simulated"])  # fmt: skip
        for d in devices.values():
            up.add_metric([d.device_id, d.device_type, d.backend, _flag(d.simulated)], 1)
        seen = GaugeMetricFamily("edgetrain_device_last_seen_timestamp_seconds", "last heartbeat (Redis time)", labels=["device"])
        for device_id, at in sorted(last_seen.items()):
            seen.add_metric([device_id], at)
        yield from (up, seen)
        running: dict[str, tuple[str, DevicePart, FinetuneProgress]] = {}  # device -> the fine-tune it reports now
        for view in jobs:
            for device_id, progress in view.progress.items():
                part = view.parts.get(device_id)
                if part is not None and part.state == PartState.finetuning:
                    if device_id not in running or running[device_id][2].updated_at < progress.updated_at:
                        running[device_id] = (view.record.job_id, part, progress)
        gauges = {name: GaugeMetricFamily(f"edgetrain_device_{name}", doc, labels=DEVICE_LABELS) for name, doc in (
            ("power_watts", "mean board power of the running fine-tune since its previous report"),
            ("peak_power_watts", "highest board power reading of the running fine-tune"),
            ("power_cap_watts", "board power cap in force (the running fine-tune's, else the cap set on the device)"),
            ("frequency_hertz", "GPU clock the running fine-tune pinned (devices whose control axis is the clock)"),
            ("power_limit_watts", "GPU power limit the running fine-tune set (devices whose control axis is the power limit)"),
            ("batch_size", "batch size the running fine-tune trains with"),
            ("samples_per_second", "samples per second of device time since the previous report"),
            ("accuracy_ratio", "test accuracy of the running fine-tune at its last evaluation (0..1)"),
            ("paused", "1 while the running fine-tune is paused: no configuration meets the cap"),
        )}  # fmt: skip
        counters = {name: CounterMetricFamily(f"edgetrain_device_{name}", doc, labels=DEVICE_LABELS) for name, doc in (
            ("guard_step_downs", "frequency step-downs of the power guard in the running fine-tune"),
            ("switches", "configuration changes (cap, guard, pause, resume) in the running fine-tune"),
            ("over_cap_seconds", "device time of measured regions whose peak power was over the cap, running fine-tune"),
        )}  # fmt: skip
        job = GaugeMetricFamily("edgetrain_device_job_info", "the job whose fine-tune runs on the device", labels=["device", "job_id"])
        for device_id, (job_id, part, p) in sorted(running.items()):
            labels = [device_id, _flag(part.simulated)]
            job.add_metric([device_id, job_id], 1)
            axis = {ControlAxis.GPU_CLOCK_HZ: ("frequency_hertz", 1.0), ControlAxis.POWER_LIMIT_MW: ("power_limit_watts", 1e-3)}
            setting = axis.get(part.control or ControlAxis.GPU_CLOCK_HZ)
            values = {
                "power_watts": p.power_w, "peak_power_watts": p.peak_power_w, "power_cap_watts": p.power_cap_w,
                "batch_size": p.batch_size, "samples_per_second": p.samples_per_s, "accuracy_ratio": p.accuracy,
                "paused": int(p.paused is not None),
            }  # fmt: skip
            if setting is not None and p.frequency_hz is not None:
                values[setting[0]] = p.frequency_hz * setting[1]
            for name, value in values.items():
                if value is not None:
                    gauges[name].add_metric(labels, value)
            for name, count in (("guard_step_downs", p.guard_step_downs), ("switches", p.switches), ("over_cap_seconds", p.over_cap_s)):
                counters[name].add_metric(labels, count)
        for device_id, device in sorted(devices.items()):  # idle devices: the cap set on them
            if device_id not in running and (cap := s.fleet.power_cap(device_id)) is not None and cap.power_cap_w is not None:
                gauges["power_cap_watts"].add_metric([device_id, _flag(device.simulated)], cap.power_cap_w)
        yield from (*gauges.values(), *counters.values(), job)

    def _parts(self, jobs: list[JobView], consumed: set[str]) -> Iterator[Metric]:
        by_job: Counter[JobState] = Counter()
        by_part: Counter[PartState] = Counter()
        waiting: Counter[str] = Counter()
        state = GaugeMetricFamily("edgetrain_part_state", "1 for the state a device's part of a job is in", labels=[*PART_LABELS, "state"])
        waits = GaugeMetricFamily("edgetrain_part_waiting", "1 for an unfinished part that waits", labels=[*PART_LABELS, "reason"])
        gauges = {name: GaugeMetricFamily(f"edgetrain_part_{name}", doc, labels=PART_LABELS) for name, doc in (
            ("accuracy_ratio", "test accuracy of the part's fine-tune: its last evaluation, or its final one (0..1)"),
            ("target_accuracy_ratio", "the job's target accuracy (0..1)"),
            ("samples", "samples the part's fine-tune has processed"),
            ("max_samples", "the job's sample budget"),
            ("device_time_seconds", "device time of the part's fine-tune so far"),
            ("energy_joules", "board energy of the part's fine-tune so far"),
            ("achieved_time_to_accuracy_seconds", "device time the completed fine-tune took to reach the target"),
            ("attempts", "times the part's fine-tune started (> 1: its worker died and it resumed)"),
        )}  # fmt: skip
        estimated = GaugeMetricFamily("edgetrain_part_estimated_time_to_accuracy_seconds",
                                      "estimated device time to the target accuracy of the selection (T[b][f] * N_b / N_s)",
                                      labels=[*PART_LABELS, "method"])  # fmt: skip
        for view in jobs:
            job_id = view.record.job_id
            by_job[job_state(list(view.parts.values()))] += 1
            for device_id, part in view.parts.items():
                labels = [job_id, device_id, _flag(part.simulated)]
                by_part[part.state] += 1
                state.add_metric([*labels, part.state.value], 1)
                progress, report = view.progress.get(device_id), part.report
                if part.state not in TERMINAL and (reason := waiting_reason(part, progress, consumed)) is not None:
                    waiting[reason] += 1
                    waits.add_metric([*labels, reason], 1)
                estimates = {"edgetrain": part.estimated_time_to_accuracy_s, "baseline1": part.baseline1_estimated_time_to_accuracy_s}
                for method, value in estimates.items():
                    if value is not None:
                        estimated.add_metric([*labels, method], value)
                values: dict[str, float | None] = {"target_accuracy_ratio": view.record.spec.target_accuracy,
                                                   "max_samples": view.record.spec.max_samples}  # fmt: skip
                if part.attempts:
                    values["attempts"] = part.attempts
                if report is not None:
                    values |= {"accuracy_ratio": report.final_accuracy, "samples": report.samples_processed,
                               "device_time_seconds": report.device_time_s, "energy_joules": report.energy_j,
                               "achieved_time_to_accuracy_seconds": report.device_time_s if report.reached else None}  # fmt: skip
                elif progress is not None:
                    values |= {"accuracy_ratio": progress.accuracy, "samples": progress.samples,
                               "device_time_seconds": progress.device_time_s, "energy_joules": progress.energy_j}  # fmt: skip
                for name, value in values.items():
                    if value is not None:
                        gauges[name].add_metric(labels, value)
        jobs_family = GaugeMetricFamily("edgetrain_jobs", "reported jobs by state", labels=["state"])
        for job_state_ in JobState:
            jobs_family.add_metric([job_state_.value], by_job[job_state_])
        parts_family = GaugeMetricFamily("edgetrain_parts", "parts of the reported jobs by state", labels=["state"])
        for part_state in PartState:
            parts_family.add_metric([part_state.value], by_part[part_state])
        waiting_family = GaugeMetricFamily("edgetrain_parts_waiting", "unfinished parts that wait, by why", labels=["reason"])
        for reason in WAITING_REASONS:
            waiting_family.add_metric([reason], waiting[reason])
        yield from (jobs_family, parts_family, waiting_family, state, waits, estimated, *gauges.values())


def registry(store: Store, settings: Settings) -> CollectorRegistry:
    """A registry holding only the fleet's collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(store, settings))
    return reg


def serve(settings: Settings, address: str, port: int) -> None:
    """Serve /metrics on `address`:`port` until SIGTERM or SIGINT."""
    store = Store.connect(settings.redis_url, settings.key_prefix)
    server, thread = start_http_server(port, address, registry(store, settings))
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    logger.info("serving edgetrain metrics on http://%s:%d/metrics", address, port)
    stopped.wait()
    server.shutdown()
    thread.join(timeout=5)
