"""End to end: a lookup table shared by the jobs of a device type stays whole when jobs add rows
to it, and a stored table that no longer loads is set aside and profiled again, with real
worker processes and default settings."""

import json
import subprocess
import sys

import pytest
import redis

from edgetrain.common.jobs.state import EventKind
from edgetrain.common.keys import table_id
from edgetrain.common.models import get_model
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import ProfileTable
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
TIMEOUT_S = 300
TID = table_id("jetson-nano", "smallcnn", get_model("smallcnn").input_shape)
DIGITS = {"dataset": {"name": "digits", "fraction": 0.5}, "target_accuracy": 0.8}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cluster"), devices={"nano-1": "sim:jetson-nano", "nano-2": "sim:jetson-nano"}) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster) -> EdgeTrainClient:
    return EdgeTrainClient(cluster.redis_url)


def run(client: EdgeTrainClient, device_id: str, batch_sizes: list[int]):
    spec = quick_job([{"device_id": device_id, "power_cap_w": 3.0}], batch_sizes=batch_sizes, target_accuracy=0.6)  # lean
    status = client.wait(client.submit(spec), TIMEOUT_S)
    assert status.state.value == "completed", [e.line() for e in status.events]
    return status


def assert_whole(table: ProfileTable, batch_sizes: list[int]) -> None:
    """Every per-row field has a row of every batch size, and the table loads again."""
    assert table.batch_sizes == batch_sizes and ProfileTable.model_validate_json(table.model_dump_json()) == table
    for name in ProfileTable.GRIDS:
        assert len(getattr(table, name)) == len(batch_sizes), name


def test_jobs_adding_rows_to_a_shared_table_leave_it_whole(cluster, client) -> None:
    run(client, "nano-1", [16, 64])  # job A profiles rows 16 and 64
    b = run(client, "nano-2", [32, 64])  # job B profiles row 32 on another Nano, merged into A's table
    assert any(e.kind == EventKind.profiling and "rows [32]" in e.message for e in b.events), b.events
    again = run(client, "nano-1", [16, 64])  # A's spec again: the merged table serves it
    assert EventKind.profiling not in {e.kind for e in again.events}
    table = cluster.store().resources.table(TID)
    assert table.observed_clock_hz is not None and table.energy_j is not None
    assert_whole(table, [16, 32, 64])


def test_a_stored_table_that_no_longer_loads_is_set_aside_and_profiled_again(cluster, client) -> None:
    store, raw = cluster.store(), redis.Redis(unix_socket_path=cluster.redis_url.removeprefix("unix://"))
    key = store.keys.table(TID)
    broken = b'{"batch_sizes": [16, 32, 64], "time_s": [[1.0]]}'
    raw.set(key, broken)  # written past edgetrain, as by hand or by an older release
    status = run(client, "nano-2", [16, 64])
    kinds = [e.kind for e in status.events]
    assert EventKind.set_aside in kinds and kinds.index(EventKind.set_aside) < kinds.index(EventKind.profiling), kinds
    [event] = [e for e in status.events if e.kind == EventKind.set_aside]
    assert f"{key} no longer loads (" in event.message and "set aside under edgetrain:set-aside:table:" in event.message
    [record] = [r for r in store.resources.set_asides() if r.key == key]
    assert record.moved_to in event.message and raw.get(record.moved_to) == broken  # kept as it was
    assert_whole(store.resources.table(TID), [16, 64])


def test_evaluations_of_two_batch_size_sets_both_run(cluster, tmp) -> None:
    spec = {"model": "smallcnn", "proxy": DIGITS, "targets": [DIGITS], "devices": [{"twin": "jetson-nano", "power_caps_w": [3.0]}],
            "seeds": [0], "eval_every_samples": 128, "max_samples": 20000}  # fmt: skip
    for batch_sizes in ([16, 64], [8, 64]):  # the second adds row 8 to the stored table
        (tmp / "spec.json").write_text(json.dumps(spec | {"batch_sizes": batch_sizes}))
        cmd = [sys.executable, "-m", "edgetrain.workers.cli", "evaluate", str(tmp / "spec.json"), "--redis-url", cluster.redis_url,
               "--json", "--out", str(tmp / f"out-{batch_sizes[0]}")]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        [row] = json.loads(done.stdout)["rows"]
        assert row["edgetrain"]["batch_size"] in batch_sizes and row["edgetrain"]["reached"]
    assert_whole(cluster.store().resources.table(TID), [8, 16, 64])
