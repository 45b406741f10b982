"""TLS to Redis (`rediss://`): the certificate checks of the URL, given to every Redis client
of a Celery app (the broker, the result backend and Flower's queue lengths).

    rediss://USER:PASSWORD@HOST:6379/0?ssl_ca_certs=/etc/edgetrain/ca.pem

verifies the server's certificate against that CA (`ssl_cert_reqs` defaults to `required`:
the system's CAs when `ssl_ca_certs` is not given); `ssl_certfile` and `ssl_keyfile` add a
client certificate for servers that ask for one (`tls-auth-clients yes`)."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qs, urlparse

CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def tls_options(redis_url: str) -> dict[str, Any] | None:
    """The TLS options of a rediss:// URL (None for other schemes)."""
    parsed = urlparse(redis_url)
    if parsed.scheme != "rediss":
        return None
    query = {name: values[-1] for name, values in parse_qs(parsed.query).items()}
    reqs = query.get("ssl_cert_reqs", "required").lower().removeprefix("cert_")
    if reqs not in CERT_REQS:
        raise ValueError(f"redis_url: ssl_cert_reqs={query['ssl_cert_reqs']!r}; use one of {list(CERT_REQS)}")
    return {"ssl_cert_reqs": CERT_REQS[reqs]} | {name: query[name] for name in FILE_OPTIONS if name in query}


def tls_config(redis_url: str) -> dict[str, Any]:
    """The Celery settings that make the broker and result backend use TLS as the URL says."""
    options = tls_options(redis_url)
    return {} if options is None else {"broker_use_ssl": options, "redis_backend_use_ssl": options}
