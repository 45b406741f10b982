import errno
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.devices.base import Device, DeviceError, DevicePermissionError
from edgetrain.common.devices.jetson import JetsonDevice, SysfsIO, inspect
from edgetrain.common.testing.fake_sysfs import (
    NANO_FREQS,
    ORIN_NANO_FREQS,
    TX2_FREQS,
    FakeBoard,
    KernelRulesIO,
    ReadOnlyIO,
    build_agx_orin,
    build_board,
    build_nano,
    build_orin_nano,
    build_tx2_nx,
)
from edgetrain.workers.commands.device_cli import format_jetson

BOARDS: dict[str, Callable[..., FakeBoard]] = {"nano": build_nano, "tx2-nx": build_tx2_nx, "orin-nano": build_orin_nano}
# family, devfreq entry, frequencies (Hz), rails, total power (W), memory (bytes)
EXPECTED = {
    "nano": ("jetson-nano", "57000000.gpu", NANO_FREQS, ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"], 4.8, 4051060 * 1024),
    "tx2-nx": ("jetson-tx2-nx", "17000000.gp10b", TX2_FREQS, ["VDD_IN", "VDD_CPU_GPU", "VDD_SOC"], 6.4, 3952940 * 1024),
    "orin-nano": ("jetson-orin-nano", "17000000.gpu", ORIN_NANO_FREQS, ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"], 7.5, 7802784 * 1024),
}


@pytest.mark.parametrize("board", BOARDS)
def test_discovery(board: str, tmp_path: Path) -> None:
    fake = BOARDS[board](tmp_path)
    family, entry, freqs, rails, total_w, memory = EXPECTED[board]
    device = JetsonDevice(sysfs_root=tmp_path)
    assert isinstance(device, Device)
    assert (device.device_type, device.backend, device.simulated) == (family, "jetson", False)
    assert device.control is ControlAxis.GPU_CLOCK_HZ
    assert device.devfreq.name == entry and device.devfreq.resolve() == fake.devfreq.resolve()
    assert device.frequencies_hz == freqs
    assert device.current_frequency() == freqs[-1]
    assert [r.name for r in device.rails] == rails  # NC and the channel 7 sum are skipped on the Orin
    assert [r.power_w(SysfsIO()) for r in device.rails] == pytest.approx([fake.rails_w[r] for r in rails])
    assert device.read_power_w() == pytest.approx(total_w)
    assert device.memory_bytes == memory
    assert device.fits(64) is None and device.power_envelope_w is None


def test_a_tree_without_a_total_rail_sums_the_rails(tmp_path: Path) -> None:
    build_agx_orin(tmp_path)
    device = JetsonDevice(sysfs_root=tmp_path)
    assert device.read_power_w() == pytest.approx(9.0 + 4.0 + 3.5)
    assert device.device_type == "jetson-agx-orin" and device.devfreq.name == "17000000.ga10b"
    assert device.memory_bytes == 0  # no proc/meminfo in this tree


@pytest.mark.parametrize(
    ("board", "family"),
    [
        ("nano", "jetson-nano"),
        ("tx2-nx", "jetson-tx2-nx"),
        ("orin-nano", "jetson-orin"),
    ],
)
def test_family_without_a_model_file_comes_from_the_gpu_node_and_rails(board: str, family: str, tmp_path: Path) -> None:
    BOARDS[board](tmp_path, model=None)
    assert JetsonDevice(sysfs_root=tmp_path).device_type == family


def test_a_model_naming_another_soc_is_not_trusted(tmp_path: Path) -> None:
    build_tx2_nx(tmp_path, model="NVIDIA Jetson Xavier NX Developer Kit")  # a TX2 NX module on a Xavier NX carrier
    assert JetsonDevice(sysfs_root=tmp_path).device_type == "jetson-tx2-nx"


def test_device_type_can_be_overridden(tmp_path: Path) -> None:
    build_orin_nano(tmp_path, model=None)
    assert JetsonDevice(sysfs_root=tmp_path, device_type="jetson-orin-nx").device_type == "jetson-orin-nx"


def test_known_directories_are_the_fallback(tmp_path: Path) -> None:
    fake = build_orin_nano(tmp_path)
    shutil.rmtree(tmp_path / "sys/class/devfreq")
    assert JetsonDevice(sysfs_root=tmp_path).devfreq == fake.devfreq


def test_not_a_jetson(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="no Jetson GPU devfreq entry"):
        JetsonDevice(sysfs_root=tmp_path)


def test_no_power_monitor(tmp_path: Path) -> None:
    build_board(tmp_path, "sys/devices/57000000.gpu", "57000000.gpu", "gpu", NANO_FREQS, [], model=None)
    with pytest.raises(DeviceError, match="no INA3221 power monitor"):
        JetsonDevice(sysfs_root=tmp_path)


def test_the_fake_kernel_refuses_min_above_max(tmp_path: Path) -> None:
    fake = build_nano(tmp_path, max_hz=NANO_FREQS[3])
    io = KernelRulesIO()
    with pytest.raises(OSError) as caught:
        io.write(fake.devfreq / "min_freq", str(NANO_FREQS[5]))
    assert caught.value.errno == errno.EINVAL
    with pytest.raises(OSError):
        io.write(fake.devfreq / "max_freq", str(NANO_FREQS[0] - 1))


def test_pin_down_then_up_in_the_order_the_kernel_accepts(tmp_path: Path) -> None:
    fake = build_nano(tmp_path)
    io = KernelRulesIO()
    device = JetsonDevice(sysfs_root=tmp_path, io=io)
    low, high = NANO_FREQS[2], NANO_FREQS[-2]

    device.set_frequency(low)
    assert io.writes == [("min_freq", str(low)), ("max_freq", str(low))]
    assert fake.settings()[:2] == (low, low) and device.current_frequency() == low

    io.writes.clear()
    device.set_frequency(high)  # above the current max: max_freq first
    assert io.writes == [("max_freq", str(high)), ("min_freq", str(high))]
    assert fake.settings()[:2] == (high, high) and device.current_frequency() == high


def test_an_unavailable_frequency_names_the_allowed_ones(tmp_path: Path) -> None:
    build_tx2_nx(tmp_path)
    device = JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO())
    with pytest.raises(DeviceError, match=r"frequency_hz=900000000 .*jetson-tx2-nx.*1300500000"):
        device.set_frequency(900_000_000)


def test_cur_freq_that_does_not_follow_is_an_error(tmp_path: Path) -> None:
    build_nano(tmp_path)
    device = JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO(cap_hz=614400000), settle_s=0.05)
    device.set_frequency(614400000)
    with pytest.raises(DeviceError, match=r"runs at 614400000 Hz after pinning .* to 921600000 Hz.*nvpmodel"):
        device.set_frequency(921600000)


def test_restore_puts_back_a_capped_range_from_below_and_above(tmp_path: Path) -> None:
    fake = build_nano(tmp_path, min_hz=460800000, max_hz=614400000)
    original = fake.settings()
    io = KernelRulesIO()
    device = JetsonDevice(sysfs_root=tmp_path, io=io)

    device.set_frequency(NANO_FREQS[0])  # below the original min
    device.restore()
    assert fake.settings() == original

    device.set_frequency(NANO_FREQS[-1])  # above the original max
    fake.write("governor", "userspace")  # changed behind our back (e.g. by a tool)
    device.restore()
    assert fake.settings() == original

    io.writes.clear()
    device.restore()  # idempotent: nothing left to write
    assert io.writes == []


def test_restore_without_changes_writes_nothing(tmp_path: Path) -> None:
    build_nano(tmp_path)
    io = KernelRulesIO()
    JetsonDevice(sysfs_root=tmp_path, io=io).restore()
    assert io.writes == []


def test_restore_runs_when_the_with_block_raises(tmp_path: Path) -> None:
    fake = build_orin_nano(tmp_path)
    original = fake.settings()
    with pytest.raises(RuntimeError, match="training failed"):
        with JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO()) as device:
            device.set_frequency(ORIN_NANO_FREQS[1])
            assert fake.settings()[:2] == (ORIN_NANO_FREQS[1], ORIN_NANO_FREQS[1])
            raise RuntimeError("training failed")
    assert fake.settings() == original


def test_without_root_pinning_explains_itself_and_reading_works(tmp_path: Path) -> None:
    fake = build_tx2_nx(tmp_path)
    original = fake.settings()
    device = JetsonDevice(sysfs_root=tmp_path, io=ReadOnlyIO())
    with pytest.raises(DevicePermissionError, match=r"permission denied.*needs root.*sudo.*udev rule") as caught:
        device.set_frequency(TX2_FREQS[3])
    assert str(fake.devfreq.name) in str(caught.value)
    assert device.frequencies_hz == TX2_FREQS
    assert device.current_frequency() == TX2_FREQS[-1]
    assert device.read_power_w() == pytest.approx(6.4)
    device.restore()  # nothing was changed, so nothing to write
    assert fake.settings() == original


def test_run_steps_measures_time_and_board_power(tmp_path: Path) -> None:
    build_nano(tmp_path)
    device = JetsonDevice(sysfs_root=tmp_path)
    m = device.run_steps(lambda: time.sleep(0.02), batch_size=8, steps=5)
    assert (m.steps, m.batch_size, m.simulated) == (5, 8, False)
    assert m.elapsed_s >= 0.1
    assert m.peak_power_w == pytest.approx(4.8) and m.mean_power_w == pytest.approx(4.8)
    assert m.energy_j == pytest.approx(4.8 * m.elapsed_s)
    assert m.clock is not None and (m.clock.min_hz, m.clock.max_hz) == (NANO_FREQS[-1], NANO_FREQS[-1])
    assert m.clock.samples >= 2  # read with every power sample


def test_run_steps_records_a_clock_held_below_the_pinned_one(tmp_path: Path) -> None:
    """A thermal or power-mode cap that lowers cur_freq while steps run shows in the
    observed clock, not just the pinned one."""
    fake = build_nano(tmp_path)
    device = JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO())
    device.set_frequency(NANO_FREQS[-1])

    def throttled_step() -> None:
        fake.write("cur_freq", NANO_FREQS[7])
        time.sleep(0.06)

    m = device.run_steps(throttled_step, batch_size=8, steps=3)
    assert m.clock is not None and m.clock.min_hz == NANO_FREQS[7] and m.clock.max_hz == NANO_FREQS[-1]
    assert NANO_FREQS[7] < m.clock.mean_hz < NANO_FREQS[-1]


@pytest.mark.parametrize("board", BOARDS)
def test_inspect(board: str, tmp_path: Path) -> None:
    fake = BOARDS[board](tmp_path)
    family, entry, freqs, rails, total_w, _ = EXPECTED[board]
    info = inspect(tmp_path)
    json.dumps(info)
    assert info["board"] == family and info["devfreq_path"].endswith(entry)
    assert info["frequencies_hz"] == freqs
    assert info["current_frequency_hz"] == info["max_frequency_hz"] == freqs[-1]
    assert info["min_frequency_hz"] == freqs[0]
    assert info["governor"] == "nvhost_podgov"
    assert [r["name"] for r in info["rails"]] == rails
    assert [r["power_w"] for r in info["rails"]] == pytest.approx([fake.rails_w[r] for r in rails])
    assert info["total_rail"] == rails[0] and info["total_power_w"] == pytest.approx(total_w)

    text = format_jetson(info)
    assert family in text and entry in text and "nvhost_podgov" in text
    assert f"{freqs[-1] / 1e6:g} MHz now" in text and f"({len(freqs)})" in text
    assert f"{total_w:.3f} W (rail {rails[0]})" in text
    assert all(name in text for name in rails) and "NC" not in text.split()


def test_inspect_without_a_total_rail_or_any_rail(tmp_path: Path) -> None:
    build_agx_orin(tmp_path / "agx")
    info = inspect(tmp_path / "agx")
    assert info["total_rail"] is None and info["total_power_w"] == pytest.approx(16.5)
    assert "16.500 W (sum of rails)" in format_jetson(info)

    build_board(tmp_path / "bare", "sys/devices/57000000.gpu", "57000000.gpu", "gpu", NANO_FREQS, [], model=None)
    info = inspect(tmp_path / "bare")
    assert info["rails"] == [] and info["total_power_w"] is None
    assert "no INA3221 power monitor found" in format_jetson(info)


def test_l4t_release_is_reported_for_tables(tmp_path) -> None:
    build_nano(tmp_path)
    assert JetsonDevice(tmp_path).software == {}
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text("# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64\n")
    assert JetsonDevice(tmp_path).software == {"l4t": "R32.7.1"}


def test_the_worker_process_restores_what_its_pool_child_pinned(tmp_path: Path) -> None:
    fake = build_nano(tmp_path)
    original = fake.settings()
    parent = JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO())  # opened before the pool forks
    child = JetsonDevice(sysfs_root=tmp_path, io=KernelRulesIO())  # stands in for the forked copy
    child.set_frequency(NANO_FREQS[2])  # ... which dies while pinned
    assert fake.settings() != original
    parent.restore()
    assert fake.settings() == original
