"""A federated evaluation as text: per method the rounds, device time and fleet energy to the
target global accuracy (mean ± std over seeds) and the speed-up over Baseline 1, the global
model on each device's held-out data (mean, worst device, spread), then each device's
configuration and local steps per method; Markdown tables, device figures SIMULATED."""

from __future__ import annotations

from edgetrain.common.federated.evaluation import LABELS, FederatedEvaluation
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.schemas import RelationVector

from .evaluation_text import cap_cell, markdown_table, mhz_cell, spread_cell, times_cell


def summary_table(evaluation: FederatedEvaluation) -> list[str]:
    """One line per method: seeds that reached the target, rounds, device time, speed-up, energy."""
    head = ["method", "seeds reached", "rounds", "time to target (device s, SIMULATED)", "speed-up vs Baseline 1",
            "fleet energy to target (J, SIMULATED)"]  # fmt: skip
    return markdown_table(head, [
        [LABELS[s.method], f"{s.reached}/{s.runs}", spread_cell(s.rounds), spread_cell(s.time_to_target_s),
         times_cell(s.speedup_vs_baseline1), spread_cell(s.energy_to_target_j)]
        for s in evaluation.summary
    ])  # fmt: skip


def fairness_table(evaluation: FederatedEvaluation) -> list[str]:
    """One line per method: the global model on each device's held-out data at each run's last
    round (mean over the devices, worst device, spread), and the worst device against Baseline 1's."""
    baseline = next((s.device_worst for s in evaluation.summary if s.method == "baseline1"), None)
    rows = []
    for s in evaluation.summary:
        gap = f"{100 * (s.device_worst.mean - baseline.mean):+.1f}" if s.device_worst and baseline else "-"
        rows.append([LABELS[s.method], *(spread_cell(v) if v else "-" for v in (s.device_mean, s.device_worst, s.device_spread)), gap])
    head = ["method", "mean over devices", "worst device", "spread (std over devices)", "worst device vs Baseline 1 (points)"]
    return markdown_table(head, rows)


def plan_table(evaluation: FederatedEvaluation) -> list[str]:
    """One line per device: its twin and cap, and per method b @ MHz x local steps per round
    with the device time per round the table expects (s)."""
    plans = [{a.device_id: a for a in s.plan} for s in evaluation.summary]
    lines = []
    for d in evaluation.spec.job.devices:
        cells = [f"{a.batch_size} @ {mhz_cell(a.frequency_hz)} x {a.local_steps} ({a.expected_time_s:.3g} s)"
                 if (a := plan.get(d.device_id)) else "-" for plan in plans]  # fmt: skip
        lines.append([d.device_id, evaluation.spec.twins[d.device_id], cap_cell(d.power_cap_w), *cells])
    return markdown_table(["device", "twin", "cap", *(LABELS[s.method] for s in evaluation.summary)], lines)


def job_line(job: FederatedSpec, async_size: int) -> str:
    """The job in one sentence: model, data and its split, target, local work, aggregation (the
    async methods' `async_size` updates per aggregation)."""
    scheme = job.partition.scheme
    split = {"iid": "an IID split", "dirichlet": f"a Dirichlet({job.partition.alpha:g}) split",
             "shards": f"{job.partition.shards_per_device} label shards per device"}[scheme]  # fmt: skip
    data = f"{job.dataset.name} in {split} (seed {job.partition.seed})" if job.dataset and job.partitioned() else "their own data"
    prox = f", FedProx mu = {job.aggregation.mu:g}" if job.aggregation.mu > 0 else ""
    budget = f", the +budget method's rounds within {job.local.fleet_power_w:g} W across the fleet" if job.local.fleet_power_w else ""
    rule = "FedAvg (FedNova for the + FedNova methods, drift-corrected for the SCAFFOLD ones"
    rule += f"; the async methods buffered, {async_size} updates per aggregation, staleness {job.aggregation.staleness})"
    return (
        f"{job.model} from {job.weights} on {len(job.devices)} devices holding {data}; target global accuracy "
        f"{job.target_accuracy:g} on the test split of {job.test_dataset.name}; {job.local.local_steps} local steps per round "
        f"(time-balanced: the median device's){budget}, {rule}{prox}, {job.participation.fraction:.0%} of the devices per round, "
        f"at most {job.max_rounds} rounds."
    )


def vector_line(vector: RelationVector) -> str:
    """The `+vector` methods' r_b = N_b / N_bmax per batch size ('-': censored) and where it comes from."""
    source = (f"proxy runs on {r.proxy_dataset.name} to {r.target_accuracy:g}, seeds {r.seeds}" if (r := vector.request)
              else "given in the spec")  # fmt: skip
    ratios = ", ".join(f"{b}: {'-' if r_b is None else f'{r_b:.3g}'}" for b, r_b in zip(vector.batch_sizes, vector.ratios))
    return f"Relation vector of the +vector methods (r_b = N_b / N_bmax; {source}): {ratios}."


def format_federated_evaluation(evaluation: FederatedEvaluation) -> str:
    """The evaluation: title, the job (and the relation vector), the summary table and the configurations."""
    spec = evaluation.spec
    return "\n".join([
        f"## {evaluation.name or 'federated evaluation'}", "",
        "Device figures are SIMULATED (twins): device time and energy come from the twins' models; the global "
        "accuracy comes from real training (every device's local steps on its own real data, aggregated).", "",
        f"Job: {job_line(spec.job, spec.async_buffer_size())} Seeds {spec.seeds}; wall time {evaluation.wall_s:.0f} s.", "",
        *([vector_line(evaluation.vector), ""] if evaluation.vector else []),
        "To the target global accuracy (mean ± std over the seeds that reached it; a round lasts as long as its slowest "
        "device, the fleet's energy is every device's):", "",
        *summary_table(evaluation), "",
        "Accuracy of the global model on each device's held-out data at each run's last round (the target round where it "
        "reached the target; mean ± std over the seeds):", "",
        *fairness_table(evaluation), "",
        "Batch size @ GPU MHz x local steps per round (the device time per round the table expects, SIMULATED):", "",
        *plan_table(evaluation),
    ])  # fmt: skip
