"""Learning across jobs: solo curves matched by test loss, the vector records give, the records'
store and keys, and where a vector's numbers come from."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from edgetrain.common.finetune.learned import (
    DataIdentity,
    FinetuneRecord,
    Segment,
    data_identity,
    learned_vector,
    relative_samples,
    similar_vector,
    warp_ratio,
)
from edgetrain.common.keys import learned_key, similar_key
from edgetrain.common.schemas import DatasetRef, LearningRatePolicy, RelationVector
from edgetrain.common.security import RefusedError
from edgetrain.common.store.learned import MAX_RECORDS
from edgetrain.common.training import Trainer, make_optimizer

PRIOR = RelationVector(batch_sizes=[8, 32, 128], ratios=[0.6, 0.8, 1.0], samples_mean=[6000.0, 8000.0, 10000.0],
                       samples_std=[300.0, 400.0, 500.0], key="proxy")  # fmt: skip
DATA = DataIdentity(name="mnist5k", fraction=1.0)


def curve(efficiency: float, end: int, noise: float = 0.0) -> list[tuple[int, float, float | None]]:
    """A solo curve of the time-warp model: test loss 2 exp(-e n / 2000), with alternating noise (relative)."""
    points = []
    for k, n in enumerate(range(0, end + 1, 256)):
        loss = 2.0 * math.exp(-efficiency * n / 2000) * (1 + noise * (-1) ** k)
        points.append((n, 1 - loss / 2, loss))
    return points


def record(b: int, efficiency: float, record_id: str, n: int | None = None, stop: int | None = None) -> FinetuneRecord:
    end = stop or (n or 0) + 256
    return FinetuneRecord(
        record_id=record_id, model="smallcnn", weights="init:0", data=DATA, target_accuracy=0.9, lr=LearningRatePolicy(),
        eval_every_samples=256, device_type="jetson-nano", power_cap_w=5.0, seed=0,
        segments=[Segment(batch_size=b, frequency_hz=921600000, start_samples=0, end_samples=end, device_time_s=1.0,
                          curve=curve(efficiency, end))],
        reached=stop is None, samples_to_accuracy=n,
    )  # fmt: skip


def test_warp_ratio_gives_the_stretch_between_two_solo_curves() -> None:
    fast = [(n, loss) for n, _, loss in curve(2.0, 4000) if loss is not None]
    slow = [(n, loss) for n, _, loss in curve(1.0, 8000) if loss is not None]
    assert warp_ratio(slow, fast) == pytest.approx(2.0, rel=0.02)
    assert warp_ratio(fast, slow) == pytest.approx(0.5, rel=0.02)
    noisy = [(n, loss) for n, _, loss in curve(1.0, 8000, noise=0.01) if loss is not None]
    assert warp_ratio(noisy, fast) == pytest.approx(2.0, rel=0.08)  # the running minimum and the median absorb noise
    assert warp_ratio(slow[:4], fast) is None  # too few shared levels


def test_learned_vector_takes_measured_N_b_and_scales_the_prior_elsewhere() -> None:
    # N_8 = 9000 and N_32 = 6000 measured on this data (full runs); the prior has 6000 and 8000
    records = [record(8, 1.0, "a", n=9000), record(32, 1.5, "b", n=6000)]
    vector = learned_vector(records, PRIOR)
    assert vector is not None and vector.provenance is not None
    scale = math.sqrt(9000 / 6000 * 6000 / 8000)
    assert vector.samples_mean == pytest.approx([9000, 6000, 10000 * scale])
    assert vector.ratios == pytest.approx([9000 / (10000 * scale), 6000 / (10000 * scale), 1.0])
    assert vector.provenance.source == "learned" and vector.provenance.measured_batch_sizes == [8, 32]
    assert vector.provenance.records == ["a", "b"] and vector.provenance.prior_key == "proxy"
    assert "b=[8, 32]" in vector.provenance.summary and "from the prior proxy" in vector.provenance.summary
    # a run stopped early (or switched) still measures through its solo curve against a full run
    partial = learned_vector([record(32, 1.5, "b", n=6000), record(8, 1.0, "c", stop=3000)], PRIOR)
    assert partial is not None and partial.samples_for(8) == pytest.approx(9000, rel=0.03)
    assert learned_vector([record(8, 1.0, "a", n=9000), record(8, 1.0, "d", n=9400)], PRIOR) is None  # one batch size


def test_runs_that_reached_the_target_within_a_few_evaluations_measure_their_N_b() -> None:
    """A run that reached the target in four evaluations has too short a curve to be matched,
    but its N_b is measured outright: before, such records counted for nothing."""
    quick = [record(8, 1.0, "a", n=700), record(32, 1.5, "b", n=500)]
    assert all(r.solo_curve() is None for r in quick)
    vector = learned_vector(quick, PRIOR)
    assert vector is not None and vector.samples_for(8) == 700 and vector.samples_for(32) == 500


def test_the_devices_of_one_job_count_as_one_draw_of_N_b() -> None:
    one_job = [record(32, 1.0, f"job-a:dev-{k}", n=8000) for k in range(3)]  # one job's seed: one run, on three devices
    still_running = record(32, 1.0, "job-a:dev-3", stop=4000)  # the same draw, short of the target so far
    another_seed = record(32, 1.0, "job-b:dev-0", n=9000).model_copy(update={"seed": 1})
    assert relative_samples([still_running, *one_job, another_seed]) == {32: [8000.0, 9000.0]}


def test_without_a_run_that_reached_the_target_no_run_reads_as_past_it() -> None:
    """Two runs still going on one data, none reached: a run at b=8 matched to a longer one at
    b=32 read as needing fewer samples than it had already run (the closed loop then took it for
    finished and never switched). Each now reads as needing at least twice what it ran, the
    ratio between them kept."""
    runs = [record(32, 1.5, "long", stop=9216), record(8, 3.0, "mine", stop=6144)]  # N_8 / N_32 = 0.5
    measured = relative_samples(runs)
    assert measured[8][0] >= 2 * 6144 and measured[32][0] >= 2 * 9216
    assert measured[8][0] / measured[32][0] == pytest.approx(0.5, rel=0.03)


def test_records_of_similar_data_blend_with_the_prior() -> None:
    records = [record(8, 1.0, "a", n=9000), record(32, 1.5, "b", n=6000)]
    same, similar = learned_vector(records, PRIOR), similar_vector({"other": records}, PRIOR)
    assert same is not None and similar is not None
    for b in (8, 32):  # r_b halfway, in logs, between the learned and the prior's
        assert similar.ratio(b) == pytest.approx(math.sqrt(same.ratio(b) * PRIOR.ratio(b)))  # type: ignore[operator]
    assert similar.samples_for(128) == PRIOR.samples_for(128)  # on the prior's scale: other data's N_b are not this data's
    assert similar.provenance is not None and similar.provenance.measured_batch_sizes == []


def on(data: DataIdentity, target: float, *records: FinetuneRecord) -> list[FinetuneRecord]:
    return [r.model_copy(update={"data": data, "target_accuracy": target}) for r in records]


def test_similar_data_combine_their_ratios_not_their_samples() -> None:
    # three other data of the kind, on three scales: A (a tenth, to 75 %) has r_8 = 0.36, C (a
    # half, to 92 %) r_8 = 0.64, B (a fifth, to 85 %) r_32 = 0.7; pooled as one data, A's N_8 =
    # 1800 and B's N_128 = 20000 would make r_8 = 0.14
    a = on(DataIdentity(name="mnist5k", fraction=0.1), 0.75, record(8, 1.0, "a8", n=1800), record(128, 0.36, "a128", n=5000))
    b = on(DataIdentity(name="mnist5k", fraction=0.2), 0.85, record(32, 1.0, "b32", n=14000), record(128, 0.7, "b128", n=20000))
    c = on(DataIdentity(name="mnist5k", fraction=0.5), 0.92, record(8, 1.0, "c8", n=6400), record(128, 0.64, "c128", n=10000))
    vector = similar_vector({"a": a, "b": b, "c": c}, PRIOR)
    assert vector is not None
    r_8 = math.sqrt(0.36 * 0.64)  # the geometric mean of the data that measured b=8 (two records each)
    assert vector.ratios == pytest.approx([math.sqrt(r_8 * 0.6), math.sqrt(0.7 * 0.8), 1.0])
    assert vector.samples_mean == pytest.approx([10000 * math.sqrt(r_8 * 0.6), 10000 * math.sqrt(0.7 * 0.8), 10000])
    assert sorted(vector.provenance.records) == ["a128", "a8", "b128", "b32", "c128", "c8"]  # type: ignore[union-attr]
    # data that measured one batch size each say nothing about r_b
    assert similar_vector({"a": a[:1], "b": b[1:]}, PRIOR) is None


def test_data_identity_digests_what_a_path_holds(tmp_path) -> None:
    assert data_identity(DatasetRef(name="mnist5k", fraction=0.5), []) == DataIdentity(name="mnist5k", fraction=0.5)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(b"1")
    ref = DatasetRef(name="imagefolder", path=str(tmp_path))
    before = data_identity(ref, [tmp_path])
    assert before.path_digest and data_identity(ref, [tmp_path]) == before
    (tmp_path / "a" / "y.png").write_bytes(b"22")
    assert data_identity(ref, [tmp_path]).path_digest != before.path_digest
    with pytest.raises(RefusedError, match="dataset.path: .* is outside the data roots"):
        data_identity(ref, [tmp_path / "a"])


def test_keys_separate_data_and_group_similar_data() -> None:
    lr = LearningRatePolicy()
    key = learned_key("smallcnn", "init:0", DATA, 0.9, lr)
    assert key == learned_key("smallcnn", "init:0", DATA, 0.9, lr)
    assert key != learned_key("smallcnn", "init:0", DATA, 0.93, lr)
    assert key != learned_key("smallcnn", "init:0", DataIdentity(name="mnist5k", fraction=0.5), 0.9, lr)
    assert key != learned_key("smallcnn", "init:1", DATA, 0.9, lr)
    assert similar_key("smallcnn", "init:0", "mnist5k", lr) != similar_key("smallcnn", "init:0", "digits", lr)
    # N_b depends on the learning-rate rule and optimizer as on the data: runs under another are not similar
    assert similar_key("smallcnn", "init:0", "mnist5k", lr) != similar_key(
        "smallcnn", "init:0", "mnist5k", LearningRatePolicy(rule="linear")
    )
    assert similar_key("smallcnn", "init:0", "mnist5k", lr) != similar_key(
        "smallcnn", "init:0", "mnist5k", LearningRatePolicy(optimizer="adamw")
    )


def test_the_store_keeps_the_newest_records_per_data_and_finds_similar_data(store) -> None:
    lr = LearningRatePolicy()
    key, other = learned_key("smallcnn", "init:0", DATA, 0.9, lr), learned_key("smallcnn", "init:0", DATA, 0.93, lr)
    kind = similar_key("smallcnn", "init:0", "mnist5k", lr)
    for k in range(MAX_RECORDS + 2):
        store.learned.put_record(key, kind, record(8, 1.0, f"job{k}:dev", n=9000))
    store.learned.put_record(other, kind, record(32, 1.5, "x:dev", n=6000))
    found = store.learned.records(key)
    assert len(found) == MAX_RECORDS and found[0].record_id == f"job{MAX_RECORDS + 1}:dev"  # newest first, oldest dropped
    assert found[0] == record(8, 1.0, f"job{MAX_RECORDS + 1}:dev", n=9000).model_copy(update={"created_at": found[0].created_at})
    assert list(store.learned.similar(kind, exclude=key)) == [other]
    assert store.learned.records("unknown") == [] and store.learned.similar("unknown") == {}


def test_a_polling_reader_gets_the_records_only_when_one_was_kept_since_its_last_read(store) -> None:
    key, kind = (
        learned_key("smallcnn", "init:0", DATA, 0.9, LearningRatePolicy()),
        similar_key("smallcnn", "init:0", "mnist5k", LearningRatePolicy()),
    )
    assert store.learned.records_if_new(key, kept=-1) == (0, [])  # the first read: nothing kept yet
    assert store.learned.records_if_new(key, kept=0) == (0, None)
    store.learned.put_record(key, kind, record(8, 1.0, "a:dev", n=9000))
    kept, found = store.learned.records_if_new(key, kept=0)
    assert kept == 1 and found is not None and [r.record_id for r in found] == ["a:dev"]
    assert store.learned.records_if_new(key, kept=1) == (1, None)
    store.learned.put_record(key, kind, record(32, 1.5, "b:dev", n=6000))
    kept, found = store.learned.records_if_new(key, kept=1)
    assert kept == 2 and found is not None and [r.record_id for r in found] == ["b:dev", "a:dev"]


def test_a_vector_stored_before_provenance_existed_still_loads() -> None:
    old = '{"batch_sizes": [8, 32], "ratios": [0.5, 1.0], "key": "k"}'
    assert RelationVector.model_validate_json(old).provenance is None


def test_evaluation_keeps_the_test_loss_of_the_same_pass() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    model = nn.Linear(4, 3)
    trainer = Trainer(model, make_optimizer(model, LearningRatePolicy(), 8), 8, TensorDataset(x, y), TensorDataset(x, y), 0,
                      device=torch.device("cpu"))  # fmt: skip
    assert trainer.test_loss is None
    trainer.evaluate()
    with torch.no_grad():
        expected = nn.functional.cross_entropy(model(x), y).item()
    assert trainer.test_loss == pytest.approx(expected, rel=1e-5)


def test_vector_show_says_where_the_numbers_come_from() -> None:
    from edgetrain.common.schemas import EstimationRequest
    from edgetrain.workers.rendering.output import format_vector

    learned = learned_vector([record(8, 1.0, "a", n=9000), record(32, 1.5, "b", n=6000)], PRIOR)
    assert learned is not None
    assert format_vector(learned).splitlines()[-1].startswith("numbers from: learned: learned from 2 fine-tune record(s) of this data")
    request = EstimationRequest(model="smallcnn", weights="init:0", proxy_dataset=DatasetRef(name="digits"), target_accuracy=0.9,
                                batch_sizes=[8, 32], seeds=[0, 1], lr=LearningRatePolicy(), eval_every_samples=256, max_samples=1000)  # fmt: skip
    proxy = RelationVector(batch_sizes=[8, 32], ratios=[0.5, 1.0], request=request)
    assert format_vector(proxy).splitlines()[-1] == (
        "numbers from: proxy: digits to 0.9 on the server pool, 2 batch sizes x 2 seeds from init:0"
    )
