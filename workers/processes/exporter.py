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
unfinished part. A scrape reads each job's summary (parts per state, progress totals) and the
fine-tune running on each device, never every part of a big job: a series per part only for
jobs of up to STATUS_PARTS (50) devices, per-job series (`edgetrain_job_*`) for every job."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator

import redis

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.state import TERMINAL, DevicePart, JobState, PartState
from edgetrain.common.limits import STATUS_PARTS
from edgetrain.common.settings import Settings
from edgetrain.common.store import JobView, Running, Store, Tally
from edgetrain.tasks.contract import CONTROL_QUEUE, HANDED_ON, RETRIES, ROLES, SERVER_QUEUE, device_queue, queue_role

from .exposition import Family, gauge, render, serve_text

logger = logging.getLogger(__name__)

WAITING_REASONS = ("no_worker", "paused", "planning", "table", "vector", "device_queue")
DEVICE_LABELS = ["device", "simulated"]
PART_LABELS = ["job_id", "device", "simulated"]  # "job" is the label Prometheus gives the scrape job
DEVICE_QUEUE_STATES = (PartState.profiling, PartState.queued, PartState.finetuning)  # parts that need their device's worker


def _flag(simulated: bool | None) -> str:
    return "unknown" if simulated is None else str(simulated).lower()


def waiting_reason(state: PartState, device_id: str, paused: bool, consumed: set[str]) -> str | None:
    """Why an unfinished part waits, None when its fine-tune runs: `no_worker` (no live worker
    consumes the queue it needs), `paused` (its fine-tune is paused: no configuration meets the
    cap), `planning` (pending), `table` (profiling), `vector` (estimating), `device_queue` (its
    fine-tune is queued on the device, behind what runs there)."""
    needs = {PartState.pending: CONTROL_QUEUE, PartState.estimating: SERVER_QUEUE}.get(state, device_queue(device_id))
    if needs not in consumed:
        return "no_worker"
    if state == PartState.finetuning:
        return "paused" if paused else None
    reasons = {PartState.pending: "planning", PartState.profiling: "table", PartState.estimating: "vector"}
    return reasons.get(state, "device_queue")  # queued


class FleetCollector:
    """Yields the fleet's metrics from one read of the store at each scrape."""

    def __init__(self, store: Store, settings: Settings):
        self.store, self.settings = store, settings

    def collect(self) -> Iterable[Family]:
        """The metrics of the fleet now; `edgetrain_redis_up 0` alone when Redis cannot be read."""
        started = time.perf_counter()
        up = Family("edgetrain_redis_up", "1 when the exporter could read Redis at this scrape")
        try:
            families = list(self._families())
        except redis.RedisError as exc:
            logger.warning("scrape: cannot read Redis: %s", exc)
            up.add([], 0)
            yield up
            return
        up.add([], 1)
        yield up
        yield from families
        yield gauge("edgetrain_exporter_scrape_duration_seconds", "time this scrape took to read Redis", time.perf_counter() - started)

    def _families(self) -> Iterator[Family]:
        s = self.store
        yield from self._redis_info()
        workers = s.liveness.workers(self.settings.heartbeat_ttl_s)
        consumed = {q for w in workers for q in w.queues}
        yield from self._roles(workers)
        last_seen = s.monitoring.last_seen()
        job_ids = s.monitoring.job_ids(self.settings.metrics_jobs, list(last_seen))
        tallies = {j: t for j, t in s.jobs.tallies(job_ids).items() if t.counts}  # a job whose keys expired has none
        running = s.monitoring.running()
        yield from self._devices(running, last_seen)
        yield from self._jobs(tallies, running, consumed)
        queues = [CONTROL_QUEUE, SERVER_QUEUE, *(device_queue(d) for d in last_seen)]
        depth = Family("edgetrain_queue_messages", "messages waiting in a broker queue", labels=["queue", "role"])
        for queue, length in s.monitoring.queue_lengths(queues).items():
            depth.add([queue, queue_role(queue)], length)
        yield depth

    def _redis_info(self) -> Iterator[Family]:
        facts = self.store.redis_facts()
        yield gauge("edgetrain_redis_memory_used_bytes", "memory Redis uses", facts.used_memory_bytes)
        yield gauge("edgetrain_redis_memory_max_bytes", "Redis's maxmemory (0: no limit)", facts.maxmemory_bytes)
        policy = Family("edgetrain_redis_maxmemory_policy_info", "Redis's maxmemory-policy (edgetrain needs noeviction)",
                                   labels=["policy"])  # fmt: skip
        policy.add([facts.maxmemory_policy], 1)
        yield policy
        yield gauge("edgetrain_redis_aof_enabled", "1 when Redis keeps an append-only file", int(facts.aof_enabled))

    def _roles(self, workers: list) -> Iterator[Family]:
        s = self.store
        live = Family("edgetrain_workers", "live workers (heartbeat within the TTL)", labels=["role"])
        by_role = Counter(w.role for w in workers)
        running = Family("edgetrain_tasks_running", "tasks whose lease is held now", labels=["role"])
        leases = Counter(queue_role(lease.queue) for lease in s.liveness.running())
        handed_on = Family("edgetrain_tasks_handed_on", "tasks of lost workers handed on by the reaper", labels=["role"], counter=True)
        retries = Family("edgetrain_task_retries", "redelivered tasks run again after their worker died", labels=["role"], counter=True)
        handed, retried = s.monitoring.counts(HANDED_ON), s.monitoring.counts(RETRIES)
        for role in ROLES:
            live.add([role], by_role[role])
            running.add([role], leases[role])
            handed_on.add([role], handed.get(role, 0))
            retries.add([role], retried.get(role, 0))
        yield from (live, running, handed_on, retries)

    def _devices(self, running: dict[str, Running], last_seen: dict[str, float]) -> Iterator[Family]:
        s = self.store
        devices = {d.device_id: d for d in s.monitoring.live_devices(last_seen, self.settings.heartbeat_ttl_s)}
        up = Family("edgetrain_device_up", "1 for a device with a live heartbeat",
                               labels=["device", "device_type", "backend", "simulated"])  # fmt: skip
        for d in devices.values():
            up.add([d.device_id, d.device_type, d.backend, _flag(d.simulated)], 1)
        seen = Family("edgetrain_device_last_seen_timestamp_seconds", "last heartbeat (Redis time)", labels=["device"])
        for device_id, at in last_seen.items():
            seen.add([device_id], at)
        yield from (up, seen)
        gauges = {name: Family(f"edgetrain_device_{name}", doc, labels=DEVICE_LABELS) for name, doc in (
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
        counters = {name: Family(f"edgetrain_device_{name}", doc, labels=DEVICE_LABELS, counter=True) for name, doc in (
            ("guard_step_downs", "frequency step-downs of the power guard in the running fine-tune"),
            ("switches", "configuration changes (cap, guard, pause, resume) in the running fine-tune"),
            ("over_cap_seconds", "device time of measured regions whose peak power was over the cap, running fine-tune"),
        )}  # fmt: skip
        job = Family("edgetrain_device_job_info", "the job whose fine-tune runs on the device", labels=["device", "job_id"])
        for device_id, run in sorted(running.items()):
            part, p = run.part, run.progress
            job.add([device_id, run.job_id], 1)
            if p is None:  # started, nothing measured yet
                continue
            labels = [device_id, _flag(part.simulated)]
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
                    gauges[name].add(labels, value)
            for name, count in (("guard_step_downs", p.guard_step_downs), ("switches", p.switches), ("over_cap_seconds", p.over_cap_s)):
                counters[name].add(labels, count)
        for device_id, cap_w in s.monitoring.power_caps().items():  # live idle devices: the cap set on them
            if device_id in devices and (running.get(device_id) is None or running[device_id].progress is None):
                gauges["power_cap_watts"].add([device_id, _flag(devices[device_id].simulated)], cap_w)
        yield from (*gauges.values(), *counters.values(), job)

    def _jobs(self, tallies: dict[str, Tally], running: dict[str, Running], consumed: set[str]) -> Iterator[Family]:
        """Per job, from its summary (never from its parts): its state, parts per state and
        progress totals; the parts that wait and why (a big job's devices read from its sets of
        devices by state); and a series per part for the jobs of up to STATUS_PARTS devices."""
        by_job: Counter[JobState] = Counter()
        by_part: Counter[PartState] = Counter()
        waiting: Counter[str] = Counter()
        job_parts = Family("edgetrain_job_parts", "a reported job's parts in each state", labels=["job_id", "state"])
        totals = {name: Family(f"edgetrain_job_{name}", doc, labels=["job_id"]) for name, doc in (
            ("samples", "samples the job's fine-tunes have processed, all parts together"),
            ("device_time_seconds", "device time of the job's fine-tunes so far, all parts together"),
            ("energy_joules", "board energy of the job's fine-tunes so far, all parts together"),
        )}  # fmt: skip
        small = [j for j, t in tallies.items() if sum(t.counts.values()) <= STATUS_PARTS]
        for job_id, tally in tallies.items():
            by_job[tally.state] += 1
            for part_state, n in tally.counts.items():
                by_part[part_state] += n
                job_parts.add([job_id, part_state.value], n)
            for name, value in zip(totals, (tally.samples, tally.device_time_s, tally.energy_j)):
                totals[name].add([job_id], value)
        big = [j for j in tallies if j not in small]
        members = self.store.monitoring.parts_in([(j, state) for j in big for state in DEVICE_QUEUE_STATES])
        for job_id in big:
            counts = tallies[job_id].counts
            shared = [(state, "") for state in (PartState.pending, PartState.estimating) for _ in range(counts.get(state, 0))]
            on_devices = [(state, d) for state in DEVICE_QUEUE_STATES for d in members[(job_id, state)]]
            for state, device_id in shared + on_devices:
                if reason := waiting_reason(state, device_id, _paused(running, job_id, device_id), consumed):
                    waiting[reason] += 1
        yield from (*self._parts(self.store.monitoring.jobs(small), running, consumed, waiting), job_parts, *totals.values())
        jobs_family = Family("edgetrain_jobs", "reported jobs by state", labels=["state"])
        for job_state_ in JobState:
            jobs_family.add([job_state_.value], by_job[job_state_])
        parts_family = Family("edgetrain_parts", "parts of the reported jobs by state", labels=["state"])
        for part_state in PartState:
            parts_family.add([part_state.value], by_part[part_state])
        waiting_family = Family("edgetrain_parts_waiting", "unfinished parts that wait, by why", labels=["reason"])
        for reason in WAITING_REASONS:
            waiting_family.add([reason], waiting[reason])
        yield from (jobs_family, parts_family, waiting_family)

    def _parts(self, jobs: list[JobView], running: dict[str, Running], consumed: set[str], waiting: Counter[str]) -> Iterator[Family]:
        """A series per part of `jobs` (small ones), counting in `waiting` why theirs wait."""
        state = Family("edgetrain_part_state", "1 for the state a device's part of a job is in", labels=[*PART_LABELS, "state"])
        waits = Family("edgetrain_part_waiting", "1 for an unfinished part that waits", labels=[*PART_LABELS, "reason"])
        gauges = {name: Family(f"edgetrain_part_{name}", doc, labels=PART_LABELS) for name, doc in (
            ("accuracy_ratio", "test accuracy of the part's fine-tune: its last evaluation, or its final one (0..1)"),
            ("target_accuracy_ratio", "the job's target accuracy (0..1)"),
            ("samples", "samples the part's fine-tune has processed"),
            ("max_samples", "the job's sample budget"),
            ("device_time_seconds", "device time of the part's fine-tune so far"),
            ("energy_joules", "board energy of the part's fine-tune so far"),
            ("achieved_time_to_accuracy_seconds", "device time the completed fine-tune took to reach the target"),
            ("attempts", "times the part's fine-tune started (> 1: its worker died and it resumed)"),
        )}  # fmt: skip
        estimated = Family("edgetrain_part_estimated_time_to_accuracy_seconds",
                                      "estimated device time to the target accuracy of what the fine-tune runs (the plan, or the "
                                      "configuration the device chose at its start) and of Baseline 1 (T[b][f] * N_b / N_s)",
                                      labels=[*PART_LABELS, "method"])  # fmt: skip
        for view in jobs:
            job_id = view.record.job_id
            for device_id, part in view.parts.items():
                labels = [job_id, device_id, _flag(part.simulated)]
                state.add([*labels, part.state.value], 1)
                progress, report = view.progress.get(device_id), part.report
                if part.state not in TERMINAL and (
                    reason := waiting_reason(part.state, device_id, _paused(running, job_id, device_id), consumed)
                ):
                    waiting[reason] += 1
                    waits.add([*labels, reason], 1)
                for method, value in _estimates(part).items():
                    if value is not None:
                        estimated.add([*labels, method], value)
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
                        gauges[name].add(labels, value)
        yield from (state, waits, estimated, *gauges.values())


def _paused(running: dict[str, Running], job_id: str, device_id: str) -> bool:
    """Whether the job's fine-tune on the device runs paused: no configuration meets the cap."""
    run = running.get(device_id)
    return run is not None and run.job_id == job_id and run.progress is not None and run.progress.paused is not None


def _estimates(part: DevicePart) -> dict[str, float | None]:
    """The estimated time to accuracy of what the part's fine-tune runs and of Baseline 1 (s),
    under the vector that chose it."""
    if part.started is not None:
        return {"edgetrain": part.started.estimated_time_to_accuracy_s, "baseline1": part.started.baseline1_estimated_time_to_accuracy_s}
    return {"edgetrain": part.estimated_time_to_accuracy_s, "baseline1": part.baseline1_estimated_time_to_accuracy_s}


def scrape(store: Store, settings: Settings) -> bytes:
    """One scrape's body: the fleet's metrics now, in Prometheus's text format."""
    return render(FleetCollector(store, settings).collect())


def serve(settings: Settings, address: str, port: int) -> None:
    """Serve /metrics on `address`:`port` until SIGTERM or SIGINT."""
    store = Store.connect(settings.redis_url, settings.key_prefix)
    server, thread = serve_text(address, port, lambda: scrape(store, settings))
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    logger.info("serving edgetrain metrics on http://%s:%d/metrics", address, port)
    stopped.wait()
    server.shutdown()
    thread.join(timeout=5)
