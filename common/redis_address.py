"""Where Redis is: a URL (redis://, rediss:// or unix://), or a Sentinel address that names
the sentinels and the master they watch:

    sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]

With a Sentinel address the store, Celery's broker and its result backend all follow the master
the sentinels name, also after they promote a replica."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlparse, urlsplit

SENTINEL_FORM = "sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]"


@dataclass(frozen=True)
class SentinelAddress:
    """A Redis deployment behind Sentinel: the sentinels, the name of the master they watch,
    the database and the credentials of the master (the sentinels take none)."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def celery_url(self) -> str:
        """The same address in the form of Celery's broker and result backend (one
        `sentinel://` URL per sentinel, separated by `;`; the master name goes into their
        transport options)."""
        user = quote(self.username or "", safe="")
        credentials = f"{user}:{quote(self.password, safe='')}@" if self.password is not None else (f"{user}@" if user else "")
        return ";".join(f"sentinel://{credentials}{host}:{port}/{self.db}" for host, port in self.sentinels)


def sentinel_address(url: str) -> SentinelAddress | None:
    """The Sentinel address of a `sentinel://` URL, None for other schemes; ValueError naming
    `redis_url` and the form expected for a malformed one."""
    parts = urlsplit(url)
    if parts.scheme != "sentinel":
        return None
    where = parts.netloc.rpartition("@")[2]
    sentinels = []
    for item in where.split(","):
        match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5})", item.strip())
        if match is None or not 0 < int(match[2]) < 65536:
            raise ValueError(f"redis_url: sentinel {item!r} is not HOST:PORT; expected {SENTINEL_FORM}")
        sentinels.append((match[1], int(match[2])))
    path = [p for p in parts.path.split("/") if p]
    if not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"redis_url: {parts.path!r} does not name the master (and database); expected {SENTINEL_FORM}")
    return SentinelAddress(
        sentinels=tuple(sentinels), master_name=unquote(path[0]), db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )  # fmt: skip


def redacted(url: str) -> str:
    """`url` with its password (in the address or a `password=` parameter) replaced by ***, to
    be shown to people."""
    parsed = urlparse(url)
    if parsed.password is not None:
        url = url.replace(f":{parsed.password}@", ":***@", 1)
    return re.sub(r"([?&])password=[^&#]*", r"\1password=***", url)


def redis_user(url: str) -> str | None:
    """The user a Redis URL or Sentinel address logs in as (None: the default user)."""
    address = sentinel_address(url)
    return address.username if address is not None else urlsplit(url).username or None
