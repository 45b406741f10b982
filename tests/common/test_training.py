import pytest

from edgetrain.common.schemas import AccuracyBracket
from edgetrain.common.training import crossing, train_to_accuracy

# A recorded accuracy curve: evaluations every 512 samples, the first one before training.
RECORDED = [(0, 0.10), (512, 0.45), (1024, 0.71), (1536, 0.83), (2048, 0.88)]


def test_crossing_is_interpolated_between_the_evaluations_around_the_target() -> None:
    n_b, bracket = crossing(RECORDED, 0.80)
    # 0.80 lies 0.09 / 0.12 = 3/4 of the way from 0.71 (1024 samples) to 0.83 (1536): 1024 + 384
    assert n_b == 1408
    assert bracket == AccuracyBracket(before_samples=1024, before_accuracy=0.71, after_samples=1536, after_accuracy=0.83)
    assert bracket.width_samples == 512
    # a target met exactly at an evaluation is that evaluation's count
    assert crossing(RECORDED, 0.83)[0] == 1536
    # a little over the 0.45 evaluation: 512 + 512 * 0.01 / 0.26 = 531.69 -> 532
    assert crossing(RECORDED, 0.46)[0] == 532


def test_target_reached_at_the_first_evaluation_after_training_interpolates_from_before_training() -> None:
    n_b, bracket = crossing([(0, 0.30), (520, 0.90)], 0.80)
    assert n_b == 433  # 520 * 0.5 / 0.6 = 433.33
    assert (bracket.before_samples, bracket.before_accuracy, bracket.after_samples) == (0, 0.30, 520)


def test_target_met_before_training_needs_no_samples() -> None:
    n_b, bracket = crossing([(0, 0.85), (512, 0.9)], 0.80)
    assert n_b == 0 and bracket.width_samples == 0 and bracket.after_accuracy == 0.85


def test_non_monotone_curve_uses_the_first_evaluation_at_the_target_and_the_one_before() -> None:
    history = [(0, 0.1), (512, 0.79), (1024, 0.60), (1536, 0.70), (2048, 0.90), (2560, 0.75)]
    n_b, bracket = crossing(history, 0.80)
    assert n_b == 1792  # halfway from 0.70 to 0.90; the earlier 0.79 and later dip do not count
    assert (bracket.before_samples, bracket.after_samples) == (1536, 2048)


def test_curve_that_never_reaches_the_target_has_no_crossing() -> None:
    assert crossing(RECORDED, 0.95) is None


class ScriptedTrainer:
    """Stands in for Trainer: accuracy is samples / 2000, steps of `batch_size` samples."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.samples = 0

    def step(self) -> None:
        self.samples += self.batch_size

    def evaluate(self) -> float:
        return self.samples / 2000


def test_training_loop_evaluates_before_training_and_interpolates_n_b() -> None:
    seen: list[int] = []
    outcome, totals = train_to_accuracy(ScriptedTrainer(100), 0.7, 512, 10_000, seed=3, on_evaluation=lambda s, a, t: seen.append(s))
    # evaluations at 0 and at the first step boundary past each 512 samples: 600, 1200, 1800
    assert [s for s, _ in totals.history] == seen == [0, 600, 1200, 1800]
    assert outcome.reached and outcome.samples_processed == 1800 and outcome.evaluations == 4
    # the accuracy is linear in samples here, so interpolation finds the exact crossing: 0.7 * 2000
    assert outcome.samples_to_accuracy == 1400
    assert (outcome.bracket.before_samples, outcome.bracket.after_samples) == (1200, 1800)
    assert outcome.final_accuracy == pytest.approx(0.9)


def test_training_loop_censored_by_the_budget() -> None:
    outcome, totals = train_to_accuracy(ScriptedTrainer(100), 0.7, 512, 1000, seed=0)
    assert not outcome.reached and outcome.samples_to_accuracy is None and outcome.bracket is None
    assert [s for s, _ in totals.history] == [0, 600, 1000]  # the budget ends with an evaluation


def test_training_loop_stops_before_training_when_the_target_is_already_met() -> None:
    trainer = ScriptedTrainer(100)
    outcome, _ = train_to_accuracy(trainer, 0.0, 512, 1000, seed=0)
    assert outcome.reached and outcome.samples_to_accuracy == 0 and trainer.samples == 0
