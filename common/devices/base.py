"""One protocol for every device backend (Jetson sysfs, NVML, simulated twins)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable


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
    board power (W); simulated: the figures come from a twin, not from hardware.
    """

    steps: int
    batch_size: int
    elapsed_s: float
    energy_j: float
    peak_power_w: float
    mean_power_w: float
    simulated: bool


@runtime_checkable
class Device(Protocol):
    """A GPU whose frequency edgetrain pins while it measures training steps."""

    device_type: str
    backend: str
    simulated: bool

    @property
    def frequencies_hz(self) -> list[int]:
        """Supported GPU frequencies, ascending (Hz)."""

    @property
    def memory_bytes(self) -> int:
        """Memory available to training (bytes)."""

    @property
    def power_envelope_w(self) -> list[float] | None:
        """Model-agnostic full-load board power per frequency (W), if known."""

    def set_frequency(self, frequency_hz: int) -> None:
        """Pin the GPU to one frequency (Hz)."""

    def current_frequency(self) -> int:
        """The GPU frequency now (Hz)."""

    def read_power_w(self) -> float:
        """Board power now (W)."""

    def bind_workload(self, workload: Workload) -> None:
        """Tell the device what a step costs (twins derive time and power from it)."""

    def fits(self, batch_size: int) -> bool | None:
        """Whether a step of this batch size fits in memory; None = only trying tells."""

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        """Run `step` `steps` times and measure time, energy and peak power."""

    def restore(self) -> None:
        """Put the original frequency settings back."""
