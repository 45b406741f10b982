"""What the store holds of a federated job (no PyTorch here: the control worker reads it)."""

from __future__ import annotations

import hashlib
import statistics
from datetime import datetime
from enum import Enum

from pydantic import Field

from ..ids import Identifier
from ..jobs.state import JobEvent
from ..schemas import Strict, utc_now
from .plan import Assignment
from .spec import FederatedSpec


class Phase(str, Enum):
    """Where a federated job is (common/federated/events.py: the transitions)."""

    starting = "starting"  # before round 1
    training = "training"  # a round is open: its devices train
    aggregating = "aggregating"  # the round closed: the server aggregates its updates
    aggregated = "aggregated"  # the round's global model is stored: the next one may open
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


FINAL = frozenset({Phase.completed, Phase.failed, Phase.cancelled})


class DeviceRound(Strict):
    """What one device did in a round: its assignment and the measured device time (s) and
    energy (J) of its local steps (SIMULATED for twins)."""

    assignment: Assignment
    device_time_s: float
    energy_j: float
    samples: int
    simulated: bool = True


class Fairness(Strict):
    """The global model on the devices' held-out data: the mean over the devices (fraction),
    the worst device and its accuracy, and the spread (population standard deviation)."""

    mean: float
    worst: float
    worst_device: str
    spread: float

    @classmethod
    def of(cls, device_accuracy: dict[str, float]) -> Fairness | None:
        """The summary of per-device accuracies (None without any)."""
        if not device_accuracy:
            return None
        worst_device = min(sorted(device_accuracy), key=device_accuracy.__getitem__)
        return cls(mean=statistics.fmean(device_accuracy.values()), worst=device_accuracy[worst_device], worst_device=worst_device,
                   spread=statistics.pstdev(device_accuracy.values()))  # fmt: skip

    def line(self) -> str:
        """In words, accuracies in fractions."""
        return f"mean {self.mean:.4f}, worst {self.worst:.4f} ({self.worst_device}), spread (std) {self.spread:.4f}"


class RoundRecord(Strict):
    """One round: the global accuracy after it, its device time (s: its slowest participant,
    devices train side by side), the device time since the job started (s), the energy of
    every participant's local steps (J), what each did, the devices assigned whose update
    did not arrive before the round closed (`missing`; buffered: the devices of the works
    dropped since the aggregation before), and the global model's accuracy on every device's
    held-out data (`device_accuracy`, fraction; common/federated/fairness.py)."""

    round: int
    accuracy: float
    device_time_s: float
    elapsed_s: float
    energy_j: float
    devices: list[DeviceRound]
    missing: list[str] = Field(default_factory=list)
    device_accuracy: dict[str, float] = Field(default_factory=dict, description="device id -> accuracy on its held-out data")
    staleness: list[int] = Field(default_factory=list, description="buffered: each update's staleness, as `devices`")
    works: list[int] = Field(default_factory=list, description="buffered: each update's work, as `devices`")
    dropped: list[int] = Field(default_factory=list, description="buffered: works dropped since the aggregation before (in `energy_j`)")

    def fairness(self) -> Fairness | None:
        """Mean, worst and spread of `device_accuracy` (None without it)."""
        return Fairness.of(self.device_accuracy)


class LocalUpdate(Strict):
    """A device's update for a round: where its weights are (an artifact reference), the
    samples it holds (its FedAvg weight) and what its local steps took. Buffered: `work` names
    the work it hands in, `round` is the aggregation its work started before (the global model
    of `round` - 1 aggregations), `started_s` the device's clock then (device s since the job
    started), and `weights` hold the change from the work's starting weights. With drift
    correction, `gradient` is where its control variate is (the mean gradient of its steps;
    common/federated/rounds.py)."""

    job_id: str
    device_id: Identifier
    round: int = Field(ge=1)
    weights: str
    held_samples: int = Field(gt=0)
    trained: DeviceRound
    work: int | None = Field(None, ge=1)
    started_s: float = Field(0.0, ge=0)
    gradient: str | None = None

    def artifacts(self) -> list[str]:
        """The artifacts the update names: its weights and, with drift correction, its control variate."""
        return [self.weights, *([self.gradient] if self.gradient else [])]

    @property
    def key(self) -> str:
        """What the state files the update under: its device, and its work when buffered."""
        return self.device_id if self.work is None else work_key(self.device_id, self.work)

    @property
    def finished_s(self) -> float:
        """Buffered: the device's clock when its work was done (device s since the job started)."""
        return self.started_s + self.trained.device_time_s

    def digest(self) -> str:
        """A digest of the update: the state records it when it accepts the update, so only
        that update is aggregated, whatever else is written beside it."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:32]


def work_key(device_id: str, work: int) -> str:
    """A buffered update's key: its device and its work."""
    return f"{device_id}#{work}"


def work_of(key: str) -> int:
    """The work of a buffered update's key (`work_key`'s inverse: an id holds no '#')."""
    return int(key.rsplit("#", 1)[1])


class Work(Strict):
    """Buffered: a device's local work in flight: its number in the job, the aggregation it
    started before (`round`: it trains the global model of `round` - 1 aggregations, `weights`),
    the device's clock when it started (device s), until when its update is awaited, and its
    assignment."""

    work: int = Field(ge=1)
    round: int = Field(ge=1)
    weights: str
    started_s: float = Field(ge=0)
    deadline_at: datetime
    assignment: Assignment

    @property
    def device_id(self) -> str:
        """The device doing the work."""
        return self.assignment.device_id


class FederatedRecord(Strict):
    """A federated job as submitted."""

    job_id: str
    spec: FederatedSpec
    created_at: datetime = Field(default_factory=utc_now)


class FederatedState(Strict):
    """Where a federated job is: the round and its phase, the global model (an artifact
    reference; the spec's weights before round 1) and its accuracy, the device time so far,
    what the open round assigned and until when it waits, the updates it accepted (device ->
    the update's digest) and the devices whose updates a closed round aggregates. The rounds
    done are a list of their own (`FederatedStore.rounds`), so the state stays the same size
    however long the job runs."""

    phase: Phase = Phase.starting
    round: int = 0
    global_weights: str
    accuracy: float | None = None
    assignments: list[Assignment] = Field(default_factory=list)
    deadline_at: datetime | None = None
    received: dict[str, str] = Field(default_factory=dict, description="the open round's accepted updates: device -> digest")
    closed_with: list[str] = Field(default_factory=list)
    elapsed_s: float = Field(0.0, description="device time of the rounds done (s): the sum of each round's slowest update")
    empty_rounds: int = Field(0, description="rounds in a row that closed without an update")
    reason: str | None = None
    notice: str | None = Field(None, description="what the job waits for, when it waits")
    updated_at: datetime = Field(default_factory=utc_now)
    buffered: bool = Field(False, description="aggregation.mode buffered (no rounds: works in flight and a buffer)")
    in_flight: list[Work] = Field(default_factory=list, description="buffered: each device's work in flight")
    works_sent: int = Field(0, description="buffered: the works started so far (the last work's number)")
    aggregating: dict[str, str] = Field(default_factory=dict, description="buffered: the buffer being aggregated (key -> digest)")
    device_clock_s: dict[str, float] = Field(default_factory=dict, description="buffered: each device's clock (device s of its works)")
    dropped: list[Work] = Field(default_factory=list, description="buffered: the works dropped since the last aggregation recorded")
    control: str | None = Field(None, description="drift correction: the server's control variate (an artifact reference)")
    drift: dict[str, str] = Field(default_factory=dict, description="drift correction: device -> its control variate's artifact")

    def assigned(self, device_id: str) -> Assignment | None:
        """The open round's assignment of `device_id`, if it has one."""
        return next((a for a in self.assignments if a.device_id == device_id), None)

    def work(self, number: int) -> Work | None:
        """Buffered: the work in flight with this number, if it is."""
        return next((w for w in self.in_flight if w.work == number), None)

    def models_needed(self) -> set[str]:
        """The models the job still reads: its global model, (buffered) those its works in
        flight start from and, until it ends, (drift correction) the control variates."""
        needed = {self.global_weights, *(w.weights for w in self.in_flight)}
        if self.phase not in FINAL:
            needed |= {*([self.control] if self.control else []), *self.drift.values()}
        return needed


class TrainRequest(Strict):
    """A device's local training in a round (buffered: its work `work`), as the control worker
    sent it."""

    job_id: str
    round: int = Field(ge=1)
    device_id: Identifier
    batch_size: int
    frequency_hz: int
    local_steps: int
    work: int | None = Field(None, ge=1)


class AggregateRequest(Strict):
    """Aggregate a closed round."""

    job_id: str
    round: int = Field(ge=1)


class FederatedStatus(Strict):
    """A federated job as `status` shows it: what was submitted, where it is, its rounds and its
    newest events."""

    record: FederatedRecord
    state: FederatedState
    rounds: list[RoundRecord] = Field(default_factory=list)
    events: list[JobEvent] = Field(default_factory=list)

    @property
    def finished(self) -> bool:
        """Whether the job completed, failed or was cancelled."""
        return self.state.phase in FINAL
