import copy
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from edgetrain.common.evaluation import SCALES, EvaluationSpec, scale_preset
from edgetrain.common.models import get_model

ISSUE_FORM = {
    "model": "smallcnn", "weights": "init:0",
    "pretrain": {"dataset": {"name": "fashion_mnist"}, "max_samples": 60000},
    "proxy": {"dataset": {"name": "digits"}, "target_accuracy": 0.9},
    "targets": [{"dataset": {"name": "mnist5k"}, "target_accuracy": 0.9}],
    "devices": [{"twin": "jetson-nano", "power_caps_w": [3.5, 5.0, None]}],
    "batch_sizes": [4, 8, 16, 32, 64, 128], "seeds": [0, 1, 2],
}  # fmt: skip


def changed(path: str, value) -> dict:
    """ISSUE_FORM with the value at a dotted path replaced (list items by index)."""
    data = copy.deepcopy(ISSUE_FORM)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


def problems(data: dict) -> list[tuple[str, str]]:
    """(field path, message) of every error the spec raises."""
    with pytest.raises(ValidationError) as err:
        EvaluationSpec.model_validate(data)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in err.value.errors()]


def test_the_issue_form_is_accepted_with_defaults_filled_in() -> None:
    spec = EvaluationSpec.model_validate(ISSUE_FORM)
    assert spec.devices[0].power_caps_w == [3.5, 5.0, None]
    assert spec.pretrain.max_samples == 60000 and spec.pretrain.batch_size == 128 and spec.init_seed == 0
    assert [g.label for g in spec.goals()] == ["digits", "mnist5k"]
    assert spec.profiling.mode == "grid" and spec.eval_every_samples == 512
    registered = EvaluationSpec.model_validate(changed("devices.0", {"device_id": "nano-1", "power_caps_w": [None]}))
    assert registered.devices[0].device_id == "nano-1" and registered.devices[0].twin is None


def test_estimation_requests_measure_each_dataset_from_the_pretrained_weights() -> None:
    spec = EvaluationSpec.model_validate(ISSUE_FORM)
    with pytest.raises(ValueError, match="pre-trains first"):
        spec.estimation_request(spec.proxy)
    request = spec.estimation_request(spec.targets[0], "file:///w.pt#sha256=ab")
    assert (request.weights, request.proxy_dataset.name, request.target_accuracy) == ("file:///w.pt#sha256=ab", "mnist5k", 0.9)
    assert request.batch_sizes == spec.batch_sizes and request.seeds == [0, 1, 2] and request.eval_every_samples == 512
    plain = EvaluationSpec.model_validate({k: v for k, v in ISSUE_FORM.items() if k != "pretrain"})
    assert plain.estimation_request(plain.proxy).weights == "init:0"


@pytest.mark.parametrize(
    "data, field, message",
    [
        ({k: v for k, v in ISSUE_FORM.items() if k != "targets"}, "targets", "Field required"),
        (changed("targets", []), "targets", "at least 1 item"),
        (changed("proxy.target_accuracy", 1.2), "proxy.target_accuracy", "less than 1"),
        (changed("targets.0.dataset.name", "cifar11"), "targets.0.dataset", "unknown dataset 'cifar11'"),
        (changed("targets.0.dataset", {"name": "imagefolder"}), "targets.0.dataset", "path: dataset 'imagefolder' reads your own data"),
        (changed("targets.0.dataset", {"name": "austen"}), "", "targets.0.dataset: 'austen' is a text dataset, model 'smallcnn' needs image data"),
        (changed("devices.0.power_caps_w.1", -5), "devices.0.power_caps_w.1", "greater than 0"),
        (changed("devices.0.power_caps_w", [5.0, 5.0]), "devices.0.power_caps_w", "each power cap may appear once"),
        (changed("devices.0", {"twin": "jetson-nano", "device_id": "n1"}), "devices.0", "exactly one of 'twin'"),
        (changed("devices.0", {"power_caps_w": [5.0]}), "devices.0", "exactly one of 'twin'"),
        (changed("devices.0.twin", "jetson-nana"), "devices.0.twin", "unknown twin 'jetson-nana'"),
        (changed("devices.0", {"device_id": "bad id!"}), "devices.0.device_id", "should match pattern"),
        (changed("batch_sizes", [4, 12]), "batch_sizes", "powers of two"),
        (changed("model", "resnet19"), "model", "unknown model 'resnet19'"),
        (changed("weights", "file:///w.pt"), "", "weights: with 'pretrain', weights must be 'init:<seed>'"),
        (changed("pretrain.max_samples", 0), "pretrain.max_samples", "greater than 0"),
        (changed("proxi", {}), "proxi", "Extra inputs are not permitted"),
        (changed("targets", [ISSUE_FORM["targets"][0], {"dataset": {"name": "mnist5k"}, "target_accuracy": 0.8}]), "",
         "targets.1: label 'mnist5k' is used twice"),
        (changed("targets.0", {"dataset": {"name": "digits"}, "target_accuracy": 0.95}), "", "targets.0: label 'digits' is the proxy's"),
        (changed("devices", [ISSUE_FORM["devices"][0]] * 2), "", "devices: each twin or device_id may appear once"),
        (changed("profiling", {"mode": "staircase"}), "", "profiling.mode: a staircase profile serves one power cap"),
    ],
)  # fmt: skip
def test_a_malformed_spec_is_refused_with_the_field_named(data: dict, field: str, message: str) -> None:
    found = problems(data)
    assert any(loc == field and message in msg for loc, msg in found), found


def test_a_target_may_repeat_the_proxy_and_a_named_target_may_reuse_its_dataset() -> None:
    same = EvaluationSpec.model_validate(changed("targets.0", ISSUE_FORM["proxy"]))
    assert [g.label for g in same.goals()] == ["digits"]
    named = changed("targets.0", {"dataset": {"name": "digits"}, "target_accuracy": 0.95, "name": "digits-95"})
    assert [g.label for g in EvaluationSpec.model_validate(named).goals()] == ["digits", "digits-95"]
    fraction = EvaluationSpec.model_validate(changed("targets.0.dataset", {"name": "fashion_mnist", "fraction": 0.1}))
    assert fraction.targets[0].label == "fashion_mnist (0.1)"


def test_presets_quick_runs_offline_data_and_paper_follows_the_protocol() -> None:
    assert SCALES == ("quick", "paper")
    quick = scale_preset("quick")
    assert len(quick) == 2 and all(s.model == "smallcnn" for s in quick)
    assert quick[0].pretrain is not None and quick[1].pretrain is None  # pre-trained; poorly matched proxy
    offline = {"digits", "mnist5k", "fashion_mnist"}
    for spec in quick:
        assert {g.dataset.name for g in spec.goals()} <= offline and len(spec.seeds) >= 2
        assert {d.twin for d in spec.devices} == {"jetson-nano", "jetson-tx2-nx"}
        assert all(None in d.power_caps_w and len(d.power_caps_w) >= 3 for d in spec.devices)
    assert len(quick[1].goals()) == 3  # the sensitivity matrix covers every pair among three datasets
    paper = scale_preset("paper")
    assert [s.model for s in paper] == ["resnet18", "mobilenet_v2"]
    for spec in paper:
        assert get_model(spec.model).input_shape == (3, 32, 32)
        assert spec.seeds == [0, 1, 2, 3, 4] and spec.batch_sizes == [4, 8, 16, 32, 64, 128]
        assert spec.pretrain.dataset.name == "cifar100" and spec.proxy.dataset.name == "cifar10"
        assert round(spec.proxy.dataset.fraction * 60_000) == 12_500
    assert [s.targets[0].target_accuracy for s in paper] == [0.92, 0.915]
    with pytest.raises(ValueError, match="scale: unknown scale 'huge'"):
        scale_preset("huge")


@pytest.mark.parametrize("name", ["held_out_related", "held_out_poor"])
def test_the_held_out_specs_in_bench_run_offline_data(name: str) -> None:
    path = Path(__file__).parents[2] / "bench" / "specs" / f"{name}.json"
    spec = EvaluationSpec.model_validate(json.loads(path.read_text()))
    assert {g.dataset.name for g in spec.goals()} <= {"mnist5k", "fashion_mnist"} and len(spec.seeds) == 3
