"""`edgetrain demo`: a whole job on a local cluster of simulated Jetsons."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from edgetrain.common.jobs import JobState
from edgetrain.common.presets import QUICK_JOB
from edgetrain.common.settings import get_settings
from edgetrain.tasks.client import EdgeTrainClient

from .cluster import LocalCluster
from .output import ProgressPrinter, format_report, note

DEMO_DEVICES = {"nano-1": "sim:jetson-nano", "tx2nx-1": "sim:jetson-tx2-nx"}


def run_demo(as_json: bool, report_path: Path) -> int:
    """Run the quick job on a local cluster of two simulated Jetsons; print and save the report."""
    url = get_settings().redis_url if "EDGETRAIN_REDIS_URL" in os.environ else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgetrain-demo-") as tmp:
        note(f"starting Redis ({'configured' if url else 'embedded'}) and 4 worker processes ...")
        with LocalCluster(Path(tmp), devices=dict(DEMO_DEVICES), redis_url=url) as cluster:
            client = EdgeTrainClient(cluster.url)
            job_id = client.submit(QUICK_JOB)
            note(f"submitted job {job_id}")
            client.wait(job_id, timeout_s=600, on_update=ProgressPrinter())
            report = client.report(job_id)
    wall_s = time.perf_counter() - started
    document = report.model_dump(mode="json") | {"wall_s": wall_s}
    report_path.write_text(json.dumps(document, indent=2))
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        print(format_report(report))
        print(f"\nfull report: {report_path}  (wall time {wall_s:.0f} s)")
    return 0 if report.state == JobState.completed else 1
