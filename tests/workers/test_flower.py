"""Real Flower against a local cluster: it sees the workers, the queues and the tasks, each
labelled with its job, and a running fine-tune's progress; the same job through the CLI."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from edgetrain.common.jobs.state import EventKind
from edgetrain.common.keys import vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.processes.cluster import LocalCluster

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


def test_flower_shows_workers_queues_tasks_by_job_and_progress(tmp) -> None:
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
            proxy_run = "edgetrain.train_proxy[b=64 seed=0]"  # asked for by a command: no job
            tasks = get_json(f"{base}/tasks", until=lambda d: any(t["name"] == proxy_run for t in d.values()))
            done = [t for t in tasks.values() if t["name"] == proxy_run]
            assert done[0]["state"] == "SUCCESS" and done[0]["worker"].startswith("server-0@")

            # a job through the CLI: stderr a pipe, so progress comes as lines
            long_run = {"device_id": "nano-f", "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}
            spec = quick_job([long_run], batch_sizes=[16, 64], target_accuracy=0.9, max_samples=12000)  # the target is out of reach
            (tmp / "job.json").write_text(json.dumps(spec))
            submit = subprocess.Popen([*cmd[:-3], "submit", str(tmp / "job.json"), "--timeout", "280"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            job_id = submit.stdout.readline().strip()
            running = get_json(
                f"{base}/tasks",
                timeout_s=240,
                until=lambda d: any(
                    t["name"].startswith(f"edgetrain.finetune[{job_id}/nano-f planned b=") and t["state"] == "PROGRESS" for t in d.values()
                ),
            )
            fine_tune = next(i for i, t in running.items() if t["name"].startswith(f"edgetrain.finetune[{job_id}/nano-f planned b="))
            info = get_json(f"{base}/task/info/{fine_tune}")  # what the task's page shows
            assert info["state"] == "PROGRESS" and re.search(r"samples \d+/12000  accuracy 0\.\d+ \(target 0\.9\)", info["result"]), info
            names = {t["name"] for t in running.values()}
            assert {
                f"edgetrain.profile_device[{job_id}/nano-f smallcnn]",
                f"edgetrain.estimate_relation_vector[{job_id} smallcnn]",
                f"edgetrain.train_proxy[{job_id} b=16 seed=0]",
                f"edgetrain.train_proxy[{job_id} b=64 seed=0]",
            } <= names, names
            device = next(name for name in workers if name.startswith("device-nano-f@"))
            status = get_json(f"{base}/workers?status=1&refresh=1")  # asked while the device trains
            assert status[device] is True, status  # a busy device worker still answers: it stays online
            out, err = submit.communicate(timeout=300)
            assert submit.returncode == ExitCode.failed, (out, err)  # it ran, and did not reach the target
            assert "(target 0.9 not reached) after 12" in out, out
            lines = err.splitlines()  # one event, one line
            assert all(line.startswith(("note: ", "[", "edgetrain: ")) for line in lines), err
            assert any("proxy runs" in line and "nano-f: " in line for line in lines), err  # the estimation, as it went
            assert any("nano-f: completed, target not reached" in line for line in lines), err
            client = EdgeTrainClient(cluster.redis_url)
            completed = [e.message for e in client.status(job_id).events if e.kind == EventKind.completed]
            assert len(completed) == 1 and re.search(r"target 0\.9 not reached in 120\d\d samples$", completed[0]), completed
            profiled = client.profiling_progress("jetson-nano", "smallcnn")
            assert profiled.done and profiled.device_id == "nano-f" and profiled.points_measured > 0
            key = vector_key(JobSpec.model_validate(spec).estimation_request())
            assert sorted(r.batch_size for r in client.store.progress.proxy_runs(key)) == [16, 64]  # reported while they ran

            # a part that fails before any task of it runs: Flower has only the step that took the job up, its result the job's state
            infeasible = client.submit(quick_job([{**long_run, "power_cap_w": 0.5}], batch_sizes=[16, 64], target_accuracy=0.9,
                                                 max_samples=12000))  # fmt: skip
            assert client.wait(infeasible, timeout_s=60).state.value == "failed"
            get_json(
                f"{base}/tasks",
                until=lambda d: any(
                    t["name"] == f"edgetrain.plan_submitted[{infeasible}]" and t["result"] == f"'took up 1 job(s): {infeasible} failed'"
                    for t in d.values()
                ),
            )
        finally:
            flower.terminate()
            flower.wait(timeout=30)
