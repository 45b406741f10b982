"""`edgetrain evaluate --federated SPEC`: a tiny federated evaluation end to end in this process
(no Redis): the table on stdout, the JSON document and the figure in --out; refusals name the
field and run nothing."""

import json
from pathlib import Path

import pytest

from edgetrain.common.federated.evaluation import LABELS, FederatedEvaluation, FederatedEvaluationSpec
from edgetrain.common.federated.simulate import twin_table
from edgetrain.common.schemas import RelationVector
from edgetrain.common.selection import Equation4
from edgetrain.workers.cli import main as edgetrain_main
from edgetrain.workers.commands.evaluate import read_spec

TINY = {
    "name": "tiny federated",
    "seeds": [0, 1],
    "twins": {"nano-1": "jetson-nano", "tx2-1": "jetson-tx2-nx", "orin-1": "jetson-agx-orin"},
    "job": {
        "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "partition": {"scheme": "dirichlet", "alpha": 1.0},
        "test_dataset": {"name": "digits"}, "target_accuracy": 0.5,
        "devices": [{"device_id": "nano-1", "power_cap_w": 5.0}, {"device_id": "tx2-1"}, {"device_id": "orin-1", "power_cap_w": 15.0}],
        "batch_sizes": [8, 16, 32], "local": {"local_steps": 5}, "max_rounds": 10,
    },
}  # fmt: skip
REPO = Path(__file__).resolve().parents[2]
VECTOR = {"batch_sizes": [8, 16, 32], "ratios": [0.05, 0.5, 1.0]}  # b = 8 needs 20 times fewer samples than b = 32


@pytest.fixture
def no_redis(monkeypatch) -> None:
    for name in ("EDGETRAIN_REDIS_URL", "EDGETRAIN_REDIS_URL_FILE"):
        monkeypatch.delenv(name, raising=False)


def evaluate(tmp, spec: dict, *argv: str) -> int:
    (tmp / "fed.json").write_text(json.dumps(spec))
    return edgetrain_main(["evaluate", "--federated", str(tmp / "fed.json"), "--out", str(tmp / "out"), *argv])


def test_a_tiny_federated_evaluation_prints_the_table_and_writes_the_json_and_the_figure(tmp, no_redis, capsys) -> None:
    assert evaluate(tmp, TINY) == 0
    out = capsys.readouterr().out
    assert out.startswith("## tiny federated\n")
    assert (
        "| method | seeds reached | rounds | time to target (device s, SIMULATED) | speed-up vs Baseline 1 | fleet energy to target (J, SIMULATED) |"
        in out
    )
    assert ("| device | twin | cap | Baseline 1 | Baseline 1, partial work to the deadline | eq. (4), equal steps | edgetrain (time-balanced) "
            "| edgetrain + FedNova (time-balanced) |") in out  # fmt: skip
    assert ("| method | mean over devices | worst device | spread (std over devices) | worst device vs Baseline 1 (points) |\n"
            "|---|---|---|---|---|\n| Baseline 1 | ") in out  # fmt: skip
    assert "| nano-1 | jetson-nano | 5 W | " in out and "| tx2-1 | jetson-tx2-nx | none | " in out

    evaluation = FederatedEvaluation.model_validate_json((tmp / "out" / "federated.json").read_text())
    methods = ("baseline1", "baseline1-deadline", "equation4", "edgetrain", "edgetrain+fednova", "edgetrain+scaffold", "edgetrain+async")
    assert [(r.method, r.seed) for r in evaluation.runs] == [(m, s) for m in methods for s in (0, 1)]
    assert evaluation.simulated and all(r.simulated for r in evaluation.runs)
    for summary in evaluation.summary:
        runs = [r for r in evaluation.runs if r.method == summary.method]
        assert summary.runs == 2 and summary.reached == sum(r.reached for r in runs)
        assert {a.device_id for a in summary.plan} == {"nano-1", "tx2-1", "orin-1"}
        line = next(line for line in out.splitlines() if line.startswith(f"| {LABELS[summary.method]} | "))
        assert line.split(" | ")[1] == f"{summary.reached}/2"
        for run in runs:
            assert run.rounds and all(r.accuracy >= 0 and r.device_time_s > 0 and r.energy_j > 0 for r in run.rounds)
            assert run.reached == (run.rounds[-1].accuracy >= 0.5)
            assert all(set(r.device_accuracy) == {"nano-1", "tx2-1", "orin-1"} for r in run.rounds)
            if run.reached:
                assert run.time_to_target_s == pytest.approx(sum(r.device_time_s for r in run.rounds))
    baseline, deadline, _, balanced, nova, corrected, buffered = evaluation.summary
    assert baseline.speedup_vs_baseline1 == pytest.approx(1.0)
    assert all(a.local_steps == 5 for a in baseline.plan)
    assert len({a.local_steps for a in balanced.plan}) > 1  # time-balanced: the devices' steps differ
    # partial work to the deadline: Baseline 1's configurations, time-balanced steps; FedNova: edgetrain's work, aggregated otherwise
    assert [(a.batch_size, a.frequency_hz) for a in deadline.plan] == [(a.batch_size, a.frequency_hz) for a in baseline.plan]
    assert len({a.local_steps for a in deadline.plan}) > 1
    assert nova.plan == balanced.plan
    by_device = sorted(buffered.plan, key=lambda a: a.device_id) == sorted(balanced.plan, key=lambda a: a.device_id)
    assert by_device  # async: the same work per device, aggregated every 1 update (half of 3 devices)
    assert all(len(r.devices) == len(r.works) == 1 for run in evaluation.runs if run.method == "edgetrain+async" for r in run.rounds)
    accuracy = {r.method: [x.accuracy for x in r.rounds] for r in evaluation.runs if r.seed == 0}
    assert accuracy["edgetrain+fednova"][0] != accuracy["edgetrain"][0]  # the same local work, aggregated otherwise
    assert corrected.plan == balanced.plan and accuracy["edgetrain+scaffold"][0] == accuracy["edgetrain"][0]  # no variate in round 1
    assert accuracy["edgetrain+scaffold"][1:2] != accuracy["edgetrain"][1:2]  # corrected from round 2 on
    for summary in evaluation.summary:
        worst = [min(r.rounds[-1].device_accuracy.values()) for r in evaluation.runs if r.method == summary.method]
        assert summary.device_worst.mean == pytest.approx(sum(worst) / 2) and summary.device_worst.mean <= summary.device_mean.mean
    assert all(s.reached == 2 for s in evaluation.summary)  # target 0.5 on digits: 5 to 8 rounds
    assert balanced.speedup_vs_baseline1 == pytest.approx(baseline.time_to_target_s.mean / balanced.time_to_target_s.mean)
    assert f"{balanced.speedup_vs_baseline1:.2f}x" in out

    png = (tmp / "out" / "federated-accuracy.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000


def test_a_budget_run_plans_every_round_within_the_fleet_power_budget_and_draws_its_own_line(tmp, no_redis, capsys) -> None:
    job = TINY["job"] | {"local": {"local_steps": 5, "fleet_power_w": 10.0}, "max_rounds": 2, "target_accuracy": 0.99}
    assert evaluate(tmp, TINY | {"seeds": [0], "methods": ["edgetrain", "edgetrain+budget"], "job": job}) == 0
    out = capsys.readouterr().out
    assert "the +budget method's rounds within 10 W across the fleet" in out
    assert "| edgetrain within the fleet power budget (time-balanced) | 0/1 |" in out
    evaluation = FederatedEvaluation.model_validate_json((tmp / "out" / "federated.json").read_text())
    balanced, budgeted = evaluation.runs
    assert (balanced.method, budgeted.method) == ("edgetrain", "edgetrain+budget")
    for plain, within in zip(balanced.rounds, budgeted.rounds):
        assert {d.assignment.strategy for d in within.devices} == {"fleet_power"}
        assert sum(d.assignment.expected_energy_j for d in within.devices) < sum(d.assignment.expected_energy_j for d in plain.devices)
    assert (tmp / "out" / "federated-accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_json_puts_the_document_on_stdout(tmp, no_redis, capsys) -> None:
    small = TINY | {"seeds": [3], "methods": ["edgetrain"], "job": TINY["job"] | {"max_rounds": 2, "target_accuracy": 0.99}}
    assert evaluate(tmp, small, "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["seed"], r["reached"], len(r["rounds"])) for r in document["runs"]] == [("edgetrain", 3, False, 2)]
    (summary,) = document["summary"]
    assert summary["reached"] == 0 and summary["time_to_target_s"] is None and summary["speedup_vs_baseline1"] is None


@pytest.mark.parametrize(
    "spec, words",
    [
        (
            TINY | {"twins": {"nano-1": "jetson-nano", "tx2-1": "jetson-tx2-nx"}},
            "twins: give a twin for every device of job.devices; missing ['orin-1']",
        ),
        (TINY | {"twins": TINY["twins"] | {"orin-1": "no-such-board"}}, "twins: orin-1: unknown twin 'no-such-board'"),
        (TINY | {"methods": ["baseline1", "fastest"]}, "methods: unknown methods ['fastest']"),
        (TINY | {"job": TINY["job"] | {"target_accuracy": 1.5}}, "job.target_accuracy: Input should be less than 1"),
        (TINY | {"job": {k: v for k, v in TINY["job"].items() if k != "dataset"}}, "job: dataset: required when a device names no dataset"),
        (TINY | {"methods": ["edgetrain", "edgetrain+vector"]}, "methods: ['edgetrain+vector'] need a relation vector: give proxy"),
        (TINY | {"proxy": {"dataset": {"name": "digits"}}}, "proxy: no method uses it; add equation4+vector or edgetrain+vector"),
        (TINY | {"methods": ["equation4+vector"], "proxy": {"dataset": {"name": "digits"}}, "vector": VECTOR},
         "vector: give either proxy (estimated in this process) or vector, not both"),
        (TINY | {"methods": ["equation4+vector"], "vector": "no-such-vector.json"}, "vector: cannot read relation vector no-such-vector.json"),
        (TINY | {"methods": ["equation4+vector"], "vector": VECTOR | {"batch_sizes": [8, 16, 64]}},
         "vector: no r_b for the job's batch sizes [32]"),
        (TINY | {"methods": ["equation4+vector"], "proxy": {"dataset": {"name": "digits"}, "seeds": []}}, "proxy.seeds: List should have at least 1 item"),
    ],
)  # fmt: skip
def test_a_bad_federated_spec_exits_2_naming_the_field(tmp, no_redis, capsys, spec, words) -> None:
    assert evaluate(tmp, spec) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"invalid federated evaluation spec {tmp / 'fed.json'}:" in captured.err
    assert words in captured.err
    assert not (tmp / "out").exists()


def test_federated_is_not_combined_with_a_scale(tmp, no_redis, capsys) -> None:
    assert evaluate(tmp, TINY, "--scale", "quick") == 2
    assert "--federated runs the ready-made federated evaluation or SPEC; not with --scale or --verify" in capsys.readouterr().err


def test_a_cap_no_configuration_meets_exits_3_naming_the_device(tmp, no_redis, capsys) -> None:
    devices = [{"device_id": "nano-1", "power_cap_w": 0.5}, {"device_id": "tx2-1"}, {"device_id": "orin-1"}]
    assert evaluate(tmp, TINY | {"seeds": [0], "job": TINY["job"] | {"devices": devices}}) == 3
    assert "device nano-1: power cap 0.50 W is below what any configuration needs" in capsys.readouterr().err
    assert not (tmp / "out").exists()


def _plans(evaluation: FederatedEvaluation) -> dict[str, dict[str, tuple[int, int]]]:
    """Per method, each device's (b, f) in its first round."""
    return {s.method: {a.device_id: (a.batch_size, a.frequency_hz) for a in s.plan} for s in evaluation.summary}


def test_a_proxy_vector_is_estimated_in_this_process_and_chooses_each_devices_configuration(tmp, no_redis, capsys) -> None:
    spec = TINY | {"seeds": [0], "methods": ["equation4+vector"], "proxy": {"dataset": {"name": "digits"}},
                   "job": TINY["job"] | {"max_rounds": 1}}  # fmt: skip
    assert evaluate(tmp, spec) == 0
    captured = capsys.readouterr()
    evaluation = FederatedEvaluation.model_validate_json((tmp / "out" / "federated.json").read_text())
    vector = evaluation.vector
    assert vector is not None and vector.request is not None
    assert (vector.request.proxy_dataset.name, vector.request.target_accuracy, vector.request.seeds) == ("digits", 0.5, [0])
    assert (vector.request.model, vector.request.weights, vector.request.lr) == ("smallcnn", "init:0", evaluation.spec.job.lr)
    assert vector.batch_sizes == [8, 16, 32] and vector.ratios[-1] == 1.0 and all(r is not None and r > 0 for r in vector.ratios)
    for b in (8, 16, 32):
        assert f"proxy run b = {b}, seed 0: N_b = " in captured.err
    ratios = ", ".join(f"{b}: {r:.3g}" for b, r in zip(vector.batch_sizes, vector.ratios))
    assert f"Relation vector of the +vector methods (r_b = N_b / N_bmax; proxy runs on digits to 0.5, seeds [0]): {ratios}." in captured.out
    assert [r.method for r in evaluation.runs] == ["equation4+vector"]
    assert "| eq. (4) + vector, equal steps | " in captured.out
    caps = {d.device_id: d.power_cap_w for d in evaluation.spec.job.devices}
    tables = {twin: twin_table(twin, evaluation.spec.job) for twin in set(TINY["twins"].values())}
    expected = {d: Equation4(vector).choose(tables[twin], caps[d]) for d, twin in TINY["twins"].items()}
    assert _plans(evaluation)["equation4+vector"] == {d: (c.batch_size, c.frequency_hz) for d, c in expected.items()}


def test_a_vector_file_changes_the_choice_of_the_vector_methods_only(tmp, no_redis, capsys) -> None:
    (tmp / "vector.json").write_text(json.dumps(VECTOR))
    spec = TINY | {"seeds": [0], "methods": ["edgetrain", "edgetrain+vector"], "vector": str(tmp / "vector.json"),
                   "job": TINY["job"] | {"max_rounds": 1}}  # fmt: skip
    assert evaluate(tmp, spec) == 0
    assert (
        "Relation vector of the +vector methods (r_b = N_b / N_bmax; given in the spec): 8: 0.05, 16: 0.5, 32: 1."
        in capsys.readouterr().out
    )
    evaluation = FederatedEvaluation.model_validate_json((tmp / "out" / "federated.json").read_text())
    assert evaluation.vector == evaluation.spec.vector == RelationVector.model_validate(VECTOR)
    plans = _plans(evaluation)
    assert {b for b, _ in plans["edgetrain"].values()} == {32}  # r_b = 1: the most samples per second
    assert {b for b, _ in plans["edgetrain+vector"].values()} == {8}
    assert FederatedEvaluationSpec.model_validate(spec).run_spec("edgetrain+vector", 4).local.method == "edgetrain"


@pytest.mark.parametrize("path", sorted((REPO / "docs" / "federated").glob("*.yaml")), ids=lambda p: p.name)
def test_every_federated_evaluation_the_docs_record_is_a_valid_spec(path) -> None:
    """The specs behind docs/federated.md's tables stay runnable as the docs say (`edgetrain
    evaluate --federated <file>`): each validates, with its seeds, methods and twins."""
    spec = read_spec(str(path), FederatedEvaluationSpec, "federated evaluation spec")
    assert spec.seeds and spec.methods and set(spec.twins) == {d.device_id for d in spec.job.devices}
