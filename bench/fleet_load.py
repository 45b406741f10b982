"""Planning and dispatch over a fleet of registered simulated devices, with real Redis and a
real control worker: how fast jobs go from submission to their `finetune` task leaving, how
long `status()` and `fleet()` take, and what Redis holds per device and per job.

The devices are registered in the fleet (heartbeats from this process) with a stored table for
each device type and the job's relation vector, so jobs go straight to selection; every device
has its own queue, where the dispatched `finetune` messages wait (no device worker consumes
them: what is measured is planning and dispatch, not training).

- paced: one single-device job per device, submitted at a rate (jobs per second);
- burst: one job over every device at once (planned in pages by the control worker's pool).

Last, on a Redis of its own, one job over 10 000 devices (`--scrape-devices`) is dispatched and a
real `edgetrain exporter` process is scraped over HTTP, as Prometheus scrapes it: the time to the
last byte of /metrics, and the exporter's CPU per scrape.

Beside the control worker's CPU per paced job, the bench runs the same planning step
(`plan_submitted` taking up 6 single-device jobs, their fine-tunes sent) in its own process on a
Redis of its own (`--step-jobs`): that step's CPU is what a job costs without Celery's handling
of the messages (taking one, handing it to a pool process, acknowledging it), which is the rest.
Paced jobs wait for the planning window (`EDGETRAIN_PLAN_WINDOW_S`, 0.2 s) or for 6 jobs: a step
takes up about 6 of them from 25 jobs/s on.

Latency = when a part's fine-tune was dispatched minus the job's submission time. Every part is
checked at the end: each dispatched once, each device queue holding one fine-tune per job.
What each paced job costs: the control worker's CPU (its main process and pool children) and
the commands Redis runs (the fleet's heartbeats taken out: what one costs, measured while idle,
times those sent meanwhile), divided by the paced jobs. Runs
the three sizes by default, each on its own Redis, and prints how each figure grows.

    python bench/fleet_load.py [--sizes 500 2000 10000] [--rates 25 100 250] [--control-concurrency 2]
                               [--scrape-devices 10000] [--step-jobs 400] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from edgetrain.common.devices.twin_spec import builtin_twins
from edgetrain.common.jobs.state import JobStatus, PartState
from edgetrain.common.keys import table_id, vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.profiling import software_versions
from edgetrain.common.schemas import PAPER_BATCH_SIZES, DeviceInfo, JobSpec, ProfileTable, RelationVector
from edgetrain.common.settings import Settings
from edgetrain.common.store import Store
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.tasks.contract import device_queue
from edgetrain.workers.processes.cluster import LocalCluster

TWINS = ["jetson-nano", "jetson-tx2-nx", "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"]
SHAPE = [1, 28, 28]  # smallcnn
HEARTBEAT_S = Settings.model_fields["heartbeat_s"].default  # a device worker's heartbeat period (s)
HEARTBEAT_TTL_S = Settings.model_fields["heartbeat_ttl_s"].default


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
        self.sent = 0  # heartbeats sent so far

    def beat(self) -> None:
        for info in self.infos:
            self.store.fleet.register(info, HEARTBEAT_TTL_S, f"bench:{info.device_id}")
            self.sent += 1

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            self.beat()


def cap_w(info: DeviceInfo) -> float:
    """A cap half way up the device type's full-load power: some configurations fit, not all."""
    envelope = info.power_envelope_w or [5.0]
    return round((envelope[0] + envelope[-1]) / 2, 2)


def job_spec(devices: list[DeviceInfo]) -> dict:
    return quick_job([{"device_id": d.device_id, "power_cap_w": cap_w(d)} for d in devices])


def dispatch_latencies_s(status: JobStatus) -> list[float]:
    """Per part: when its fine-tune was dispatched minus the job's submission (s)."""
    return [(p.dispatch.at - status.created_at).total_seconds() for p in status.parts.values() if p.dispatch]


def wait_dispatched(store: Store, job_ids: list[str], expected: int, timeout_s: float = 900, stalled_s: float = 10.0) -> None:
    """Until `expected` fine-tunes in all are dispatched (one command a poll: the ledger of
    dispatched fine-tunes, so that polling adds next to nothing to what is measured); when none
    was dispatched for `stalled_s`, the jobs' failed parts are looked for."""
    deadline, count, moved = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        if (now := store._redis.zcard(store.keys.dispatched())) >= expected:
            return
        if now != count:
            count, moved = now, time.monotonic()
        elif time.monotonic() - moved > stalled_s and (
            failed := [j for j, tally in store.jobs.tallies(job_ids).items() if tally.counts.get(PartState.failed)]
        ):
            reason = next(p.reason for p in store.jobs.status(failed[0]).parts.values() if p.reason)
            raise RuntimeError(f"parts failed, e.g. {reason}")
        time.sleep(0.05)
    raise TimeoutError(f"not every fine-tune was dispatched within {timeout_s} s")


def check_every_part(store: Store, statuses: list[JobStatus], infos: list[DeviceInfo], per_device: int) -> None:
    """Every part dispatched once, and every device's queue holds `per_device` fine-tunes: none
    lost, none sent twice."""
    parts = [p for s in statuses for p in s.parts.values()]
    assert all(p.state == PartState.queued and p.dispatch for p in parts), "a part was not dispatched"
    with store._redis.pipeline(transaction=False) as p:
        for info in infos:
            p.llen(device_queue(info.device_id))
        lengths = p.execute()
    wrong = [(i.device_id, n) for i, n in zip(infos, lengths) if n != per_device]
    assert not wrong, f"{len(wrong)} device queues hold other than {per_device} fine-tunes, e.g. {wrong[0]}"


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


def cpu_s(process: subprocess.Popen | None) -> float:
    """CPU time (user + system, s) a process and its children have used so far."""
    assert process is not None
    parent = psutil.Process(process.pid)
    return sum(sum(p.cpu_times()[:2]) for p in [parent, *parent.children(recursive=True)])


def redis_work(store: Store) -> tuple[int, float]:
    """Commands Redis has run and the CPU time it has used (s), since it started."""
    stats, cpu = store._redis.info("commandstats"), store._redis.info("cpu")
    return sum(int(v["calls"]) for v in stats.values()), float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run(devices: int, rate: float, control_concurrency: int) -> dict:
    """One fleet of `devices`: paced jobs at `rate` per second, then one job over every device."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), server_workers=0, control_concurrency=control_concurrency) as cluster,
    ):
        store, client = cluster.store(), EdgeTrainClient(cluster.url)
        infos = fleet_infos(devices)
        empty = used_memory(store)
        heartbeats = Heartbeats(store, infos)
        heartbeats.beat()
        heartbeats.start()
        fleet_bytes = used_memory(store) - empty
        put_resources(store, infos)

        idle_before, idle_sent, idle_started = redis_work(store), heartbeats.sent, time.perf_counter()
        time.sleep(HEARTBEAT_S + 0.5)  # a whole heartbeat period: what the fleet alone costs Redis
        idle_after, idle_s = redis_work(store), time.perf_counter() - idle_started
        per_heartbeat = (idle_after[0] - idle_before[0]) / max(1, heartbeats.sent - idle_sent)  # commands (and the idle control worker's)
        control = cluster.worker("control").process
        before_jobs, work_before, control_before, paced_sent = used_memory(store), redis_work(store), cpu_s(control), heartbeats.sent
        started = time.perf_counter()
        paced = []
        for k, info in enumerate(infos):
            time.sleep(max(0.0, started + k / rate - time.perf_counter()))
            paced.append(client.submit(job_spec([info])))
        wait_dispatched(store, paced, len(infos))
        paced_s = time.perf_counter() - started
        work_after, control_after, heartbeats_paced = redis_work(store), cpu_s(control), heartbeats.sent - paced_sent
        statuses = [store.jobs.status(j) for j in paced]
        paced_latency = [x for s in statuses for x in dispatch_latencies_s(s)]
        per_job_bytes = (used_memory(store) - before_jobs) / len(paced)

        started = time.perf_counter()
        burst = client.submit(job_spec(infos))
        wait_dispatched(store, [burst], 2 * len(infos))  # the paced jobs' fine-tunes and the burst's
        burst_s = time.perf_counter() - started
        burst_status = store.jobs.status(burst)
        burst_latency = dispatch_latencies_s(burst_status)
        check_every_part(store, [*statuses, burst_status], infos, per_device=2)

        status_ms = timed_ms(lambda: client.status(burst))
        fleet_ms = timed_ms(client.fleet, repeat=10)
        heartbeats.stopped.set()
        heartbeats.join()  # no beat left running when the cluster and its Redis stop
    return {
        "devices": devices, "control_processes": control_concurrency, "rate_per_s": rate,
        "paced_all_dispatched_s": paced_s, "paced_throughput_per_s": devices / paced_s,
        "paced_latency_ms": {"median": statistics.median(paced_latency) * 1e3, "p99": percentile(paced_latency, 99) * 1e3},
        "burst_all_dispatched_s": burst_s, "burst_throughput_per_s": devices / burst_s,
        "burst_latency_ms": {"median": statistics.median(burst_latency) * 1e3, "p99": percentile(burst_latency, 99) * 1e3},
        "status_ms": {"median": status_ms[0], "p99": status_ms[1]}, "fleet_ms": {"median": fleet_ms[0], "p99": fleet_ms[1]},
        "redis_bytes_per_device": fleet_bytes / devices, "redis_bytes_per_job": per_job_bytes,
        "redis_cpu_idle": (idle_after[1] - idle_before[1]) / idle_s, "redis_cpu_paced": (work_after[1] - work_before[1]) / paced_s,
        "redis_commands_per_job": ((work_after[0] - work_before[0]) - per_heartbeat * heartbeats_paced) / devices,
        "control_cpu_ms_per_job": (control_after - control_before) / devices * 1e3,
    }  # fmt: skip


def scrape_run(devices: int, repeat: int = 20) -> dict:
    """One job over `devices` registered devices, every fine-tune dispatched (the parts moved
    there through the store, as the control worker would; no worker runs), scraped over HTTP from
    an `edgetrain exporter` process: (median, p99) of a scrape (ms), its CPU per scrape (ms) and
    the body's size (bytes)."""
    from edgetrain.common.control_axis import ControlAxis
    from edgetrain.common.jobs.events import Dispatched, Identified
    from edgetrain.common.payloads import finetune_request
    from edgetrain.common.schemas import Selection
    from edgetrain.common.testing.prometheus import Exporter
    from edgetrain.workers.processes.cluster import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp))
        exporter = None
        try:
            store, infos = Store.connect(server.url), fleet_infos(devices)
            for info in infos:
                store.fleet.register(info, 3600, f"bench:{info.device_id}")
            spec = JobSpec.model_validate(job_spec(infos))
            store.jobs.create("scraped", spec)
            identity = Identified(device_type=infos[0].device_type, simulated=True, control=ControlAxis.GPU_CLOCK_HZ)
            choice = Selection(batch_size=32, frequency_hz=infos[0].frequencies_hz[-1], estimated_time_s=1.0, peak_power_w=None)
            for target in spec.devices:
                request = finetune_request("scraped", spec, target, choice, "table", "vector")
                store.jobs.apply("scraped", target.device_id, Dispatched(device=identity, token=target.device_id, request=request,
                                                                         selection=choice, estimated_time_to_accuracy_s=1.0))  # fmt: skip
            exporter = Exporter(Path(tmp) / "exporter", server.url).start()
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            body = urllib.request.urlopen(url, timeout=60).read()  # the first scrape warms its imports
            cpu_before = cpu_s(exporter.process)
            median, p99 = timed_ms(lambda: urllib.request.urlopen(url, timeout=60).read(), repeat=repeat)
            cpu_ms = (cpu_s(exporter.process) - cpu_before) * 1e3 / repeat
        finally:
            if exporter is not None:
                exporter.stop()
            server.stop()
    return {"devices": devices, "scrape_ms": {"median": median, "p99": p99}, "exporter_cpu_ms": cpu_ms, "bytes": len(body)}


def step_run(jobs: int, warm_up: int = 24) -> dict:
    """`jobs` single-device jobs submitted in groups of PLAN_EARLY_AT, each group taken up by
    calling `plan_submitted` in this process (configured as a control worker's pool process is,
    with no planning window), on a Redis of its own: the step's CPU (ms) and round trips to
    Redis per job, the first `warm_up` jobs left out."""
    import redis.connection

    from edgetrain.common.store.jobs import PLAN_EARLY_AT
    from edgetrain.tasks import context
    from edgetrain.tasks.workflow import plan_submitted
    from edgetrain.workers.processes.cluster import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp))
        send = redis.connection.AbstractConnection.send_packed_command
        sent, cpu_s_used, measured_jobs = [0], 0.0, 0

        def counted(connection, *args, **kwargs):
            sent[0] += 1
            return send(connection, *args, **kwargs)

        try:
            store, infos = context.init(Settings(redis_url=server.url, plan_window_s=0)), fleet_infos(warm_up + jobs)
            for info in infos:
                store.fleet.register(info, 3600, f"bench:{info.device_id}")
            put_resources(store, infos)
            client = EdgeTrainClient(server.url)
            for first in range(0, len(infos), PLAN_EARLY_AT):
                group = [client.submit(job_spec([info])) for info in infos[first : first + PLAN_EARLY_AT]]
                measured = first >= warm_up
                if measured:
                    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
                started = time.process_time()
                plan_submitted(group[0])
                if measured:
                    cpu_s_used, measured_jobs = cpu_s_used + time.process_time() - started, measured_jobs + len(group)
                redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
            dispatched = store._redis.zcard(store.keys.dispatched())
        finally:
            redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
            server.stop()
    assert dispatched == len(infos), f"{dispatched} of {len(infos)} fine-tunes dispatched"
    return {"jobs": measured_jobs, "per_step": PLAN_EARLY_AT, "cpu_ms_per_job": cpu_s_used / measured_jobs * 1e3,
            "round_trips_per_job": sent[0] / measured_jobs}  # fmt: skip


def put_resources(store: Store, infos: list[DeviceInfo]) -> None:
    """A table for each device type and the job's relation vector, as profiling and the proxy would store them."""
    rng = random.Random(0)
    for info in {i.device_type: i for i in infos}.values():
        store.resources.put_table(synthetic_table(info, rng))
    request = JobSpec.model_validate(job_spec([infos[0]])).estimation_request()
    ratios = [0.3, 0.4, 0.5, 0.7, 0.85, 1.0]
    store.resources.put_vector(RelationVector(batch_sizes=PAPER_BATCH_SIZES, ratios=ratios, key=vector_key(request)))
    assert all(store.resources.table(table_id(t, "smallcnn", SHAPE)) for t in {i.device_type for i in infos})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 10000], help="fleet sizes (devices)")
    parser.add_argument("--rates", type=float, nargs="+", default=[25.0, 100.0, 250.0], help="paced jobs/s, one per size")
    parser.add_argument("--control-concurrency", type=int, default=2)
    parser.add_argument("--scrape-devices", type=int, default=10000, help="devices of the one job the exporter scrapes; 0: no scrape")
    parser.add_argument("--step-jobs", type=int, default=400, help="jobs of the in-process planning step; 0: none")
    parser.add_argument("--json")
    args = parser.parse_args()
    if len(args.rates) != len(args.sizes):
        parser.error("give one --rates value per --sizes value")
    print(
        f"simulated devices ({', '.join(TWINS)}), one real Redis per size, a control worker of "
        f"{args.control_concurrency} processes; every part checked: dispatched once, nothing lost"
    )
    print(
        "| devices | paced jobs: rate, p99 latency | one job over every device: all dispatched | "
        "status() of that job (summary), median / p99 | fleet(), median | Redis per device, per job |"
    )
    print("|---|---|---|---|---|---|")
    results = []
    for devices, rate in zip(args.sizes, args.rates):
        r = run(devices, rate, args.control_concurrency)
        results.append(r)
        print(f"| {devices} (rate {rate:g}/s) | {r['paced_throughput_per_s']:.0f}/s, p99 {r['paced_latency_ms']['p99']:.0f} ms "
              f"| {r['burst_all_dispatched_s']:.2f} s ({r['burst_throughput_per_s']:.0f}/s), latency p99 "
              f"{r['burst_latency_ms']['p99'] / 1e3:.2f} s | {r['status_ms']['median']:.1f} / {r['status_ms']['p99']:.1f} ms "
              f"| {r['fleet_ms']['median']:.1f} ms | {r['redis_bytes_per_device']:.0f} B, {r['redis_bytes_per_job']:.0f} B |",
              flush=True)  # fmt: skip
    step = step_run(args.step_jobs) if args.step_jobs else None
    for r in results:
        split = (
            f"; the planning step alone {step['cpu_ms_per_job']:.2f} ms in {step['round_trips_per_job']:.1f} round trips to Redis "
            f"(plan_submitted of {step['per_step']} jobs in this process), the rest "
            f"{r['control_cpu_ms_per_job'] - step['cpu_ms_per_job']:.2f} ms Celery's handling of the messages"
            if step
            else ""
        )
        print(
            f"{r['devices']} devices: each paced job cost the control worker {r['control_cpu_ms_per_job']:.2f} ms of CPU and Redis "
            f"{r['redis_commands_per_job']:.0f} commands (the fleet's heartbeats taken out); Redis's CPU "
            f"{100 * r['redis_cpu_idle']:.0f} % of a core with heartbeats alone, {100 * r['redis_cpu_paced']:.0f} % while paced{split}"
        )
    scraped = scrape_run(args.scrape_devices) if args.scrape_devices else None
    if scraped:
        print(
            f"one job over {scraped['devices']} devices, every fine-tune dispatched: a scrape of the exporter takes "
            f"{scraped['scrape_ms']['median']:.0f} ms (median), {scraped['scrape_ms']['p99']:.0f} ms (p99) over HTTP, "
            f"{scraped['exporter_cpu_ms']:.0f} ms of the exporter's CPU, {scraped['bytes'] / 1e6:.1f} MB"
        )
    for small, big in zip(results, results[1:]):
        ideal = big["devices"] / small["devices"]
        grew = big["burst_all_dispatched_s"] / small["burst_all_dispatched_s"]
        status = big["status_ms"]["median"] / small["status_ms"]["median"]
        print(
            f"{small['devices']} -> {big['devices']} devices (x{ideal:g}, linear): dispatch time x{grew:.1f}, status median x{status:.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": results, "step": step, "scrape": scraped}, indent=2))


if __name__ == "__main__":
    main()
