"""`edgetrain demo`: a whole job on a local cluster of simulated Jetsons."""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from edgetrain.common.presets import QUICK_JOB
from edgetrain.tasks.client import EdgeTrainClient

from ..cli_args import job_exit_code
from ..processes.cluster import LocalCluster
from ..rendering.output import format_report, note
from ..rendering.progress import JobProgress, activity

DEMO_DEVICES = {"nano-1": "sim:jetson-nano", "tx2nx-1": "sim:jetson-tx2-nx"}


def run_demo(as_json: bool, report_path: Path | None = None) -> int:
    """Run the quick job on a local cluster of two simulated Jetsons; print the report and
    save it to `report_path` (default: edgetrain-demo-<job id>.json in the current folder, so
    demos run side by side keep their own). It always starts its own embedded Redis and never
    uses EDGETRAIN_REDIS_URL: its workers would consume a real fleet's queues and its
    simulated devices would join that fleet."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgetrain-demo-") as tmp, ExitStack() as stack:
        with activity("starting an embedded Redis and 4 worker processes (control, server, two simulated Jetsons)"):
            cluster = stack.enter_context(LocalCluster(Path(tmp), devices=dict(DEMO_DEVICES)))
        client = EdgeTrainClient(cluster.url, password_file=False)
        job_id = client.submit(QUICK_JOB)
        note(f"submitted job {job_id}")
        progress = JobProgress()
        try:
            client.wait(job_id, timeout_s=600, on_update=progress)
        finally:
            progress.close()
        report = client.report(job_id)
        with activity("stopping the workers and Redis"):
            stack.close()
    wall_s = time.perf_counter() - started
    document = report.model_dump(mode="json") | {"wall_s": wall_s}
    report_path = report_path or Path(f"edgetrain-demo-{job_id}.json")
    report_path.write_text(json.dumps(document, indent=2))
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        print(format_report(report))
        print(f"\nwall time of the whole demo {wall_s:.0f} s (the device times above are the twins' clocks); "
              f"full report: {report_path}")  # fmt: skip
    return job_exit_code(report)
