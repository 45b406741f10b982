"""What a job spec may name: models from the allow-list only (nothing else is imported), weights
from the artifact store only and data from the data roots only (nothing else is read), and the
bounds on what a spec may ask for; each refusal names the field."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import uuid
from pathlib import Path

import pytest
import torch

from edgetrain.common.artifacts import (
    ArtifactError,
    get_bytes,
    initial_model,
    put_state_dict,
)
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.limits import MAX_DEVICES
from edgetrain.common.models import build_model, get_model
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DatasetRef
from edgetrain.common.security import (
    RefusedError,
    confine,
    data_path,
    user_model_problem,
)
from edgetrain.common.settings import Settings, get_settings, reload_settings
from edgetrain.common.store import connect
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks.client import EdgeTrainClient, JobSpecError, validate_job

SIDE_EFFECT = """
from pathlib import Path
Path({marker!r}).write_text("imported")
def build(num_classes, input_shape):
    raise AssertionError("never called")
"""
GOOD_MODEL = """
from os import system  # a callable that is not a factory of this module
from torch import nn

def build(num_classes, input_shape):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes))

build.task = "image"
build.input_shape = (1, 28, 28)
build.optimizer = "adamw"
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes a module on sys.path under a fresh name; returns (name, marker file)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> tuple[str, Path]:
        name = f"usermod_{uuid.uuid4().hex[:8]}"
        marker = tmp_path / f"{name}.imported"
        (tmp_path / f"{name}.py").write_text(source.format(marker=str(marker)) if "{marker" in source else source)
        return name, marker

    yield write
    for name in [m for m in sys.modules if m.startswith("usermod_")]:
        del sys.modules[name]


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch):
    """Sets EDGETRAIN_* variables for this test's get_settings()."""

    def set_env(**values: str) -> Settings:
        for name, value in values.items():
            monkeypatch.setenv(f"EDGETRAIN_{name.upper()}", value)
        reload_settings()
        return get_settings()

    yield set_env
    reload_settings()


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize(
    "name, allowed, words",
    [
        ("os:system", ["os"], "standard library"),
        ("builtins:eval", None, "standard library"),
        ("subprocess:run", None, "standard library"),
        ("mypkg.models:build", [], "not allowed here (EDGETRAIN_ALLOWED_MODEL_MODULES: none)"),
        ("mypkg.models_evil:build", ["mypkg.models"], "not allowed"),
        ("mypkg:build", ["mypkg.models"], "not allowed"),
        ("mypkg.models:_private", ["mypkg.models"], "neither a registered model"),
        ("mypkg.models:build.__globals__", ["mypkg.models"], "neither a registered model"),
        ("../mypkg:build", ["mypkg"], "neither a registered model"),
        ("mypkg.models:build; rm -rf /", ["mypkg.models"], "neither a registered model"),
    ],
)
def test_user_model_names_refused(name, allowed, words) -> None:
    assert words in user_model_problem(name, allowed)


def test_allowed_modules_and_their_submodules_pass() -> None:
    assert user_model_problem("mypkg.models:build", ["mypkg.models"]) is None
    assert user_model_problem("mypkg.models.vision:build", ["mypkg.models"]) is None
    assert user_model_problem("mypkg.models:build", None) is None  # a client without the list: form only


def test_module_not_allowed_is_never_imported(modules) -> None:
    name, marker = modules(SIDE_EFFECT)
    with pytest.raises(ValueError, match="not allowed here"):
        get_model(f"{name}:build", allowed_modules=["mypkg"])
    with pytest.raises(ValueError, match="not allowed here"):
        get_model(f"{name}:build")  # default: the settings' list, empty
    assert not marker.exists() and name not in sys.modules
    get_model(f"{name}:build", allowed_modules=[name])  # the test can fail: allowed, it is imported
    assert marker.read_text() == "imported"


def test_allowed_model_is_built_with_its_declared_task_shape_and_optimizer(modules) -> None:
    name, _ = modules(GOOD_MODEL)
    entry = get_model(f"{name}:build", allowed_modules=[name])
    assert (entry.task, entry.input_shape, entry.optimizer) == ("image", (1, 28, 28), "adamw")
    assert entry.build(7)(entry.example_input(7)).shape == (1, 7)
    with pytest.raises(ValueError, match="not a factory defined in"):
        get_model(f"{name}:system", allowed_modules=[name])  # imported into the module, not defined there


# --------------------------------------------------------------------------- specs at submission


def test_client_never_imports_a_user_module(modules, settings_env) -> None:
    name, marker = modules(SIDE_EFFECT)
    validate_job(quick_job(model=f"{name}:build"))  # form only: the workers hold the allow-list
    settings_env(allowed_model_modules="mypkg.models,other")
    with pytest.raises(JobSpecError, match=rf"model: '{name}:build': module '{name}' is not allowed here"):
        validate_job(quick_job(model=f"{name}:build"))
    assert not marker.exists() and name not in sys.modules


HOSTILE_SPECS = [
    ({"model": "os:system"}, "model", "standard library"),
    ({"model": "builtins:eval"}, "model", "standard library"),
    ({"model": "__import__('os').system('id')"}, "model", "unknown model"),
    ({"weights": "file:///etc/shadow"}, "weights", "files outside the artifact store are never read"),
    ({"weights": "http://evil.example/w.pt"}, "weights", "is not 'init:<integer seed>' or 'artifact:"),
    ({"weights": "artifact:../../etc/shadow#sha256=" + "0" * 64}, "weights", "never read"),
    ({"weights": "artifact:w.pt"}, "weights", "never read"),  # no hash
    ({"weights": "init:-1"}, "weights", "never read"),
    ({"weights": "init:" + "9" * 5000}, "weights", "at most 256 characters"),
    ({"dataset": {"name": "npz", "path": "../../etc/passwd"}}, "dataset.path", "contains '..'"),
    ({"dataset": {"name": "npz", "path": "/etc/passwd"}}, "dataset.path", "is absolute"),
    ({"dataset": {"name": "text", "path": "~root/.ssh/id_rsa"}}, "dataset.path", "is absolute"),
    ({"dataset": {"name": "text", "path": "mine/../../../etc"}}, "dataset.path", "contains '..'"),
    ({"proxy_dataset": {"name": "../../etc/passwd"}}, "proxy_dataset.name", "unknown dataset"),
    ({"dataset": {"name": "mnist5k/../../x"}}, "dataset.name", "unknown dataset"),
    ({"devices": [{"device_id": "nano; rm -rf /"}]}, "devices.0.device_id", "pattern"),
    ({"devices": [{"device_id": "$(reboot)"}]}, "devices.0.device_id", "pattern"),
    ({"devices": [{"device_id": f"d{i}"} for i in range(MAX_DEVICES + 1)]}, "devices", f"at most {MAX_DEVICES} items"),
    ({"devices": [{"device_id": "x", "dataset": {"name": "npz", "path": "/root"}}]}, "devices.0.dataset.path", "absolute"),
    ({"batch_sizes": [4, 1 << 30]}, "batch_sizes.1", "less than or equal to 4096"),
    ({"batch_sizes": [1 << i for i in range(17)]}, "batch_sizes", "at most 16 items"),
    ({"seeds": list(range(1000))}, "seeds", "at most 16 items"),
    ({"seeds": [-1]}, "seeds.0", "greater than or equal to 0"),
    ({"seeds": [1 << 70]}, "seeds.0", "less than or equal to 4294967295"),
    ({"max_samples": 10**12}, "max_samples", "less than or equal to 10000000"),
    ({"eval_every_samples": 10**9}, "eval_every_samples", "less than or equal to 10000000"),
    ({"profiling": {"measure_batches": 10**6}}, "profiling.measure_batches", "less than or equal to 100"),
    ({"profiling": {"warmup_batches": 10**6}}, "profiling.warmup_batches", "less than or equal to 100"),
]


@pytest.mark.parametrize("changes, field, words", HOSTILE_SPECS)
def test_hostile_spec_is_refused_at_submission_and_nothing_is_enqueued(redis_server, store, changes, field, words) -> None:
    connect(redis_server.url).delete("control")  # what other tests on this Redis left there
    with pytest.raises(JobSpecError) as err:
        EdgeTrainClient(redis_server.url).submit(quick_job(**changes))
    assert f"\n  {field}:" in str(err.value) and words in str(err.value), str(err.value)
    assert store.jobs.job_ids() == [] and queued_tasks(connect(redis_server.url), "control") == []


# --------------------------------------------------------------------------- files


def test_data_paths_resolve_inside_the_roots_only(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "mine").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    assert data_path("mine", [root]) == root / "mine"
    assert data_path(str(root / "mine"), [root]) == root / "mine"
    assert data_path("mine", [tmp_path / "first", root]) == root / "mine"  # the root where it exists
    for path, words in [
        ("escape/secret.txt", "is outside the data roots"),  # a symbolic link out of the root
        (str(outside / "secret.txt"), "is outside the data roots"),
        ("../outside/secret.txt", "contains '..'"),
        (str(root / ".." / "outside"), "contains '..'"),
    ]:
        with pytest.raises(RefusedError, match=rf"dataset.path: .*{words}"):
            data_path(path, [root])


def test_dataset_outside_the_roots_is_not_read(tmp_path: Path, settings_env) -> None:
    """A FIFO blocks whoever opens it for reading until a writer comes: the refusal returns,
    so nothing opened it; inside a root the same kind of path is read."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    os.mkfifo(outside / "a.txt")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "mine.txt").write_text("To be, or not to be, that is the question. " * 20)
    settings_env(data_roots=str(root))
    model = get_model("char_transformer")
    for path in [str(outside), "escape", str(outside / "a.txt")]:
        with pytest.raises(RefusedError, match="outside the data roots"):
            load_dataset(DatasetRef(name="text", path=path), model)
    with pytest.raises(OSError):  # no reader has the FIFO open
        os.open(outside / "a.txt", os.O_WRONLY | os.O_NONBLOCK)
    assert len(load_dataset(DatasetRef(name="text", path="mine.txt"), model).train) > 0


def test_artifacts_resolve_inside_the_store_only(tmp_path: Path) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    url = put_state_dict(build_model("smallcnn", 10, 1), "smallcnn-pre", store)
    assert initial_model("smallcnn", url, 10, store=store).head[1].out_features == 10
    buffer = io.BytesIO()
    torch.save(build_model("smallcnn", 10, 2).state_dict(), buffer)
    (outside / "w.pt").write_bytes(buffer.getvalue())
    (store / "link.pt").symlink_to(outside / "w.pt")
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    with pytest.raises(ArtifactError, match="weights: .*link.pt' is outside the artifact store"):
        get_bytes(f"artifact:link.pt#sha256={digest}", store)
    with pytest.raises(ArtifactError, match="never read"):
        get_bytes(f"file://{outside / 'w.pt'}#sha256={digest}", store)
    with pytest.raises(ArtifactError, match="is not in the artifact store"):
        get_bytes(f"artifact:missing.pt#sha256={digest}", store)
    with pytest.raises(ArtifactError, match="never read"):
        initial_model("smallcnn", "file:///etc/shadow", 10, store=store)


def test_confine_accepts_paths_that_do_not_exist_yet(tmp_path: Path) -> None:
    assert confine(tmp_path / "new" / "file", [tmp_path], "f", "here") == tmp_path / "new" / "file"
    with pytest.raises(RefusedError, match="f: '/etc' is outside here"):
        confine(Path("/etc"), [tmp_path], "f", "here")


# --------------------------------------------------------------------------- settings


def test_security_settings_from_the_environment(tmp_path: Path, settings_env) -> None:
    url_file = tmp_path / "redis-url"
    url_file.write_text("redis://:s3cret@redis:6379/0\n")
    settings = settings_env(
        redis_url="redis://127.0.0.1:6379/0", redis_url_file=str(url_file),
        allowed_model_modules=" mypkg.models, other ", data_roots=f"/data{os.pathsep}/srv/data",
    )  # fmt: skip
    assert settings.redis_url == "redis://:s3cret@redis:6379/0"
    assert settings.allowed_model_modules == ("mypkg.models", "other")
    assert settings.readable_data_roots() == (Path("/data"), Path("/srv/data"))
    assert Settings(data_roots=()).readable_data_roots() == (Settings().data_dir,)
    assert not settings.signing
    (tmp_path / "password").write_text("p@ss:word/1\n")
    assert Settings(redis_url="rediss://worker@redis:6380/0?ssl_ca_certs=/ca.pem", redis_password_file=tmp_path / "password",
                    redis_url_file=None).redis_url == "rediss://worker:p%40ss%3Aword%2F1@redis:6380/0?ssl_ca_certs=/ca.pem"  # fmt: skip
    assert Settings(redis_url="unix:///run/redis.sock?db=1", redis_password_file=tmp_path / "password",
                    redis_url_file=None).redis_url == "unix:///run/redis.sock?db=1&password=p%40ss%3Aword%2F1"  # fmt: skip


def test_incomplete_signing_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing: \['signing_cert_store'\]"):
        Settings(signing_key=tmp_path / "k.pem", signing_certificate=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="EDGETRAIN_REDIS_URL_FILE: cannot read"):
        Settings(redis_url_file=tmp_path / "absent")
