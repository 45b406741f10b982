"""What the columns of a lookup table are: the setting a device controls while it trains.

A device offers an ascending list of settings on one axis, and profiling, selection and
fine-tuning treat them alike (selection picks, per batch size, the highest setting whose
peak power fits the cap). The value stored per setting is an integer in the axis' unit:

- `gpu_clock_hz`: the GPU clock is locked to each value (Hz). Jetson devfreq, simulated
  twins, and NVML with clock control allowed.
- `driver_clock`: one setting (0): the device does not choose its clock, the driver does.
  What ran is recorded per measurement as the observed clock (mean and range, Hz).
- `power_limit_mw`: the GPU's power limit is set to each value (mW); the driver picks
  the clock under it. NVML with power-limit control allowed.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

DRIVER_CHOICE = 0  # the single setting of the driver_clock axis


class ControlAxis(str, Enum):
    """What a device's settings are: locked GPU clocks (Hz), the driver's choice, or power limits (mW)."""

    GPU_CLOCK_HZ = "gpu_clock_hz"
    DRIVER_CLOCK = "driver_clock"
    POWER_LIMIT_MW = "power_limit_mw"

    @property
    def label(self) -> str:
        """The axis in words, with its unit."""
        return {
            ControlAxis.GPU_CLOCK_HZ: "locked GPU clock (Hz)",
            ControlAxis.DRIVER_CLOCK: "GPU clock chosen by the driver (observed clock per point)",
            ControlAxis.POWER_LIMIT_MW: "GPU power limit (mW); the driver chooses the clock under it",
        }[self]

    def describe(self, setting: int) -> str:
        """One setting for people: "921.6 MHz", "driver's choice", "250 W limit"."""
        if self is ControlAxis.GPU_CLOCK_HZ:
            return f"{setting / 1e6:g} MHz"
        if self is ControlAxis.POWER_LIMIT_MW:
            return f"{setting / 1e3:g} W limit"
        return "driver's choice"


class ClockObservation(BaseModel):
    """The GPU clock sampled while measured steps ran: mean, lowest and highest (Hz)."""

    model_config = ConfigDict(extra="forbid")

    mean_hz: float = Field(ge=0)
    min_hz: int = Field(ge=0)
    max_hz: int = Field(ge=0)
    samples: int = Field(ge=1, description="clock readings taken")

    def describe(self) -> str:
        """ "1410-1980 MHz (mean 1845)" or "1410 MHz" when it did not move."""
        if self.min_hz == self.max_hz:
            return f"{self.min_hz / 1e6:g} MHz"
        return f"{self.min_hz / 1e6:g}-{self.max_hz / 1e6:g} MHz (mean {self.mean_hz / 1e6:.0f})"


def describe_setting(axis: ControlAxis, setting: int, observed: ClockObservation | None = None) -> str:
    """A setting with the clock observed at it, e.g. "driver's choice, observed 1410-1980 MHz
    (mean 1845)"; never an idle clock passed off as the trained-at one."""
    text = axis.describe(setting)
    pinned = axis is ControlAxis.GPU_CLOCK_HZ and observed is not None and observed.min_hz == observed.max_hz == setting
    if observed is not None and not pinned:
        text += f", observed {observed.describe()}"
    return text
