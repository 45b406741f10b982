"""A job's records: its spec as submitted, each device's part, progress and events."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import Enum

from pydantic import Field

from ..control_axis import ControlAxis
from ..payloads import FinetuneRequest
from ..progress import Preparation
from ..schemas import JobSpec, RunReport, Selection, Strict, utc_now


class PartState(str, Enum):
    """Where one device's share of a job is (common/jobs/events.py has the transitions):
    `queued` once its fine-tune is dispatched, while it waits on the device's queue (behind
    what runs there) and no attempt runs it; `finetuning` while an attempt runs it."""

    pending = "pending"
    profiling = "profiling"
    estimating = "estimating"
    queued = "queued"
    finetuning = "finetuning"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({PartState.completed, PartState.failed, PartState.cancelled})
DISPATCHED = frozenset({PartState.queued, PartState.finetuning})  # its fine-tune is on the device's queue or runs


class Refused(ValueError):
    """An event that does not apply to a job's part or federated state as it is; the message says why."""


class Dispatch(Strict):
    """The fine-tune the control worker sent for a part: its token (the Celery task id) and the
    request, so a device runs only what was dispatched and a lost message can be sent again."""

    token: str
    request: FinetuneRequest
    at: datetime = Field(default_factory=utc_now)


class Attempt(Strict):
    """One run of a part's task on a worker: every write it makes is fenced by `token`."""

    token: str
    number: int = Field(ge=1, description="1 for the first attempt, more after lost ones")
    node: str = Field(description="the worker node running it")
    started_at: datetime = Field(default_factory=utc_now)


class Started(Strict):
    """The configuration a fine-tune trains at from its first step where the device chose
    otherwise than the plan (what earlier fine-tunes measured on its data, the guard against
    Baseline 1): `selection` (its note says why), Baseline 1 and their estimates, all under the
    vector it chose with (`vector`, in words)."""

    selection: Selection
    estimated_time_to_accuracy_s: float | None
    baseline1: Selection | None = None
    baseline1_estimated_time_to_accuracy_s: float | None = None
    vector: str = Field(description="where the r_b it chose with come from, in words")


class DevicePart(Strict):
    """The state of one device's share of a job (changed only by common/jobs/events.py)."""

    device_id: str
    power_cap_w: float | None
    state: PartState = PartState.pending
    reason: str | None = None
    device_type: str | None = None
    simulated: bool | None = None
    control: ControlAxis | None = Field(None, description="what the device's settings are (clocks, power limits)")
    selection: Selection | None = Field(None, description="the plan: the control worker's selection, dispatched")
    started: Started | None = Field(None, description="what its fine-tune trains at instead, chosen on the device")
    baseline1: Selection | None = None
    estimated_time_to_accuracy_s: float | None = None
    baseline1_estimated_time_to_accuracy_s: float | None = None
    report: RunReport | None = None
    waiting: str | None = Field(None, description="what the part waits for, when it waits on something unusual")
    device_missing: bool = Field(False, description="`waiting` says its device stopped heartbeating")
    dispatch: Dispatch | None = Field(None, description="the fine-tune dispatched for the part")
    attempt: Attempt | None = Field(None, description="the live attempt of its fine-tune, if one runs")
    attempts: int = Field(0, description="fine-tune attempts started")
    lost_device_time_s: float = Field(0.0, description="device time of the work lost with dead attempts (s)")
    lost_energy_j: float = Field(0.0, description="energy of the work lost with dead attempts (J)")
    lost_counted_at: datetime | None = Field(None, description="when the progress last counted as lost was written")
    cancel_requested_at: datetime | None = Field(None, description="when a running attempt was asked to stop")
    requeued_at: datetime | None = Field(None, description="when the part was last planned again")
    updated_at: datetime = Field(default_factory=utc_now)


class JobState(str, Enum):
    """A job's state, derived from how many of its parts are in each state by `state_of_counts`."""

    queued = "queued"  # every part pending
    running = "running"
    cancelling = "cancelling"  # cancelled while parts are left to stop
    completed = "completed"  # every device part completed
    partial = "partial"  # some parts completed, some failed
    failed = "failed"  # every part failed
    cancelled = "cancelled"  # cancelled before every part finished


class JobRecord(Strict):
    """What was submitted, and when."""

    job_id: str
    spec: JobSpec
    created_at: datetime = Field(default_factory=utc_now)
    cancelled_at: datetime | None = Field(None, description="when cancelling the job was asked for")


class EventKind(str, Enum):
    """What happened to a job; events carry a kind for programs and a message for people."""

    submitted = "submitted"
    table_not_reused = "table_not_reused"
    profiling = "profiling"  # profiling dispatched to a device
    estimating = "estimating"  # relation-vector estimation dispatched to the server pool
    selected = "selected"  # (b, f) selected, fine-tuning dispatched
    started = "started"  # a fine-tune trains at another (b, f) than the plan, chosen on the device
    attempt_lost = "attempt_lost"  # the process running a task stopped; the task was handed on
    resumed = "resumed"  # a fine-tune continued from its checkpoint
    checkpoint_failed = "checkpoint_failed"  # a fine-tune could not save a checkpoint and went on without
    reconfigured = "reconfigured"  # a running fine-tune changed (b, f), paused or resumed for a new cap
    device_missing = "device_missing"  # a device stopped heartbeating while a part needs it
    baseline1_unavailable = "baseline1_unavailable"
    completed = "completed"
    failed = "failed"
    finished = "finished"  # every part is completed, failed or cancelled
    cancelled = "cancelled"
    requeued = "requeued"  # a failed or cancelled part is planned again
    set_aside = "set_aside"  # a stored table or vector no longer loaded: set aside, and produced again
    federated_round = "federated_round"  # a round of a federated job opened, closed or was aggregated
    federated_update = "federated_update"  # a device's update of a federated round arrived, late or refused
    store_failover = "store_failover"  # Redis Sentinel promoted a replica: the store runs on a new master


EventField = str | int | float | bool | None


class JobEvent(Strict):
    """One entry of a job's event log: its kind and typed `fields` for programs (e.g. the samples
    a fine-tune resumed at), the sentence made from them for people."""

    at: datetime = Field(default_factory=utc_now)
    kind: EventKind
    device_id: str | None = None
    message: str
    fields: dict[str, EventField] = Field(default_factory=dict)

    def line(self) -> str:
        """The event as one line for people: time, device, message."""
        who = f"{self.device_id}: " if self.device_id else ""
        return f"{self.at:%H:%M:%S} {who}{self.message}"


class FinetuneProgress(Strict):
    """A running fine-tune's latest evaluation."""

    samples: int
    accuracy: float
    device_time_s: float = Field(description="device time so far (simulated on a twin)")
    energy_j: float
    target_accuracy: float
    max_samples: int
    batch_size: int | None = Field(None, description="the batch size training runs with now")
    frequency_hz: int | None = Field(None, description="the frequency it runs at now (Hz)")
    power_cap_w: float | None = Field(None, description="the cap in force now (W)")
    paused: str | None = Field(None, description="why training is paused at idle clocks, while it is")
    power_w: float | None = Field(None, description="mean board power since the previous report (W)")
    peak_power_w: float | None = Field(None, description="the highest board power reading of the run so far (W)")
    samples_per_s: float | None = Field(None, description="samples per second of device time since the previous report")
    over_cap_s: float = Field(0.0, description="device time of measured regions whose peak was over the cap (s)")
    guard_step_downs: int = Field(0, description="frequency step-downs of the power guard so far")
    switches: int = Field(0, description="configuration changes so far (cap, guard, pause, resume)")
    updated_at: datetime = Field(default_factory=utc_now)


class CheckpointRef(Strict):
    """Where a running fine-tune saved its state, and how far it had got."""

    url: str = Field(description="artifact URL of the checkpoint (on the device's worker host)")
    samples: int
    steps: int
    device_time_s: float
    energy_j: float
    saved_at: datetime = Field(default_factory=utc_now)


class JobSummary(Strict):
    """One line of the job list."""

    job_id: str
    state: JobState
    model: str
    devices: int
    created_at: datetime
    not_reached: int = Field(0, description="devices whose fine-tune ended without reaching the target accuracy")
    failed: int = Field(0, description="parts that failed")
    failure: str | None = Field(None, description='one failed part and why: "device: reason"')


class JobStatus(Strict):
    """Everything known about a job, read in one go."""

    job_id: str
    state: JobState
    spec: JobSpec
    parts: dict[str, DevicePart]
    progress: dict[str, FinetuneProgress] = Field(default_factory=dict)
    created_at: datetime
    events: list[JobEvent] = Field(default_factory=list)
    cancelled_at: datetime | None = None
    notes: list[str] = Field(default_factory=list, description="what the job waits for that nothing will do")
    preparation: Preparation = Field(default_factory=Preparation, description="tables and vector being made for it")
    counts: dict[PartState, int] = Field(description="the job's parts in each state, all of them")
    running_there: dict[str, str] = Field(
        default_factory=dict, description="for each queued part shown whose device runs a fine-tune now: that fine-tune's job"
    )
    shown: str | None = Field(None, description="which parts `parts` holds when not all of them (a big job's summary)")

    def digest(self) -> str:
        """What changes as the job goes on: part states and waits (and what a queued part waits
        behind), progress, notes, events, the tables and vector being made."""
        parts = ";".join(f"{d}={p.state.value}:{p.waiting}:{self.running_there.get(d)}" for d, p in self.parts.items())
        progress = ";".join(f"{d}={p.samples}" for d, p in self.progress.items())
        made = self.preparation.model_dump_json()
        counts = ";".join(f"{s.value}={n}" for s, n in self.counts.items())
        newest = self.events[-1].at.isoformat() if self.events else ""
        return f"{self.state.value}|{counts}|{parts}|{progress}|{len(self.events)}:{newest}|{'|'.join(self.notes)}|{made}"

    def __str__(self) -> str:
        """One line per job: its state and each device's."""

        def part(device_id: str, p: DevicePart) -> str:
            done = self.progress.get(device_id)
            more = f" (samples {done.samples}, accuracy {done.accuracy:.3f})" if done and p.state == PartState.finetuning else ""
            if p.cancel_requested_at is not None:
                more += ", stops at its next step"
            return f"{device_id} {self.describe(device_id)}{more}"

        return f"job {self.job_id} {self.state.value}: " + ", ".join(part(d, p) for d, p in self.parts.items())

    @property
    def finished(self) -> bool:
        """Every part is completed, failed or cancelled (shown or not)."""
        return all(n == 0 or s in TERMINAL for s, n in self.counts.items())

    def describe(self, device_id: str) -> str:
        """A part's state in words; a queued one says what it waits behind on its device."""
        part = self.parts[device_id]
        if part.state != PartState.queued:
            return part.state.value
        ahead = self.running_there.get(device_id)
        if ahead is None or ahead == self.job_id:
            return "queued on the device (nothing runs there now: it starts when the device's worker takes it)"
        return f"queued on the device behind job {ahead} (fine-tuning there now)"

    def counts_line(self) -> str:
        """Parts per state, e.g. `10000 parts: 9950 finetuning, 50 failed`, `1 part: 1 queued`."""
        total = sum(self.counts.values())
        noun = "part" if total == 1 else "parts"
        return f"{total} {noun}: " + ", ".join(f"{self.counts[s]} {s.value}" for s in PartState if self.counts.get(s))


def state_of_counts(counts: Mapping[PartState, int], cancelled: bool = False) -> JobState:
    """A job's state from how many of its parts are in each state (`cancelled`: cancelling it
    was asked for)."""
    states = {state for state, n in counts.items() if n > 0}
    if not states <= TERMINAL:
        if cancelled:
            return JobState.cancelling
        return JobState.running if states != {PartState.pending} else JobState.queued
    if PartState.cancelled in states:
        return JobState.cancelled
    if states == {PartState.completed}:
        return JobState.completed
    if states == {PartState.failed}:
        return JobState.failed
    return JobState.partial
