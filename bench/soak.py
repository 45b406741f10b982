"""Memory of long-running workers: `--jobs` small jobs, one after the other, through one device
worker (real Redis, real control, server and device worker processes), with the resident
memory (RSS, MB) of each worker's processes after every job. Target: the device worker's pool
child grows at most 50 MB in all after the first 20 jobs; the control and server workers stay
flat.

Each job is the quick job (smallcnn from `init:0` on the MNIST subset, SIMULATED Jetson Nano
twin at 3 W) on one device; the first one also profiles the device and estimates the relation
vector, the later ones only fine-tune (the closed loop reads what the earlier ones measured).
The workers run with this environment: EDGETRAIN_WORKER_MAX_MEMORY_MB, if set, replaces a pool
process after a task that left it above the limit (the summary says which limit was in force).

    python bench/soak.py [--jobs 500] [--warm-up 20] [--target-accuracy 0.85] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from edgetrain.common.jobs.state import PartState
from edgetrain.common.presets import quick_job
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.processes.cluster import LocalCluster, WorkerProcess

DEVICE_ID = "soak-1"
BACKEND = "sim:jetson-nano"
ROLES = {"device": f"device-{DEVICE_ID}", "control": "control", "server": "server-0"}


def rss_mb(pid: int) -> float | None:
    """The resident memory of process `pid` (MB), from /proc; None once it exited."""
    with contextlib.suppress(FileNotFoundError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def children(pid: int) -> list[int]:
    """The child processes of `pid` (a prefork worker's pool), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return sorted(found)


def sample(worker: WorkerProcess) -> dict:
    """RSS of a worker's main process and of its live pool children (MB), with the children's
    ids; a pool process replaced after its task (EDGETRAIN_WORKER_MAX_MEMORY_MB) is waited for."""
    assert worker.process is not None
    main = worker.process.pid

    def live() -> list[tuple[int, float]] | None:
        return [(p, mb) for p in children(main) if (mb := rss_mb(p)) is not None] or None

    pool = poll_until(live, 60, 0.1, f"a pool process of {worker.name}")
    return {"main_mb": rss_mb(main), "pool_mb": [mb for _, mb in pool], "pool_pids": [p for p, _ in pool]}


def total_mb(row: dict, role: str, parts: tuple[str, ...] = ("main_mb", "pool_mb")) -> float:
    """The RSS (MB) of `parts` of the `role` worker after one job: its main process, its pool or both."""
    return sum(sum(v) if isinstance(v := row[role][part], list) else v for part in parts)


def soak(jobs: int, target_accuracy: float, workdir: Path) -> list[dict]:
    """Run `jobs` jobs one after the other; per job: its wall time and every worker's RSS."""
    rows = []
    spec = quick_job([{"device_id": DEVICE_ID, "power_cap_w": 3.0}], target_accuracy=target_accuracy)
    with LocalCluster(workdir, devices={DEVICE_ID: BACKEND}) as cluster:
        client = EdgeTrainClient(cluster.url)
        for n in range(1, jobs + 1):
            started = time.perf_counter()
            job_id = client.submit(spec)
            status = client.wait(job_id, timeout_s=600, poll_s=0.2)
            part = status.parts[DEVICE_ID]
            if part.state != PartState.completed:
                raise RuntimeError(f"job {n} ({job_id}) ended {part.state.value}: {part.model_dump_json()}")
            row = {"job": n, "job_id": job_id, "wall_s": time.perf_counter() - started}
            row |= {role: sample(cluster.worker(name)) for role, name in ROLES.items()}
            rows.append(row)
            device = row["device"]
            print(f"job {n:4d} {row['wall_s']:5.1f} s  device pool {'+'.join(f'{m:.0f}' for m in device['pool_mb'])} MB "
                  f"(pid {','.join(map(str, device['pool_pids']))}), main {device['main_mb']:.0f} MB; "
                  f"control {row['control']['main_mb']:.0f}+{sum(row['control']['pool_mb']):.0f} MB; "
                  f"server {row['server']['main_mb']:.0f}+{sum(row['server']['pool_mb']):.0f} MB", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--warm-up", type=int, default=20, help="jobs before growth is counted")
    parser.add_argument("--target-accuracy", type=float, default=0.85)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not 1 <= args.warm_up < args.jobs:
        parser.error(f"--warm-up must be at least 1 and below --jobs ({args.jobs}), not {args.warm_up}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = soak(args.jobs, args.target_accuracy, Path(tmp))
    pool = [total_mb(row, "device", ("pool_mb",)) for row in rows]
    warm = args.warm_up - 1  # the row of the last job before growth is counted

    def grown(role: str, parts: tuple[str, ...] = ("main_mb", "pool_mb")) -> float:
        return total_mb(rows[-1], role, parts) - total_mb(rows[warm], role, parts)

    summary = {
        "jobs": args.jobs, "warm_up": args.warm_up, "wall_s": time.perf_counter() - started,
        "worker_max_memory_mb": int(os.environ.get("EDGETRAIN_WORKER_MAX_MEMORY_MB") or 0),  # 0: pool processes never replaced
        "device_pool_first_job_mb": pool[0], "device_pool_warm_mb": pool[warm], "device_pool_last_mb": pool[-1],
        "device_pool_max_mb": max(pool[warm:]), "device_pool_growth_mb": grown("device", ("pool_mb",)),
        "device_pool_mb_per_job": grown("device", ("pool_mb",)) / (args.jobs - args.warm_up),
        "device_pool_processes": len({p for r in rows for p in r["device"]["pool_pids"]}),
        "device_main_growth_mb": grown("device", ("main_mb",)), "control_growth_mb": grown("control"), "server_growth_mb": grown("server"),
    }  # fmt: skip
    print(json.dumps(summary, indent=2))
    cells = [
        f"{args.jobs}", f"{pool[0]:.0f} / {pool[warm]:.0f} / {pool[-1]:.0f} MB (max {summary['device_pool_max_mb']:.0f})",
        f"{summary['device_pool_growth_mb']:+.0f} MB ({summary['device_pool_mb_per_job']:+.2f} MB/job)",
        *(f"{summary[k]:+.0f} MB" for k in ("device_main_growth_mb", "control_growth_mb", "server_growth_mb")),
        f"{summary['wall_s'] / 60:.0f} min",
    ]  # fmt: skip
    print("| " + " | ".join(cells) + " |")  # a row of the README's table
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "jobs": rows}, indent=2))


if __name__ == "__main__":
    main()
