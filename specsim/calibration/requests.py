"""Acceptance calibrated from the engines' per-request responses
(``specsim.serving.request_metrics``).

Where every request has its histogram, the entry keeps them all (``acceptance_histograms``
with ``requests``), so the profile has the spread across requests and not only the mean; where
some lack one, it keeps the pooled mean acceptance length at the deployed k. The schema turns
either into chain rates (``specsim.profile.reported``).
"""

from __future__ import annotations

from specsim.profile.reported import constant_rate
from specsim.serving.prometheus import SpecDecodeCounters
from specsim.serving.request_metrics import RequestAcceptance


def requests_entry(
    requests: RequestAcceptance, drafter: str, verifier: str, temperature: float
) -> dict:
    """A profile acceptance entry (``source: calibrated``) from per-request records."""
    entry = {"drafter": drafter, "verifier": verifier, "temperature": temperature}
    if requests.histograms is not None:
        entry["acceptance_histograms"] = [{"k": requests.k, "requests": requests.histograms}]
    else:
        entry["mean_acceptance_length"] = {requests.k: requests.mean_acceptance_length}
    return {**entry, "source": "calibrated", "tokens_scored": sum(requests.steps) * requests.k}


def requests_counters(requests: RequestAcceptance) -> SpecDecodeCounters:
    """The records summed as vLLM's counters are: accepted-at-position counts from the pooled
    histogram, or, from a mean length alone, those of its constant rate (what the entry says)."""
    steps = sum(requests.steps)
    if requests.histograms is not None:
        pooled = [sum(h[j] for h in requests.histograms) for j in range(requests.k + 1)]
        per_position = [float(sum(pooled[i + 1 :])) for i in range(requests.k)]
    else:
        rate = constant_rate(requests.mean_acceptance_length, requests.k)
        per_position = [steps * rate ** (i + 1) for i in range(requests.k)]
    return SpecDecodeCounters(
        drafts=float(steps),
        draft_tokens=float(steps * requests.k),
        accepted=float(sum(requests.accepted)),
        per_position=per_position,
        series=len(requests.steps),
        series_of="requests",
    )
