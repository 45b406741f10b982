"""The rules of a part's transitions (common/jobs/events.py), without Redis: each event from
each state, stale and forged attempts, and reports that do not match what was dispatched."""

from datetime import datetime, timedelta, timezone

import pytest

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import (
    AttemptCancelled,
    AttemptFailed,
    AttemptFinished,
    AttemptLost,
    AttemptNoticed,
    AttemptSelected,
    AttemptStarted,
    AttemptStopped,
    Cancelled,
    CancelRequested,
    Dispatched,
    Failed,
    Identified,
    Prepared,
    Redispatched,
    Refused,
    ReportMismatch,
    Requeued,
    Waiting,
    request_digest,
    transition,
)
from edgetrain.common.jobs.state import TERMINAL, DevicePart, EventKind, PartState, Started
from edgetrain.common.payloads import finetune_request
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import ConfigSwitch, JobSpec, RunReport, Selection

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0}], target_accuracy=0.9, max_samples=1000))
CHOICE = Selection(batch_size=16, frequency_hz=900, estimated_time_s=1.0, peak_power_w=4.0)
REQUEST = finetune_request("j1", SPEC, SPEC.devices[0], CHOICE, "twin:smallcnn:1x28x28", "vkey")
IDENTITY = Identified(device_type="twin", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)


def part(state: PartState = PartState.pending, **changes) -> DevicePart:
    return DevicePart(device_id="d1", power_cap_w=5.0, state=state, updated_at=NOW - timedelta(seconds=1), **changes)


def apply(p: DevicePart, *events):
    for event in events:
        p = transition(p, event, NOW).part
    return p


def dispatched(token: str = "t1") -> DevicePart:
    return apply(part(), Dispatched(device=IDENTITY, token=token, request=REQUEST, selection=CHOICE, estimated_time_to_accuracy_s=2.0))


def started(attempt: str = "a1", token: str = "t1") -> AttemptStarted:
    return AttemptStarted(dispatch=token, digest=request_digest(REQUEST), attempt=attempt, node="device-d1@h")


def report(**changes) -> RunReport:
    base = dict(
        device_id="d1",
        device_type="twin",
        simulated=True,
        batch_size=16,
        frequency_hz=900,
        reached=True,
        final_accuracy=0.91,
        samples_to_accuracy=500,
        samples_processed=512,
        steps=32,
        device_time_s=1.0,
        energy_j=3.0,
        peak_power_w=4.0,
        wall_s=2.0,
    )
    return RunReport(**(base | changes))


def test_a_dispatch_records_the_selection_the_token_and_a_log_line() -> None:
    change = transition(part(PartState.profiling), Dispatched(device=IDENTITY, token="t1", request=REQUEST, selection=CHOICE,
                                                              estimated_time_to_accuracy_s=2.0), NOW)  # fmt: skip
    p = change.part
    assert p.state == PartState.queued and p.dispatch.token == "t1" and p.dispatch.request == REQUEST
    assert p.selection == CHOICE and p.device_type == "twin" and p.attempt is None and p.updated_at == NOW
    assert change.kind == EventKind.selected and "b=16" in change.message and "queued on the device" in change.message


def test_a_dispatched_fine_tune_is_queued_on_the_device_until_an_attempt_takes_it_up() -> None:
    queued = dispatched()
    assert queued.state == PartState.queued and queued.attempt is None
    running = apply(queued, started())
    assert running.state == PartState.finetuning and running.attempt.token == "a1"
    with pytest.raises(Refused, match="applies only when it is finetuning"):  # only a running attempt has notices
        transition(queued, AttemptNoticed(attempt="a1", notice="x"), NOW)
    assert apply(running, AttemptLost(attempt="a1", outcome="re-queued")).state == PartState.queued


def test_an_attempt_that_starts_at_another_configuration_than_the_plan_says_which_and_why() -> None:
    chosen = Selection(batch_size=128, frequency_hz=900, estimated_time_s=0.8, peak_power_w=4.5, note="evidence: records")
    event = AttemptSelected(attempt="a1", started=Started(selection=chosen, estimated_time_to_accuracy_s=1.5, vector="learned"))
    change = transition(apply(dispatched(), started()), event, NOW)
    assert change.part.started.selection == chosen and change.part.selection == CHOICE and change.kind == EventKind.started
    assert "b=128" in change.message and "planned b=16" in change.message and "evidence: records" in change.message
    with pytest.raises(Refused, match="no longer holds"):
        transition(change.part, event.model_copy(update={"attempt": "a0"}), NOW)
    again = apply(change.part, AttemptFailed(attempt="a1", reason="x"), Requeued())
    assert again.started is None and again.selection is None


def test_an_attempt_is_accepted_only_for_the_dispatched_task_and_request() -> None:
    p = dispatched()
    with pytest.raises(Refused, match="not dispatched"):
        transition(p, started(token="forged"), NOW)
    forged = started().model_copy(update={"digest": request_digest(REQUEST.model_copy(update={"batch_size": 64}))})
    with pytest.raises(Refused, match="not the one dispatched"):
        transition(p, forged, NOW)
    running = apply(p, started())
    assert running.attempt.token == "a1" and running.attempt.number == 1 and running.attempts == 1
    with pytest.raises(Refused, match="attempt 1 runs it"):
        transition(running, started("a2"), NOW)


def test_a_lost_attempt_lets_a_new_one_in_and_the_old_one_is_refused_whatever_it_writes() -> None:
    p = apply(dispatched(), started("a1"), AttemptLost(attempt="a1", outcome="re-queued"))
    assert p.attempt is None and p.state == PartState.queued and "re-queued" in p.waiting
    resumed = transition(p, started("a2").model_copy(update={"lost_device_time_s": 0.5, "resumed_at_samples": 256}), NOW)
    assert resumed.fields == {"attempt": 2, "samples": 256}  # what programs read of the log line
    p = resumed.part
    assert p.attempt.number == 2 and p.lost_device_time_s == 0.5
    for stale in (AttemptNoticed(attempt="a1", notice="x"), AttemptFinished(attempt="a1", report=report()),
                  AttemptFailed(attempt="a1", reason="x"), AttemptCancelled(attempt="a1", reason="x"),
                  AttemptLost(attempt="a1", outcome="x"), AttemptStopped(attempt="a1", reason="x")):  # fmt: skip
        with pytest.raises(Refused, match="no longer holds"):
            transition(p, stale, NOW)
    done = transition(p, AttemptFinished(attempt="a2", report=report()), NOW)
    assert done.part.state == PartState.completed and done.part.report.attempts == 2
    assert done.part.report.lost_device_time_s == 0.5 and done.part.attempt is None


def test_final_states_refuse_everything_but_a_requeue_of_a_failed_or_cancelled_part() -> None:
    for state in TERMINAL:
        p = part(state)
        for event in (Waiting(notice="x"), Prepared(state=PartState.profiling, device=IDENTITY), Failed(reason="x"),
                      Cancelled(reason="x"), started()):  # fmt: skip
            with pytest.raises(Refused):
                transition(p, event, NOW)
    with pytest.raises(Refused, match="submit the job again"):
        transition(part(PartState.completed), Requeued(), NOW)
    again = transition(part(PartState.failed, reason="broken"), Requeued(), NOW)
    assert again.part.state == PartState.pending and again.part.reason is None and again.part.requeued_at == NOW
    assert again.kind == EventKind.requeued


def test_a_requeue_of_a_running_or_planning_part_says_what_to_do() -> None:
    with pytest.raises(Refused, match="goes on by itself"):
        transition(part(PartState.estimating), Requeued(), NOW)
    with pytest.raises(Refused, match="cancel the job first"):
        transition(apply(dispatched(), started()), Requeued(), NOW)
    orphan = transition(dispatched(), Requeued(), NOW).part  # a fine-tune no attempt runs
    assert orphan.state == PartState.pending and orphan.dispatch is None


def test_cancel_is_at_once_without_an_attempt_and_a_request_with_one() -> None:
    with pytest.raises(Refused, match="asked to stop instead"):
        transition(apply(dispatched(), started()), Cancelled(reason="cancelled"), NOW)
    assert transition(dispatched(), Cancelled(reason="cancelled"), NOW).part.state == PartState.cancelled
    with pytest.raises(Refused, match="cancelled at once instead"):
        transition(dispatched(), CancelRequested(reason="cancelled"), NOW)
    asked = apply(dispatched(), started(), CancelRequested(reason="cancelled"))
    assert asked.cancel_requested_at == NOW and asked.state == PartState.finetuning
    with pytest.raises(Refused, match="cancelled"):  # a new attempt of a cancelled part does not start
        transition(apply(asked, AttemptLost(attempt="a1", outcome="x")), started("a2"), NOW)
    stopped = transition(asked, AttemptCancelled(attempt="a1", reason="cancelled after 64 samples"), NOW)
    assert stopped.part.state == PartState.cancelled and stopped.part.cancel_requested_at is None


def test_a_stopped_attempt_keeps_the_part_for_the_next_worker() -> None:
    p = apply(dispatched(), started(), AttemptStopped(attempt="a1", reason="its worker is shutting down"))
    assert p.state == PartState.queued and p.attempt is None and "continues from its checkpoint" in p.waiting
    assert apply(p, started("a2")).attempt.number == 2


def test_a_report_must_match_the_dispatched_fine_tune() -> None:
    running = apply(dispatched(), started())
    for bad, why in ((report(device_id="other"), "of device"), (report(batch_size=128), "never ran"),
                     (report(final_accuracy=0.2), "below the target"), (report(samples_processed=10**6), "more than the budget")):  # fmt: skip
        with pytest.raises(ReportMismatch, match=why):
            transition(running, AttemptFinished(attempt="a1", report=bad), NOW)
    switch = ConfigSwitch(device_time_s=0.1, samples=64, cause="cap", power_cap_w=4.0, old_batch_size=16, old_frequency_hz=900,
                          new_batch_size=128, new_frequency_hz=600)  # fmt: skip
    switched = report(batch_size=128, frequency_hz=600, switches=[switch])
    assert transition(running, AttemptFinished(attempt="a1", report=switched), NOW).part.report.batch_size == 128
    short = transition(running, AttemptFinished(attempt="a1", report=report(reached=False, final_accuracy=0.5)), NOW)
    assert "not reached" in short.message


def test_waiting_notices_and_redispatch() -> None:
    same = transition(part(PartState.profiling, waiting="w"), Waiting(notice="w"), NOW)
    assert same.part.updated_at == NOW - timedelta(seconds=1) and same.message is None  # nothing changes, nothing written
    missing = transition(part(PartState.profiling), Waiting(notice="device gone", device_missing=True), NOW)
    assert missing.part.device_missing and missing.kind == EventKind.device_missing
    assert not transition(missing.part, Waiting(notice=None), NOW).part.device_missing
    sent = dispatched()
    assert sent.dispatch is not None
    with pytest.raises(Refused, match="moved on"):
        transition(sent, Redispatched(token="other", outcome="sent again", seen_at=sent.dispatch.at), NOW)
    again = transition(sent, Redispatched(token="t1", outcome="sent again", seen_at=sent.dispatch.at), NOW + timedelta(seconds=30))
    assert again.kind == EventKind.attempt_lost
    with pytest.raises(Refused, match="sent on already"):  # a second reaper that found the same orphan
        transition(again.part, Redispatched(token="t1", outcome="sent again", seen_at=sent.dispatch.at), NOW + timedelta(seconds=31))
    with pytest.raises(Refused, match="applies only when"):
        transition(part(), Redispatched(token="t1", outcome="sent again", seen_at=NOW), NOW)


def test_work_lost_with_an_attempt_is_counted_once_when_the_next_attempt_dies_before_its_first_progress() -> None:
    """Attempt 1 left progress 20 s past its checkpoint; attempt 2 died in its set-up, writing
    none; attempt 3 reads the same progress again: it counts nothing more."""
    written = NOW - timedelta(minutes=5)
    lost = {"lost_device_time_s": 20.0, "lost_energy_j": 40.0, "lost_at": written}
    p = apply(dispatched(), started("a1"), AttemptLost(attempt="a1", outcome="x"))
    p = apply(p, started("a2").model_copy(update=lost), AttemptLost(attempt="a2", outcome="x"))
    p = apply(p, started("a3").model_copy(update=lost))
    assert (p.lost_device_time_s, p.lost_energy_j, p.attempt.number) == (20.0, 40.0, 3)
    later = {"lost_device_time_s": 5.0, "lost_energy_j": 10.0, "lost_at": written + timedelta(minutes=1)}  # attempt 3's own progress
    p = apply(p, AttemptLost(attempt="a3", outcome="x"), started("a4").model_copy(update=later))
    assert (p.lost_device_time_s, p.lost_energy_j) == (25.0, 50.0)
