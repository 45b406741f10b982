"""The server tasks in this process against a real Redis: a relation vector whose proxy runs are
all in but which is not stored (it no longer loaded and was set aside) is aggregated again; an
estimation cut short while it sends its runs leaves every run to the reaper."""

from types import SimpleNamespace

import pytest
import redis
from billiard.exceptions import WorkerLostError
from kombu.exceptions import OperationalError

from edgetrain.common.estimation import aggregate
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.payloads import ProxyRunRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec, TrainingOutcome
from edgetrain.common.settings import Settings
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks import context, contract, server
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName
from edgetrain.tasks.server import estimate_relation_vector, train_proxy
from edgetrain.tasks.stopped import on_lost_child


@pytest.fixture
def s(redis_server):
    redis.Redis.from_url(redis_server.url).flushdb()
    return context.init(Settings(redis_url=redis_server.url), ("edgetrain.tasks.server",))


def test_a_vector_set_aside_is_aggregated_again_from_its_runs(s, redis_server) -> None:
    request = JobSpec.model_validate(quick_job(batch_sizes=[16, 64])).estimation_request()
    key = vector_key(request)
    for b, n in ((16, 3000), (64, 6000)):
        outcome = TrainingOutcome(
            batch_size=b, seed=0, samples_to_accuracy=n, reached=True, final_accuracy=0.9, samples_processed=n, evaluations=3, wall_s=1.0
        )
        s.resources.put_vector_part(key, outcome)
    broker = redis.Redis.from_url(redis_server.url)
    broker.set(s.keys.vector(key), b'{"batch_sizes": [16, 64], "ratios": [0.5]}')  # no longer loads
    s.coordination.claim(vector_resource(key), "j1")
    s.coordination.add_waiter(vector_resource(key), "j1")
    assert estimate_relation_vector(request)["runs_dispatched"] == 0
    assert queued_tasks(broker, SERVER_QUEUE) == []  # the runs are not run again
    assert s.resources.vector(key) == aggregate(request, s.resources.vector_parts(key))
    waiting: list[str] = []
    s.coordination.settle(vector_resource(key), lambda jobs: waiting.extend(jobs) or [])
    assert s.coordination.holder(vector_resource(key)) is None and waiting == []
    assert [(t.name, t.payload) for t in queued_tasks(broker, CONTROL_QUEUE)] == [(TaskName.advance_job.value, "j1")]
    assert [r.key for r in s.resources.set_asides()] == [s.keys.vector(key)]


def test_an_estimation_cut_short_while_it_sends_its_runs_leaves_every_run_in_the_ledger(s, redis_server, monkeypatch) -> None:
    """A Redis outage past the publish retries stops the fan-out at its second run: every run
    was written down first, so the reaper sends the rest (tasks/reaper.py `resend_lost`)."""
    request = JobSpec.model_validate(quick_job(batch_sizes=[16, 32, 64])).estimation_request()
    sent = []

    def send_until_the_outage(app, sent_task):
        if sent:
            raise OperationalError("Error 111 connecting to redis.sock. Connection refused.")
        sent.append(sent_task)

    monkeypatch.setattr(contract, "send_again", send_until_the_outage)
    with pytest.raises(OperationalError):
        estimate_relation_vector(request)
    ledger = s.ledger.unseen_since(float("inf"), 100)
    assert sorted((t.task, t.payload["batch_size"]) for t in ledger) == [(TaskName.train_proxy.value, b) for b in (16, 32, 64)]
    assert [t.payload["batch_size"] for t in sent] == [16]


def test_a_proxy_run_whose_process_died_fails_the_vector_and_its_other_runs_are_skipped(s, redis_server, monkeypatch) -> None:
    """A model that kills its process killed every run of the vector, and each retry, while the
    jobs behind it on the server queue waited: the first death fails the vector, the runs still
    queued do not train."""
    request = JobSpec.model_validate(quick_job(batch_sizes=[16, 64])).estimation_request()
    resource = vector_resource(vector_key(request))
    s.coordination.claim(resource, "j1")
    estimate_relation_vector(request)
    runs = queued_tasks(redis.Redis.from_url(redis_server.url), SERVER_QUEUE)
    assert [t.payload["batch_size"] for t in runs] == [16, 64]
    on_lost_child(sender=SimpleNamespace(name=TaskName.train_proxy.value), task_id=runs[0].id, exception=WorkerLostError("signal 9"),
                  args=(runs[0].payload,), instance="server-0@h:1")  # fmt: skip
    failure = s.coordination.failure(resource)
    assert failure is not None and failure.reason.startswith("proxy training b=16 seed=0 its process died") and failure.for_job("j1")
    monkeypatch.setattr(server, "run_proxy", lambda *a: pytest.fail("a run of a failed estimation trained"))
    skipped = train_proxy(ProxyRunRequest.model_validate(runs[1].payload))
    assert skipped == f"skipped b=64 seed=0: relation vector {vector_key(request)} is no longer being estimated"  # what Flower shows
    assert s.resources.vector_parts(vector_key(request)) == []
