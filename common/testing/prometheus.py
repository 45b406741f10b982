"""A real Prometheus server (Debian: `apt-get install prometheus`) scraping an `edgetrain
exporter` process, both on loopback ports, and queries through Prometheus's HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .redis_server import free_port

START_TIMEOUT_S = 60.0


def prometheus_binary() -> str | None:
    """The prometheus server binary, None when it is not installed."""
    return shutil.which("prometheus")


def _wait_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the process logging to {log} exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not answering after {timeout_s} s; see {log}") from None
            time.sleep(0.2)


@dataclass
class Exporter:
    """`edgetrain exporter` for the Redis at `redis_url`, in its own process."""

    folder: Path
    redis_url: str
    port: int = 0
    process: subprocess.Popen | None = None

    def start(self) -> Exporter:
        """Start it and wait until /metrics answers."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = self.folder / "exporter.log"
        env = {**os.environ, "EDGETRAIN_REDIS_URL": self.redis_url}
        with open(log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "edgetrain.workers.cli", "exporter", "--port", str(self.port)],
                                            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        _wait_http(f"http://127.0.0.1:{self.port}/metrics", self.process, log)
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@dataclass
class Prometheus:
    """A Prometheus server scraping `targets` (HOST:PORT) every `interval_s` seconds and
    evaluating the rule files `rules` (e.g. deploy/prometheus/alerts.yml), its data in `folder`."""

    folder: Path
    targets: list[str]
    rules: list[Path] = field(default_factory=list)
    interval_s: float = 1.0
    port: int = 0
    process: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        """Start it and wait until it is ready."""
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError("prometheus not found: install it (Debian: apt-get install prometheus)")
        self.folder.mkdir(parents=True, exist_ok=True)
        interval = f"{self.interval_s:g}s"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(r) for r in self.rules],
            "scrape_configs": [{"job_name": "edgetrain", "static_configs": [{"targets": self.targets}]}],
        }
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        log = self.folder / "prometheus.log"
        argv = [binary, f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]  # fmt: skip
        with open(log, "ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(f"http://127.0.0.1:{self.port}/-/ready", self.process, log)
        return self

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/`path` with `params`; the `data` of a successful answer, RuntimeError otherwise."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {body.get('errorType')}: {body.get('error')} for {params}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """The range of `expr`: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        return self.api("query_range", query=expr, start=start, end=end, step=step_s)["result"]

    def stop(self) -> None:
        """Stop it (SIGTERM) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
