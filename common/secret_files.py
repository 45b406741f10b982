"""Secrets read from files, so that they stay out of the process list (`ps`, /proc/<pid>/cmdline)
and out of the environment of child processes that do not need them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit


def read_secret(field: str, path: Path) -> str:
    """The content of the secret file `path` without surrounding blanks; ValueError naming `field`."""
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{field}: cannot read {path}: {exc.strerror}") from None


def url_with_password(url: str, password: str) -> str:
    """`url` (redis://, rediss:// or unix://) with `password` for its user (unix: `?password=`)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"{url}{'&' if parts.query else '?'}password={quote(password, safe='')}"
    host = parts.netloc.rpartition("@")[2]
    user = quote(parts.username or "", safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))
