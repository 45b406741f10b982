"""A federated job for people: `edgetrain submit --wait` and `edgetrain status` of one."""

from __future__ import annotations

from edgetrain.common.federated.records import FederatedStatus, Phase

EVENTS_SHOWN = 10


def federated_job_line(j: FederatedStatus) -> str:
    """A federated job's line of the job list."""
    return (f"{j.record.job_id}  {j.state.phase.value:<10} {j.record.spec.model:<18} {len(j.record.spec.devices):>4} device(s)  "
            f"submitted {j.record.created_at:%Y-%m-%d %H:%M:%S}  federated, round {j.state.round}"
            + (f", global accuracy {j.state.accuracy:.4f}" if j.state.accuracy is not None else ""))  # fmt: skip


def format_federated(status: FederatedStatus) -> str:
    """The job's phase, its rounds (buffered: aggregations) so far (global accuracy, the worst device's accuracy on its
    held-out data, device time, energy), the last round's mean, worst and spread over the
    devices, the open round's assignments (buffered: the buffer and the work in flight) and the newest events; figures from twins say
    SIMULATED."""
    spec, state = status.record.spec, status.state
    accuracy = "none yet" if state.accuracy is None else f"{state.accuracy:.4f}"
    lines = [
        f"federated job {status.record.job_id}: {state.phase.value}, {'aggregation' if state.buffered else 'round'} {state.round} of at "
        f"most {spec.max_rounds}; "
        f"global accuracy {accuracy} (target {spec.target_accuracy}); {len(spec.devices)} devices, {spec.local.method} local work"
        + (f" within a fleet power budget of {spec.local.fleet_power_w:g} W" if spec.local.fleet_power_w is not None else "")
        + ", "
        + (
            f"buffered, {spec.aggregation.buffer_size} updates per aggregation, staleness {spec.aggregation.staleness}"
            if state.buffered
            else spec.aggregation.rule
        )
        + (", drift-corrected (SCAFFOLD)" if spec.aggregation.drift == "scaffold" else "")
        + (f", FedProx mu {spec.aggregation.mu:g}" if spec.aggregation.mu > 0 else "")  # fmt: skip
    ]
    if state.reason:
        lines.append(f"  {state.reason}")
    if state.notice:
        lines.append(f"  waiting: {state.notice}")
    simulated = any(d.simulated for r in status.rounds for d in r.devices)
    if status.rounds:
        lines.append(f"  {'round':>5}  {'accuracy':>8}  {'worst device':>12}  {'device s':>9}  {'elapsed s':>9}  {'energy J':>9}  "
                     "updates  missing")  # fmt: skip
        for r in status.rounds:
            worst = f"{f.worst:.4f}" if (f := r.fairness()) else "-"
            lines.append(f"  {r.round:>5}  {r.accuracy:>8.4f}  {worst:>12}  {r.device_time_s:>9.3f}  {r.elapsed_s:>9.3f}  "
                         f"{r.energy_j:>9.2f}  {len(r.devices):>7}  {', '.join(r.missing) or '-'}")  # fmt: skip
        if fair := status.rounds[-1].fairness():
            lines.append(f"  round {status.rounds[-1].round}, the global model on each device's held-out data: {fair.line()}")
    if status.rounds and status.rounds[-1].devices:
        last = status.rounds[-1]
        each = "; ".join(f"{d.assignment.device_id} b={d.assignment.batch_size} x{d.assignment.local_steps} {d.device_time_s:.3f} s "
                         f"{d.energy_j:.2f} J" for d in last.devices)  # fmt: skip
        lines.append(f"  round {last.round} by device: {each}")
    if state.buffered and state.phase == Phase.training:
        each = ", ".join(f"{w.work} {w.device_id} b={w.assignment.batch_size} x{w.assignment.local_steps} from aggregation {w.round - 1}"
                         for w in state.in_flight)  # fmt: skip
        lines.append(f"  buffer {len(state.received)} of {spec.aggregation.buffer_size}"
                     + (", an aggregation running" if state.aggregating else "") + f"; work in flight: {each or 'none'}")  # fmt: skip
    elif state.phase == Phase.training and state.deadline_at is not None:
        each = ", ".join(f"{a.device_id} b={a.batch_size} f={a.frequency_hz} x{a.local_steps}" for a in state.assignments)
        lines.append(f"  round {state.round} open until {state.deadline_at:%H:%M:%S} UTC: {each}")
    if simulated:
        lines.append("  device time and energy are SIMULATED (twins)")
    if status.events:
        lines.append("  events:")
        lines += [f"    {e.line()}" for e in status.events[-EVENTS_SHOWN:]]
    return "\n".join(lines)
