"""Public measurements of real Jetson boards that the twins are checked against.

Jetson Nano 4 GB, L4T R32.5.1, CPU pinned at 1479 MHz: FP32 SGEMM (cuBLAS, one call and a
cudaDeviceSynchronize per iteration, 20 s per point) at each of the 12 GPU clocks, board
power from an external meter at 0.1 W resolution. Source: github.com/emwjacobson/
JetsonEfficiencyTesting, data/Nano/square_all_frequency/Nano-float-<n>-tensor-<Hz>.data
(commit 2b440806, 2022-04-19): the last line of each file is FLOP/s, the others are power
samples; the figures below are the FLOP/s in GFLOP/s and the mean of the power samples.
The matrix size n plays the part of the batch size: small n leaves the GPU waiting on the
per-call overhead, large n keeps it busy.
"""

NANO_CLOCKS_HZ = [
    76800000,
    153600000,
    230400000,
    307200000,
    384000000,
    460800000,
    537600000,
    614400000,
    691200000,
    768000000,
    844800000,
    921600000,
]

NANO_SGEMM_GFLOPS = {  # n -> GFLOP/s per clock
    128: [9.6, 17.1, 22.9, 27.9, 31.8, 35.2, 38.4, 40.8, 42.5, 44.9, 45.9, 48.0],
    256: [15.9, 31.0, 45.0, 58.8, 70.9, 84.7, 95.7, 107.4, 117.6, 128.7, 136.9, 148.3],
    1024: [18.3, 36.2, 54.0, 72.2, 89.6, 108.2, 126.5, 145.7, 162.1, 180.8, 198.5, 217.9],
    2048: [18.5, 36.6, 54.5, 73.0, 90.9, 109.7, 128.5, 148.2, 165.0, 184.2, 202.5, 222.4],
}

NANO_SGEMM_BOARD_W = {  # n -> mean board power (W) per clock
    128: [2.69, 2.95, 3.3, 3.42, 3.55, 3.7, 3.81, 3.98, 4.27, 4.28, 4.51, 4.61],
    256: [2.55, 2.87, 3.1, 3.42, 3.75, 3.92, 4.19, 4.59, 5.03, 5.44, 5.96, 6.45],
    1024: [2.36, 2.69, 2.95, 3.24, 3.57, 3.86, 4.14, 4.66, 5.23, 5.95, 6.67, 8.41],
    2048: [2.37, 2.69, 2.96, 3.26, 3.6, 3.86, 4.2, 4.75, 5.3, 6.0, 7.51, 8.65],
}

# Mean board power over the saturating sizes n = 1024, 1152, ..., 2048 (9 sizes), per clock (W).
NANO_FULL_LOAD_W = [2.38, 2.70, 2.96, 3.27, 3.59, 3.87, 4.18, 4.72, 5.30, 6.02, 7.17, 8.57]
