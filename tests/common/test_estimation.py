import re

import pytest

from edgetrain.common.artifacts import ArtifactError, initial_model
from edgetrain.common.estimation import aggregate, pretrain, train_proxy, vector_key
from edgetrain.common.schemas import AccuracyBracket, DatasetRef, EstimationRequest, LearningRatePolicy, TrainingOutcome
from edgetrain.common.training import make_optimizer


def request(**changes) -> EstimationRequest:
    base = dict(
        model="smallcnn", weights="init:0", proxy_dataset=DatasetRef(name="digits"), target_accuracy=0.8,
        batch_sizes=[16, 64], seeds=[0, 1], lr=LearningRatePolicy(), eval_every_samples=128, max_samples=20000,
    )  # fmt: skip
    return EstimationRequest(**(base | changes))


def outcome(b: int, seed: int, n: int | None) -> TrainingOutcome:
    return TrainingOutcome(
        batch_size=b,
        seed=seed,
        samples_to_accuracy=n,
        reached=n is not None,
        final_accuracy=0.9,
        samples_processed=n or 999,
        evaluations=1,
        wall_s=0.1,
    )


def test_aggregate_mean_std_and_ratio_to_the_largest_batch() -> None:
    req = request(batch_sizes=[8, 16, 64])
    vector = aggregate(
        req, [outcome(8, 0, 100), outcome(8, 1, 300), outcome(16, 0, 400), outcome(16, 1, None), outcome(64, 0, 800), outcome(64, 1, 800)]
    )
    assert vector.samples_mean == [200.0, None, 800.0]
    assert vector.samples_std[0] == pytest.approx(141.42, rel=1e-3) and vector.samples_std[2] == 0.0
    assert vector.ratios == [0.25, None, 1.0]
    assert vector.censored == [False, True, False]
    assert vector.resolution_samples == 128 and vector.key == vector_key(req)
    with pytest.raises(ValueError, match="no outcome for seeds"):
        aggregate(req, [outcome(8, 0, 100)])


def test_aggregate_uses_interpolated_counts_and_reports_the_widest_bracket() -> None:
    def bracketed(b: int, seed: int, n: int, before: int, after: int) -> TrainingOutcome:
        bracket = AccuracyBracket(before_samples=before, before_accuracy=0.7, after_samples=after, after_accuracy=0.85)
        return outcome(b, seed, n).model_copy(update={"bracket": bracket, "samples_processed": after})

    req = request(batch_sizes=[16, 64], eval_every_samples=512)
    vector = aggregate(req, [bracketed(16, 0, 700, 512, 1024), bracketed(16, 1, 900, 512, 1024),
                             bracketed(64, 0, 1600, 1088, 1600), bracketed(64, 1, 2000, 1600, 2176)])  # fmt: skip
    assert vector.samples_mean == [800.0, 1800.0]
    assert vector.ratios == [pytest.approx(800 / 1800), 1.0]
    assert vector.resolution_samples == 576  # 2176 - 1600: b = 64 steps past the 512-sample interval
    assert vector.samples_std_for(64) == pytest.approx(282.84, rel=1e-3)
    assert aggregate(req, [outcome(b, s, None) for b in (16, 64) for s in (0, 1)]).resolution_samples is None


def test_proxy_already_at_the_target_before_training_is_refused() -> None:
    with pytest.raises(ValueError, match="target_accuracy: digits is at .* before any training"):
        train_proxy(request(target_accuracy=0.01), 32, 0)


def test_cache_key_changes_with_anything_the_vector_depends_on() -> None:
    keys = {vector_key(request()), vector_key(request(seeds=[0])), vector_key(request(target_accuracy=0.81)),
            vector_key(request(lr=LearningRatePolicy(rule="linear"))), vector_key(request(weights="init:1"))}  # fmt: skip
    assert len(keys) == 5
    assert vector_key(request()) == vector_key(request())


def test_proxy_run_reaches_the_target_or_is_censored_by_the_budget() -> None:
    reached = train_proxy(request(), 32, 0)
    assert reached.reached and reached.final_accuracy >= 0.8
    bracket = reached.bracket  # evaluated every 128 samples, at the first step boundary past each interval
    assert bracket.before_accuracy < 0.8 <= bracket.after_accuracy == reached.final_accuracy
    assert bracket.after_samples == reached.samples_processed and bracket.after_samples % 128 < 32
    assert 128 <= bracket.width_samples < 128 + 32
    assert bracket.before_samples < reached.samples_to_accuracy <= bracket.after_samples
    censored = train_proxy(request(max_samples=64), 32, 0)
    assert not censored.reached and censored.samples_to_accuracy is None and censored.samples_processed == 64


def test_learning_rate_follows_the_square_root_rule_in_the_optimizer() -> None:
    model = initial_model("smallcnn", "init:0", 10)
    assert make_optimizer(model, LearningRatePolicy(), 32).param_groups[0]["lr"] == pytest.approx(2.5e-4)
    assert type(make_optimizer(model, LearningRatePolicy(optimizer="adamw"), 32)).__name__ == "AdamW"


def test_pretrained_weights_are_published_and_loaded_by_reference(tmp) -> None:
    url, accuracy = pretrain("smallcnn", DatasetRef(name="digits"), 2000, 64, LearningRatePolicy(), 0, tmp)
    assert re.fullmatch(r"artifact:smallcnn-digits-2000-[0-9a-f]{12}\.pt#sha256=[0-9a-f]{64}", url) and accuracy > 0.5
    model = initial_model("smallcnn", url, 10, store=tmp)
    fresh = initial_model("smallcnn", "init:0", 10)
    assert not model.features[0].weight.equal(fresh.features[0].weight)
    five = initial_model("smallcnn", url, 5, store=tmp)  # another task: the head is new, the body is kept
    assert five.head[1].out_features == 5 and five.features[0].weight.equal(model.features[0].weight)
    path = tmp / url.removeprefix("artifact:").split("#")[0]
    with open(path, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(ArtifactError, match="sha256"):
        initial_model("smallcnn", url, 10, store=tmp)
    with pytest.raises(ArtifactError, match="init:<integer seed>"):
        initial_model("smallcnn", "init:x", 10)
