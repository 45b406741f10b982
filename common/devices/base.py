"""One protocol for every device backend (Jetson sysfs, NVML, simulated twins)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..control_axis import ClockObservation, ControlAxis


class DeviceError(RuntimeError):
    """A device operation failed; the message says what is needed to fix it."""


class DevicePermissionError(DeviceError):
    """Writing a device setting needs privileges this process lacks."""


@dataclass(frozen=True)
class Workload:
    """What one training step of a model costs, measured from the real torch model.

    flops_per_sample: forward + backward FLOPs per sample (about 3x the forward).
    activation_bytes_per_sample: bytes of forward activations kept for backward.
    parameter_bytes: bytes of the parameters (fp32).
    kernels_per_step: kernels launched per training step (forward, backward, optimizer).
    """

    model: str
    input_shape: tuple[int, ...]
    flops_per_sample: float
    activation_bytes_per_sample: float
    parameter_bytes: float
    kernels_per_step: int


@dataclass(frozen=True)
class Measurement:
    """A measured region of `steps` training steps of `batch_size` samples.

    elapsed_s: device time (s); energy_j: board energy (J); peak_power_w / mean_power_w:
    board power (W); simulated: the figures come from a twin, not from hardware;
    clock: the GPU clock observed while the steps ran (None when it could not be read).
    """

    steps: int
    batch_size: int
    elapsed_s: float
    energy_j: float
    peak_power_w: float
    mean_power_w: float
    simulated: bool
    clock: ClockObservation | None = None


@runtime_checkable
class Device(Protocol):
    """A GPU that edgetrain sets to one value of its control axis while it measures
    training steps.

    `control` names the axis (see edgetrain.common.control_axis): the values of
    `frequencies_hz` and the argument of `set_frequency` are settings on that axis, in its
    unit (locked clocks in Hz, power limits in mW, or the single driver's-choice setting 0).
    `current_frequency` is always the GPU clock now, in Hz.
    """

    device_type: str
    backend: str
    simulated: bool
    control: ControlAxis
    power_resolution_w: float  # the smallest step of a board power reading (W): one within it of a cap is not over it

    @property
    def frequencies_hz(self) -> list[int]:
        """The settings of the control axis, ascending (Hz for locked clocks)."""

    @property
    def memory_bytes(self) -> int:
        """Memory available to training (bytes)."""

    @property
    def power_envelope_w(self) -> list[float] | None:
        """Model-agnostic full-load board power per setting (W), if known."""

    @property
    def software(self) -> dict[str, str]:
        """What the device's tables are made with beyond edgetrain and torch (driver,
        L4T release, twin spec version); a table is reused only where these match."""

    def set_frequency(self, frequency_hz: int) -> None:
        """Apply one setting of the control axis (Hz for locked clocks)."""

    def current_frequency(self) -> int:
        """The GPU clock now (Hz)."""

    def read_power_w(self) -> float:
        """Board power now (W)."""

    def bind_workload(self, workload: Workload) -> None:
        """Tell the device what a step costs (twins derive time and power from it)."""

    def fits(self, batch_size: int) -> bool | None:
        """Whether a step of this batch size fits in memory; None = only trying tells."""

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        """Run `step` `steps` times and measure time, energy, peak power and the clock."""

    def idle(self, seconds: float) -> Measurement:
        """Hold the GPU idle for `seconds` (s) at the current setting and measure it (a
        measured region of no steps): the time a fine-tune waits for a cap it can meet."""

    def restore(self) -> None:
        """Put the original settings (clocks, power limit) back."""
