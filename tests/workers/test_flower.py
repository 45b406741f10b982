"""Real Flower against a local cluster: it sees the workers, the queues and the tasks."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from edgetrain.common.presets import quick_job
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.cluster import LocalCluster

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout_s: float = 60.0, until=lambda data: True):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            data = json.load(urllib.request.urlopen(url, timeout=5))
            if until(data):
                return data
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(url)
        time.sleep(0.5)


def test_flower_shows_workers_queues_and_tasks(tmp) -> None:
    with LocalCluster(tmp, devices={"nano-f": "sim:jetson-nano"}) as cluster:
        port = free_port()
        env = {**os.environ, "FLOWER_UNAUTHENTICATED_API": "true"}
        cmd = [sys.executable, "-m", "edgetrain.workers.cli", "--redis-url", cluster.redis_url, "flower", "--port", str(port)]
        flower = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}/api"
            workers = get_json(f"{base}/workers?refresh=1", until=lambda d: len(d) >= 3)
            assert {name.split("@")[0] for name in workers} == {"control", "server-0", "device-nano-f"}
            queues = {q["name"] for q in get_json(f"{base}/queues/length")["active_queues"]}
            assert {"control", "server", "device.nano-f"} <= queues
            EdgeTrainClient(cluster.redis_url).estimate(
                {"model": "smallcnn", "weights": "init:0", "proxy_dataset": {"name": "digits"}, "target_accuracy": 0.5,
                 "batch_sizes": [64], "seeds": [0], "lr": {}, "eval_every_samples": 256, "max_samples": 5000},
                timeout_s=120,
            )  # fmt: skip
            proxy_run = "edgetrain.train_proxy[b=64 seed=0]"  # each task shows whom it serves
            tasks = get_json(f"{base}/tasks", until=lambda d: any(t["name"] == proxy_run for t in d.values()))
            done = [t for t in tasks.values() if t["name"] == proxy_run]
            assert done[0]["state"] == "SUCCESS" and done[0]["worker"].startswith("server-0@")
            client = EdgeTrainClient(cluster.redis_url)
            long_run = {"device_id": "nano-f", "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}
            job_id = client.submit(quick_job([long_run], batch_sizes=[16, 64], target_accuracy=0.9, max_samples=12000))
            fine_tune = f"edgetrain.finetune[{job_id}/nano-f]"
            get_json(f"{base}/tasks", timeout_s=240,
                     until=lambda d: any(t["name"] == fine_tune and t["state"] == "STARTED" for t in d.values()))  # fmt: skip
            device = next(name for name in workers if name.startswith("device-nano-f@"))
            status = get_json(f"{base}/workers?status=1&refresh=1")  # asked while the device trains
            assert status[device] is True, status  # a busy device worker still answers: it stays online
            client.wait(job_id, timeout_s=300)
        finally:
            flower.terminate()
            flower.wait(timeout=30)
