"""`edgetrain evaluate --federated [SPEC.yaml]`: the federated evaluation
(common/federated/evaluation.py: the ready-made fleet, or a FederatedEvaluationSpec file) in
this process on twins, with no Redis and no workers. Prints the table (or, with --json, the
document) on stdout and writes federated.json and federated-accuracy.png into --out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_args import ExitCode
from ..rendering.output import note
from .evaluate import SpecProblem, read_spec

if TYPE_CHECKING:
    from edgetrain.common.federated.evaluation import FederatedEvaluation, FederatedEvaluationSpec

JSON_NAME = "federated.json"
PLOT_NAME = "federated-accuracy.png"


def load_federated(path: str | None) -> FederatedEvaluationSpec:
    """The spec file's federated evaluation, or the ready-made one; SpecProblem naming every bad field."""
    from edgetrain.common.federated.evaluation import FederatedEvaluationSpec, preset

    return preset() if path is None else read_spec(path, FederatedEvaluationSpec, "federated evaluation spec")


def run_federated(spec: FederatedEvaluationSpec) -> FederatedEvaluation:
    """Every method and seed, with a live line per round and a log line per run on stderr."""
    from edgetrain.common.federated.evaluation import LABELS, evaluate_fleet
    from edgetrain.common.federated.records import RoundRecord
    from edgetrain.common.federated.simulate import FederatedRun
    from edgetrain.common.schemas import TrainingOutcome

    from ..rendering.evaluation_progress import EvaluationProgress

    target = spec.job.target_accuracy
    with EvaluationProgress() as progress:
        progress.log(f"federated evaluation in this process (no Redis, no workers): {len(spec.job.devices)} devices, methods "
                     f"{spec.methods}, seeds {spec.seeds}; profiling the twins {sorted(set(spec.twins.values()))}")  # fmt: skip
        first = f"estimating the relation vector on {spec.proxy.dataset.name}" if spec.proxy else "profiling the twins"
        task = progress.add(f"federated: {first}")

        def on_round(method: str, seed: int, r: RoundRecord) -> None:
            progress.update(task, f"federated: {LABELS[method]}, seed {seed}: round {r.round}, global accuracy {r.accuracy:.3f} "
                                  f"(target {target:g}), {r.elapsed_s:.2f} device s SIMULATED")  # fmt: skip

        def on_run(run: FederatedRun) -> None:
            if run.reached:
                outcome = (f"reached {target:g} in {len(run.rounds)} rounds, {run.time_to_target_s:.2f} device s, "
                           f"{run.energy_to_target_j:.1f} J (SIMULATED)")  # fmt: skip
            else:
                outcome = f"not reached in {len(run.rounds)} rounds (global accuracy {run.rounds[-1].accuracy:.3f})"
            progress.log(f"{LABELS[run.method]}, seed {run.seed}: {outcome}")

        def on_proxy_run(o: TrainingOutcome) -> None:
            found = f"N_b = {o.samples_to_accuracy} samples" if o.reached else f"not reached in {o.samples_processed} samples"
            progress.log(f"proxy run b = {o.batch_size}, seed {o.seed}: {found}")

        evaluation = evaluate_fleet(spec, on_round, on_run, on_proxy_run)
        progress.finish(task, f"federated: {len(evaluation.runs)} runs done")
    return evaluation


def write_federated(evaluation: FederatedEvaluation, out: Path) -> list[Path]:
    """The JSON document and the accuracy figure in `out`; returns their paths."""
    from ..rendering.federated_plots import plot_accuracy

    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_NAME).write_text(evaluation.model_dump_json(indent=2))
    plot_accuracy(evaluation, out / PLOT_NAME)
    return [out / JSON_NAME, out / PLOT_NAME]


def cmd_evaluate_federated(args: argparse.Namespace) -> int:
    """`edgetrain evaluate --federated [SPEC.yaml]`."""
    from edgetrain.common.datasets.sources import DatasetMissingError
    from edgetrain.common.selection import SelectionError

    from ..rendering.federated_text import format_federated_evaluation

    try:
        if args.scale or args.verify:
            raise SpecProblem("--federated runs the ready-made federated evaluation or SPEC; not with --scale or --verify")
        evaluation = run_federated(load_federated(args.spec))
    except SpecProblem as exc:
        print(f"edgetrain evaluate: {exc}", file=sys.stderr)
        return ExitCode.usage
    except SelectionError as exc:
        print(f"edgetrain evaluate: {exc}", file=sys.stderr)
        return ExitCode.infeasible
    except (DatasetMissingError, ValueError) as exc:  # missing data, or a split that cannot serve the fleet
        print(f"edgetrain evaluate: {exc}", file=sys.stderr)
        return ExitCode.usage
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.interrupted
    written = write_federated(evaluation, Path(args.out))
    print(evaluation.model_dump_json(indent=2) if args.json else format_federated_evaluation(evaluation))
    note(f"JSON and figure in {', '.join(map(str, written))}; wall time {evaluation.wall_s:.0f} s")
    return ExitCode.ok
