"""`edgetrain demo`: a whole job on a local cluster of simulated Jetsons."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgetrain.common.schemas import JobStatus
from edgetrain.common.settings import get_settings
from edgetrain.tasks.client import EdgeTrainClient

from .cluster import LocalCluster

DEMO_DEVICES = {"nano-1": "sim:jetson-nano", "tx2nx-1": "sim:jetson-tx2-nx"}
DEMO_JOB: dict[str, Any] = {
    "model": "smallcnn",
    "weights": "init:0",
    "dataset": {"name": "mnist5k"},
    "proxy_dataset": {"name": "digits"},
    "target_accuracy": 0.85,
    "devices": [
        {"device_id": "nano-1", "power_cap_w": 3.0},
        {"device_id": "tx2nx-1", "power_cap_w": 5.0},
    ],
    "batch_sizes": [4, 8, 16, 32, 64, 128],
    "seeds": [0],
    "eval_every_samples": 256,
    "max_samples": 40000,
}


class ProgressPrinter:
    """Prints a line to stderr whenever a device's state or accuracy changes."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, status: JobStatus) -> None:
        for device_id, part in status.parts.items():
            progress = status.progress.get(device_id, {})
            line = part.state.value
            if progress and part.state.value in ("finetuning", "completed"):
                line += f"  samples {int(progress['samples'])}  accuracy {progress['accuracy']:.3f}"
            if self.seen.get(device_id) != line:
                self.seen[device_id] = line
                print(f"[{time.strftime('%H:%M:%S')}] {device_id}: {line}", file=sys.stderr, flush=True)


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.3g} {unit}"


def format_report(report: dict[str, Any]) -> str:
    """Human-readable result per device; simulated figures are labelled."""
    lines = [f"job {report['job_id']}: {report['state']}"]
    for d in report["devices"]:
        label = " (SIMULATED device: time, power and energy come from its twin)" if d["simulated"] else ""
        cap = "none" if d["power_cap_w"] is None else f"{d['power_cap_w']} W"
        lines.append(f"\n{d['device_id']} [{d['device_type']}] power cap {cap}{label}")
        if d["state"] == "failed":
            lines.append(f"  failed: {d['reason']}")
            continue
        sel, base, run = d["selection"], d["baseline1"], d["achieved"]
        lines.append(
            f"  edgetrain : b={sel['batch_size']:<4} f={sel['frequency_hz'] / 1e6:7.1f} MHz  "
            f"estimated time to accuracy {_fmt(d['estimated_time_to_accuracy_s'], 's')}"
        )
        if base:
            lines.append(
                f"  baseline 1: b={base['batch_size']:<4} f={base['frequency_hz'] / 1e6:7.1f} MHz  "
                f"estimated time to accuracy {_fmt(d['baseline1_estimated_time_to_accuracy_s'], 's')}"
                + (f"  (estimated speed-up {d['estimated_speedup_vs_baseline1']:.2f}x)" if d["estimated_speedup_vs_baseline1"] else "")
            )
        if run:
            lines.append(
                f"  achieved  : accuracy {run['final_accuracy']:.3f} ({'reached' if run['reached'] else 'NOT reached'}) "
                f"after {run['samples_processed']} samples; time to accuracy {_fmt(run['device_time_s'], 's')}, "
                f"energy {_fmt(run['energy_j'], 'J')}, peak power {_fmt(run['peak_power_w'], 'W')}"
            )
    return "\n".join(lines)


def run_demo(as_json: bool, report_path: Path) -> int:
    url = get_settings().redis_url if "EDGETRAIN_REDIS_URL" in os.environ else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgetrain-demo-") as tmp:
        print(f"starting Redis ({'configured' if url else 'embedded'}) and 4 worker processes ...", file=sys.stderr, flush=True)
        with LocalCluster(Path(tmp), devices=dict(DEMO_DEVICES), redis_url=url) as cluster:
            client = EdgeTrainClient(cluster.redis_url)
            job_id = client.submit(DEMO_JOB)
            print(f"submitted job {job_id}", file=sys.stderr, flush=True)
            client.wait(job_id, timeout_s=600, on_update=ProgressPrinter())
            report = client.report(job_id)
    report["wall_s"] = time.perf_counter() - started
    report_path.write_text(json.dumps(report, indent=2))
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        print(f"\nfull report: {report_path}  (wall time {report['wall_s']:.0f} s)")
    return 0 if report["state"] == "completed" else 1
