"""`edgetrain doctor`: checks a deployment and says what to fix, each finding with the setting
or command that fixes it.

- Redis: a master (not a read-only replica), its version, `maxmemory-policy`, memory and persistence (common/redis_health.py),
  and an append-only file; the ACL users and TLS the URL configures, as configured: a URL that
  names a user needs the default user off (and Redis 7 for edgetrain's ACL file), a
  `rediss://` URL needs the server's certificate checked, and a Redis off this host must not
  let in connections without a password.
- Workers: a live control and server worker, a live worker for every device queue that has
  work; each worker's clock against Redis's (heartbeats carry the worker's own clock); what
  each worker found on its host at start (data roots, model modules, device permissions).
- The fleet: devices on twins labelled simulated, and real ones not.

The checks read Redis only (INFO, the registries, every device's queue length), so they need a
user that may read every key: `monitor` (read only), or `worker`; the `submitter` may not read
the device queues, and is told which user to use instead."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from edgetrain.common.host_checks import Finding
from edgetrain.common.redis_address import redacted, sentinel_address
from edgetrain.common.redis_health import RedisFacts, problems
from edgetrain.common.settings import Settings
from edgetrain.common.store import Store
from edgetrain.common.store.connection import connect, master_address
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, device_queue

from ..processes.flower import is_loopback

MIN_REDIS = (6, 2)  # ACL users, ZMSCORE, GETDEL
ACL_FILE_REDIS = (7, 0)  # the ACL file of `edgetrain redis-acl` (docs/security.md)
CLOCK_SKEW_S = 1.0
ROLE_NEEDED = {
    CONTROL_QUEUE: "no job advances (planning, dispatch, the reaper that hands on lost tasks)",
    SERVER_QUEUE: "no relation vector is estimated, so no new job gets past estimation",
}


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a Redis version such as '7.0.15'."""
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def redis_findings(facts: RedisFacts, subject: str) -> list[Finding]:
    """The Redis server's role (a master), version, eviction policy, memory and persistence."""
    found = []
    if facts.role != "master":
        found.append(Finding(check="redis role", subject=subject,
                             problem=f"it is a read-only replica (role {facts.role}): every job, claim and heartbeat is a write "
                                     "it refuses",
                             fix="set EDGETRAIN_REDIS_URL to its master, or to the sentinels that follow the master "
                                 "(sentinel://HOST:PORT,.../MASTER_NAME/DB)"))  # fmt: skip
    if _release(facts.version) < MIN_REDIS:
        found.append(Finding(check="redis version", subject=subject,
                             problem=f"Redis {facts.version} is older than {'.'.join(map(str, MIN_REDIS))}, which edgetrain needs "
                                     "(ACL users, ZMSCORE)",
                             fix="upgrade Redis to 6.2 or later (Debian 12: apt-get install redis-server, Redis 7.0)"))  # fmt: skip
    for p in problems(facts):
        found.append(Finding(check=f"redis {p.setting}", subject=subject, problem=f"{p.setting} is {p.found}: {p.why}",
                             fix=f"`{p.fix}` in redis.conf, and `redis-cli CONFIG SET {p.fix}` to apply it now"))  # fmt: skip
    if not facts.aof_enabled and facts.rdb_save:  # snapshots only: problems() accepts them as persistence
        found.append(Finding(check="redis appendonly", subject=subject,
                             problem="appendonly is no (RDB snapshots only): a crash loses every job, claim and queued task "
                                     "written since the last snapshot",
                             fix="`appendonly yes` in redis.conf, and `redis-cli CONFIG SET appendonly yes` to apply it now"))  # fmt: skip
    return found


def _anonymous(url: str) -> redis.Redis:
    """A client of the Redis `url` names (the master, behind Sentinel), without a user or password."""
    if sentinel_address(url) is not None:
        host, _, port = (master_address(connect(url)) or "").rpartition(":")
        return redis.Redis(host=host, port=int(port), socket_connect_timeout=5)
    parts = urlsplit(url)
    query = "&".join(f"{k}={v[-1]}" for k, v in parse_qs(parts.query).items() if k != "password")
    if parts.scheme == "unix":  # urlunsplit would drop the empty authority of unix:///path
        return redis.Redis.from_url(f"unix://{parts.path}" + (f"?{query}" if query else ""), socket_connect_timeout=5)
    return redis.Redis.from_url(urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query=query)), socket_connect_timeout=5)


def access_findings(url: str, subject: str, version: str) -> list[Finding]:
    """The ACL users and TLS the URL configures, as configured (Redis `version`)."""
    parts = urlsplit(url)
    address = sentinel_address(url)
    user = address.username if address else parts.username
    password = address.password if address else parts.password or parse_qs(parts.query).get("password")
    hosts = [host for host, _ in address.sentinels] if address else ([parts.hostname or ""] if parts.scheme != "unix" else [])
    remote = any(not is_loopback(h) for h in hosts)
    found = []
    try:
        _anonymous(url).ping()
        open_door = True
    except redis.AuthenticationError:
        open_door = False
    except redis.ResponseError as exc:  # NOAUTH on older servers
        open_door = "NOAUTH" not in str(exc)
    if user and _release(version) < ACL_FILE_REDIS:
        found.append(Finding(check="redis ACL", subject=subject,
                             problem=f"the URL logs in as {user!r}, but Redis {version} cannot load the ACL file of "
                                     "`edgetrain redis-acl` (kombu's event channels need Redis 7's channel patterns)",
                             fix="upgrade Redis to 7 or later (Debian 12: apt-get install redis-server)"))  # fmt: skip
    if user and open_door:
        found.append(Finding(check="redis ACL", subject=subject,
                             problem=f"the URL logs in as {user!r}, but the default user is on: a connection without a password "
                                     "gets every right, so the users per role protect nothing",
                             fix="start Redis with the ACL file of `edgetrain redis-acl --passwords DIR` (--aclfile users.acl: "
                                 "its first line turns the default user off), or `ACL SETUSER default off`"))  # fmt: skip
    elif not user and not password and remote and open_door:
        found.append(Finding(check="redis ACL", subject=subject,
                             problem="Redis off this host lets in anyone who reaches it (no user, no password)",
                             fix="give each role its own user (`edgetrain redis-acl`, docs/security.md) and name it in "
                                 "EDGETRAIN_REDIS_URL (redis://worker@HOST:6379/0 with EDGETRAIN_REDIS_PASSWORD_FILE)"))  # fmt: skip
    if parts.scheme == "rediss" and parse_qs(parts.query).get("ssl_cert_reqs", ["required"])[-1].lower().removeprefix("cert_") == "none":
        found.append(Finding(check="redis TLS", subject=subject,
                             problem="TLS does not check the server's certificate (ssl_cert_reqs=none): anyone on the way can pose "
                                     "as Redis and read every record",
                             fix="ssl_cert_reqs=required&ssl_ca_certs=/etc/edgetrain/ca.pem in EDGETRAIN_REDIS_URL"))  # fmt: skip
    return found


def worker_findings(store: Store, settings: Settings) -> list[Finding]:
    """Live workers per role and per device queue with work, clocks, and what each worker
    found on its host at start."""
    workers = store.liveness.workers(settings.heartbeat_ttl_s)
    consumed = {q for w in workers for q in w.queues}
    found = []
    for queue, consequence in ROLE_NEEDED.items():
        if queue not in consumed:
            found.append(Finding(check="workers", subject=f"queue {queue!r}", problem=f"no live {queue} worker: {consequence}",
                                 fix=f"start `edgetrain worker {queue}`"))  # fmt: skip
    devices = sorted(store.monitoring.last_seen())
    waiting = store.monitoring.queue_lengths([device_queue(d) for d in devices])
    for device_id in devices:
        queue = device_queue(device_id)
        jobs = store.jobs.device_jobs(device_id)
        if queue not in consumed and (waiting[queue] or jobs):
            work = f"{waiting[queue]} tasks wait in it" if waiting[queue] else f"job {', '.join(jobs)} waits on it"
            found.append(Finding(check="workers", subject=f"queue {queue!r}", problem=f"no live worker consumes it; {work}",
                                 fix=f"start `edgetrain worker device --device-id {device_id} --backend ...` on its board"))  # fmt: skip
    heard = store.liveness.heard_at([w.node for w in workers])
    for w in workers:
        if w.clock_s is not None and w.node in heard and abs(skew := w.clock_s - heard[w.node]) - w.clock_error_s > CLOCK_SKEW_S:
            found.append(Finding(check="clock", subject=w.node,
                                 problem=f"the clock of {w.hostname} is {skew:+.1f} s off Redis's: events, logs and reports from "
                                         "its workers carry times that disagree with the rest of the fleet",
                                 fix=f"synchronise {w.hostname}'s clock with NTP (`timedatectl set-ntp true`, or chrony)"))  # fmt: skip
        found += w.findings
    return found


def fleet_findings(store: Store) -> list[Finding]:
    """Devices on twins are labelled simulated, real ones are not."""
    found = []
    for d in store.fleet.devices():
        twin = d.backend.partition(":")[0] == "sim"  # a twin's backend: "sim" (or "sim:<twin>")
        if twin != d.simulated:
            taken = "measured on hardware" if twin else "simulated"
            found.append(Finding(check="twins labelled", subject=f"device {d.device_id}",
                                 problem=f"backend {d.backend!r} but labelled simulated={d.simulated}: its figures would be taken "
                                         f"for {taken}",
                                 fix=f"restart its worker (`edgetrain worker device --device-id {d.device_id} --backend "
                                     f"{d.backend}`) with this edgetrain version, which labels what twins produce"))  # fmt: skip
    return found


def diagnose(settings: Settings) -> list[Finding]:
    """Everything to fix in the deployment `settings` reach; redis.ConnectionError when Redis
    cannot be reached at all."""
    store = Store.connect(settings.redis_url, settings.key_prefix)
    store.ping()
    subject = f"Redis at {redacted(settings.redis_url)}"
    facts = store.redis_facts()
    return [
        *redis_findings(facts, subject),
        *access_findings(settings.redis_url, subject, facts.version),
        *worker_findings(store, settings),
        *fleet_findings(store),
    ]


def summary(store: Store, settings: Settings) -> str:
    """One line on a deployment with nothing to fix."""
    facts = store.redis_facts()
    roles: dict[str, int] = {}
    for w in store.liveness.workers(settings.heartbeat_ttl_s):
        roles[w.role] = roles.get(w.role, 0) + 1
    workers = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    return (f"all well: Redis {facts.version} (maxmemory-policy {facts.maxmemory_policy}, append-only file on), "
            f"live workers: {workers}; clocks within {CLOCK_SKEW_S:g} s of Redis's")  # fmt: skip
