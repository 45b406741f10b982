"""How far to trust a proxy's r_b on new data, learned from how far it was on other data.

Records pair what a proxy predicted with what runs on the target data then measured. For one
data whose runs measured two batch sizes or more, a `ProxyCheck` holds the proxy's error on it:
for every two measured batch sizes, |log| of (their N_b ratio measured) / (the proxy's ratio);
the check keeps the largest. `trust_width` is a high quantile of the checks of one proxy (its
model, weights and dataset: `proxy_family`) over every data it was checked on, with the paper's
results counted as `PAPER_WEIGHT` checks at `PAPER_TRUST` (equation (4) within 8 % of the
oracle on related proxies): with no history the paper's figure holds, and a proxy that was far
off on other data is trusted less on the next, as a good one is trusted more. common/finetune/belief.py
uses the width as the interval of the proxy's r_b where nothing on the data measured it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import statistics
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from ..schemas import EstimationRequest, RelationVector, Strict, utc_now
from .belief import PAPER_TRUST
from .learned import FinetuneRecord, prior_samples, relative_samples

PAPER_WEIGHT = 2  # how many checks the paper's results count as
QUANTILE = 0.8  # the share of data on which the proxy's error stays inside the width


class ProxyCheck(Strict):
    """How far a proxy's r_b were from what runs on one data measured (see the module docstring)."""

    data: str = Field(description="the data key of the records (common/keys.py learned_key)")
    error: float = Field(ge=0, description="the largest |log| error of the proxy's N_b ratio between two measured batch sizes")
    pairs: int = Field(ge=1, description="pairs of measured batch sizes the check compared")
    at: datetime = Field(default_factory=utc_now)


def proxy_family(request: EstimationRequest | None) -> str | None:
    """The key of a proxy: its model, weights and dataset (a proxy trained to another accuracy
    is the same proxy)."""
    if request is None:
        return None
    parts = [request.model, request.weights, request.proxy_dataset.model_dump_json(), request.lr.model_dump_json()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def proxy_check(records: Sequence[FinetuneRecord], prior: RelationVector, data: str = "") -> ProxyCheck | None:
    """The proxy's error on the data of `records`; None unless they measured two batch sizes
    the prior has N_b for."""
    measured = {b: statistics.fmean(v) for b, v in relative_samples(list(records)).items()}
    prior_n = {b: n for b in measured if (n := prior_samples(prior, b))}
    if len(prior_n) < 2:
        return None
    shared = sorted(prior_n)
    errors = [abs(math.log((measured[a] / measured[b]) / (prior_n[a] / prior_n[b]))) for a, b in itertools.combinations(shared, 2)]
    return ProxyCheck(data=data, error=max(errors), pairs=len(errors))


def trust_width(checks: Sequence[ProxyCheck]) -> float:
    """The width within which a proxy's r_b is trusted on new data: the QUANTILE of its checks'
    errors, the paper's results counted as PAPER_WEIGHT checks at PAPER_TRUST."""
    values = sorted([c.error for c in checks] + [PAPER_TRUST] * PAPER_WEIGHT)
    position = QUANTILE * (len(values) - 1)
    low, high = math.floor(position), math.ceil(position)
    return values[low] + (values[high] - values[low]) * (position - low)
