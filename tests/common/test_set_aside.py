"""Stored records that no longer load are set aside, kept as they were with why and when, and
read as not stored; nothing that does not load again is stored."""

import pytest
import redis
from pydantic import ValidationError

from edgetrain.common.keys import Keys
from edgetrain.common.payloads import PretrainRequest, PretrainResult
from edgetrain.common.schemas import DatasetRef, LearningRatePolicy, ProfileTable, RelationVector
from edgetrain.common.store import SetAside
from edgetrain.common.store.resources import ResourceStore

TID = "jetson-nano:smallcnn:1x28x28"
TABLE = ProfileTable(
    batch_sizes=[16, 64], frequencies_hz=[100, 200], samples=512, time_s=[[2.0, 1.0], [1.5, 0.8]],
    peak_power_w=[[3.0, 4.0], [3.5, 4.5]], device_type="jetson-nano", model="smallcnn", input_shape=[1, 28, 28],
)  # fmt: skip
POISONED = TABLE.model_copy(update={"batch_sizes": [16, 32, 64]}).model_dump_json()  # 3 rows of batch sizes, 2 of values


@pytest.fixture
def raw(redis_server) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(redis_server.socket))


@pytest.mark.parametrize(
    "write, reason",
    [
        (lambda r, k: r.set(k, POISONED), "time_s must have 3 rows"),  # what an unvalidated merge stored
        (lambda r, k: r.set(k, TABLE.model_dump_json()[:-1] + ', "peak_memory_bytes": 1}'), "peak_memory_bytes: Extra inputs"),
        (lambda r, k: r.set(k, b"{not json"), "Invalid JSON"),  # a hand-edited key
        (lambda r, k: r.set(k, b"\xff\xfe binary"), "Invalid JSON"),  # not even text
        (lambda r, k: r.hset(k, "time_s", "[]"), "WRONGTYPE"),
    ],
)
def test_a_table_that_no_longer_loads_is_set_aside_as_it_was(store, raw, write, reason) -> None:
    key = store.keys.table(TID)
    write(raw, key)
    dumped = raw.dump(key)
    met: list[SetAside] = []
    assert store.resources.table(TID, met.append) is None
    [record] = met
    assert record.key == key and reason in record.reason and "\n" not in record.reason
    assert record.moved_to.startswith(f"edgetrain:set-aside:table:{TID}:") and record.moved_to in record.line()
    assert raw.dump(record.moved_to) == dumped and not raw.exists(key)  # kept exactly as it was, whatever its type
    assert store.resources.set_asides() == [record]
    assert store.resources.table(TID, met.append) is None and len(met) == 1  # gone: nothing more to set aside
    store.resources.put_table(TABLE)  # profiled again
    assert store.resources.table(TID) == TABLE and store.resources.tables() == [TABLE]


def test_listing_tables_sets_aside_those_that_no_longer_load(store, raw) -> None:
    store.resources.put_table(TABLE)
    raw.set(store.keys.table("jetson-tx2-nx:smallcnn:1x28x28"), b"{}")
    met: list[SetAside] = []
    assert store.resources.tables(on_set_aside=met.append) == [TABLE]
    assert [r.key for r in met] == ["edgetrain:table:jetson-tx2-nx:smallcnn:1x28x28"]


def test_vectors_and_pretrained_weights_that_no_longer_load_are_set_aside(store, raw) -> None:
    raw.set(store.keys.vector("k1"), RelationVector(batch_sizes=[4, 8], ratios=[0.5, 1.0]).model_dump_json().replace("[0.5,1.0]", "[1.0]"))
    met: list[SetAside] = []
    assert store.resources.vector("k1", met.append) is None
    assert "ratios must have one value per batch size (2), not 1" in met[0].reason
    request = PretrainRequest(
        model="smallcnn", dataset=DatasetRef(name="digits"), samples=10, batch_size=4, lr=LearningRatePolicy(), seed=0
    )
    store.resources.put_pretrained(request, PretrainResult(weights="artifact:w", test_accuracy=0.5))
    key = next(k for k in raw.scan_iter("edgetrain:pretrained:*"))
    raw.set(key, b'{"weights": "artifact:w"}')  # an older format
    assert store.resources.pretrained(request, met.append) is None
    assert "test_accuracy: Field required" in met[1].reason
    assert [r.key for r in store.resources.set_asides()] == ["edgetrain:vector:k1", key.decode()]


def test_storing_validates_what_is_stored(store) -> None:
    with pytest.raises(ValidationError, match="time_s must have 3 rows"):
        store.resources.put_table(
            ProfileTable.model_validate_json(TABLE.model_dump_json()).model_copy(update={"batch_sizes": [16, 32, 64]})
        )
    with pytest.raises(ValidationError, match="censored must have one value per batch size"):
        store.resources.put_vector(RelationVector(batch_sizes=[4, 8], ratios=[0.5, 1.0], key="k").model_copy(update={"censored": [False]}))
    assert store.resources.table(TID) is None and store.resources.vector("k") is None


def test_a_reader_that_may_only_read_reports_the_record_and_leaves_it(store, raw, redis_server) -> None:
    raw.execute_command("ACL", "SETUSER", "reader", "reset", "on", ">pw", "~*", "+@read", "+@transaction", "+@connection")
    try:
        reader = redis.Redis(unix_socket_path=str(redis_server.socket), username="reader", password="pw", decode_responses=True)
        raw.set(store.keys.table(TID), POISONED)
        met: list[SetAside] = []
        assert ResourceStore(reader, Keys()).table(TID, met.append) is None
        assert met[0].moved_to is None and "left in place" in met[0].line()
        assert raw.get(store.keys.table(TID)) == POISONED.encode()
        assert store.resources.table(TID) is None and store.resources.set_asides()[0].key == store.keys.table(TID)  # a worker moves it
    finally:
        raw.execute_command("ACL", "DELUSER", "reader")
