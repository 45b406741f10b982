"""The built-in twins against public measurements and published figures of their boards.

Jetson Nano: the twin's step law (a fixed time per call plus cycles / f) and its
parameters reproduce the measured SGEMM sweep (see measured.py): normalised time per FLOP
vs GPU clock for matrix sizes 128 (launch-bound) to 2048 (compute-bound) within 15 %, and
full-load board power within 10 % at every clock, rising faster than linearly at the top.

TX2 NX, Orin Nano, Orin NX, AGX Orin: no per-frequency measurement of these boards was
found in public sources. Their full-load curves are the Nano's measured normalised curve
placed on their SoC's clock range (checked within 0.05 W), bounded by the module power
ratings and nvpmodel budgets NVIDIA publishes, and their clock tables hold the nvpmodel
GPU caps of the release they model.
"""

from itertools import pairwise

import pytest

from edgetrain.common.devices.base import Workload
from edgetrain.common.devices.step_model import StepModel
from edgetrain.common.devices.twin_spec import TwinSpec, builtin_twins

from .measured import NANO_CLOCKS_HZ, NANO_FULL_LOAD_W, NANO_SGEMM_GFLOPS

TWINS = builtin_twins()
TIME_TOLERANCE = 0.15  # relative, on t(f) / t(f_max)
POWER_TOLERANCE = 0.10  # relative, on board power (W)
SHAPE_TOLERANCE_W = 0.05

# Module power ratings from NVIDIA's data sheets (W): the most a module draws.
MODULE_MAX_W = {"jetson-tx2-nx": 15.0, "jetson-orin-nano": 15.0, "jetson-orin-nx": 25.0, "jetson-agx-orin": 60.0}
# The top GPU clock of each SoC (Hz), where its voltage curve ends: T186 and T234 at 1300.5 MHz.
SOC_TOP_HZ = {"jetson-tx2-nx": 1300500000, "jetson-orin-nano": 1300500000, "jetson-orin-nx": 1300500000, "jetson-agx-orin": 1300500000}
# nvpmodel modes that keep every TPC of the GPU powered: their budget bounds full GPU load.
ALL_TPC_MODES = {"jetson-orin-nano": ["15W"], "jetson-orin-nx": ["25W"], "jetson-agx-orin": ["50W"]}


def sgemm(n: int) -> Workload:
    """One n x n SGEMM per step: 2 n^3 FLOP, one kernel."""
    return Workload(
        model=f"sgemm-{n}",
        input_shape=(n, n),
        flops_per_sample=2.0 * n**3,
        activation_bytes_per_sample=4.0 * n**2,
        parameter_bytes=8.0 * n**2,
        kernels_per_step=1,
    )


def test_every_builtin_twin_cites_its_sources_and_release() -> None:
    assert set(TWINS) == {"jetson-nano", "jetson-tx2-nx", "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"}
    for spec in TWINS.values():
        assert spec.l4t_release and len(spec.sources) >= 3
        assert spec.memory_bandwidth_bytes_per_s and spec.power_rails
        assert (spec.total_rail is None) == (spec.name == "jetson-agx-orin")  # only the AGX Orin lacks VDD_IN


def test_orin_modules_have_no_gpu_only_rail() -> None:
    for name in ("jetson-orin-nano", "jetson-orin-nx"):
        assert TWINS[name].power_rails == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"] and TWINS[name].total_rail == "VDD_IN"
    assert TWINS["jetson-agx-orin"].power_rails == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]


@pytest.mark.parametrize("n", sorted(NANO_SGEMM_GFLOPS))
def test_nano_time_per_flop_vs_clock_matches_the_sgemm_sweep(n: int) -> None:
    """The twin's law with its launch time and FLOP per cycle, applied to one SGEMM per step
    (cuBLAS SGEMM reaches the rate the FLOP per cycle was calibrated on, so efficiency 1;
    the training traffic counts of the memory term do not apply to it)."""
    spec = TWINS["jetson-nano"].model_copy(update={"compute_efficiency": 1.0, "memory_bandwidth_bytes_per_s": None})
    assert spec.frequencies_hz == NANO_CLOCKS_HZ
    model = StepModel(spec, sgemm(n))
    twin = [model.step(1, f)[0] for f in NANO_CLOCKS_HZ]
    measured = [1 / g for g in NANO_SGEMM_GFLOPS[n]]  # time per FLOP, up to a constant
    for f, t, m in zip(NANO_CLOCKS_HZ, twin, measured):
        assert t / twin[-1] == pytest.approx(m / measured[-1], rel=TIME_TOLERANCE), f"n={n} at {f / 1e6} MHz"
    if n >= 1024:  # compute-bound: the twin's throughput itself, not only its shape
        assert 2.0 * n**3 / twin[-1] / 1e9 == pytest.approx(NANO_SGEMM_GFLOPS[n][-1], rel=0.05)


def test_nano_small_sizes_are_held_back_by_a_clock_independent_part() -> None:
    """Measured: 12x the clock gives 12x the speed at n=2048 but 5x at n=128; so does the twin."""
    spec = TWINS["jetson-nano"].model_copy(update={"compute_efficiency": 1.0, "memory_bandwidth_bytes_per_s": None})
    speedup = {
        n: StepModel(spec, sgemm(n)).step(1, NANO_CLOCKS_HZ[0])[0] / StepModel(spec, sgemm(n)).step(1, NANO_CLOCKS_HZ[-1])[0]
        for n in (128, 2048)
    }
    measured = {n: NANO_SGEMM_GFLOPS[n][-1] / NANO_SGEMM_GFLOPS[n][0] for n in (128, 2048)}
    assert measured[128] < 0.5 * measured[2048] and speedup[128] < 0.5 * speedup[2048]


def test_nano_full_load_power_vs_clock_matches_the_sweep() -> None:
    spec = TWINS["jetson-nano"]
    for f, twin, measured in zip(NANO_CLOCKS_HZ, spec.full_load_power_w, NANO_FULL_LOAD_W):
        assert twin == pytest.approx(measured, rel=POWER_TOLERANCE), f"{f / 1e6} MHz"

    def top_vs_middle_rise(p: list[float]) -> float:  # watts per step at the top / in the middle of the range
        return (p[-1] - p[-2]) / (p[6] - p[5])

    assert top_vs_middle_rise(NANO_FULL_LOAD_W) > 2.0 and top_vs_middle_rise(spec.full_load_power_w) > 2.0


def nano_shape(fraction_of_top: float) -> float:
    """(P - idle) / (P_top - idle) of the Nano sweep at this fraction of its top clock
    (linear between the measured clocks, to zero at zero)."""
    idle = TWINS["jetson-nano"].idle_power_w
    xs = [f / NANO_CLOCKS_HZ[-1] for f in NANO_CLOCKS_HZ]
    ys = [(p - idle) / (NANO_FULL_LOAD_W[-1] - idle) for p in NANO_FULL_LOAD_W]
    points = [(0.0, 0.0), *zip(xs, ys)]
    for (x0, y0), (x1, y1) in pairwise(points):
        if fraction_of_top <= x1:
            return y0 + (y1 - y0) * (fraction_of_top - x0) / (x1 - x0)
    return 1.0


@pytest.mark.parametrize("name", sorted(MODULE_MAX_W))
def test_full_load_power_follows_the_measured_shape_within_the_published_budgets(name: str) -> None:
    spec: TwinSpec = TWINS[name]
    top = SOC_TOP_HZ[name]
    scale = (spec.full_load_power_w[-1] - spec.idle_power_w) / nano_shape(spec.frequencies_hz[-1] / top)
    for f, p in zip(spec.frequencies_hz, spec.full_load_power_w):
        assert p == pytest.approx(spec.idle_power_w + scale * nano_shape(f / top), abs=SHAPE_TOLERANCE_W), f"{f / 1e6} MHz"
    rating = MODULE_MAX_W[name]
    assert 0.5 * rating <= spec.full_load_power_w[-1] <= rating
    assert spec.idle_power_w < 0.5 * spec.full_load_power_w[-1]
    modes = {m.name: m for m in spec.power_modes}
    for mode in ALL_TPC_MODES.get(name, []):
        cap = max(f for f in spec.frequencies_hz if f <= modes[mode].gpu_max_frequency_hz)
        assert spec.full_load_power_w[spec.frequencies_hz.index(cap)] <= modes[mode].budget_w


def test_clock_tables_hold_the_nvpmodel_caps_of_their_release() -> None:
    for spec in TWINS.values():
        for mode in spec.power_modes:
            assert spec.frequencies_hz[0] <= mode.gpu_max_frequency_hz
    caps = {name: {m.gpu_max_frequency_hz for m in TWINS[name].power_modes} for name in TWINS}
    assert caps["jetson-orin-nano"] <= set(TWINS["jetson-orin-nano"].frequencies_hz)
    assert caps["jetson-orin-nx"] <= set(TWINS["jetson-orin-nx"].frequencies_hz)
    assert caps["jetson-agx-orin"] <= set(TWINS["jetson-agx-orin"].frequencies_hz)
    assert TWINS["jetson-orin-nano"].frequencies_hz[-1] == 624750000  # before JetPack 6.2's MAXN SUPER
    assert TWINS["jetson-agx-orin"].frequencies_hz[-1] == 1300500000 and len(TWINS["jetson-agx-orin"].frequencies_hz) == 13
