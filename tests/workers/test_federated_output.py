"""`edgetrain status` of a buffered federated job: its aggregations, buffer and work in flight."""

from edgetrain.common.federated.records import FederatedStatus
from edgetrain.common.federated.rounds import Buffered, buffer_record
from edgetrain.workers.rendering.federated_output import format_federated

from ..common.test_federated_buffered import RECORD, RUNNING, update, work


def test_a_buffered_job_s_status_shows_its_aggregations_buffer_and_work_in_flight() -> None:
    done = buffer_record(1, 0.6, [Buffered(update(work(1, "a")).trained, 1, 0.2, 0)], 0.0)
    state = RUNNING.model_copy(update={"round": 1, "received": {"c#3": "x"}, "aggregating": {"a#4": "y"}})
    text = format_federated(FederatedStatus(record=RECORD, state=state, rounds=[done]))
    assert "training, aggregation 1 of at most 5;" in text and "buffered, 2 updates per aggregation, staleness sqrt" in text
    assert "buffer 1 of 2, an aggregation running; work in flight: 1 a b=16 x4 from aggregation 0, 2 b b=16 x4 from aggregation 0" in text
    assert "SIMULATED" in text
