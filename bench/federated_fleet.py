"""Memory and time of a large federated fleet of twins in one process (`simulate`): every
device's local steps really train (on this CPU) on its own share of the data, device time and
energy come from the twins (SIMULATED).

The fleet takes the built-in twins in turn; every other device is capped at 1.3 times the
lowest peak power its table measured, the others run uncapped. The job's dataset is split over
the devices (Dirichlet, alpha 0.5). Prints the peak resident memory of the process
(resource.getrusage) once the tables are profiled and after the rounds, and the wall time of
each round (every device's local steps, FedAvg and the global accuracy).

    python bench/federated_fleet.py [--devices 50] [--rounds 3] [--method edgetrain] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

from edgetrain.common.devices.twin_spec import builtin_twins
from edgetrain.common.federated.data import shares
from edgetrain.common.federated.records import RoundRecord
from edgetrain.common.federated.simulate import simulate, twin_table
from edgetrain.common.federated.spec import METHODS, FederatedSpec
from edgetrain.common.selection import lowest_feasible_cap_w

TWINS = ["jetson-nano", "jetson-tx2-nx", "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"]
BATCH_SIZES = [8, 16, 32, 64, 128]


def peak_rss_mib() -> float:
    """The peak resident memory of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fleet_spec(devices: int, rounds: int, method: str) -> tuple[FederatedSpec, dict[str, str]]:
    """A job over `devices` twins (never reaching its target, so every round runs) and the twin of each device."""
    twins = {f"dev-{i:03d}": TWINS[i % len(TWINS)] for i in range(devices)}
    spec = FederatedSpec.model_validate({
        "kind": "federated", "model": "smallcnn", "dataset": {"name": "mnist5k"}, "test_dataset": {"name": "mnist5k"},
        "partition": {"scheme": "dirichlet", "alpha": 0.5}, "target_accuracy": 0.999, "batch_sizes": BATCH_SIZES,
        "devices": [{"device_id": d} for d in twins], "max_rounds": rounds, "local": {"method": method, "local_steps": 10},
    })  # fmt: skip
    return spec, twins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--method", choices=METHODS, default="edgetrain")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    assert set(TWINS) <= set(builtin_twins())

    started = time.perf_counter()
    spec, twins = fleet_spec(args.devices, args.rounds, args.method)
    tables = {twin: twin_table(twin, spec) for twin in dict.fromkeys(twins.values())}
    caps = {d: round(1.3 * (lowest_feasible_cap_w(tables[t]) or 0), 1) if i % 2 else None for i, (d, t) in enumerate(twins.items())}
    spec = spec.model_copy(update={"devices": [d.model_copy(update={"power_cap_w": caps[d.device_id]}) for d in spec.devices]})
    held = [len(v) for v in shares(spec).values()]
    before_mib = peak_rss_mib()
    print(f"{args.devices} twins of {len(tables)} types, {args.method}, {args.rounds} rounds; samples per device "
          f"{min(held)}..{max(held)} (median {statistics.median(held):.0f}); "
          f"tables profiled in {time.perf_counter() - started:.1f} s")  # fmt: skip
    print(f"peak RSS before the fleet (imports, data, tables): {before_mib:.0f} MiB")

    stamps = [time.perf_counter()]

    def on_round(record: RoundRecord) -> None:
        stamps.append(time.perf_counter())
        steps = sum(d.assignment.local_steps for d in record.devices)
        print(f"round {record.round}: {stamps[-1] - stamps[-2]:.1f} s wall, {len(record.devices)} devices, {steps} local steps, "
              f"global accuracy {record.accuracy:.3f}, {record.device_time_s:.3f} device s, "
              f"{record.energy_j:.1f} J (SIMULATED)")  # fmt: skip

    run = simulate(spec, twins, tables, on_round=on_round)
    per_round = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # the first round also builds the twins and loads the data
    after_mib = peak_rss_mib()
    print(f"first round (with the fleet's set-up) {stamps[1] - stamps[0]:.1f} s wall; later rounds "
          f"{statistics.fmean(per_round) if per_round else float('nan'):.1f} s wall each")  # fmt: skip
    print(f"peak RSS with {args.devices} twins after {len(run.rounds)} rounds: {after_mib:.0f} MiB "
          f"({after_mib - before_mib:+.0f} MiB over before the fleet)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({
            "devices": args.devices, "method": args.method, "rounds": len(run.rounds), "peak_rss_before_mib": before_mib,
            "peak_rss_after_mib": after_mib, "first_round_wall_s": stamps[1] - stamps[0], "round_wall_s": per_round,
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
