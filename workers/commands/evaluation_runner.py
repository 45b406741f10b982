"""One evaluation through a cluster's workers, as real jobs do it.

1. Each device type's lookup table: reused when Redis holds a current one with every batch
   size of the spec, else claimed and profiled on one of its devices (`EdgeTrainClient.profile`,
   the protocol of `edgetrain profile run`), missing rows merged into the stored table.
2. The pre-trained weights (`pretrain` on the server queue), unless pre-trained alike before.
3. N_b of the proxy and of every target, for every batch size and seed: one relation vector
   per dataset on the server pool, all sent before any is waited for, so they spread over
   every server worker (the oracle's N_b, measured on the target data, do not depend on the
   device and run there too); stored vectors are reused.
4. The figures of every method (common/evaluation), from the tables and the vectors.
5. With `verify`, every distinct configuration of a row fine-tuned on its device to the
   target, as a job with a fixed configuration, and compared with equation (2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.progress import TaskID

from edgetrain.common.evaluation import (
    Achieved,
    Check,
    DatasetGoal,
    DeviceProfile,
    EvaluationRow,
    EvaluationRun,
    EvaluationSpec,
    SentToWorkers,
    Verification,
    achieved,
    checks,
    evaluate,
    verification,
)
from edgetrain.common.jobs.state import JobStatus
from edgetrain.common.keys import table_id, vector_key
from edgetrain.common.models import get_model
from edgetrain.common.payloads import PretrainRequest
from edgetrain.common.schemas import DeviceInfo, EstimationRequest, ProfileTable, RelationVector, utc_now
from edgetrain.common.store import SetAside
from edgetrain.common.tables import Profile, Reuse, rows_of, table_need
from edgetrain.tasks.client import EdgeTrainClient, Pending, ResourceFailed

from ..rendering.evaluation_progress import EvaluationProgress
from ..rendering.progress import part_line

POLL_S = 0.5


class EvaluationFailed(RuntimeError):
    """Something the evaluation needs failed on the workers or did not come in time; the
    message names it and why."""


@dataclass
class _Waited:
    """One thing produced by the workers that the evaluation waits for."""

    what: str
    ready: Callable[[], Any]
    task: TaskID
    describe: Callable[[], str] | None = None  # how far it got, while waiting
    outcome: Callable[[Any], str] | None = None  # what came of it, once ready
    value: Any = None


@dataclass
class _Evaluation:
    client: EdgeTrainClient
    spec: EvaluationSpec
    devices: list[DeviceInfo]  # one per spec.devices entry
    progress: EvaluationProgress
    timeout_s: float
    dispatched: SentToWorkers = field(default_factory=SentToWorkers)
    started_at: datetime = field(default_factory=utc_now)  # profiling.force: tables older than this are profiled again

    def table_id(self, info: DeviceInfo) -> str:
        return table_id(info.device_type, self.spec.model, get_model(self.spec.model).input_shape)

    def set_aside(self, record: SetAside) -> None:
        """A stored table, vector or weights record no longer loaded: it was set aside, and is made again."""
        self.progress.log(record.line())

    # ---------------------------------------------------------------- waiting

    def wait_all(self, waited: list[_Waited]) -> None:
        """Poll until every one is ready; EvaluationFailed when one fails or time runs out."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for w in waited:
                if w.value is not None:
                    continue
                try:
                    w.value = w.ready()
                except ResourceFailed as exc:
                    self.progress.finish(w.task, f"{w.what}: FAILED")
                    raise EvaluationFailed(f"{w.what}: {exc}") from None
                if w.value is not None:
                    self.progress.finish(w.task, f"{w.what}: {w.outcome(w.value) if w.outcome else 'ready'}")
                elif w.describe is not None:
                    self.progress.update(w.task, w.describe())
            left = [w.what for w in waited if w.value is None]
            if not left:
                return
            if time.monotonic() > deadline:
                raise EvaluationFailed(f"still waiting after {self.timeout_s:g} s for {left}: are the workers running?")
            time.sleep(POLL_S)

    def pending(self, what: str, pending: Pending[Any], doing: str, describe: Callable[[], str] | None = None) -> _Waited:
        """A line for `pending`: what this client dispatched, or whose production it waits for."""
        text = f"{what}: {doing}" if pending.dispatched else f"{what}: waiting for {pending.holder}, which produces it"
        task = self.progress.add(text)
        return _Waited(what, pending.ready, task, (lambda: f"{what}: {describe()}") if describe else None)

    # ---------------------------------------------------------------- tables

    def request_tables(self) -> tuple[dict[str, ProfileTable], dict[str, _Waited]]:
        """By table id: the stored tables that serve the spec, and the profiles dispatched for the others."""
        spec = self.spec
        stored: dict[str, ProfileTable] = {}
        waited: dict[str, _Waited] = {}
        for entry, info in zip(spec.devices, self.devices):
            tid = self.table_id(info)
            if tid in stored or tid in waited:
                continue
            cap = entry.power_caps_w[0] if spec.profiling.mode == "staircase" else None
            current = self.client.store.resources.table(tid, self.set_aside)
            need = table_need(current, info, spec.batch_sizes, cap, not_before=self.started_at if spec.profiling.force else None)
            if isinstance(need, Reuse):
                stored[tid] = need.table
                self.progress.log(f"lookup table {tid}: stored, reused")
                continue
            assert isinstance(need, Profile), "no failure is asked about"
            if need.why is not None:
                self.progress.log(f"lookup table {tid}: not reused: {need.why}")
            rows = need.rows
            pending = self.client.profile(info, spec.model, rows, spec.profiling, cap, merge=need.merge)
            self.dispatched.profiles += pending.dispatched
            doing = f"profiling {spec.profiling.mode} of batch sizes {rows} on {info.device_id}"

            def measured(info: DeviceInfo = info, doing: str = doing) -> str:
                progress = self.client.profiling_progress(info.device_type, spec.model)
                return f"{doing}: {progress.line()}" if progress and not progress.done else doing

            waited[tid] = self.pending(f"lookup table {tid}", pending, doing, measured)
        return stored, waited

    # ---------------------------------------------------------------- weights and vectors

    def weights(self) -> tuple[str, float | None]:
        """The weights every run starts from: the spec's, or pre-trained on the server pool."""
        spec = self.spec
        if spec.pretrain is None:
            return spec.weights, None
        assert spec.init_seed is not None, "the spec checks that pre-training starts from init:<seed>"
        options = {"batch_size": spec.pretrain.batch_size, "lr": spec.lr, "seed": spec.init_seed}
        request = PretrainRequest(model=spec.model, dataset=spec.pretrain.dataset, samples=spec.pretrain.max_samples, **options)
        what = f"pre-training {spec.model} on {spec.pretrain.dataset.name} ({spec.pretrain.max_samples} samples)"
        stored = self.client.store.resources.pretrained(request, self.set_aside)
        if stored is not None:
            self.progress.log(f"{what}: stored, reused")
            return stored.weights, stored.test_accuracy
        task = self.progress.add(f"{what} on the server queue")
        self.dispatched.pretrain += 1
        try:
            result = self.client.pretrain(spec.model, request.dataset, request.samples, self.timeout_s, **options)
        except Exception as exc:  # the task's own error, re-raised by its result
            self.progress.finish(task, f"{what}: FAILED")
            raise EvaluationFailed(f"{what} failed: {type(exc).__name__}: {exc}") from None
        self.progress.finish(task, f"{what}: test accuracy {result.test_accuracy:.3f}")
        return result.weights, result.test_accuracy

    def request_vectors(self, weights: str) -> tuple[dict[str, RelationVector], dict[str, _Waited]]:
        """Every dataset's relation vector: stored ones, and estimations sent for the others."""
        stored: dict[str, RelationVector] = {}
        waited: dict[str, _Waited] = {}
        for goal in self.spec.goals():
            request = self.spec.estimation_request(goal, weights)
            key = vector_key(request)
            role = "proxy" if goal == self.spec.proxy else "target"
            what = f"N_b on {goal.label} ({role}, to {goal.target_accuracy:g})"
            vector = self.client.store.resources.vector(key, self.set_aside)
            if vector is not None:
                stored[goal.label] = vector
                self.progress.log(f"{what}: stored, reused")
                continue
            pending = self.client.request_vector(request)
            self.dispatched.estimations += pending.dispatched
            runs = len(request.batch_sizes) * len(request.seeds)

            def done(request: EstimationRequest = request) -> str:
                progress = self.client.estimation_progress(request)
                if progress is None:
                    return "estimated"
                return "; ".join([f"{progress.line()} on the server pool", *progress.running_lines()])

            waited[goal.label] = self.pending(what, pending, f"0/{runs} proxy runs done on the server pool", done)
        return stored, waited

    # ---------------------------------------------------------------- verification

    def verify(self, weights: str, run: EvaluationRun, tables: dict[str, ProfileTable]) -> tuple[list[Verification], list[Achieved]]:
        """Fine-tune, as real jobs on each row's device: edgetrain as a user's job runs it, then,
        once every such job has finished, every distinct configuration of the row's methods (so
        edgetrain learns only from its own earlier fine-tunes, never from the fixed
        configurations' records, even where its job waits for a vector the others do not)."""
        by_type = {info.device_type: info for info in reversed(self.devices)}  # the first device of each type
        goals = {goal.label: goal for goal in self.spec.goals()}
        seed = self.spec.seeds[0]
        own: list[tuple[EvaluationRow, str, _Waited]] = []
        for row in run.rows:
            info, goal = by_type[row.device_type], goals[row.target]
            job_id = self.client.submit(self.job(weights, info, goal, row.power_cap_w, None))
            self.dispatched.finetunes += 1
            what = f"run edgetrain {info.device_id}, {_cap(row.power_cap_w)}, {goal.label}: the closed loop from the proxy, job {job_id}"
            waited = _Waited(what, self.finished_status(job_id), self.progress.add(what), self.job_progress(what, job_id, info),
                             self.job_outcome(info))  # fmt: skip
            own.append((row, job_id, waited))
        self.wait_all([w for _, _, w in own])
        jobs: list[tuple[Check, str, _Waited]] = []
        for check in checks(run.rows):
            info, goal = by_type[check.row.device_type], goals[check.row.target]
            job_id = self.client.submit(self.job(weights, info, goal, check.row.power_cap_w, check))
            self.dispatched.finetunes += 1
            what = (f"verify {info.device_id}, {_cap(check.row.power_cap_w)}, {goal.label}: b={check.batch_size} at "
                    f"{check.frequency_hz / 1e6:g} MHz ({', '.join(check.methods)}), job {job_id}")  # fmt: skip
            task = self.progress.add(what)
            waited = _Waited(what, self.finished_status(job_id), task, self.job_progress(what, job_id, info), self.job_outcome(info))
            jobs.append((check, job_id, waited))
        self.wait_all([w for _, _, w in jobs])
        ran = []
        for row, job_id, w in own:
            part = w.value.parts[by_type[row.device_type].device_id]
            ran.append(achieved(row, part.device_id, part.report, job_id, part.reason))
        verified = []
        for check, job_id, w in jobs:
            info, goal = by_type[check.row.device_type], goals[check.row.target]
            part = w.value.parts[info.device_id]
            key = vector_key(self.spec.estimation_request(goal, weights))
            server = {(o.batch_size, o.seed): o.samples_to_accuracy for o in self.client.store.resources.vector_parts(key)}
            verified.append(verification(check, info.device_id, seed, tables[info.device_type], part.report,
                                         server.get((check.batch_size, seed)), job_id, part.reason))  # fmt: skip
        return verified, ran

    def job(self, weights: str, info: DeviceInfo, goal: DatasetGoal, power_cap_w: float | None, check: Check | None) -> dict[str, Any]:
        """A job that fine-tunes on the target's data: `check`'s configuration, its proxy the
        target itself (so the job's relation vector is the target's, estimated already); or,
        without a check, edgetrain's own choice from the spec's proxy at the proxy's target
        (the vector the computed methods use), as a user's job."""
        spec = self.spec
        proxy = goal if check else spec.proxy
        fixed = {"configuration": {"batch_size": check.batch_size, "frequency_hz": check.frequency_hz}} if check else {}
        return {
            "model": spec.model, "weights": weights, "dataset": goal.dataset.model_dump(), "proxy_dataset": proxy.dataset.model_dump(),
            "target_accuracy": goal.target_accuracy, "proxy_target_accuracy": proxy.target_accuracy,
            "devices": [{"device_id": info.device_id, "power_cap_w": power_cap_w, **fixed}],
            "batch_sizes": spec.batch_sizes, "seeds": spec.seeds, "lr": spec.lr.model_dump(),
            "eval_every_samples": spec.eval_every_samples, "max_samples": spec.max_samples,
            "profiling": spec.profiling.model_dump() | {"force": False},  # the table was just made or checked
        }  # fmt: skip

    def finished_status(self, job_id: str) -> Callable[[], JobStatus | None]:
        def ready() -> JobStatus | None:
            status = self.client.status(job_id)
            return status if status.finished else None

        return ready

    @staticmethod
    def job_outcome(info: DeviceInfo) -> Callable[[JobStatus], str]:
        def outcome(status: JobStatus) -> str:
            part = status.parts[info.device_id]
            if part.report is None:
                return f"{part.state.value}: {part.reason}"
            run = part.report
            return (f"{part.state.value}, accuracy {run.final_accuracy:.3f} ({'reached' if run.reached else 'target not reached'}) "
                    f"after {run.samples_processed} samples, device time {run.device_time_s:.3g} s")  # fmt: skip

        return outcome

    def job_progress(self, what: str, job_id: str, info: DeviceInfo) -> Callable[[], str]:
        def describe() -> str:
            return f"{what}: {part_line(self.client.status(job_id), info.device_id)}"

        return describe

    # ---------------------------------------------------------------- the whole

    def run(self, verify: bool) -> tuple[EvaluationRun, dict[str, ProfileTable]]:
        started = time.perf_counter()
        spec = self.spec
        stored_tables, waited_tables = self.request_tables()
        weights, accuracy = self.weights()
        vectors, waited_vectors = self.request_vectors(weights)
        self.wait_all([*waited_tables.values(), *waited_vectors.values()])
        tables = stored_tables | {tid: w.value for tid, w in waited_tables.items()}
        vectors |= {label: w.value for label, w in waited_vectors.items()}
        by_type = {info.device_type: tables[self.table_id(info)] for info in self.devices}
        profiles = [
            DeviceProfile(device_type=info.device_type, table=rows_of(by_type[info.device_type], spec.batch_sizes),
                          power_envelope_w=info.power_envelope_w, power_caps_w=entry.power_caps_w)
            for entry, info in zip(spec.devices, self.devices)
        ]  # fmt: skip
        report = evaluate(profiles, vectors, spec.proxy.label, [t.label for t in spec.targets])
        run = EvaluationRun(
            **report.model_dump(), name=spec.name, spec=spec, weights=weights, pretrain_test_accuracy=accuracy,
            vectors={goal.label: vectors[goal.label] for goal in spec.goals()}, dispatched=self.dispatched, wall_s=0.0,
        )  # fmt: skip
        evaluated = {p.device_type: p.table for p in profiles}
        if verify:
            run.verification, run.achieved = self.verify(weights, run, evaluated)
        run.wall_s = time.perf_counter() - started
        return run, evaluated


def _cap(power_cap_w: float | None) -> str:
    return "no cap" if power_cap_w is None else f"cap {power_cap_w:g} W"


def run_evaluation(client: EdgeTrainClient, spec: EvaluationSpec, devices: list[DeviceInfo], progress: EvaluationProgress,
                   verify: bool = False, timeout_s: float = 6 * 3600) -> tuple[EvaluationRun, dict[str, ProfileTable]]:  # fmt: skip
    """Run `spec` on the cluster of `client` with `devices` (one per `spec.devices` entry, in
    order); returns the evaluation and the lookup table of each device type (its rows of the
    spec's batch sizes). EvaluationFailed when a step fails on the workers or waits longer
    than `timeout_s` (s)."""
    return _Evaluation(client, spec, devices, progress, timeout_s).run(verify)
