"""Prometheus's text exposition format (0.0.4), each series written as a line when it is added.

A scrape of a fleet of 10 000 devices holds tens of thousands of series (a device's heartbeat,
labels and queue each); prometheus_client's generic writer takes about 12 µs a series on the
2-core development machine (0.4 s for 30 000), a line formatted here about 1 µs. Label values
are escaped as the format says (backslash, double quote, newline)."""

from __future__ import annotations

import http.server
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable

from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

logger = logging.getLogger(__name__)


def _escape(value: str) -> str:
    if '"' in value or "\\" in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


class Family:
    """One metric family: a gauge, or a counter (its series named `<name>_total`)."""

    def __init__(self, name: str, doc: str, labels: Iterable[str] = (), counter: bool = False):
        self.name = f"{name}_total" if counter else name
        self.labels = tuple(labels)
        doc = doc.replace("\\", "\\\\").replace("\n", "\\n")
        self.lines = [f"# HELP {self.name} {doc}", f"# TYPE {self.name} {'counter' if counter else 'gauge'}"]
        pairs = ",".join(f'{k}="{{}}"' for k in self.labels)
        self._series = f"{self.name}{{{{{pairs}}}}} {{}}" if pairs else f"{self.name} {{}}"  # e.g. 'name{device="{}"} {}'

    def add(self, values: Iterable[str], value: float) -> None:
        """A series with these label values (in the order of `labels`)."""
        self.lines.append(self._series.format(*map(_escape, values), _number(value)))


def _number(value: float) -> str:
    """A sample's value: an int as it is (not a bool), a finite float as Python writes it (which
    Prometheus reads), infinities and NaN as the format spells them."""
    if type(value) is int:
        return str(value)
    number = float(value)
    return repr(number) if math.isfinite(number) else floatToGoString(number)


def gauge(name: str, doc: str, value: float) -> Family:
    """A family of one series without labels."""
    family = Family(name, doc)
    family.add((), value)
    return family


def render(families: Iterable[Family]) -> bytes:
    """The families as a scrape's body."""
    return "".join("\n".join(f.lines) + "\n" for f in families).encode()


def serve_text(address: str, port: int, body: Callable[[], bytes]) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    """Serve `body()` on GET /metrics (and /) from a thread, on an IPv4 or IPv6 `address`; a
    `body()` that raises is answered 500 with its error. (server, thread)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            if self.path.split("?")[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            try:
                payload = body()
            except Exception as exc:  # a scrape that cannot be answered says why (the exporter lives on)
                logger.exception("a scrape failed")
                self.send_error(500, explain=f"{type(exc).__name__}: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            """Scrapes are not logged."""

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    server = Server((address, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread
