"""`edgetrain evaluate SPEC.json | --scale quick|paper`: the paper's evaluation (Baseline 1,
Baseline 2, edgetrain and the oracle; time and energy to accuracy; proxy sensitivity) through
the cluster's workers. `edgetrain evaluate --federated [SPEC.yaml]` runs the federated
evaluation in this process instead (evaluate_federated.py).

With a Redis configured (`--redis-url` or EDGETRAIN_REDIS_URL[_FILE]) it runs on that
cluster's workers: a `device_id` entry names a registered device, a `twin` entry the first
registered device that simulates that twin. Otherwise it starts a local cluster (an embedded
Redis, the control worker, server workers and one device worker per twin) and stops it after,
also on Ctrl-C; that Redis keeps its data in `--workdir`, with the pre-trained weights, so a
second evaluation reuses the tables, vectors and weights of the first.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from edgetrain.common.redis_address import redacted

from ..cli_args import ExitCode, settings_from
from ..rendering.output import note

if TYPE_CHECKING:
    from edgetrain.common.evaluation import EvaluationRun, EvaluationSpec
    from edgetrain.common.schemas import DeviceInfo, ProfileTable
    from edgetrain.tasks.client import EdgeTrainClient

DEFAULT_WORKDIR = Path.home() / ".cache" / "edgetrain" / "evaluation"
DEFAULT_TIMEOUT_S = 6 * 3600.0
Spec = TypeVar("Spec", bound=BaseModel)


class SpecProblem(ValueError):
    """An evaluation cannot run as asked; the message names the field and what is allowed."""


def load_specs(path: str | None, scale: str | None) -> list[EvaluationSpec]:
    """The spec file's evaluation, or the evaluations of a scale; SpecProblem naming every bad field."""
    from edgetrain.common.evaluation import EvaluationSpec, scale_preset

    if (path is None) == (scale is None):
        raise SpecProblem("give a spec file (SPEC.json) or --scale quick|paper, not both")
    if scale is not None:
        return scale_preset(scale)  # type: ignore[arg-type]  # argparse allows the scales only
    return [read_spec(path, EvaluationSpec, "evaluation spec")]  # type: ignore[arg-type]  # not None here


def read_spec(path: str, model: type[Spec], what: str) -> Spec:
    """The document in file `path` (JSON, or YAML by its suffix) validated as `model`;
    SpecProblem naming every bad field."""
    from edgetrain.common.documents import DocumentError, read_document

    try:
        data = read_document(path, f"the {what}")
    except DocumentError as exc:
        raise SpecProblem(str(exc)) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(spec)'}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]
        raise SpecProblem(f"invalid {what} {path}:\n  " + "\n  ".join(lines)) from None


def twin_device_id(twin: str) -> str:
    """The device id of a twin's worker in the local cluster: sim-<its device type>."""
    from edgetrain.common.devices.simulated import load_twin

    return "sim-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", load_twin(twin).device_type)[:59]


def local_problems(specs: list[EvaluationSpec]) -> list[str]:
    """What a local cluster cannot run: registered devices, and data missing on this machine."""
    from edgetrain.common.datasets.sources import SOURCES, DatasetMissingError, locate

    problems = []
    for spec in specs:
        for k, entry in enumerate(spec.devices):
            if entry.device_id is not None:
                problems.append(f"devices.{k}.device_id: {entry.device_id!r} is a registered device, which needs a running "
                                "cluster: set EDGETRAIN_REDIS_URL or pass --redis-url (or name a 'twin')")  # fmt: skip
        refs = {"proxy.dataset": spec.proxy.dataset} | {f"targets.{k}.dataset": t.dataset for k, t in enumerate(spec.targets)}
        if spec.pretrain is not None:
            refs["pretrain.dataset"] = spec.pretrain.dataset
        for where, ref in refs.items():
            if ref.name in SOURCES and ref.path is None:  # user data (a path) is checked by the workers that read it
                try:
                    locate(ref.name)
                except DatasetMissingError as exc:
                    problems.append(f"{where}: {exc}")
    return list(dict.fromkeys(problems))


def fleet_devices(client: EdgeTrainClient, spec: EvaluationSpec) -> list[DeviceInfo]:
    """The registered device of every spec entry; SpecProblem naming an entry without one."""
    from edgetrain.common.devices.simulated import load_twin

    fleet = client.fleet()
    found = []
    for k, entry in enumerate(spec.devices):
        if entry.device_id is not None:
            match = [d for d in fleet if d.device_id == entry.device_id]
            what = f"devices.{k}.device_id: {entry.device_id!r} is not registered in the fleet"
        else:
            assert entry.twin is not None
            twin = load_twin(entry.twin)
            match = [d for d in fleet if d.backend == f"sim:{entry.twin}" or (d.simulated and d.device_type == twin.device_type)]
            what = (f"devices.{k}.twin: no registered device simulates {entry.twin!r}; start one with `edgetrain worker "
                    f"device --device-id ID --backend sim:{entry.twin}`")  # fmt: skip
        if not match:
            raise SpecProblem(f"{what} (registered: {sorted(d.device_id for d in fleet)})")
        found.append(sorted(match, key=lambda d: d.device_id)[0])
    return found


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def write_outputs(runs: list[tuple[EvaluationRun, dict[str, ProfileTable]]], out: Path) -> list[Path]:
    """Per evaluation, its JSON document and figures: in `out`, or in a folder per evaluation."""
    from ..rendering.evaluation_plots import write_figures

    folders = []
    for k, (run, tables) in enumerate(runs, start=1):
        folder = out if len(runs) == 1 else out / f"{k}-{_slug(run.name or 'evaluation')}"
        write_figures(run, tables, folder, run.name)
        (folder / "evaluation.json").write_text(run.model_dump_json(indent=2))
        folders.append(folder)
    return folders


@contextmanager
def _exclusive(workdir: Path) -> Iterator[None]:
    """Hold `workdir` (its embedded Redis) for this process; SpecProblem when another holds it."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecProblem(f"another `edgetrain evaluate` uses {workdir} (its Redis); wait for it or pass --workdir") from None
        yield


def _run_all(client: EdgeTrainClient, specs: list[EvaluationSpec], devices: list[list[DeviceInfo]],
             args: argparse.Namespace) -> list[tuple[EvaluationRun, dict[str, ProfileTable]]]:  # fmt: skip
    from ..rendering.evaluation_progress import EvaluationProgress
    from .evaluation_runner import run_evaluation

    runs = []
    with EvaluationProgress() as progress:
        for spec, found in zip(specs, devices):
            progress.log(f"evaluation: {spec.name or spec.model} on {[d.device_id for d in found]}")
            runs.append(run_evaluation(client, spec, found, progress, args.verify, args.timeout))
    return runs


def _configured(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "redis_url", None)) or any(v in os.environ for v in ("EDGETRAIN_REDIS_URL", "EDGETRAIN_REDIS_URL_FILE"))


def _on_cluster(specs: list[EvaluationSpec], args: argparse.Namespace) -> list[tuple[EvaluationRun, dict[str, ProfileTable]]]:
    """Run on the configured cluster's workers."""
    from edgetrain.tasks.client import EdgeTrainClient

    settings = settings_from(args)
    client = EdgeTrainClient(settings.redis_url, settings.key_prefix)
    devices = [fleet_devices(client, spec) for spec in specs]
    note(f"running on the cluster's workers at {redacted(settings.redis_url)}")
    return _run_all(client, specs, devices, args)


def _on_local_cluster(specs: list[EvaluationSpec], args: argparse.Namespace) -> list[tuple[EvaluationRun, dict[str, ProfileTable]]]:
    """Start a local cluster with a device worker per twin, run, and stop it."""
    from edgetrain.tasks.client import EdgeTrainClient

    from ..processes.cluster import LocalCluster

    problems = local_problems(specs)
    if problems:
        raise SpecProblem("cannot run on a local cluster:\n  " + "\n  ".join(problems))
    twins = {twin_device_id(e.twin): f"sim:{e.twin}" for spec in specs for e in spec.devices if e.twin}
    workdir = Path(args.workdir)
    env = {"EDGETRAIN_ARTIFACT_DIR": str(workdir / "artifacts")}
    with _exclusive(workdir):
        note(f"starting a local cluster in {workdir}: Redis, a control worker, {args.server_workers} server worker(s), "
             f"device workers {sorted(twins)} ...")  # fmt: skip
        started = time.perf_counter()
        with LocalCluster(workdir, devices=twins, server_workers=args.server_workers, env=env, persistent_redis=True) as cluster:
            note(f"cluster ready after {time.perf_counter() - started:.0f} s")
            client = EdgeTrainClient(cluster.url, password_file=False)
            fleet = {d.device_id: d for d in client.fleet()}
            devices = [[fleet[twin_device_id(e.twin)] for e in spec.devices if e.twin] for spec in specs]
            return _run_all(client, specs, devices, args)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """`edgetrain evaluate`."""
    if args.federated:
        from .evaluate_federated import cmd_evaluate_federated

        return cmd_evaluate_federated(args)
    from ..rendering.evaluation_text import format_run
    from .evaluation_runner import EvaluationFailed

    started = time.perf_counter()
    configured = _configured(args)
    try:
        specs = load_specs(args.spec, args.scale)
        runs = _on_cluster(specs, args) if configured else _on_local_cluster(specs, args)
    except SpecProblem as exc:
        print(f"edgetrain evaluate: {exc}", file=sys.stderr)
        return ExitCode.usage
    except EvaluationFailed as exc:
        print(f"edgetrain evaluate: failed: {exc}", file=sys.stderr)
        return ExitCode.failed
    except KeyboardInterrupt:
        where = "what was sent goes on on the cluster's workers" if configured else "the local cluster was shut down"
        print(f"interrupted; {where}", file=sys.stderr)
        return ExitCode.interrupted
    folders = write_outputs(runs, Path(args.out))
    if args.json:
        documents = [json.loads(run.model_dump_json()) for run, _ in runs]
        print(json.dumps(documents[0] if args.spec else {"scale": args.scale, "evaluations": documents}, indent=2))
    else:
        print("\n\n".join(format_run(run) for run, _ in runs))
    note(f"figures and JSON in {', '.join(map(str, folders))}; wall time {time.perf_counter() - started:.0f} s in all")
    return ExitCode.ok


def add_evaluate_command(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add `evaluate` to the `edgetrain` command."""
    p = subparsers.add_parser("evaluate", parents=parents, help="the paper's evaluation: baselines, edgetrain and the oracle, "
                              "time and energy to accuracy, proxy sensitivity, through the workers (--federated: the "
                              "federated evaluation, in this process)")  # fmt: skip
    p.add_argument("spec", nargs="?", help="SPEC.json (see common/evaluation/spec.py: EvaluationSpec; with --federated: "
                   "common/federated/evaluation.py: FederatedEvaluationSpec)")  # fmt: skip
    p.add_argument("--scale", choices=["quick", "paper"], help="run a ready-made evaluation instead of a spec file")
    p.add_argument("--federated", action="store_true",
                   help="the federated evaluation instead: Baseline 1, eq. (4) with equal local steps and edgetrain's "
                        "time-balanced steps on a fleet of twins (the ready-made one without SPEC); runs in this process, "
                        "needs no Redis or workers")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--out", default="edgetrain-evaluation", help="folder for the figures and the JSON (default: %(default)s)")
    p.add_argument("--verify", action="store_true", help="fine-tune each method's configuration on the device and compare")
    p.add_argument(
        "--workdir",
        default=str(DEFAULT_WORKDIR),
        help="local cluster only: where its Redis keeps the cache between runs, and the logs (default: %(default)s)",
    )
    p.add_argument("--server-workers", type=int, default=2, help="local cluster only: server worker processes (default: 2)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for each step (default: 6 h)")
    p.set_defaults(func=cmd_evaluate)
