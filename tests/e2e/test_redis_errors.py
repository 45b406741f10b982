"""What every command says when Redis refuses it, against real Redis 7 servers (ACL users, TLS, a
replica): the cause and its fix, exit status 4, one line, `doctor` the same as the others;
never "is it running?" for a refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.store import Store
from edgetrain.common.testing.certificates import issue
from edgetrain.common.testing.redis_processes import RedisProcess, redis_binary
from edgetrain.common.testing.redis_server import TlsRedis, free_port
from edgetrain.tasks.client import poll_until
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.commands.redis_acl import ROLES, acl_file

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "edgetrain.workers.cli"]
PASSWORDS = {role: f"{role}-secret-{os.getpid()}" for role in ROLES}


@dataclass
class Servers:
    folder: Path
    acl: RedisProcess  # the users of `edgetrain redis-acl`, default user off
    tls: TlsRedis  # TLS only, the same users
    replica: RedisProcess  # a read-only replica of `master`
    master: RedisProcess

    def password_file(self, role: str) -> Path:
        path = self.folder / f"{role}.password"
        path.write_text(PASSWORDS[role] + "\n")
        return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if redis_binary() is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server)")
    folder = tmp_path_factory.mktemp("refusals")
    (folder / "users.acl").write_text(acl_file(PASSWORDS))
    ca = issue(folder / "tls", "ca")
    started = []
    try:
        acl = RedisProcess(folder / "acl", ["--aclfile", str(folder / "users.acl"), "--appendonly", "yes"]).start()
        started.append(acl)
        tls = TlsRedis(folder / "tls-redis", issue(folder / "tls", "redis", ca, hosts=("127.0.0.1",)), ca.certificate,
                       folder / "users.acl").start()  # fmt: skip
        started.append(tls)
        master = RedisProcess(folder / "master", ["--appendonly", "yes"]).start()
        started.append(master)
        replica = RedisProcess(folder / "replica", ["--appendonly", "yes", "--replicaof", "127.0.0.1", str(master.port)]).start()
        started.append(replica)
        poll_until(lambda: replica.client().info("replication")["master_link_status"] == "up" or None, 30, 0.1, "the replica in sync")
        nano = DeviceInfo(device_id="nano-7", device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1], memory_bytes=1,
                          simulated=True)  # fmt: skip
        worker = Store.connect(f"redis://worker:{PASSWORDS['worker']}@127.0.0.1:{acl.port}/0")
        worker.fleet.register(nano, ttl_s=3600, instance="test")  # doctor reads its queue's length
        yield Servers(folder, acl, tls, replica, master)
    finally:
        for server in started:
            server.stop()


def edgetrain(argv: list[str], url: str, password_file: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("EDGETRAIN_REDIS_URL_FILE", "EDGETRAIN_REDIS_PASSWORD_FILE")}
    env["EDGETRAIN_REDIS_URL"] = url
    if password_file is not None:
        env["EDGETRAIN_REDIS_PASSWORD_FILE"] = str(password_file)
    return subprocess.run([*CLI, *argv], env=env, capture_output=True, text=True, timeout=120)


def refused(argv: list[str], url: str, password_file: Path | None = None) -> str:
    """The one line a command refused by Redis prints, after checking its exit status."""
    done = edgetrain(argv, url, password_file)
    assert done.returncode == ExitCode.unreachable, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_no_refusal_reads_as_redis_not_running(servers: Servers) -> None:
    for line in (refused(["fleet"], f"redis://127.0.0.1:{servers.acl.port}/0"),
                 refused(["doctor"], f"redis://submitter@127.0.0.1:{servers.acl.port}/0", servers.password_file("submitter")),
                 refused(["cap", "nano-7", "3"], servers.replica.url)):  # fmt: skip
        assert "Is it running" not in line and "cannot reach" not in line, line


@pytest.mark.parametrize("argv", [["fleet"], ["doctor"]])
def test_a_wrong_password_names_the_user_and_the_password_file(servers: Servers, argv: list[str], tmp_path: Path) -> None:
    wrong = tmp_path / "worker.password"
    wrong.write_text("not-the-password\n")
    line = refused(argv, f"redis://worker@127.0.0.1:{servers.acl.port}/0", wrong)
    assert "refused the password of user 'worker'" in line and "EDGETRAIN_REDIS_PASSWORD_FILE holds worker's password" in line, line
    assert "not-the-password" not in line


@pytest.mark.parametrize("argv", [["fleet"], ["doctor"]])
def test_no_user_on_a_redis_whose_default_user_is_off_says_to_name_one(servers: Servers, argv: list[str]) -> None:
    line = refused(argv, f"redis://127.0.0.1:{servers.acl.port}/0")
    assert "wants a user and a password (its default user is off) and the URL names no user" in line, line
    assert "EDGETRAIN_REDIS_URL=redis://ROLE@HOST:PORT/DB" in line and "monitor for Flower, the exporter and doctor" in line


def test_a_user_without_its_password_says_which_file_is_missing(servers: Servers) -> None:
    line = refused(["status", "abc123"], f"redis://submitter@127.0.0.1:{servers.acl.port}/0")
    assert "wants a password for user 'submitter' and none was given: set EDGETRAIN_REDIS_PASSWORD_FILE" in line, line


def test_doctor_as_the_submitter_says_it_needs_the_monitor_user(servers: Servers) -> None:
    monitor = edgetrain(["doctor", "--json"], f"redis://monitor@127.0.0.1:{servers.acl.port}/0", servers.password_file("monitor"))
    assert monitor.returncode in (ExitCode.ok, ExitCode.failed) and '"findings"' in monitor.stdout, monitor.stderr
    line = refused(["doctor"], f"redis://submitter@127.0.0.1:{servers.acl.port}/0", servers.password_file("submitter"))
    assert "refused user 'submitter' this command" in line and "this command needs the monitor user (or worker)" in line, line


@pytest.mark.parametrize("argv", [["fleet"], ["doctor"]])
def test_a_certificate_not_trusted_is_a_tls_refusal_naming_ssl_ca_certs(servers: Servers, argv: list[str]) -> None:
    line = refused(argv, f"rediss://worker@127.0.0.1:{servers.tls.port}/0", servers.password_file("worker"))
    assert line.startswith("edgetrain: TLS refused: the certificate of Redis at rediss://worker:***@127.0.0.1:"), line
    assert "is not trusted (self-signed certificate in certificate chain)" in line
    assert "ssl_ca_certs=/path/to/ca.pem" in line


def test_plain_redis_against_a_tls_port_says_to_use_rediss(servers: Servers) -> None:
    line = refused(["fleet"], f"redis://worker@127.0.0.1:{servers.tls.port}/0", servers.password_file("worker"))
    assert "closed the connection without an answer" in line and "if it accepts TLS only, use rediss://" in line, line


def test_tls_against_a_plain_port_says_to_use_redis(servers: Servers) -> None:
    line = refused(["fleet"], f"rediss://127.0.0.1:{servers.master.port}/0?ssl_cert_reqs=none")
    assert line.startswith("edgetrain: TLS refused: no TLS handshake with Redis at rediss://127.0.0.1:"), line
    assert "if it does not speak TLS on that port, use redis://" in line


@pytest.mark.parametrize("argv", [["fleet"], ["doctor"]])
def test_nothing_listening_is_not_reachable(argv: list[str]) -> None:
    line = refused(argv, f"redis://127.0.0.1:{free_port()}/0")
    assert "cannot reach Redis at redis://127.0.0.1:" in line and "Connection refused" in line and "Is it running" in line, line


def test_a_read_only_replica_is_named_with_its_fix_by_submit_and_by_doctor(servers: Servers, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(quick_job([{"device_id": "nano-7", "power_cap_w": 3.0}])))
    line = refused(["submit", str(job)], servers.replica.url)
    assert "is a read-only replica, and edgetrain writes: set EDGETRAIN_REDIS_URL to its master" in line, line
    done = edgetrain(["doctor"], servers.replica.url)
    assert done.returncode == ExitCode.failed and "[redis role]" in done.stdout and "read-only replica" in done.stdout, done.stdout
    master = edgetrain(["doctor", "--json"], servers.master.url)
    assert "redis role" not in master.stdout, master.stdout
