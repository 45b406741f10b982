"""Makespan of one relation-vector estimation with 1, 2, ... server worker processes, each
on its own fresh cluster (real Redis, real Celery workers), as efficiency against ideal.

    python bench/estimation_scaling.py [--workers 1 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.processes.cluster import LocalCluster

REQUEST = {
    "model": "smallcnn",
    "weights": "init:0",
    "proxy_dataset": {"name": "digits"},
    "target_accuracy": 0.85,
    "batch_sizes": [4, 8, 16, 32, 64, 128],
    "seeds": [0, 1, 2],
    "lr": {},
    "eval_every_samples": 128,
    "max_samples": 40000,
}


def makespan(workers: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), server_workers=workers) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        started = time.perf_counter()
        vector = client.estimate(REQUEST, timeout_s=1800)
        elapsed = time.perf_counter() - started
        busy = {}
        for part in cluster.store().vector_parts(vector.key):
            busy[part.worker] = busy.get(part.worker, 0.0) + part.wall_s
    return elapsed, busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json")
    args = parser.parse_args()
    tasks = len(REQUEST["batch_sizes"]) * len(REQUEST["seeds"])
    results = []
    for n in args.workers:
        elapsed, busy = makespan(n)
        results.append({"workers": n, "makespan_s": elapsed, "busy_s_per_worker": sorted(busy.values())})
    base = results[0]["makespan_s"] * results[0]["workers"]
    for r in results:
        r["speedup"] = results[0]["makespan_s"] / r["makespan_s"]
        r["efficiency"] = base / (r["makespan_s"] * r["workers"])
        print(f"{r['workers']} server worker(s): makespan {r['makespan_s']:.1f} s for {tasks} proxy runs, "
              f"speed-up {r['speedup']:.2f}x, efficiency {r['efficiency']:.2f} "
              f"(busy per worker: {', '.join(f'{b:.1f}' for b in r['busy_s_per_worker'])} s)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
