"""The fleet dashboard from a real run: a real Prometheus scrapes `edgetrain exporter` every
second while the demo's twin fleet (real Redis, real worker processes) runs two jobs: the quick
job on both twins (it reaches its target: estimated against achieved time to accuracy), then a
long fine-tune on both whose Nano cap is lowered while it runs. The panels of
deploy/grafana/edgetrain-dashboard.json are then drawn with matplotlib from Prometheus's
query_range API (Grafana does not run here), and the figures each panel ends on are printed.
Device time, power and energy are SIMULATED (the twins'); accuracy is real.

    python bench/monitoring_dashboard.py [--png docs/monitoring-dashboard.png]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from edgetrain.common.presets import quick_job  # noqa: E402
from edgetrain.common.testing.prometheus import Exporter, Prometheus  # noqa: E402
from edgetrain.tasks.client import EdgeTrainClient, poll_until  # noqa: E402
from edgetrain.workers.commands.demo import DEMO_DEVICES  # noqa: E402
from edgetrain.workers.processes.cluster import LocalCluster  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = {"watt": "W", "hertz": "Hz", "percentunit": "accuracy / target", "s": "s (device time)", "bytes": "bytes"}
LONG = {"dataset": {"name": "fashion_mnist", "fraction": 0.1}}  # the proxy reaches 90 %, this data does not: the whole budget runs
CAP_CHANGE = ("nano-1", 2.6)  # W, set once the long fine-tune on the Nano has reported progress


def legend(template: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        template = template.replace("{{" + key + "}}", value)
    return template


def draw(prometheus: Prometheus, start: float, end: float, png: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "edgetrain-dashboard.json").read_text())
    panels = dashboard["panels"]
    fig, axes = plt.subplots((len(panels) + 1) // 2, 2, figsize=(14, 3.2 * ((len(panels) + 1) // 2)))
    for ax, panel in zip(axes.flat, panels):
        ax.set_title(panel["title"], fontsize=10)
        bars: list[tuple[str, float]] = []
        for target in panel["targets"]:
            for series in prometheus.query_range(target["expr"], start, end, 1.0):
                name = legend(target["legendFormat"], series["metric"])
                t = [float(x) - start for x, _ in series["values"]]
                v = [float(y) for _, y in series["values"]]
                if panel["type"] in ("bargauge", "table"):  # the value now, one bar per series
                    bars.append((name, v[-1]))
                else:
                    ax.plot(t, v, label=name, linestyle="--" if " cap" in name else "-")
                print(f"{panel['title']:42s} {name:55s} last {v[-1]:.6g}")
        if bars:
            ax.barh([n for n, _ in bars], [v for _, v in bars])
            ax.tick_params(axis="y", labelsize=7)
        else:
            ax.set_xlabel("s since the first job was submitted", fontsize=8)
            if ax.lines:
                ax.legend(fontsize=7)
        unit = UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), "")
        if bars:
            ax.set_xlabel(unit, fontsize=8)
        else:
            ax.set_ylabel(unit, fontsize=8)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle("edgetrain fleet (SIMULATED twins: device time, power and energy are the twins'; accuracy is real)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, default=Path("docs/monitoring-dashboard.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgetrain-dashboard-") as tmp:
        folder = Path(tmp)
        with LocalCluster(folder / "cluster", devices=dict(DEMO_DEVICES)) as cluster:
            exporter = Exporter(folder / "exporter", cluster.url).start()
            prometheus = Prometheus(folder / "prometheus", [f"127.0.0.1:{exporter.port}"], rules=[DEPLOY / "prometheus" / "alerts.yml"])
            try:
                prometheus.start()
                client = EdgeTrainClient(cluster.url)
                start = time.time()
                quick = client.submit(quick_job())
                long_job = client.submit(quick_job([
                    {"device_id": "nano-1", "power_cap_w": 3.0, **LONG}, {"device_id": "tx2nx-1", "power_cap_w": 5.0, **LONG},
                ], target_accuracy=0.9, max_samples=12000))  # fmt: skip
                client.wait(quick, timeout_s=600)
                poll_until(lambda: client.status(long_job).progress.get(CAP_CHANGE[0]), 600, 0.5, "the long fine-tune on the Nano")
                time.sleep(10)
                client.set_power_cap(*CAP_CHANGE)
                print(f"{time.time() - start:.0f} s: cap of {CAP_CHANGE[0]} set to {CAP_CHANGE[1]} W")
                client.wait(long_job, timeout_s=900)
                time.sleep(5)  # a last scrape of the finished jobs
                draw(prometheus, start, time.time(), args.png)
                firing = [f"{a['metric']['alertname']}({a['metric'].get('device', a['metric'].get('role', ''))})"
                          for a in prometheus.query('ALERTS{alertstate="firing"}')]  # fmt: skip
                print(f"alerts firing at the end: {', '.join(firing) or 'none'}")
                for job in (quick, long_job):
                    for device_id, part in client.status(job).parts.items():
                        guard = part.report.guard if part.report else None
                        print(f"job {job} {device_id}: guard step-downs {guard.step_downs if guard else '-'}, "
                              f"over the cap {guard.over_cap_s if guard else 0:.4f} device s")  # fmt: skip
            finally:
                prometheus.stop()
                exporter.stop()


if __name__ == "__main__":
    main()
