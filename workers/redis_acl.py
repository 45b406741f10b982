"""Redis ACL users for an edgetrain deployment, one per role, as a Redis ACL file.

- `worker`: the control, server and device workers (and operators' commands such as
  `edgetrain profile`): every key and channel, no administration command (CONFIG, ACL,
  SHUTDOWN, FLUSHALL, DEBUG, MODULE, KEYS, ...).
- `submitter`: the client (`edgetrain submit`, `status`, `fleet`, `cap`, `EdgeTrainClient`): writes
  job records (and which jobs wait on which device) and the power caps set on devices, reads the worker registry, and pushes
  onto the `control` and `server` queues only (it cannot read or take
  tasks from them, nor push onto a device's queue), reads the fleet, vectors, tables, failures,
  pre-trained weights and task results.
- `monitor`: Flower and dashboards: reads every key and follows the Celery events; it cannot
  write, so it cannot control workers (Flower's shutdown, revoke and pool buttons need `worker`).
- `default`: off, so a connection without a user name and password gets nothing.

The passwords are stored as SHA-256 hashes. Celery's own keys (queues, `_kombu.binding.*`,
`unacked*`, `celery-task-meta-*`) do not carry edgetrain's key prefix; the prefix scopes only
edgetrain's own keys.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgetrain.common.keys import DEFAULT_PREFIX

ROLES = ("worker", "submitter", "monitor")


def role_rules(prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The ACL rules (without the password) of each role, for edgetrain keys under `prefix`:
    every role may run every command but the administrative and dangerous ones, and its key
    and channel patterns say what it may touch (`%R~`: read only, `%W~`: write only)."""
    p = prefix
    commands = "+@all -@admin -@dangerous +info"
    return {
        "worker": f"~* &* {commands}",
        "submitter": " ".join([
            f"~{p}:job:* ~{p}:jobs ~{p}:fleet:jobs:* ~{p}:fleet:cap:* %R~{p}:fleet:* %R~{p}:vector:* %R~{p}:table:* %R~{p}:failed:*",
            f"%R~{p}:worker* %R~{p}:pretrained:*",
            "%R~control* %W~control %R~server* %W~server ~_kombu.binding*.control ~_kombu.binding*.server",
            "%R~celery-task-meta-* &celery-task-meta-* &/*.celeryev/*",
            commands,
        ]),
        "monitor": " ".join([
            "%R~* ~_kombu.binding*.celeryev ~_kombu.binding*.reply.celery.pidbox ~_kombu.binding_deadlines",
            f"~celeryev.* ~*.reply.celery.pidbox* &* {commands}",
        ]),
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
        raise ValueError(f"no <role>.password file in {folder}; roles: {list(ROLES)}")
    return found
