"""The time and board power of one training step on a twin, from the real workload.

One step of `b` samples at GPU clock `f` (Hz):

    t_host    = kernels_per_step * kernel_launch_s                      (GPU waits for the host)
    t_compute = b * flops_per_sample / (flops_per_cycle * f * compute_efficiency)
    t_memory  = (4 * b * activation_bytes + 10 * parameter_bytes) / (bandwidth * memory_efficiency)
    t_gpu     = max(t_compute, t_memory)                              (a time roofline)
    t_step    = t_host + t_gpu

Only t_compute follows the GPU clock. The host part (kernel launches from the CPU) and the
memory part (DRAM traffic at the EMC clock, which the GPU clock does not change) do not,
so a step never speeds up in proportion to f, and once t_compute falls below t_memory a
higher clock gains nothing. That a fixed time per call adds to cycles / f is what the
Jetson Nano's SGEMM sweep shows (github.com/emwjacobson/JetsonEfficiencyTesting,
data/Nano/square_all_frequency, L4T R32.5.1); the roofline of time over compute and memory
is the one measured for Jetson Orin power modes by Pagoda (github.com/dream-lab/pagoda).
Traffic per step: activations are written in the forward pass, read in the backward pass,
and their gradients written and read (4 passes); parameters are read forward and backward,
their gradients written, and Adam reads parameters, gradients and both moments and writes
three of them back (10 passes).

Power (W): `P_full(f)` is the board's full-load power per frequency from the spec; it
rises faster than linearly at the top clocks, where the voltage rises too (measured on the
Nano). A small batch keeps fewer units busy:

    activity = A / (A + activation_half_bytes),   A = b * activation_bytes
    P_peak   = idle + (P_full(f) - idle) * activity          (while kernels run)
    P_mean   = idle + (P_peak - idle) * t_gpu / t_step

Memory: parameters, gradients and Adam state (4x the parameter bytes) plus the activations
and their gradients (2 x A) must fit next to the reserved memory.
"""

from __future__ import annotations

from .base import Workload
from .twin_spec import TwinSpec

MODEL_VERSION = "2"  # raise when the formulas change: stored twin tables are then made again
ACTIVATION_PASSES = 4
PARAMETER_PASSES = 10


class StepModel:
    """The noiseless time and power of one training step on a twin."""

    def __init__(self, spec: TwinSpec, workload: Workload):
        self.spec = spec
        self.workload = workload

    def full_load_power_w(self, frequency_hz: int) -> float:
        """The board's full-load power at `frequency_hz` (W), from the twin's spec."""
        return self.spec.full_load_power_w[self.spec.frequencies_hz.index(frequency_hz)]

    def times_s(self, batch_size: int, frequency_hz: int) -> tuple[float, float]:
        """(host time, GPU compute time) of one step (s); only the second follows the clock."""
        s, w = self.spec, self.workload
        compute = batch_size * w.flops_per_sample / (s.flops_per_cycle * frequency_hz * s.compute_efficiency)
        return w.kernels_per_step * s.kernel_launch_s, compute

    def memory_s(self, batch_size: int) -> float:
        """DRAM traffic time of one step (s), independent of the GPU clock."""
        s, w = self.spec, self.workload
        if s.memory_bandwidth_bytes_per_s is None:
            return 0.0
        traffic = ACTIVATION_PASSES * batch_size * w.activation_bytes_per_sample + PARAMETER_PASSES * w.parameter_bytes
        return traffic / (s.memory_bandwidth_bytes_per_s * s.memory_efficiency)

    def activity(self, batch_size: int) -> float:
        """The share of the GPU a step of `batch_size` keeps busy (0..1), from its activation bytes."""
        a = batch_size * self.workload.activation_bytes_per_sample
        return a / (a + self.spec.activation_half_bytes)

    def peak_power_w(self, batch_size: int, frequency_hz: int) -> float:
        """Board power while a step of `batch_size` runs at `frequency_hz` (W)."""
        idle = self.spec.idle_power_w
        return idle + (self.full_load_power_w(frequency_hz) - idle) * self.activity(batch_size)

    def step(self, batch_size: int, frequency_hz: int) -> tuple[float, float, float]:
        """(step time s, peak power W, mean power W)."""
        host, compute = self.times_s(batch_size, frequency_hz)
        busy = max(compute, self.memory_s(batch_size))
        total = host + busy
        idle = self.spec.idle_power_w
        peak = self.peak_power_w(batch_size, frequency_hz)
        return total, peak, idle + (peak - idle) * busy / total

    def memory_bytes(self, batch_size: int) -> float:
        """Memory a training step of `batch_size` needs: reserved, weights with optimizer state, activations (bytes)."""
        w = self.workload
        return self.spec.reserved_memory_bytes + 4 * w.parameter_bytes + 2 * batch_size * w.activation_bytes_per_sample
