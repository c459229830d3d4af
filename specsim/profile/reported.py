"""Acceptance as engines and benchmarks report it, turned into the chain rates the simulator uses.

An acceptance entry may give, instead of ``per_position``:

- a mean acceptance length at one k, or a table of them over k (``mean_acceptance_length``):
  ``table_rates``;
- counts of steps by accepted drafts (``acceptance_histograms``, pooled or per request, per k):
  ``histogram_rates``, and from per-request counts their spread, ``histogram_concentration``.

Each function is the one stated rule for its form; the schema's field descriptions quote them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from specsim.bounds import MAX_COUNT, MAX_FACTOR, MAX_K, MIN_FACTOR
from specsim.config import StrictModel

StepCount = Annotated[int, Field(ge=0, le=MAX_COUNT)]


def constant_rate(length: float, k: int) -> float:
    """The rate a in [0, 1] with 1 + a + a^2 + ... + a^k = ``length`` (in [1, k + 1]).

    The sum rises strictly in a, so bisection to adjacent floats solves it to rounding."""
    if length <= 1.0 or length >= k + 1:
        return 0.0 if length <= 1.0 else 1.0

    def total(a: float) -> float:
        return sum(a**i for i in range(k + 1))

    low, high = 0.0, 1.0
    while (middle := (low + high) / 2) not in (low, high):
        low, high = (middle, high) if total(middle) < length else (low, middle)
    return high if total(high) - length <= length - total(low) else low


def table_rates(lengths: dict[int, float], proposal_rate: float = 1.0) -> list[float]:
    """Conditional per-position rates from mean acceptance lengths L_k (k without gaps).

    Lengths of a drafter that proposes in a share r of steps are first taken per proposal:
    L' = 1 + (L - 1) / r. At the smallest k given, k0, positions 1..k0 share the constant rate
    a with 1 + a + ... + a^k0 = L'_k0 (``constant_rate``); each further k's gain
    L'_k - L'_(k-1) is the chance that the first k drafts are all accepted, so its rate is the
    gain over the chain's reach so far, within [0, 1]. From k0 = 1 this is
    ``specsim.simulation.acceptance.window_rates``. A chain's length never falls as k grows:
    where the table falls (DSpark's need not rise), the rate is 0 there and after."""
    ks = sorted(lengths)
    scaled = {k: 1.0 + (lengths[k] - 1.0) / proposal_rate for k in ks}
    first = constant_rate(scaled[ks[0]], ks[0])
    rates = [first] * ks[0]
    reach, previous = first ** ks[0], scaled[ks[0]]
    for k in ks[1:]:
        rate = 0.0 if reach <= 0.0 else min(max((scaled[k] - previous) / reach, 0.0), 1.0)
        rates.append(rate)
        reach *= rate
        previous = scaled[k]
    return rates


def histogram_rates(counts: list[int]) -> list[float]:
    """Conditional per-position rates from counts c_j of steps that accepted exactly j drafts:
    with u_i = (c_i + ... + c_k) / (c_0 + ... + c_k) the share of steps whose first i drafts
    were accepted (u_0 = 1), rate i is u_i / u_(i-1) (0 where no step got that far). The chain
    reproduces the histogram's mean acceptance length, 1 + sum_j j c_j / sum_j c_j."""
    total = sum(counts)
    rates, previous = [], 1.0
    for i in range(1, len(counts)):
        reached = sum(counts[i:]) / total
        rates.append(reached / previous if previous > 0 else 0.0)
        previous = reached
    return rates


def histogram_concentration(requests: list[list[int]]) -> float | None:
    """``request_concentration`` c from per-request counts, by the method of moments on each
    request's first-draft acceptance (the simulator draws a request's rates from
    Beta(c a, c (1 - a)), so the first position's spread determines c).

    Request r ran n_r steps and accepted its first draft in x_r = n_r - c_(r,0) of them; with
    a = sum x / sum n, S^2 = mean_r (x_r / n_r - a)^2 and h = mean_r 1 / n_r, a beta-binomial
    spread has S^2 = a (1 - a) (h + rho (1 - h)), rho = 1 / (1 + c). So
    rho = (S^2 / (a (1 - a)) - h) / (1 - h) and c = 1 / rho - 1. None (requests alike) where
    rho <= 0, fewer than two requests ran a step, every request ran one step, or a is 0 or 1."""
    runs = [(sum(c), sum(c) - c[0]) for c in requests if sum(c) > 0]
    if len(runs) < 2:
        return None
    steps = sum(n for n, _ in runs)
    a = sum(x for _, x in runs) / steps
    h = sum(1 / n for n, _ in runs) / len(runs)
    if a <= 0.0 or a >= 1.0 or h >= 1.0:
        return None
    spread = sum((x / n - a) ** 2 for n, x in runs) / len(runs)
    rho = (spread / (a * (1 - a)) - h) / (1 - h)
    if rho <= 0.0:
        return None
    return min(max(1.0 / rho - 1.0, MIN_FACTOR), MAX_FACTOR)


class AcceptanceHistogram(StrictModel):
    """Steps counted by how many drafts they accepted, at one window k: what vLLM's per-request
    ``metrics.speculative_decoding.acceptance_histogram`` and SGLang's ``meta_info``
    ``spec_accept_histogram`` report. Index j counts the steps that accepted exactly j drafts."""

    k: Annotated[int, Field(ge=1, le=MAX_K)] = Field(description="the window the steps drafted")
    counts: list[StepCount] | None = Field(
        default=None,
        description="pooled over requests, j = 0..k (a shorter list: the missing j counted 0); "
        "absent: the sum of requests",
    )
    requests: list[list[StepCount]] | None = Field(
        default=None,
        description="each request's own counts, j = 0..k: their spread gives "
        "request_concentration (histogram_concentration)",
    )

    @model_validator(mode="after")
    def _counts_fit_the_window(self) -> AcceptanceHistogram:
        lists = ([self.counts] if self.counts is not None else []) + (self.requests or [])
        if not lists:
            raise ValueError("an acceptance histogram needs counts or requests; fix: give one")
        if any(len(c) > self.k + 1 for c in lists):
            raise ValueError(
                f"an acceptance histogram has a list longer than k + 1 = {self.k + 1} (0..k "
                "drafts accepted); fix: give the k the steps drafted"
            )
        if self.counts is not None and self.requests and self.pooled() != self.summed():
            raise ValueError(
                "an acceptance histogram's counts are not the sum of its requests; fix: give one "
                "of them, or the sum"
            )
        if sum(self.pooled()) == 0:
            raise ValueError("an acceptance histogram counts no step; fix: give counts of steps")
        return self

    def summed(self) -> list[int]:
        return [
            sum(c[j] if j < len(c) else 0 for c in self.requests or []) for j in range(self.k + 1)
        ]

    def pooled(self) -> list[int]:
        """Counts j = 0..k over every request."""
        if self.counts is None:
            return self.summed()
        return list(self.counts) + [0] * (self.k + 1 - len(self.counts))

    def mean_length(self) -> float:
        counts = self.pooled()
        return 1.0 + sum(j * c for j, c in enumerate(counts)) / sum(counts)
