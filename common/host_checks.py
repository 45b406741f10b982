"""What a worker finds about its own host at start, kept in its registry entry for `edgetrain
doctor`: configured data roots that are not there, allowed model modules it cannot import, and
a device it may not control with its privileges."""

from __future__ import annotations

import importlib.util
import socket

from pydantic import Field

from .devices.base import Device
from .devices.permissions import control_problems
from .schemas import Strict
from .settings import Settings


class Finding(Strict):
    """One thing to fix in a deployment, with the setting or command that fixes it."""

    check: str = Field(description="what was checked: 'redis maxmemory-policy', 'clock', 'device permissions', ...")
    subject: str = Field(description="where: the Redis server, a worker node, a device, a queue")
    problem: str
    fix: str = Field(description="the setting or command that fixes it")

    def line(self) -> str:
        """The finding for people: where, what, and how to fix it."""
        return f"{self.subject}: {self.problem}\n    fix: {self.fix}"


def module_missing(module: str) -> bool:
    """Whether `module` cannot be imported here (its parent packages are imported to find it)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def host_findings(settings: Settings, role: str, node: str, device: Device | None = None) -> list[Finding]:
    """What worker `node` of `role` (control, server or device) finds wrong on its host: data
    roots (server and device workers read data), allowed model modules (every worker imports
    them), and whether it may set its device's clock or power limit."""
    host = socket.gethostname()
    found = []
    if role in ("server", "device"):
        for root in settings.data_roots:
            if not root.is_dir():
                found.append(Finding(check="data roots", subject=node, problem=f"data root {root} (EDGETRAIN_DATA_ROOTS) does not exist",
                                     fix=f"create {root} on {host}, or set EDGETRAIN_DATA_ROOTS to folders that exist"))  # fmt: skip
    for module in settings.allowed_model_modules:
        if module_missing(module):
            found.append(Finding(check="model modules", subject=node,
                                 problem=f"allowed model module {module!r} (EDGETRAIN_ALLOWED_MODEL_MODULES) is not installed",
                                 fix=f"install the package that provides {module} on {host} (pip install ...), or drop it from "
                                     "EDGETRAIN_ALLOWED_MODEL_MODULES on every worker"))  # fmt: skip
    if device is not None:
        found += [Finding(check="device permissions", subject=node, problem=problem, fix=fix) for problem, fix in control_problems(device)]
    return found
