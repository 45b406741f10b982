from matplotlib.image import imread

from edgetrain.common.evaluation import DeviceProfile, EvaluationReport, evaluate
from edgetrain.common.schemas import ProfileTable, RelationVector
from edgetrain.workers.rendering.evaluation_plots import plot_sensitivity, plot_time_energy, write_figures
from tests.common.devices.measured import NANO_CLOCKS_HZ as NANO_HZ

BATCH_SIZES = [4, 8, 16, 32, 64, 128]
NANO_FULL_W = [2.4, 2.7, 3.0, 3.3, 3.7, 4.0, 4.3, 4.9, 5.5, 6.25, 7.0, 8.7]


def board_table(device_type: str, frequencies_hz: list[int], full_load_w: list[float], speed: float) -> ProfileTable:
    """A hand-made table shaped like a twin's: a step costs a fixed host time plus compute
    that scales with b / f; a small batch keeps fewer units busy, so it draws less power."""
    idle_w, samples = 2.0, 1024
    time_s, power_w, energy_j = [], [], []
    for b in BATCH_SIZES:
        activity = b / (b + 24)
        step_s = [4e-3 + b * 2e6 / (speed * f) for f in frequencies_hz]
        time_s.append([t * samples / b for t in step_s])
        power_w.append([idle_w + (p - idle_w) * activity for p in full_load_w])
        energy_j.append([t * (idle_w + 0.8 * (p - idle_w)) for t, p in zip(time_s[-1], power_w[-1])])
    return ProfileTable(batch_sizes=BATCH_SIZES, frequencies_hz=frequencies_hz, samples=samples, time_s=time_s,
                        peak_power_w=power_w, energy_j=energy_j, max_batch_size=128, device_type=device_type,
                        model="smallcnn", input_shape=[1, 28, 28], simulated=True)  # fmt: skip


def vector(means: list[float | None], spread: float) -> RelationVector:
    reference = [m for m in means if m is not None][-1]
    return RelationVector(batch_sizes=BATCH_SIZES, ratios=[None if m is None else m / reference for m in means],
                          samples_mean=means, samples_std=[None if m is None else m * spread for m in means])  # fmt: skip


def hand_made_report() -> tuple[EvaluationReport, dict[str, ProfileTable]]:
    nano = board_table("jetson-nano", NANO_HZ, NANO_FULL_W, 1.0)
    tx2 = board_table("jetson-tx2-nx", [int(f * 1.41) for f in NANO_HZ], [p * 1.36 for p in NANO_FULL_W], 2.2)
    devices = [
        DeviceProfile(device_type="jetson-nano", table=nano, power_envelope_w=NANO_FULL_W, power_caps_w=[3.5, 5.0, None]),
        DeviceProfile(device_type="jetson-tx2-nx", table=tx2, power_envelope_w=[p * 1.36 for p in NANO_FULL_W], power_caps_w=[5.0, 6.0, None]),
    ]  # fmt: skip
    vectors = {
        "digits": vector([2000, 2200, 2600, 3400, 4800, 7000], 0.08),
        "mnist5k": vector([6500, 6900, 7600, 9000, 12000, 15000], 0.06),
        "fashion_mnist": vector([None, 19000, 20000, 22000, 25000, 27000], 0.1),
    }
    return evaluate(devices, vectors, "digits", ["mnist5k", "fashion_mnist"]), {"jetson-nano": nano, "jetson-tx2-nx": tx2}


def test_every_figure_of_a_report_is_written(tmp) -> None:
    report, tables = hand_made_report()
    paths = write_figures(report, tables, tmp / "figures", "hand-made evaluation")
    assert [p.name for p in paths[:2]] == ["time-energy.png", "sensitivity.png"]
    assert len(paths) == 2 + len(report.rows) == 2 + 2 * 3 * 2
    assert paths[2].name == "profile-jetson-nano-3.5-W-mnist5k.png"
    for path in paths:
        height, width = imread(path).shape[:2]
        assert width >= 1000 and height >= 400 and path.stat().st_size > 20_000
    # a row of panels per (device type, target): 4 rows here, taller than a single one
    single = tmp / "single.png"
    plot_time_energy(report.rows[:3], single)
    assert imread(single).shape[0] < imread(paths[0]).shape[0]


def test_a_single_sensitivity_matrix_without_simulated_devices(tmp) -> None:
    report, _ = hand_made_report()
    matrix = report.sensitivity[0].model_copy(update={"simulated": False})
    plot_sensitivity([matrix], tmp / "one.png")
    assert imread(tmp / "one.png").shape[1] > 400
