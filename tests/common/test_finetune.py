"""The fine-tune recipe (common/finetune/recipe.py) without Celery or Redis: real training of the small
CNN on a Nano twin (SIMULATED), with a writer that records what the run writes and answers as
the store would (the attempt holds its part, the job is cancelled, another attempt took over)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from types import SimpleNamespace

import pytest

from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.finetune.learned import DataIdentity
from edgetrain.common.finetune.recipe import CancelledRun, FineTune, Options, Stopping, Superseded
from edgetrain.common.jobs.state import CheckpointRef, EventKind, Started
from edgetrain.common.payloads import finetune_request
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec, ProfileTable, RelationVector, Selection, VectorProvenance
from edgetrain.common.selection import Robust
from edgetrain.common.store import Written

TWIN = load_twin("jetson-nano")
TOP = TWIN.frequencies_hz[-1]
SPEC = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0, "dataset": {"name": "mnist5k", "fraction": 0.2}}],
                                        target_accuracy=0.999, max_samples=512, eval_every_samples=128))  # fmt: skip


def request(batch_size: int = 32):
    choice = Selection(batch_size=batch_size, frequency_hz=TOP, estimated_time_s=1.0, peak_power_w=None)
    return finetune_request("j1", SPEC, SPEC.devices[0], choice, "none", "none")


class Writer:
    """Records every write; answers `Written.ok` until `answer_from` writes were made, then `answer`
    (for checkpoint writes only, when `checkpoints_only`)."""

    def __init__(self, answer: Written = Written.ok, answer_from: int = 0, checkpoints_only: bool = False):
        self.answer, self.answer_from, self.checkpoints_only = answer, answer_from, checkpoints_only
        self.writes: list[tuple] = []
        self.begun: list[Started] = []

    def write(self, progress=None, checkpoint=None, event=None) -> Written:
        self.writes.append((progress, checkpoint, event))
        due = len(self.writes) > self.answer_from and (checkpoint is not None or not self.checkpoints_only)
        return self.answer if due else Written.ok

    def notice(self, notice):
        return Written.ok

    def started(self, started: Started) -> Written:
        self.begun.append(started)
        return Written.ok

    def checkpoints(self) -> list[CheckpointRef]:
        return [c for _, c, _ in self.writes if c is not None]

    def events(self) -> list[tuple]:
        return [e for _, _, e in self.writes if e is not None]


def run(writer: Writer, tmp_path, batch_size: int = 32, checkpoint: CheckpointRef | None = None, **options):
    device = SimulatedDevice(TWIN, seed=0)
    recipe = FineTune(request(batch_size), device, writer, Options(attempt="a" * 32, artifact_dir=tmp_path, **options))
    recipe.setup(checkpoint)
    return recipe, device


def files(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("checkpoint-*"))


def test_a_run_reports_every_configuration_that_ran_and_its_progress(tmp_path) -> None:
    writer = Writer()
    recipe, _ = run(writer, tmp_path)
    report = recipe.run()
    assert not report.reached and report.samples_processed == 512 and report.simulated
    assert [(c.batch_size, c.frequency_hz) for c in report.configurations] == [(32, TOP)]
    assert report.configurations[0].samples == 512
    assert report.configurations[0].device_time_s == pytest.approx(report.device_time_s)
    progress = [p.samples for p, _, _ in writer.writes if p is not None]
    assert progress == [0, 128, 256, 384, 512]  # an evaluation before training, then every 128 samples


def test_a_cancel_checkpoints_then_stops_and_a_new_attempt_continues_with_the_dispatched_batch_size(tmp_path) -> None:
    writer = Writer(Written.cancel, answer_from=3)  # (an event, progress at 0 and 128, then) the evaluation at 256 learns of it
    recipe, device = run(writer, tmp_path, check_every_s=3600, checkpoint_every_s=3600)  # no periodic checkpoint however slow the machine
    with pytest.raises(CancelledRun, match="cancelled after 256 samples"):
        recipe.run()
    (kept,) = writer.checkpoints()
    assert kept.samples == 256 and files(tmp_path) == [f"checkpoint-j1-d1-{'a' * 12}-1.pt"]
    assert device.current_frequency() == TOP  # restored (the twin's default is its top clock)
    again = Writer()
    device = SimulatedDevice(TWIN, seed=0)
    resumed = FineTune(request(64), device, again, Options(attempt="b" * 32, artifact_dir=tmp_path, checkpoint_every_s=0))
    resumed.setup(kept)
    report = resumed.run()
    assert report.samples_processed == 512 and [(c.batch_size, c.samples) for c in report.configurations] == [(64, 256)]
    (left,) = files(tmp_path)
    assert left.startswith(f"checkpoint-j1-d1-{'b' * 12}-")  # the new attempt's last replaced the old one


def test_an_attempt_that_no_longer_holds_its_part_stops_and_leaves_no_checkpoint(tmp_path) -> None:
    writer = Writer(Written.stale, checkpoints_only=True)
    recipe, _ = run(writer, tmp_path, checkpoint_every_s=0)
    with pytest.raises(Superseded, match="another attempt holds its part"):
        recipe.run()
    assert files(tmp_path) == [] and len(writer.checkpoints()) == 1
    gone = Writer(Written.gone)
    recipe, _ = run(gone, tmp_path)
    with pytest.raises(Superseded, match="no longer in the store"):
        recipe.run()
    assert len(gone.writes) == 1  # nothing after the first refused write


class RefusingAfterFirstCheckpoint(Writer):
    """Accepts the first checkpoint; after it the attempt no longer holds its part (cancelled,
    or handed on, while it saved the next)."""

    def write(self, progress=None, checkpoint=None, event=None) -> Written:
        refused = checkpoint is not None and bool(self.checkpoints())
        super().write(progress, checkpoint, event)
        return Written.stale if refused else Written.ok


def test_a_checkpoint_the_part_refuses_leaves_the_recorded_one_whole_for_the_next_attempt(tmp_path) -> None:
    writer = RefusingAfterFirstCheckpoint()
    recipe, _ = run(writer, tmp_path, checkpoint_every_s=0)
    with pytest.raises(Superseded):
        recipe.run()
    recorded, refused = writer.checkpoints()
    assert refused.samples > recorded.samples and len(files(tmp_path)) == 1
    resumed = FineTune(request(), SimulatedDevice(TWIN, seed=0), Writer(), Options(attempt="b" * 32, artifact_dir=tmp_path))
    resumed.setup(recorded)  # the file is there, as it was recorded
    assert resumed.trainer is not None and resumed.trainer.samples == recorded.samples


def test_a_shutting_down_worker_checkpoints_and_stops(tmp_path) -> None:
    asked = []
    writer = Writer()
    recipe, _ = run(writer, tmp_path, stop_requested=lambda: "its worker is shutting down" if len(asked.append(1) or asked) > 4 else None)
    with pytest.raises(Stopping, match="its worker is shutting down after"):
        recipe.run()
    assert writer.checkpoints() and files(tmp_path)


def test_a_checkpoint_that_cannot_be_written_is_a_warning_once_and_the_run_goes_on(tmp_path) -> None:
    not_a_folder = tmp_path / "full"
    not_a_folder.write_text("a file where the artifact folder should be")
    writer = Writer()
    recipe, _ = run(writer, not_a_folder, checkpoint_every_s=0)
    report = recipe.run()
    assert report.samples_processed == 512 and writer.checkpoints() == []
    warnings = [e for e in writer.events() if e[0] == EventKind.checkpoint_failed]
    assert len(warnings) == 1 and "the run goes on" in warnings[0][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary file left behind


def test_the_report_names_learned_r_b_only_where_they_chose_what_ran(tmp_path) -> None:
    prior = RelationVector(batch_sizes=[32, 128], ratios=[0.5, 1.0], key="proxy")
    learned = VectorProvenance(source="learned", summary="r_b 32: 0.50, 128: 1.00 (2 record(s))")
    recipe, _ = run(Writer(), tmp_path)
    recipe.vector = prior  # it started from the proxy's r_b; records kept since gave the loop a belief
    recipe.loop = SimpleNamespace(provenance=lambda: learned, decisions=[])  # type: ignore[assignment]
    assert recipe._learned() is None  # nothing it decided came from them
    recipe.loop = SimpleNamespace(provenance=lambda: learned, decisions=["a switch for evidence"])  # type: ignore[assignment]
    assert recipe._learned() == learned
    recipe.vector, recipe.loop = prior.model_copy(update={"provenance": learned}), None  # it started from records of this data
    assert recipe._learned() == learned


def test_a_first_job_runs_the_largest_batch_where_only_a_proxy_found_far_off_elsewhere_favours_a_slower_one(tmp_path) -> None:
    # per sample b=32 takes 1.5x b=128's time: only the proxy's r_32 = 0.5 makes it faster; no
    # run on this data measured either, and the proxy's r_b were far off on other data (trust width
    # 0.8: r_32 may be 1 here), so the recipe runs b=128 from its first step and says why
    table = ProfileTable(batch_sizes=[32, 128], frequencies_hz=[TOP], samples=1000, time_s=[[1.5], [1.0]],
                         peak_power_w=[[3.0], [3.0]], max_batch_size=128)  # fmt: skip
    prior = RelationVector(batch_sizes=[32, 128], ratios=[0.5, 1.0], samples_mean=[500.0, 1000.0], samples_std=[10.0, 20.0], key="proxy")
    assert Robust(prior).choose(table, None).batch_size == 32
    spec = SPEC.model_copy(update={"devices": [SPEC.devices[0].model_copy(update={"power_cap_w": None})]})
    choice = Selection(batch_size=32, frequency_hz=TOP, estimated_time_s=0.75, peak_power_w=3.0)
    options = Options(attempt="a" * 32, artifact_dir=tmp_path, table=table, vector=prior, data=DataIdentity(name="mnist5k", fraction=0.2),
                      trust=0.8)  # fmt: skip
    writer = Writer()
    recipe = FineTune(finetune_request("j1", spec, spec.devices[0], choice, "none", "none"), SimulatedDevice(TWIN, seed=0), writer, options)
    recipe.setup(None)
    report = recipe.run()
    assert [c.batch_size for c in report.configurations] == [128]
    [switch] = [s for s in report.switches if s.cause == "evidence"]
    assert (switch.samples, switch.old_batch_size, switch.new_batch_size) == (0, 32, 128)
    assert "b=128: the fastest expected that is safe against Baseline 1" in (switch.note or "") and "within 80%" in (switch.note or "")
    [begun] = writer.begun  # what its report's headline names, beside the plan
    assert begun.selection.batch_size == 128 and "safe against Baseline 1" in (begun.selection.note or "")
    assert begun.estimated_time_to_accuracy_s == pytest.approx(1.0) and begun.vector == "the proxy's r_b"
    assert not [text for _, text in writer.events() if "safe against Baseline 1" in text]  # said once, as the start
    trusting = FineTune(finetune_request("j2", spec, spec.devices[0], choice, "none", "none"), SimulatedDevice(TWIN, seed=0), Writer(),
                        Options(attempt="b" * 32, artifact_dir=tmp_path, table=table, vector=prior,
                                data=DataIdentity(name="mnist5k", fraction=0.2)))  # fmt: skip
    trusting.setup(None)
    assert [c.batch_size for c in trusting.run().configurations] == [32]  # the paper's trust: r_32 at most 0.54, 0.81x b=128


@pytest.mark.parametrize("writer", [Writer(), Writer(Written.gone)], ids=["completed", "superseded at its first selection"])
def test_a_finished_run_frees_its_model_and_data_without_waiting_for_the_cycle_collector(writer: Writer, tmp_path) -> None:
    # a device worker runs job after job in one process: what a run held must go when the task
    # drops the recipe, by reference counting; left in a reference cycle it waits for a full
    # collection, which comes seldom, and the worker grew by the data and model of every job
    table = ProfileTable(batch_sizes=[32, 128], frequencies_hz=[TOP], samples=1000, time_s=[[1.0], [0.5]],
                         peak_power_w=[[3.0], [3.0]], max_batch_size=128)  # fmt: skip
    prior = RelationVector(batch_sizes=[32, 128], ratios=[1.0, 1.0], samples_mean=[1.0, 1.0], samples_std=[0.0, 0.0], key="proxy")
    options = Options(attempt="a" * 32, artifact_dir=tmp_path, table=table, vector=prior, data=DataIdentity(name="mnist5k", fraction=0.2))
    spec = SPEC.model_copy(update={"devices": [SPEC.devices[0].model_copy(update={"power_cap_w": None})]})
    choice = Selection(batch_size=32, frequency_hz=TOP, estimated_time_s=1.0, peak_power_w=3.0)  # b=128 is faster: a switch at once

    def finished(writer: Writer) -> FineTune:
        recipe = FineTune(
            finetune_request("j1", spec, spec.devices[0], choice, "none", "none"), SimulatedDevice(TWIN, seed=0), writer, options
        )
        recipe.setup(None)
        with contextlib.suppress(Superseded):
            recipe.run()
        return recipe

    finished(Writer())  # like a worker's first job: torch imports modules as the first model runs, in a cycle with its frames
    gc.collect()
    gc.disable()
    try:
        recipe = finished(writer)
        assert recipe.control is not None and len(writer.writes) >= 1  # the cap control ran, and wrote its switch
        trainer = recipe.trainer
        held = {"recipe": recipe, "model": trainer.model, "optimizer": trainer.optimizer, "data": trainer.train_x}
        refs = {name: weakref.ref(x) for name, x in held.items()}
        del recipe, trainer, held
        assert [name for name, ref in refs.items() if ref() is not None] == []
    finally:
        gc.enable()
