"""The relation vector of a federated evaluation's `+vector` methods, one for every device's
equation (4): estimated in this process by proxy runs on a central proxy dataset (`ProxyRuns`,
what the server pool runs for a fine-tune), or read from a RelationVector JSON file (`read_vector`)."""

from __future__ import annotations

from pydantic import Field

from ..documents import DocumentError, read_document
from ..limits import MAX_SEEDS, SampleCount
from ..schemas import DatasetRef, EstimationRequest, Seeds, Strict
from .spec import FederatedSpec


class ProxyRuns(Strict):
    """Proxy runs that estimate r_b = N_b / N_bmax: the job's model from its weights, with its
    lr, trained centrally on `dataset` to the job's target accuracy at each of its batch sizes
    and every seed."""

    dataset: DatasetRef
    seeds: Seeds = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    eval_every_samples: SampleCount = Field(512, description="accuracy is checked this often (samples)")
    max_samples: SampleCount = Field(200_000, description="a run that has not reached the target by then is censored (samples)")

    def request(self, job: FederatedSpec) -> EstimationRequest:
        """The estimation request of these runs for `job`."""
        return EstimationRequest(
            model=job.model, weights=job.weights, proxy_dataset=self.dataset, target_accuracy=job.target_accuracy,
            batch_sizes=job.batch_sizes, seeds=self.seeds, lr=job.lr, eval_every_samples=self.eval_every_samples,
            max_samples=self.max_samples,
        )  # fmt: skip


def read_vector(value: object) -> object:
    """A path's RelationVector document (JSON, or YAML by its suffix), any other value as given
    (ValueError saying why the file cannot be read)."""
    if not isinstance(value, str):
        return value
    try:
        return read_document(value, "relation vector")
    except DocumentError as exc:
        raise ValueError(str(exc)) from None
