"""Real Redis server processes on loopback TCP ports, as a fleet runs them: one configured as
given (`RedisProcess`), or a primary, a replica and three sentinels (`SentinelGroup`). They
use the system's redis-server binary (Debian: `apt-get install redis-server`), which also runs
as a sentinel (`--sentinel`)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis

from .redis_server import free_port

START_TIMEOUT_S = 20.0
SYSTEM_REDIS = "/usr/bin/redis-server"


def redis_binary() -> str | None:
    """The system's redis-server (Redis 6 or later), None when it is not installed."""
    return shutil.which(SYSTEM_REDIS) or shutil.which("redis-server")


@dataclass
class RedisProcess:
    """redis-server on `host`:`port` with the extra `options` (e.g. ["--appendonly", "yes"]),
    its files and log in `folder`; `sentinel` runs it as a sentinel with the config `folder/sentinel.conf`."""

    folder: Path
    options: list[str] = field(default_factory=list)
    sentinel: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen | None = None

    def start(self) -> RedisProcess:
        """Start the server (again, on the same port) and wait until it answers."""
        binary = redis_binary()
        if binary is None:
            raise FileNotFoundError(f"{SYSTEM_REDIS} not found: install Redis 6 or later (Debian: redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config = [str(self.folder / "sentinel.conf"), "--sentinel"] if self.sentinel else []
        argv = [binary, *config, "--port", str(self.port), "--bind", self.host, "--dir", str(self.folder), "--save", "",
                *self.options]  # fmt: skip
        with open(self.folder / "redis.log", "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.folder / 'redis.log').read_text()[-2000:]}")
            try:
                redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5).ping()
                return self
            except redis.AuthenticationError:  # it answers: with ACL users, the default user is off
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server not answering on port {self.port}") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        """redis://HOST:PORT/0."""
        return f"redis://{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        """A client of this server (strings decoded)."""
        return redis.Redis(host=self.host, port=self.port, decode_responses=True)

    def kill(self) -> None:
        """SIGKILL the server, as a crash of its host would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM), or kill it when it refuses (Redis does not exit while it
        writes its first append-only file)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class SentinelGroup:
    """A primary and a replica (both with an append-only file) watched by three sentinels
    under `master_name`, on loopback ports in `folder`. A sentinel declares the primary down
    after `down_after_ms` without an answer, and two of them agree to promote the replica."""

    folder: Path
    master_name: str = "edgetrain"
    down_after_ms: int = 2000
    acl_file: Path | None = None  # with it, the replica and the sentinels log in as `replica` and `sentinel`
    passwords: dict[str, str] = field(default_factory=dict)  # role -> password, for those users
    primary: RedisProcess | None = None
    replica: RedisProcess | None = None
    sentinels: list[RedisProcess] = field(default_factory=list)

    def start(self) -> SentinelGroup:
        """Start the primary, the replica, then the sentinels; wait until the replica is in sync
        and every sentinel knows the replica and the other sentinels."""
        server = ["--appendonly", "yes", "--appendfsync", "always"]
        auth = ""
        if self.acl_file is not None:  # each may become a replica after a failover: both log in to their master
            server += ["--aclfile", str(self.acl_file), "--masteruser", "replica", "--masterauth", self.passwords["replica"]]
            auth = f"sentinel auth-user {self.master_name} sentinel\nsentinel auth-pass {self.master_name} {self.passwords['sentinel']}\n"
        self.primary = RedisProcess(self.folder / "primary", server).start()
        self.replica = RedisProcess(self.folder / "replica", [*server, "--replicaof", "127.0.0.1", str(self.primary.port)]).start()
        for i in range(3):
            folder = self.folder / f"sentinel-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "sentinel.conf").write_text(
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n{auth}"
            )
            self.sentinels.append(RedisProcess(folder, sentinel=True).start())
        self._wait(self._ready, "the replica in sync and the sentinels aware of each other")
        return self

    def _ready(self) -> bool:
        assert self.replica is not None
        if self._admin(self.replica).info("replication")["master_link_status"] != "up":
            return False
        for s in self.sentinels:
            master = s.client().sentinel_master(self.master_name)
            assert isinstance(master, dict)
            if int(master.get("num-slaves", 0)) < 1 or int(master.get("num-other-sentinels", 0)) < 2:
                return False
        return True

    def _admin(self, server: RedisProcess) -> redis.Redis:
        """A client of a data server that may read its INFO (the `sentinel` user with ACLs)."""
        if self.acl_file is None:
            return server.client()
        return redis.Redis(port=server.port, username="sentinel", password=self.passwords["sentinel"], decode_responses=True)

    @staticmethod
    def _wait(ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout_s} s")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        """The Sentinel address edgetrain takes (EDGETRAIN_REDIS_URL), without a user."""
        return self.url_for("")

    def url_for(self, user: str, password: str = "") -> str:
        """The Sentinel address with the login of `user` (none when empty)."""
        login = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user else ""
        return f"sentinel://{login}" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.master_name}/0"

    def master_port(self) -> int:
        """The port of the master the sentinels name now."""
        address = self.sentinels[0].client().sentinel_get_master_addr_by_name(self.master_name)
        assert isinstance(address, (list, tuple)), f"the sentinels know no master {self.master_name!r}"
        return int(address[1])

    def stop(self) -> None:
        """Stop every process (sentinels first, so they do not fail over while it stops)."""
        for process in [*self.sentinels, self.replica, self.primary]:
            if process is not None:
                process.stop()
