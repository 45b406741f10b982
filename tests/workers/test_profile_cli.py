"""`edgetrain profile run|show`: show against a real Redis, run against real worker processes."""

import argparse
import json
import os
import subprocess
import sys
import threading

import pytest
from matplotlib.image import imread

from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.keys import table_id
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import DeviceInfo, LearningRatePolicy, ProfileTable, ProfilingOptions, RelationVector
from edgetrain.common.settings import reload_settings
from edgetrain.workers.cli import main as edgetrain_main
from edgetrain.workers.cli_args import ExitCode, connection_options
from edgetrain.workers.commands.profile_cli import add_profile_commands
from edgetrain.workers.processes.cluster import LocalCluster

B = [16, 32, 64]
NANO_FREQUENCIES = len(load_twin("jetson-nano").frequencies_hz)
SMALL = get_model("smallcnn")
TID = table_id("jetson-nano", "smallcnn", SMALL.input_shape)


def cli(redis_url: str, *argv: str) -> int:
    """The `profile` commands under a parser like `edgetrain`'s."""
    parser = argparse.ArgumentParser(prog="edgetrain", parents=[connection_options()])
    add_profile_commands(parser.add_subparsers(dest="command", required=True), [connection_options(suppress_defaults=True)])
    args = parser.parse_args(["--redis-url", redis_url, *argv])
    return args.func(args)


@pytest.fixture(scope="module")
def staircase_table() -> ProfileTable:
    options = ProfilingOptions(mode="staircase", warmup_batches=0, measure_batches=1)
    return profile(SimulatedDevice(load_twin("jetson-nano")), SMALL, B, options, LearningRatePolicy(), 3.0)


def test_show_json_round_trips_and_select_accepts_it(store, redis_server, staircase_table, tmp, capsys) -> None:
    store.resources.put_table(staircase_table)
    assert cli(redis_server.url, "profile", "show", "jetson-nano", "smallcnn", "--json") == 0
    shown = capsys.readouterr().out
    assert ProfileTable.model_validate_json(shown) == staircase_table
    (tmp / "profile.json").write_text(shown)
    (tmp / "vector.json").write_text(RelationVector(batch_sizes=B, ratios=[0.5, 0.7, 1.0]).model_dump_json())
    rc = edgetrain_main(
        ["select", "--profile", str(tmp / "profile.json"), "--vector", str(tmp / "vector.json"), "--power-cap-w", "3", "--json"]
    )
    assert rc == 0
    choice = json.loads(capsys.readouterr().out)
    assert choice["batch_size"] in B and choice["peak_power_w"] <= 3.0


def test_edgetrain_command_shows_the_table(store, redis_server, staircase_table) -> None:
    store.resources.put_table(staircase_table)
    cmd = [
        sys.executable,
        "-m",
        "edgetrain.workers.cli",
        "--redis-url",
        redis_server.url,
        "profile",
        "show",
        "jetson-nano",
        "smallcnn",
        "--json",
    ]
    shown = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert ProfileTable.model_validate_json(shown.stdout) == staircase_table


def test_show_prints_grids_and_plots(store, redis_server, staircase_table, tmp, capsys) -> None:
    store.resources.put_table(staircase_table)
    vector = tmp / "vector.json"
    vector.write_text(RelationVector(batch_sizes=B, ratios=[0.5, 0.7, 1.0]).model_dump_json())
    png = tmp / "table.png"
    assert cli(redis_server.url, "profile", "show", "jetson-nano", "smallcnn", "--plot", str(png), "--vector", str(vector)) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "staircase for cap 3.0 W" in out
    assert "peak board power P[b][f] (W)" in out and "time T[b][f] for N_s = 1024 samples (s)" in out
    assert "        -" in out  # unmeasured points
    assert "power cap 3.0 W: selected (eq. 4)" in out and "relation vector given" in out
    assert imread(png).shape[1] > 1000


def test_show_unknown_table_names_the_stored_ones(store, redis_server, staircase_table, capsys) -> None:
    store.resources.put_table(staircase_table)
    assert cli(redis_server.url, "profile", "show", "jetson-tx2-nx", "smallcnn") == ExitCode.not_found
    err = capsys.readouterr().err
    assert "no table 'jetson-tx2-nx:smallcnn:1x28x28'" in err and TID in err


@pytest.fixture
def nano_7(store) -> str:
    """A device registered in the fleet with no worker behind it."""
    twin = load_twin("jetson-nano")
    info = DeviceInfo(device_id="nano-7", device_type=twin.device_type, backend="sim:jetson-nano",
                      frequencies_hz=twin.frequencies_hz, memory_bytes=twin.memory_bytes, simulated=True)  # fmt: skip
    store.fleet.register(info, ttl_s=60, instance="test")
    return info.device_id


def test_run_waits_for_the_holder_of_the_claim(store, redis_server, nano_7, staircase_table, capsys) -> None:
    assert store.coordination.claim(f"table:{TID}", "job-1")
    threading.Timer(1.0, store.resources.put_table, [staircase_table]).start()
    rc = cli(redis_server.url, "profile", "run", "--device-id", nano_7, "--model", "smallcnn", "--power-cap-w", "3", "--timeout", "20")
    assert rc == 0
    assert "being profiled already" in capsys.readouterr().err


def test_run_times_out_on_a_stale_claim(store, redis_server, nano_7, capsys) -> None:
    assert store.coordination.claim(f"table:{TID}", "job-1")
    rc = cli(redis_server.url, "profile", "run", "--device-id", nano_7, "--model", "smallcnn", "--timeout", "1")
    assert rc == 1
    assert "is stale" in capsys.readouterr().err


UNBUILDABLE = "def build(num_classes, input_shape):\n    return None  # not a network\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    (base / "modules").mkdir()
    (base / "modules" / "unbuildable.py").write_text(UNBUILDABLE)
    env = {"EDGETRAIN_ALLOWED_MODEL_MODULES": "unbuildable",
           "PYTHONPATH": os.pathsep.join([str(base / "modules"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with LocalCluster(base, devices={"nano-9": "sim:jetson-nano"}, server_workers=0, env=env) as c:
        yield c


def run(cluster, *argv: str) -> int:
    return cli(cluster.redis_url, "profile", "run", "--device-id", "nano-9", "--timeout", "60", *argv)


SMALL_RUN = ("--model", "smallcnn", "--batch-sizes", ",".join(map(str, B)))


@pytest.mark.e2e
def test_run_stores_staircase_then_grid_and_force_profiles_again(cluster, capsys) -> None:
    store = cluster.store()
    assert run(cluster, *SMALL_RUN, "--power-cap-w", "3") == 0
    staircase = store.resources.table(TID)
    assert staircase.mode == "staircase" and staircase.power_cap_w == 3.0 and staircase.simulated
    assert staircase.points_measured <= len(B) + NANO_FREQUENCIES + len(B)  # + one walk-down step per row
    assert "staircase for cap 3.0 W" in capsys.readouterr().out

    assert run(cluster, *SMALL_RUN, "--power-cap-w", "3") == 0
    assert store.resources.table(TID).created_at == staircase.created_at
    assert "reused" in capsys.readouterr().err

    assert run(cluster, *SMALL_RUN, "--power-cap-w", "3", "--grid", "--json") == 0
    grid = ProfileTable.model_validate_json(capsys.readouterr().out)
    assert grid.mode == "grid" and grid.points_measured == len(B) * NANO_FREQUENCIES
    assert grid == store.resources.table(TID)

    assert run(cluster, *SMALL_RUN, "--force") == 0
    assert "not reused: asked to profile again (force)" in capsys.readouterr().err
    assert store.resources.table(TID).created_at > grid.created_at


@pytest.mark.e2e
def test_run_reports_a_failure_on_the_device(cluster, capsys, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(cluster.workdir / "modules"))
    monkeypatch.setenv("EDGETRAIN_ALLOWED_MODEL_MODULES", "unbuildable")
    reload_settings()
    try:
        assert run(cluster, "--model", "unbuildable:build", "--batch-sizes", "4") == 1  # the factory cannot build a model
    finally:
        reload_settings()
    assert "profiling failed: profiling on nano-9 failed:" in capsys.readouterr().err


@pytest.mark.e2e
def test_run_on_an_unknown_device_lists_the_registered_ones(cluster, capsys) -> None:
    assert cli(cluster.redis_url, "profile", "run", "--device-id", "ghost-1", "--model", "smallcnn") == 2
    assert "unknown device 'ghost-1': not registered in the fleet (registered: ['nano-9'])" in capsys.readouterr().err
