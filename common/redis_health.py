"""What edgetrain needs from its Redis server, and what is wrong with one that falls short.

edgetrain keeps every job, claim and queued task in Redis, so the server must never drop a
key on its own: `maxmemory-policy noeviction` (Redis's default), so that a full server
refuses writes loudly instead of evicting jobs silently, and persistence (AOF or RDB), so that
a restart keeps them. `read_facts` reads the server's settings from INFO, which every edgetrain
ACL user may run; CONFIG (admin users only) adds the RDB schedule where it is allowed.

    facts = read_facts(client)
    for problem in problems(facts):
        print(problem.line())
"""

from __future__ import annotations

import redis
from pydantic import Field

from .schemas import Strict

NO_EVICTION = "noeviction"
NEARLY_FULL = 0.9  # of maxmemory: a warning


class RedisUnsafe(RuntimeError):
    """Redis is set up so that edgetrain would lose data (an evicting policy); the message
    names the setting to change."""


class RedisFull(RedisUnsafe):
    """Redis refused a write: it reached its maxmemory (with `noeviction`)."""


class RedisFacts(Strict):
    """A Redis server's settings and state that decide whether edgetrain's data is safe there."""

    version: str
    maxmemory_bytes: int = Field(ge=0, description="0: no limit")
    maxmemory_policy: str
    used_memory_bytes: int = Field(ge=0)
    aof_enabled: bool
    rdb_save: str | None = Field(description="the RDB snapshot schedule ('' = off); None when CONFIG is not allowed")
    role: str = Field("master", description="master, or slave for a replica (read-only: edgetrain cannot write to it)")

    @property
    def evicts(self) -> bool:
        """Whether the server deletes keys on its own when it is full."""
        return self.maxmemory_policy != NO_EVICTION


class Problem(Strict):
    """One thing to change on the Redis server, with the exact setting that fixes it."""

    setting: str = Field(description="the redis.conf setting, e.g. maxmemory-policy")
    found: str
    fix: str = Field(description="the line that fixes it, e.g. 'maxmemory-policy noeviction'")
    why: str
    severe: bool = Field(description="edgetrain refuses to run on it")

    def line(self) -> str:
        """One line for a log or a terminal."""
        return (f"Redis {self.setting} is {self.found}: {self.why}. Set `{self.fix}` "
                f"(redis-cli CONFIG SET {self.fix}, and in redis.conf to keep it)")  # fmt: skip


def read_facts(client: redis.Redis) -> RedisFacts:
    """The facts of the server `client` talks to: INFO, and CONFIG GET save where allowed."""
    info = client.info()
    try:
        rdb_save: str | None = str(client.config_get("save").get("save", ""))
    except redis.ResponseError:  # no admin rights (an ACL user), or CONFIG renamed away
        rdb_save = None
    return RedisFacts(
        version=str(info.get("redis_version", "?")),
        maxmemory_bytes=int(info.get("maxmemory", 0)),
        maxmemory_policy=str(info.get("maxmemory_policy", NO_EVICTION)),
        used_memory_bytes=int(info.get("used_memory", 0)),
        aof_enabled=bool(int(info.get("aof_enabled", 0))),
        rdb_save=rdb_save,
        role=str(info.get("role", "master")),
    )


def mib(n_bytes: int) -> str:
    """`n_bytes` in MiB, for people."""
    return f"{n_bytes / 2**20:.1f} MiB"


def eviction_problem(facts: RedisFacts) -> Problem | None:
    """The severe problem of an evicting policy: Redis deletes jobs, claims and queued tasks
    without a word when it is full (volatile-* policies the keys with a TTL: claims, leases)."""
    if not facts.evicts:
        return None
    return Problem(
        setting="maxmemory-policy", found=facts.maxmemory_policy, fix=f"maxmemory-policy {NO_EVICTION}", severe=True,
        why="a full Redis would delete edgetrain's jobs, claims and queued tasks without a word",
    )  # fmt: skip


def memory_problem(facts: RedisFacts) -> Problem | None:
    """A warning when Redis uses more than 90 % of its maxmemory: writes fail once it is full."""
    if not facts.maxmemory_bytes or facts.used_memory_bytes < NEARLY_FULL * facts.maxmemory_bytes:
        return None
    return Problem(
        setting="maxmemory", found=f"{mib(facts.maxmemory_bytes)} with {mib(facts.used_memory_bytes)} used",
        fix=f"maxmemory {2 * facts.maxmemory_bytes}", severe=False,
        why="Redis refuses every new job and result once it is full",
    )  # fmt: skip


def persistence_problem(facts: RedisFacts) -> Problem | None:
    """A warning when neither AOF nor RDB snapshots are on: a restart loses every job."""
    if facts.aof_enabled or facts.rdb_save:
        return None
    rdb = "off" if facts.rdb_save == "" else "unknown (CONFIG not allowed)"
    return Problem(
        setting="appendonly", found=f"no (RDB snapshots: {rdb})", fix="appendonly yes", severe=False,
        why="a restart of Redis loses every job, table and queued task",
    )  # fmt: skip


def problems(facts: RedisFacts) -> list[Problem]:
    """Everything to change on the server, the severe problems first."""
    found = [p for p in (eviction_problem(facts), memory_problem(facts), persistence_problem(facts)) if p is not None]
    return sorted(found, key=lambda p: not p.severe)


def full_message(facts: RedisFacts) -> str:
    """What to say when Redis refused a write for lack of memory."""
    return (f"Redis is full: it uses {mib(facts.used_memory_bytes)} of its maxmemory {mib(facts.maxmemory_bytes)} "
            f"(maxmemory-policy {facts.maxmemory_policy}), so it refuses new data. Raise maxmemory "
            "(redis-cli CONFIG SET maxmemory <bytes>) or free memory in it")  # fmt: skip


def refuse_unsafe(facts: RedisFacts, refusing: str) -> None:
    """RedisUnsafe when the server evicts keys, RedisFull when it is full; `refusing` says
    what is refused ("to submit")."""
    if problem := eviction_problem(facts):
        raise RedisUnsafe(f"refusing {refusing}: {problem.line()}")
    if facts.maxmemory_bytes and facts.used_memory_bytes >= facts.maxmemory_bytes:
        raise RedisFull(full_message(facts))
