import pytest
import yaml

from edgetrain.common.devices.base import Device, DeviceError
from edgetrain.common.devices.simulated import SimulatedDevice
from edgetrain.common.devices.step_model import StepModel
from edgetrain.common.devices.twin_spec import TwinSpec, builtin_twins, load_twin
from edgetrain.common.models import build_model, get_model
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import LearningRatePolicy, ProfilingOptions
from edgetrain.common.workload import measure_workload

# facts/hardware.md: Jetson Nano whole-board power at full SGEMM load (W) per GPU MHz
NANO_SGEMM_W = {
    76.8: 2.4,
    153.6: 2.7,
    230.4: 3.0,
    307.2: 3.3,
    384: 3.7,
    460.8: 4.0,
    537.6: 4.3,
    614.4: 4.9,
    691.2: 5.5,
    768: 6.25,
    844.8: 7.0,
    921.6: 8.7,
}


def workload(name: str):
    entry = get_model(name)
    return measure_workload(name, build_model(name, 10, 0), entry.example_input(10))


@pytest.fixture(scope="module")
def resnet18():
    return workload("resnet18")


def test_builtin_twins_satisfy_the_device_protocol() -> None:
    assert {"jetson-nano", "jetson-tx2-nx"} <= set(builtin_twins())
    assert isinstance(SimulatedDevice(load_twin("jetson-nano")), Device)


def test_workload_is_measured_from_the_real_model(resnet18) -> None:
    small = workload("smallcnn")
    assert resnet18.input_shape == (3, 32, 32) and small.input_shape == (1, 28, 28)
    # torchvision resnet18 at 32x32 is about 37 MFLOP (74 MFLOP counting mul+add) forward
    assert 0.15e9 < resnet18.flops_per_sample < 0.3e9
    assert resnet18.flops_per_sample > 20 * small.flops_per_sample
    assert resnet18.parameter_bytes == pytest.approx(11.18e6 * 4, rel=0.01)
    assert resnet18.kernels_per_step > small.kernels_per_step


def test_nano_full_load_power_within_10_percent_of_sgemm_calibration(resnet18) -> None:
    model = StepModel(load_twin("jetson-nano"), resnet18)
    for f in load_twin("jetson-nano").frequencies_hz:
        measured = model.peak_power_w(4096, f)  # saturating load
        assert measured == pytest.approx(NANO_SGEMM_W[round(f / 1e6, 1)], rel=0.10)


def test_throughput_linear_in_frequency_and_power_rising_with_batch(resnet18) -> None:
    spec = load_twin("jetson-nano")
    model = StepModel(spec, resnet18)
    f_lo, f_hi = spec.frequencies_hz[2], spec.frequencies_hz[-1]
    assert model.times_s(64, f_lo)[1] / model.times_s(64, f_hi)[1] == pytest.approx(f_hi / f_lo)
    for f in (f_lo, f_hi):
        powers = [model.peak_power_w(b, f) for b in (4, 8, 16, 32, 64, 128)]
        assert powers == sorted(powers) and powers[0] < powers[-1]
    host, compute = model.times_s(4, f_hi)
    assert host > compute  # small batches are launch-bound: low utilisation


def time_per_sample_under_cap(model: StepModel, batch: int, cap_w: float) -> tuple[int, float]:
    feasible = [f for f in model.spec.frequencies_hz if model.peak_power_w(batch, f) <= cap_w]
    f = max(feasible)
    return f, model.step(batch, f)[0] / batch


def test_paper_core_effect_resnet18_on_nano_under_low_cap(resnet18) -> None:
    """Under a low cap a smaller batch at a higher frequency beats the largest batch at the
    frequency the cap allows it, in time per sample; without a cap the largest batch wins."""
    model = StepModel(load_twin("jetson-nano"), resnet18)
    f_big, t_big = time_per_sample_under_cap(model, 128, cap_w=4.0)
    f_small, t_small = time_per_sample_under_cap(model, 16, cap_w=4.0)
    assert f_small > f_big
    assert t_small < 0.9 * t_big
    no_cap = {b: model.step(b, model.spec.frequencies_hz[-1])[0] / b for b in (16, 128)}
    assert no_cap[128] < no_cap[16]


def test_memory_limit_gives_the_largest_batch_that_fits(resnet18) -> None:
    spec = load_twin("jetson-nano").model_copy(update={"memory_bytes": 2_000_000_000})
    device = SimulatedDevice(spec)
    device.bind_workload(resnet18)
    fitting = [b for b in (4, 8, 16, 32, 64, 128, 256, 512) if device.fits(b)]
    assert fitting and fitting[-1] < 512
    largest = fitting[-1]
    assert StepModel(spec, resnet18).memory_bytes(largest * 2) > spec.memory_bytes
    with pytest.raises(MemoryError, match="does not fit"):
        device.run_steps(lambda: None, largest * 2, 1)


def test_sensor_noise_is_seeded(resnet18) -> None:
    def readings(seed: int) -> list[float]:
        d = SimulatedDevice(load_twin("jetson-nano"), seed=seed)
        d.bind_workload(resnet18)
        return [d.run_steps(lambda: None, 32, 1).peak_power_w for _ in range(20)]

    assert readings(1) == readings(1)
    assert readings(1) != readings(2)
    assert len(set(readings(1))) > 1  # a real sensor's spread


def test_user_twin_from_yaml_without_code(tmp) -> None:
    orin = {
        "name": "orin-nano-8gb",
        "device_type": "jetson-orin-nano",
        "frequencies_hz": [306000000, 408000000, 510000000, 624750000],
        "full_load_power_w": [6.0, 7.0, 8.5, 10.0],
        "idle_power_w": 4.5,
        "flops_per_cycle": 2048,
        "kernel_launch_s": 1.5e-5,
        "activation_half_bytes": 3.2e7,
        "memory_bytes": 8 * 2**30,
        "reserved_memory_bytes": 2 * 2**30,
    }
    path = tmp / "orin.yaml"
    path.write_text(yaml.safe_dump(orin))
    device = SimulatedDevice(load_twin(str(path)))
    assert device.device_type == "jetson-orin-nano" and device.frequencies_hz[-1] == 624750000
    with pytest.raises(DeviceError, match="unknown twin"):
        load_twin("no-such-board")
    with pytest.raises(ValueError, match="one value per frequency"):
        TwinSpec.model_validate(orin | {"full_load_power_w": [6.0]})
    with pytest.raises(DeviceError, match="allowed"):
        device.set_frequency(123)


def test_profiling_a_noisy_twin_stores_power_non_decreasing_in_frequency() -> None:
    device = SimulatedDevice(load_twin("jetson-tx2-nx"), seed=3)
    table = profile(device, get_model("smallcnn"), [4, 32, 128], ProfilingOptions(measure_batches=2), LearningRatePolicy())
    assert table.simulated and table.points_measured == 3 * 13
    for row in table.peak_power_w:
        assert row == sorted(row)
    for row in table.time_s:
        assert row[0] > row[-1]  # faster at the highest frequency


@pytest.fixture(scope="module")
def mobilenet_v2():
    return workload("mobilenet_v2")


def test_memory_bound_steps_stop_speeding_up_with_the_clock(resnet18, mobilenet_v2) -> None:
    """DRAM traffic runs at the EMC clock: once it outlasts the compute, a higher GPU clock
    gains nothing; ResNet18 at b=128 stays compute-bound on the Nano."""
    spec = load_twin("jetson-nano")
    top, below, low = spec.frequencies_hz[-1], spec.frequencies_hz[-2], spec.frequencies_hz[2]
    mobile = StepModel(spec, mobilenet_v2)
    assert mobile.memory_s(128) > mobile.times_s(128, top)[1]
    assert mobile.step(128, top)[0] == mobile.step(128, below)[0]
    assert mobile.step(128, low)[0] > mobile.step(128, top)[0]
    resnet = StepModel(spec, resnet18)
    assert resnet.memory_s(128) < resnet.times_s(128, top)[1] and resnet.step(128, below)[0] > resnet.step(128, top)[0]
    without = StepModel(spec.model_copy(update={"memory_bandwidth_bytes_per_s": None}), mobilenet_v2)
    assert without.memory_s(128) == 0.0 and without.step(128, below)[0] > without.step(128, top)[0]


def test_a_twin_reports_its_spec_version_and_the_clock_it_ran(resnet18) -> None:
    spec = load_twin("jetson-tx2-nx")
    device = SimulatedDevice(spec)
    assert device.control.value == "gpu_clock_hz"
    assert device.software == SimulatedDevice(load_twin("jetson-tx2-nx"), seed=5).software
    assert device.software != SimulatedDevice(spec.model_copy(update={"idle_power_w": 3.5})).software
    device.bind_workload(resnet18)
    device.set_frequency(spec.frequencies_hz[3])
    m = device.run_steps(lambda: None, 16, 2)
    assert m.clock is not None and m.clock.mean_hz == m.clock.min_hz == m.clock.max_hz == spec.frequencies_hz[3]


def test_rails_and_power_modes_are_checked() -> None:
    spec = load_twin("jetson-orin-nano").model_dump()
    with pytest.raises(ValueError, match="total_rail 'VDD_GPU' must be one of power_rails"):
        TwinSpec.model_validate(spec | {"total_rail": "VDD_GPU"})
    low_mode = {"name": "1W", "gpu_max_frequency_hz": 100_000_000, "budget_w": 1.0}
    with pytest.raises(ValueError, match=r"power_modes \['1W'\]: gpu_max_frequency_hz is below"):
        TwinSpec.model_validate(spec | {"power_modes": [low_mode]})
