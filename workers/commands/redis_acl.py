"""Redis ACL users for an edgetrain deployment, one per role, as a Redis ACL file (Redis 7).

- `worker`: the control, server and device workers (and operators' commands such as
  `edgetrain profile`): every key and channel, no administration command (CONFIG, ACL,
  SHUTDOWN, FLUSHALL, DEBUG, MODULE, KEYS, ...).
- `submitter`: the client (`edgetrain submit`, `status`, `fleet`, `cap`, `EdgeTrainClient`):
  writes job records (which jobs wait on which device, which no control worker took up yet),
  federated job records (and a request to cancel one; their state, rounds and updates only
  the workers write: it reads them) and the power caps set on devices;
  reads the fleet, the worker registry, vectors, tables, failures, pre-trained weights and
  the store's identity (to tell a reset store), and the progress of proxy runs and profiles
  (for `status`);
  pushes onto the `control` and `server` queues only (it cannot read, take or count their
  tasks beyond LLEN, nor push onto a device's queue: `tasks/contract.py: send` pushes without
  declaring); reads and clears its task results.
- `monitor`: Flower and dashboards: reads every key and follows the Celery events (the event
  channels of each database, `/<db>.celeryev/*`, which kombu subscribes to by that literal
  pattern, and its own event queue's binding). It has no remote-control channel
  (`/<db>.celery.pidbox`) and no reply queue, so it cannot shut workers down, revoke tasks or
  inspect workers: Flower shows workers and tasks from their events (`workers/processes/flower.py`).
- `replica` and `sentinel` (Redis Sentinel deployments only): a replica following the master
  (PSYNC, REPLCONF), and the sentinels watching it and promoting a replica (the commands Redis's
  Sentinel documentation lists).
- `default`: off, so a connection without a user name and password gets nothing.

The passwords are stored as SHA-256 hashes. Celery's own keys (queues, `_kombu.binding.*`,
`unacked*`, `celery-task-meta-*`) do not carry edgetrain's key prefix; the prefix scopes only
edgetrain's own keys. A channel permission allows both PUBLISH and SUBSCRIBE: a monitor can
publish a forged event, which Flower would show (events are not signed).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from edgetrain.common.keys import DEFAULT_PREFIX

ROLES = ("worker", "submitter", "monitor", "replica", "sentinel")
REDIS_DATABASES = range(16)  # Redis's default `databases`: kombu's event channels are named after the database


def role_rules(prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The ACL rules (without the password) of each role, for edgetrain keys under `prefix`:
    every role may run every command but the administrative and dangerous ones, and its key
    and channel patterns say what it may touch (`%R~`: read only, `%W~`: write only)."""
    p = prefix
    commands = "+@all -@admin -@dangerous +info"
    return {
        "worker": f"~* &* {commands}",
        "submitter": " ".join(
            [
                f"~{p}:job:* ~{p}:jobs %W~{p}:unplanned ~{p}:plan-doorbell %W~{p}:plan-now",
                f"~{p}:fleet:jobs:* ~{p}:fleet:cap:* ~{p}:fleet:caps ~{p}:fed:* ~{p}:federated*",
                f"%R~{p}:fleet:* %R~{p}:vector:* %R~{p}:table:* %R~{p}:failed:* %R~{p}:fedrun:*",
                f"%R~{p}:worker* %R~{p}:pretrained:* %R~{p}:store %R~{p}:vector-parts:* %R~{p}:vector-progress:* %R~{p}:profiling:*",
                "%W~control %W~server",
                "~celery-task-meta-* &celery-task-meta-*",
                commands,
            ]
        ),
        "monitor": " ".join(
            [
                "%R~* ~_kombu.binding*.celeryev ~_kombu.binding_deadlines ~celeryev.*",
                *(f"&/{db}.celeryev/*" for db in REDIS_DATABASES),
                commands,
            ]
        ),
        "replica": "-@all +psync +replconf +ping",
        "sentinel": "&* -@all +multi +slaveof +ping +exec +subscribe +config|rewrite +role +publish +info +client|setname "
        "+client|kill +script|kill",
    }


def password_hash(password: str) -> str:
    """The SHA-256 hex digest Redis ACL files store for `password`."""
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file(passwords: dict[str, str], prefix: str = DEFAULT_PREFIX) -> str:
    """A Redis ACL file with one user per role of `passwords` (role -> password) and the
    default user off."""
    unknown = sorted(set(passwords) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown roles {unknown}; roles: {list(ROLES)}")
    rules = role_rules(prefix)
    lines = ["user default off resetkeys resetchannels -@all"]
    lines += [f"user {role} on #{password_hash(pw)} resetkeys resetchannels {rules[role]}" for role, pw in passwords.items()]
    return "\n".join(lines) + "\n"


def read_passwords(folder: Path) -> dict[str, str]:
    """role -> password from the files `<role>.password` in `folder` (the roles present)."""
    found = {role: (folder / f"{role}.password").read_text().strip() for role in ROLES if (folder / f"{role}.password").is_file()}
    if not found:
        raise ValueError(f"no <role>.password file in {folder} (roles: {', '.join(ROLES)}); "
                         f"`edgetrain redis-acl --passwords {folder} --make-secrets` makes them")  # fmt: skip
    empty = sorted(role for role, password in found.items() if not password)
    if empty:
        raise ValueError(f"empty password files in {folder}: {', '.join(f'{r}.password' for r in empty)}")
    return found


def make_secrets(folder: Path) -> list[str]:
    """A random password (192 bits) in `folder/<role>.password` for every role that has none,
    the folder made this user's only (0700) and each file made readable by this user only
    (0600); returns the roles given one. Existing passwords are kept."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = []
    for role in ROLES:
        path = folder / f"{role}.password"
        if path.is_file() and path.read_text().strip():
            continue
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
        made.append(role)
    return made
