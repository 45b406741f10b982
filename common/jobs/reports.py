"""Typed reports: what a job achieved per device, as the client and the CLI return it."""

from __future__ import annotations

from pydantic import Field

from ..control_axis import ControlAxis
from ..schemas import JobSpec, RunReport, Selection, Strict
from .state import FinetuneProgress, JobEvent, JobState, JobStatus, PartState, Started


class DeviceReport(Strict):
    """One device's part of a job: the choice (the plan, and what the device trains at when it
    chose otherwise), Baseline 1 for comparison, what was achieved."""

    device_id: str
    device_type: str | None
    simulated: bool | None = Field(description="figures come from a simulated twin")
    power_cap_w: float | None
    state: PartState
    reason: str | None
    selection: Selection | None = Field(description="the plan: the control worker's selection")
    estimated_time_to_accuracy_s: float | None = Field(description="eq. (2) with the proxy's N_b (s)")
    started: Started | None = Field(None, description="what the fine-tune trains at instead, chosen on the device")
    baseline1: Selection | None
    baseline1_estimated_time_to_accuracy_s: float | None
    estimated_speedup_vs_baseline1: float | None = Field(
        description="Baseline 1's estimate over that of what runs (`started`'s when set, both under the vector it chose with)"
    )
    achieved: RunReport | None
    over_cap: bool = Field(
        False, description="power measured while fine-tuning was above the cap in force by more than the sensor's resolution"
    )
    control: ControlAxis | None = Field(None, description="what the device's settings are (clocks, power limits)")
    progress: FinetuneProgress | None = None
    behind: str | None = Field(None, description="a queued part: the job whose fine-tune runs on its device now")


class JobReport(Strict):
    """A job's result per device, with its spec and event log."""

    job_id: str
    state: JobState
    spec: JobSpec
    devices: list[DeviceReport]
    events: list[JobEvent]

    @classmethod
    def from_status(cls, status: JobStatus) -> JobReport:
        """The report of a job's status: one DeviceReport per part."""
        devices = []
        for part in status.parts.values():
            ours, base = part.estimated_time_to_accuracy_s, part.baseline1_estimated_time_to_accuracy_s
            if part.started is not None:
                ours, base = part.started.estimated_time_to_accuracy_s, part.started.baseline1_estimated_time_to_accuracy_s
            devices.append(
                DeviceReport(
                    device_id=part.device_id,
                    device_type=part.device_type,
                    simulated=part.simulated,
                    power_cap_w=part.power_cap_w,
                    state=part.state,
                    reason=part.reason,
                    selection=part.selection,
                    estimated_time_to_accuracy_s=part.estimated_time_to_accuracy_s,
                    started=part.started,
                    baseline1=part.baseline1,
                    baseline1_estimated_time_to_accuracy_s=part.baseline1_estimated_time_to_accuracy_s,
                    estimated_speedup_vs_baseline1=base / ours if ours and base else None,
                    achieved=part.report,
                    over_cap=_over_cap(part.report, part.power_cap_w),
                    control=part.control,
                    progress=status.progress.get(part.device_id),
                    behind=status.running_there.get(part.device_id) if part.state == PartState.queued else None,
                )
            )
        return cls(job_id=status.job_id, state=status.state, spec=status.spec, devices=devices, events=status.events)


def completed_message(report: RunReport, target_accuracy: float) -> str:
    """The event of a fine-tune that ran to its end: its accuracy, and whether it reached the target."""
    reached = "" if report.reached else f", target {target_accuracy:g} not reached in {report.samples_processed} samples"
    return f"completed, accuracy {report.final_accuracy:.3f}{reached}"


def _over_cap(report: RunReport | None, power_cap_w: float | None) -> bool:
    """Whether a run's power went over the cap in force by more than its sensor's resolution
    (a reading within it may be at the cap): its power guard saw such a reading, or (a run whose
    cap never changed) its peak is that far over the job's cap."""
    if report is None:
        return False
    steady = not report.switches and power_cap_w is not None and report.peak_power_w > power_cap_w + report.power_resolution_w
    return report.guard.over_cap_s > 0 or steady
