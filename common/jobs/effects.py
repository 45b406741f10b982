"""What a planner asks the workers to do besides changing state: typed effects, carried out by
the task that applied the planner's event (tasks/workflow.py, tasks/federated.py), only when
the event applied. A planner stays a pure function: it names the effect, the task sends it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..control_axis import ControlAxis
from ..federated.records import AggregateRequest, TrainRequest
from ..payloads import FinetuneRequest, ProfileRequest
from ..schemas import EstimationRequest
from .state import EventKind


@dataclass(frozen=True)
class ClaimAndProfile:
    """Claim the production of table `table_id` for the job and, when the claim is won, send
    `request` to its device (the owner becomes the claim's token); else wait for the holder.
    `stored_at`: when the stored table the planner saw was made (None: none was stored)."""

    table_id: str
    request: ProfileRequest
    stored_at: datetime | None = None


@dataclass(frozen=True)
class ClaimAndEstimate:
    """Claim the relation vector `vector_key` for the job and, when won, send its estimation."""

    vector_key: str
    request: EstimationRequest


@dataclass(frozen=True)
class SendFineTune:
    """Send the fine-tune of a part as task `token` to its device (the part records the token);
    its label gives the setting in the unit of the device's `control` axis."""

    token: str
    request: FinetuneRequest
    control: ControlAxis | None = None


@dataclass(frozen=True)
class SendTrain:
    """Send a device its local training of a federated round (`setting`: its frequency in the
    unit of the device's control axis, for the task's label)."""

    request: TrainRequest
    setting: str | None = None


@dataclass(frozen=True)
class Aggregate:
    """Aggregate a closed round on the server pool; written in the ledger of sent tasks with
    the change that closed the round, so it is sent again until it has run."""

    request: AggregateRequest


@dataclass(frozen=True)
class ReleaseTableClaim:
    """Free the claim on table `table_id` if the job holds it (its device went missing, so the
    profile cannot happen there now), and wake the jobs waiting on it."""

    table_id: str


@dataclass(frozen=True)
class AwaitDevice:
    """A part waits for a device that has not registered yet: advance its job when the device
    registers, or at `by` (UTC), when the part fails unless it did."""

    device_id: str
    by: datetime


@dataclass(frozen=True)
class Note:
    """A line for the job's log that changes nothing, written once under the name `once` (a job
    plans a part many times)."""

    once: str
    kind: EventKind
    message: str
    device_id: str | None = None


Effect = ClaimAndProfile | ClaimAndEstimate | SendFineTune | SendTrain | Aggregate | ReleaseTableClaim | AwaitDevice | Note
