"""Every Redis key edgetrain uses, named in one place under a configurable prefix.

    <p>:fleet:ids                          set of device ids
    <p>:fleet:device:<id>                  DeviceInfo JSON, expires without heartbeat
    <p>:fleet:seen                         zset device id -> last heartbeat (Redis time, s)
    <p>:fleet:owner:<id>                   the worker instance serving a device id (expires)
    <p>:fleet:jobs:<id>                    set of jobs with an unfinished part on the device
    <p>:fleet:cap:<id>                     hash: the power cap set on the device while it runs
    <p>:workers                            zset worker node -> last heartbeat (Redis time, s)
    <p>:worker:<node>                      WorkerInfo JSON: role, queues, host, pid
    <p>:leases                             zset task id -> last renewal (Redis time, s)
    <p>:lease:<task id>                    Lease JSON: which task runs where, for whom
    <p>:table:<type>:<model>:<shape>       ProfileTable JSON
    <p>:vector:<key>                       RelationVector JSON
    <p>:vector-parts:<key>                 hash "<b>:<seed>" -> TrainingOutcome JSON
    <p>:pretrained:<key>                   PretrainResult JSON: weights pre-trained for a request
    <p>:claim:<resource>                   who is producing a table or vector (expires)
    <p>:once:<name>                        an action that must happen once (expires)
    <p>:waiters:<resource>                 jobs to advance when a resource is ready or failed
    <p>:failed:<resource>                  why producing a resource failed (expires)
    <p>:attempts:<task id>                 deliveries of a task (expires)
    <p>:jobs                               zset of job ids by submit time
    <p>:job:<id>                           JobRecord JSON
    <p>:job:<id>:part:<device>             DevicePart JSON
    <p>:job:<id>:progress:<device>         FinetuneProgress JSON
    <p>:job:<id>:events                    list of JobEvent JSON
    <p>:job:<id>:checkpoint:<device>       CheckpointRef JSON: the fine-tune's last checkpoint
    <p>:job:<id>:attempts:<device>         AttemptLog JSON: lost attempts of the fine-tune
    <p>:lock:job:<id>:<page>               the lock held while a page of a job advances

A resource is a table (`table:<table id>`) or a relation vector (`vector:<key>`). The prefix
(`EDGETRAIN_KEY_PREFIX`, default "edgetrain") lets several deployments or test runs share one
Redis server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .payloads import PretrainRequest
    from .schemas import EstimationRequest

DEFAULT_PREFIX = "edgetrain"


def table_id(device_type: str, model: str, input_shape: Sequence[int]) -> str:
    """The id of a lookup table: one per (device type, model, input shape)."""
    return f"{device_type}:{model}:{'x'.join(map(str, input_shape))}"


def _digest(request: BaseModel) -> str:
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()[:24]


def vector_key(request: EstimationRequest) -> str:
    """The key of a relation vector: a hash of everything it depends on."""
    return _digest(request)


def pretrained_key(request: PretrainRequest) -> str:
    """The key of pre-trained weights: a hash of the pre-training request."""
    return _digest(request)


def table_resource(tid: str) -> str:
    """The coordination name of a lookup table (claims, waiters, failures)."""
    return f"table:{tid}"


def vector_resource(key: str) -> str:
    """The coordination name of a relation vector (claims, waiters, failures)."""
    return f"vector:{key}"


@dataclass(frozen=True)
class Keys:
    """Builds every key under `prefix`."""

    prefix: str = DEFAULT_PREFIX

    def pattern(self) -> str:
        """A SCAN pattern matching every key under the prefix."""
        return f"{self.prefix}:*"

    def fleet_ids(self) -> str:
        return f"{self.prefix}:fleet:ids"

    def device(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:device:{device_id}"

    def fleet_seen(self) -> str:
        return f"{self.prefix}:fleet:seen"

    def device_owner(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:owner:{device_id}"

    def device_jobs(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:jobs:{device_id}"

    def device_cap(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:cap:{device_id}"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, node: str) -> str:
        return f"{self.prefix}:worker:{node}"

    def leases(self) -> str:
        return f"{self.prefix}:leases"

    def lease(self, task_id: str) -> str:
        return f"{self.prefix}:lease:{task_id}"

    def table(self, tid: str) -> str:
        return f"{self.prefix}:table:{tid}"

    def tables(self, device_type: str | None = None) -> str:
        """A SCAN pattern for the tables of one device type, or of all."""
        return f"{self.prefix}:table:{device_type + ':' if device_type else ''}*"

    def vector(self, key: str) -> str:
        return f"{self.prefix}:vector:{key}"

    def vector_parts(self, key: str) -> str:
        return f"{self.prefix}:vector-parts:{key}"

    def pretrained(self, key: str) -> str:
        return f"{self.prefix}:pretrained:{key}"

    def claim(self, resource: str) -> str:
        return f"{self.prefix}:claim:{resource}"

    def once(self, name: str) -> str:
        return f"{self.prefix}:once:{name}"

    def waiters(self, resource: str) -> str:
        return f"{self.prefix}:waiters:{resource}"

    def failure(self, resource: str) -> str:
        return f"{self.prefix}:failed:{resource}"

    def attempts(self, task_id: str) -> str:
        return f"{self.prefix}:attempts:{task_id}"

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def part(self, job_id: str, device_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:part:{device_id}"

    def progress(self, job_id: str, device_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:progress:{device_id}"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:events"

    def checkpoint(self, job_id: str, device_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:checkpoint:{device_id}"

    def attempt_log(self, job_id: str, device_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:attempts:{device_id}"

    def job_lock(self, job_id: str, page: int) -> str:
        return f"{self.prefix}:lock:job:{job_id}:{page}"
