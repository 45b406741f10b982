"""Every Redis key edgetrain uses, named in one place under a configurable prefix.

    <p>:store                              StoreIdentity JSON: which store this is (id, creation time)
    <p>:fleet:ids                          set of device ids
    <p>:fleet:device:<id>                  DeviceInfo JSON, expires without heartbeat
    <p>:fleet:seen                         zset device id -> last heartbeat (Redis time, s)
    <p>:fleet:labels                       hash device id -> its metrics labels, JSON [type, backend, simulated]
    <p>:fleet:owner:<id>                   the worker instance serving a device id (expires)
    <p>:fleet:jobs:<id>                    set of jobs with an unfinished part on the device
    <p>:fleet:running                      hash device id -> the job whose fine-tune an attempt runs there now
    <p>:fleet:cap:<id>                     hash: the power cap set on the device while it runs
    <p>:fleet:caps                         hash device id -> the power cap set on it (W), for metrics
    <p>:workers                            zset worker node -> last heartbeat (Redis time, s)
    <p>:worker:<node>                      WorkerInfo JSON: role, queues, host, pid
    <p>:leases                             zset task id -> last renewal (Redis time, s)
    <p>:lease:<task id>                    Lease JSON: which task runs where, for whom
    <p>:stopping:<node>:<pid>              a worker is shutting down: its fine-tunes stop (expires)
    <p>:table:<type>:<model>:<shape>       ProfileTable JSON
    <p>:vector:<key>                       RelationVector JSON
    <p>:vector-parts:<key>                 hash "<b>:<seed>" -> TrainingOutcome JSON
    <p>:vector-request:<key>               EstimationRequest JSON: an estimation sent to the server pool
    <p>:vector-progress:<key>              hash "<b>:<seed>" -> ProxyRunProgress JSON of runs training (expires)
    <p>:profiling:<type>:<model>           ProfilingProgress JSON: a table being measured (expires)
    <p>:pretrained:<key>                   PretrainResult JSON: weights pre-trained for a request
    <p>:learned:<data key>                 list of FinetuneRecord JSON, newest first: what fine-tunes
                                           on that data measured (common/finetune/learned.py)
    <p>:learned-count:<data key>           how many records were ever kept under that data key
    <p>:learned-live:<data key>            hash record id -> FinetuneRecord JSON of the fine-tunes on that
                                           data running now (their solo curve so far; expires)
    <p>:learned-trust:<proxy family>       hash data key -> ProxyCheck JSON: how far that proxy's r_b were
                                           from what runs on each data measured (common/finetune/trust.py)
    <p>:learned-index:<kind key>           set of data keys of one kind of data (model, weights,
                                           dataset name, learning-rate rule): priors from similar data
    <p>:claim:<resource>                   who is producing a table or vector (expires)
    <p>:once:<name>                        an action that must happen once (expires)
    <p>:waiters:<resource>                 jobs to advance when a resource is ready or failed
    <p>:waiting                            zset of resources with waiters -> when the reaper last
                                           found them claimed, or their first waiter came (s)
    <p>:failed:<resource>                  why producing a resource failed (expires)
    <p>:attempts:<task id>                 deliveries of a task (expires)
    <p>:jobs                               zset of job ids by submit time
    <p>:unplanned                          zset of jobs no control worker took up yet -> when sent (s)
    <p>:plan-doorbell                      jobs submitted since a `plan_submitted` was due (expires)
    <p>:plan-now                           list: a due `plan_submitted` waits no longer
    <p>:job:<id>                           JobRecord JSON
    <p>:job:<id>:part:<device>             DevicePart JSON
    <p>:job:<id>:progress:<device>         FinetuneProgress JSON
    <p>:job:<id>:events                    list of JobEvent JSON (the newest MAX_EVENTS_KEPT)
    <p>:job:<id>:states                    hash: the job's summary: part state -> how many parts are in
                                           it, parts that ended short of the target, and the totals of
                                           its parts' progress (samples, device s, J)
    <p>:job:<id>:in:<state>                set of the job's devices whose part is in that state
    <p>:sent                               zset task id of a profile, estimation or proxy run sent and
                                           not yet run -> when it was last seen held (s)
    <p>:sent:<task id>                     SentTask JSON: the task as it can be sent again
    <p>:dispatched                         zset "<job>/<device>" of fine-tunes dispatched and not
                                           finished -> when a task was last seen for it (s)
    <p>:job:<id>:checkpoint:<device>       CheckpointRef JSON: the fine-tune's last checkpoint
    <p>:federated                          zset of federated job ids by submit time
    <p>:federated:active                   set of federated jobs not yet finished
    <p>:fed:<id>                           FederatedRecord JSON (written by the submitter)
    <p>:fed:<id>:cancel                    when an operator asked to cancel it (written by the submitter)
    <p>:fedrun:<id>:state                  FederatedState JSON: round, phase, global model (workers only)
    <p>:fedrun:<id>:rounds                 list of RoundRecord JSON: every round aggregated, in order
    <p>:fedrun:<id>:round:<r>              hash device -> LocalUpdate JSON: the updates of round r
    <p>:fedrun:<id>:buffer                 hash device#work -> LocalUpdate JSON: a buffered job's updates
                                           not yet aggregated
    <p>:fedrun:<id>:artifacts              set of artifact references: the job's global models, and once
                                           it ended the updates it did not aggregate, until deleted
    <p>:fedrun:<id>:events                 list of JobEvent JSON (the newest MAX_EVENTS_KEPT)
    <p>:fedrun:<id>:lock                   the lock held while the job advances
    <p>:set-aside:<key>:<UTC time>         a record that no longer loaded, moved from <p>:<key> as it was
    <p>:set-asides                         hash set-aside key -> SetAside JSON: where it was, why, when
    <p>:counter:<name>                     hash label -> count: events the metrics count (tasks handed on, retries)
    <p>:store:master                       HOST:PORT of the Redis master last seen behind Sentinel

A table, vector or pre-trained weights record that no longer loads (an older format, a
hand-edited key) is set aside rather than deleted (common/store/resources.py), and produced
again. Every key built from a job or device id checks the id first (`ids.py`:
InvalidIdError), so no id can reach another record's key. A resource is a table
(`table:<table id>`) or a relation vector (`vector:<key>`). The prefix (`EDGETRAIN_KEY_PREFIX`,
default "edgetrain") lets several deployments or test runs share one Redis server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .ids import checked_id

if TYPE_CHECKING:
    from datetime import datetime

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


def learned_key(model: str, weights: str, data: BaseModel, target_accuracy: float, lr: BaseModel) -> str:
    """The key of fine-tune records on one data: model, weights, data identity, target
    accuracy and learning-rate rule (what N_b depends on)."""
    parts = [model, weights, data.model_dump_json(), repr(float(target_accuracy)), lr.model_dump_json()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def similar_key(model: str, weights: str, dataset_name: str, lr: BaseModel) -> str:
    """The key that groups records of one kind of data: model, weights, dataset name and
    learning-rate rule (N_b depends on the rule and optimizer as on the data)."""
    return hashlib.sha256("\n".join([model, weights, dataset_name, lr.model_dump_json()]).encode()).hexdigest()[:24]


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

    def identity(self) -> str:
        return f"{self.prefix}:store"

    def fleet_ids(self) -> str:
        return f"{self.prefix}:fleet:ids"

    def device(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:device:{checked_id(device_id, 'device_id')}"

    def fleet_seen(self) -> str:
        return f"{self.prefix}:fleet:seen"

    def fleet_labels(self) -> str:
        return f"{self.prefix}:fleet:labels"

    def fleet_awaited(self) -> str:
        return f"{self.prefix}:fleet:awaited"

    def device_owner(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:owner:{checked_id(device_id, 'device_id')}"

    def device_jobs(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:jobs:{checked_id(device_id, 'device_id')}"

    def running(self) -> str:
        return f"{self.prefix}:fleet:running"

    def device_cap(self, device_id: str) -> str:
        return f"{self.prefix}:fleet:cap:{checked_id(device_id, 'device_id')}"

    def device_caps(self) -> str:
        """A SCAN pattern matching every device's cap (`device_cap`)."""
        return f"{self.prefix}:fleet:cap:*"

    def fleet_caps(self) -> str:
        return f"{self.prefix}:fleet:caps"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, node: str) -> str:
        return f"{self.prefix}:worker:{node}"

    def leases(self) -> str:
        return f"{self.prefix}:leases"

    def lease(self, task_id: str) -> str:
        return f"{self.prefix}:lease:{task_id}"

    def consumers(self) -> str:
        return f"{self.prefix}:consumers"

    def stopping(self, instance: str) -> str:
        return f"{self.prefix}:stopping:{instance}"

    def table(self, tid: str) -> str:
        return f"{self.prefix}:table:{tid}"

    def tables(self, device_type: str | None = None) -> str:
        """A SCAN pattern for the tables of one device type, or of all."""
        return f"{self.prefix}:table:{device_type + ':' if device_type else ''}*"

    def vector(self, key: str) -> str:
        return f"{self.prefix}:vector:{key}"

    def vector_parts(self, key: str) -> str:
        return f"{self.prefix}:vector-parts:{key}"

    def vector_request(self, key: str) -> str:
        return f"{self.prefix}:vector-request:{key}"

    def vector_progress(self, key: str) -> str:
        return f"{self.prefix}:vector-progress:{key}"

    def profiling(self, device_type: str, model: str) -> str:
        return f"{self.prefix}:profiling:{device_type}:{model}"

    def pretrained(self, key: str) -> str:
        return f"{self.prefix}:pretrained:{key}"

    def learned(self, data_key: str) -> str:
        return f"{self.prefix}:learned:{data_key}"

    def learned_count(self, data_key: str) -> str:
        return f"{self.prefix}:learned-count:{data_key}"

    def learned_live(self, data_key: str) -> str:
        return f"{self.prefix}:learned-live:{data_key}"

    def learned_trust(self, family: str) -> str:
        return f"{self.prefix}:learned-trust:{family}"

    def learned_index(self, kind_key: str) -> str:
        return f"{self.prefix}:learned-index:{kind_key}"

    def claim(self, resource: str) -> str:
        return f"{self.prefix}:claim:{resource}"

    def once(self, name: str) -> str:
        return f"{self.prefix}:once:{name}"

    def waiters(self, resource: str) -> str:
        return f"{self.prefix}:waiters:{resource}"

    def waiting(self) -> str:
        return f"{self.prefix}:waiting"

    def failure(self, resource: str) -> str:
        return f"{self.prefix}:failed:{resource}"

    def attempts(self, task_id: str) -> str:
        return f"{self.prefix}:attempts:{task_id}"

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def unplanned(self) -> str:
        return f"{self.prefix}:unplanned"

    def plan_doorbell(self) -> str:
        return f"{self.prefix}:plan-doorbell"

    def plan_now(self) -> str:
        return f"{self.prefix}:plan-now"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{checked_id(job_id, 'job_id')}"

    def part(self, job_id: str, device_id: str) -> str:
        return f"{self.job(job_id)}:part:{checked_id(device_id, 'device_id')}"

    def progress(self, job_id: str, device_id: str) -> str:
        return f"{self.job(job_id)}:progress:{checked_id(device_id, 'device_id')}"

    def events(self, job_id: str) -> str:
        return f"{self.job(job_id)}:events"

    def checkpoint(self, job_id: str, device_id: str) -> str:
        return f"{self.job(job_id)}:checkpoint:{checked_id(device_id, 'device_id')}"

    def job_states(self, job_id: str) -> str:
        return f"{self.job(job_id)}:states"

    def parts_in(self, job_id: str, state: str) -> str:
        """The set of the job's devices whose part is in `state`."""
        return f"{self.job(job_id)}:in:{state}"

    def federated_jobs(self) -> str:
        return f"{self.prefix}:federated"

    def federated_active(self) -> str:
        return f"{self.prefix}:federated:active"

    def federated(self, job_id: str) -> str:
        return f"{self.prefix}:fed:{checked_id(job_id, 'job_id')}"

    def federated_cancel(self, job_id: str) -> str:
        return f"{self.federated(job_id)}:cancel"

    def federated_run(self, job_id: str) -> str:
        """The prefix of what the workers write of a federated job (no submitter may)."""
        return f"{self.prefix}:fedrun:{checked_id(job_id, 'job_id')}"

    def federated_state(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:state"

    def federated_lock(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:lock"

    def federated_rounds(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:rounds"

    def federated_round(self, job_id: str, round_number: int) -> str:
        return f"{self.federated_run(job_id)}:round:{int(round_number)}"

    def federated_buffer(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:buffer"

    def federated_artifacts(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:artifacts"

    def federated_events(self, job_id: str) -> str:
        return f"{self.federated_run(job_id)}:events"

    def sent_tasks(self) -> str:
        return f"{self.prefix}:sent"

    def sent(self, task_id: str) -> str:
        return f"{self.prefix}:sent:{task_id}"

    def dispatched(self) -> str:
        return f"{self.prefix}:dispatched"

    def set_aside(self, key: str, at: datetime) -> str:
        """Where the record under `key` (a key of this prefix) is kept once set aside at `at` (UTC)."""
        return f"{self.prefix}:set-aside:{key.removeprefix(self.prefix + ':')}:{at:%Y%m%dT%H%M%S.%fZ}"

    def set_asides(self) -> str:
        return f"{self.prefix}:set-asides"

    def counter(self, name: str) -> str:
        return f"{self.prefix}:counter:{name}"

    def store_master(self) -> str:
        return f"{self.prefix}:store:master"
