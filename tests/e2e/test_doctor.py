"""`edgetrain doctor` on deliberately broken local deployments (real Redis servers, real worker
processes), one finding per test, and on the demo's cluster, where it finds nothing."""

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.common.devices.jetson import JetsonDevice
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.store import Store
from edgetrain.common.testing.certificates import issue
from edgetrain.common.testing.fake_sysfs import build_nano
from edgetrain.common.testing.redis_processes import RedisProcess, redis_binary
from edgetrain.common.testing.redis_server import TlsRedis
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.commands.demo import DEMO_DEVICES
from edgetrain.workers.commands.redis_acl import ROLES, acl_file
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)  # Debian's faketime package


def doctor(url: str) -> tuple[int, list[dict]]:
    run = subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", "doctor", "--json"], capture_output=True, text=True,
                         env={**os.environ, "EDGETRAIN_REDIS_URL": url}, timeout=60)  # fmt: skip
    assert run.returncode in (0, 1), run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] == (run.returncode == 0)
    return run.returncode, report["findings"]


def finding(findings: list[dict], check: str) -> dict:
    found = [f for f in findings if f["check"] == check]
    assert len(found) == 1, (check, findings)
    return found[0]


def needs_redis_server() -> None:
    if redis_binary() is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server)")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A Redis as a fleet would run it (append-only file, noeviction), which tests break and mend."""
    needs_redis_server()
    server = RedisProcess(tmp_path_factory.mktemp("redis"), ["--appendonly", "yes"]).start()
    yield server
    server.stop()


def test_the_demo_cluster_passes(tmp_path) -> None:
    with LocalCluster(tmp_path, devices=dict(DEMO_DEVICES)) as cluster:
        rc, findings = doctor(cluster.url)
        assert rc == 0 and findings == [], findings
        text = subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", "doctor"], capture_output=True, text=True,
                              env={**os.environ, "EDGETRAIN_REDIS_URL": cluster.url}, timeout=60)  # fmt: skip
        assert text.returncode == 0 and text.stdout.startswith("edgetrain doctor: all well: Redis "), text.stdout
        assert "live workers: 1 control, 2 device, 1 server" in text.stdout


def doctor_with(server: RedisProcess, setting: str, broken: str) -> tuple[int, list[dict]]:
    """The doctor on `server` with `setting` broken, then mended."""
    client = server.client()
    mended = client.config_get(setting)[setting]
    client.config_set(setting, broken)
    try:
        return doctor(server.url)
    finally:
        client.config_set(setting, mended)
        poll_until(lambda: not client.info("persistence")["aof_rewrite_in_progress"] or None, 30, 0.1, "the append-only file")


def test_an_evicting_redis(redis_server) -> None:
    rc, findings = doctor_with(redis_server, "maxmemory-policy", "allkeys-lru")
    f = finding(findings, "redis maxmemory-policy")
    assert rc == 1 and "allkeys-lru" in f["problem"] and "maxmemory-policy noeviction" in f["fix"]


def test_a_redis_without_an_append_only_file(redis_server) -> None:
    rc, findings = doctor_with(redis_server, "appendonly", "no")
    assert rc == 1 and "appendonly yes" in finding(findings, "redis appendonly")["fix"]


def test_acl_users_with_the_default_user_still_on(tmp_path) -> None:
    needs_redis_server()
    (tmp_path / "users.acl").write_text("user default on nopass ~* &* +@all\nuser worker on >worker-secret ~* &* +@all -@admin +info\n")
    server = RedisProcess(tmp_path / "redis", ["--aclfile", str(tmp_path / "users.acl"), "--appendonly", "yes"]).start()
    try:
        rc, findings = doctor(f"redis://worker:worker-secret@127.0.0.1:{server.port}/0")
        assert rc == 1 and "default user is on" in finding(findings, "redis ACL")["problem"]
        server.client().acl_setuser("default", enabled=False)
        _, findings = doctor(f"redis://worker:worker-secret@127.0.0.1:{server.port}/0")
        assert not [f for f in findings if f["check"] == "redis ACL"]
    finally:
        server.stop()


def test_a_redis_off_this_host_that_lets_anyone_in(tmp_path) -> None:
    needs_redis_server()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # picks the address of the default route; sends nothing
            address = probe.getsockname()[0]
    except OSError:
        pytest.skip("this machine has no network address but loopback")
    server = RedisProcess(tmp_path / "redis", ["--protected-mode", "no", "--appendonly", "yes"], host=address).start()
    try:
        rc, findings = doctor(server.url)
        assert rc == 1 and "lets in anyone" in finding(findings, "redis ACL")["problem"]
    finally:
        server.stop()


def test_tls_that_does_not_check_the_server_certificate(tmp_path) -> None:
    needs_redis_server()
    ca = issue(tmp_path / "tls", "ca")
    passwords = {role: f"{role}-secret" for role in ROLES}
    (tmp_path / "users.acl").write_text(acl_file(passwords))
    server = TlsRedis(
        tmp_path / "redis", issue(tmp_path / "tls", "redis", ca, hosts=("127.0.0.1",)), ca.certificate, tmp_path / "users.acl"
    ).start()
    try:
        checked = server.url("worker", passwords["worker"])
        _, findings = doctor(checked)
        assert not [f for f in findings if f["check"] in ("redis TLS", "redis ACL")], findings
        rc, findings = doctor(checked.replace("ssl_cert_reqs=required", "ssl_cert_reqs=none"))
        assert rc == 1 and "ssl_cert_reqs=required" in finding(findings, "redis TLS")["fix"]
    finally:
        server.stop()


def test_roles_and_a_device_queue_without_a_live_worker(redis_server) -> None:
    store = Store.connect(redis_server.url)
    store.clear()
    device = DeviceInfo(device_id="nano-gone", device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1], memory_bytes=1,
                        simulated=True)  # fmt: skip
    store.fleet.register(device, ttl_s=0.2, instance="w")  # a worker that registered, then died
    EdgeTrainClient(redis_server.url).submit(quick_job([{"device_id": "nano-gone", "power_cap_w": 3.0}]))
    time.sleep(0.5)
    rc, findings = doctor(redis_server.url)
    subjects = {f["subject"]: f for f in findings if f["check"] == "workers"}
    assert rc == 1 and set(subjects) == {"queue 'control'", "queue 'server'", "queue 'device.nano-gone'"}, findings
    assert "--device-id nano-gone" in subjects["queue 'device.nano-gone'"]["fix"]
    store.clear()


def test_a_twin_not_labelled_simulated(redis_server) -> None:
    store = Store.connect(redis_server.url)
    store.clear()
    mislabelled = DeviceInfo(device_id="nano-x", device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1],
                             memory_bytes=1, simulated=False)  # fmt: skip
    store.fleet.register(mislabelled, ttl_s=30, instance="w")  # as a worker of another version would
    _, findings = doctor(redis_server.url)
    assert "labelled simulated=False" in finding(findings, "twins labelled")["problem"]
    store.clear()


def doctor_with_worker(url: str, argv: list[str], env: dict[str, str], log: Path, unprivileged: bool = False) -> tuple[int, list[dict]]:
    """The doctor on `url` while a worker (`edgetrain worker ARGV`) runs there, once it has
    registered; `unprivileged` drops what root may do beyond a plain user (writing others'
    read-only files, administering devices) where this test runs as root."""
    drop = ["setpriv", "--bounding-set=-dac_override,-sys_admin"] if unprivileged and os.geteuid() == 0 else []
    if drop and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux) to drop root's privileges")
    store = Store.connect(url)
    store.clear()
    with open(log, "ab") as out:
        worker = subprocess.Popen([*drop, sys.executable, "-m", "edgetrain.workers.cli", "worker", *argv],
                                  env={**os.environ, "EDGETRAIN_REDIS_URL": url, **env}, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:

        def registered() -> bool | None:
            assert worker.poll() is None, log.read_text()[-3000:]
            return bool(store.liveness.workers(30)) or None

        poll_until(registered, 120, 0.5, f"the worker {argv} registered")
        return doctor(url)
    finally:
        worker.terminate()
        worker.wait(timeout=60)


@pytest.fixture
def skewed_control(redis_server, tmp_path):
    """A control worker on a host whose clock runs 90 s ahead (libfaketime), allowing a model
    module that is not installed there."""
    if LIBFAKETIME is None:
        pytest.skip("libfaketime not installed (Debian: apt-get install faketime)")
    env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "+90s", "EDGETRAIN_ALLOWED_MODEL_MODULES": "acme_models.vision"}
    return doctor_with_worker(redis_server.url, ["control"], env, tmp_path / "control.log")


def test_a_worker_whose_clock_is_off(skewed_control) -> None:
    rc, findings = skewed_control
    clock = finding(findings, "clock")
    assert rc == 1 and ("+90" in clock["problem"] or "+89" in clock["problem"]), clock
    assert "NTP" in clock["fix"]


def test_an_allowed_model_module_missing_on_a_worker(skewed_control) -> None:
    _, findings = skewed_control
    modules = finding(findings, "model modules")
    assert "'acme_models.vision'" in modules["problem"] and modules["subject"].startswith("control@")


def test_a_jetson_worker_that_cannot_pin_clocks_nor_find_its_data(redis_server, tmp_path) -> None:
    board = tmp_path / "board"
    build_nano(board)
    devfreq = JetsonDevice(sysfs_root=board).devfreq
    for name in ("min_freq", "max_freq", "governor"):
        (devfreq / name).chmod(0o444)  # as on a board: only a privileged process may write them
    argv = ["device", "--device-id", "jn-1", "--backend", "jetson", "--sysfs-root", str(board)]
    env = {"EDGETRAIN_DATA_ROOTS": str(tmp_path / "no-such-data")}
    rc, findings = doctor_with_worker(redis_server.url, argv, env, tmp_path / "device.log", unprivileged=True)
    permissions = finding(findings, "device permissions")
    assert rc == 1 and "cannot write min_freq, max_freq, governor" in permissions["problem"] and "root" in permissions["fix"]
    assert "no-such-data" in finding(findings, "data roots")["problem"]


def test_an_nvml_worker_allowed_to_lock_clocks_without_root(redis_server, tmp_path) -> None:
    argv = ["device", "--device-id", "gpu-1", "--backend", "nvml", "--allow-clock-control"]
    env = {"EDGETRAIN_NVML_MODULE": "edgetrain.common.testing.fake_nvml"}
    rc, findings = doctor_with_worker(redis_server.url, argv, env, tmp_path / "nvml.log", unprivileged=True)
    assert rc == 1 and "NVML refuses to lock GPU clocks" in finding(findings, "device permissions")["problem"]
