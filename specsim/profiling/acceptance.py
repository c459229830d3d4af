"""Acceptance statistics from scored text: the chain walk, per-position rates, per-request data.

Input is, per request, an acceptance matrix ``A[s, i]``: the probability that draft ``i + 1`` of
a step starting at generated position ``s`` is accepted, given drafts ``1..i`` were; and
``D[s]``, how many drafts the drafter offers at ``s`` (the window for a draft model; the proposal
length for prompt lookup, 0 where it finds no match). For a draft model scored on the target's
text, ``A[s, i] = beta[s + i]``; for prompt lookup it depends on the start, because the proposal
does. Probabilities may be 0/1 (greedy) or fractional (exact rejection sampling: beta =
sum min(p, q)).

Acceptance is not independent across positions, so the walk follows steps as they happen: a step
at ``s`` accepts ``a`` drafts and the next step starts at ``s + a + 1``. With fractional
probabilities that path is random; the walk carries the exact probability ``w[s]`` that a step
starts at ``s`` (a forward recursion over positions), so expected counts come out without
sampling noise. A step whose window would run past the scored text is not counted (it would
look artificially short) but still passes its probability on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specsim.bounds import MAX_FACTOR

MAX_K = 8


@dataclass(frozen=True)
class Scored:
    """One request: ``accept[s, i]`` (shape [L, K]) and ``drafts[s]`` (shape [L])."""

    accept: np.ndarray
    drafts: np.ndarray

    def __post_init__(self):
        if self.accept.ndim != 2 or self.drafts.shape != (self.accept.shape[0],):
            raise ValueError("accept must be [L, K] and drafts [L]")

    @property
    def length(self) -> int:
        return self.accept.shape[0]

    @classmethod
    def from_beta(cls, beta: np.ndarray, max_k: int = MAX_K) -> Scored:
        """A draft model scored position by position: ``A[s, i] = beta[s + i]``."""
        beta = np.asarray(beta, dtype=np.float64)
        n = len(beta)
        padded = np.concatenate([beta, np.zeros(max_k)])
        accept = np.stack([padded[i : i + n] for i in range(max_k)], axis=1)
        return cls(accept=accept, drafts=np.full(n, max_k, dtype=np.int64))


@dataclass
class WalkTotals:
    """Expected counts of a walk with window ``k`` over some requests."""

    k: int
    steps: float = 0.0
    proposing_steps: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    tried: np.ndarray | None = None  # [k]: steps that tried draft i + 1
    passed: np.ndarray | None = None  # [k]: steps that accepted draft i + 1

    def __post_init__(self):
        self.tried = np.zeros(self.k)
        self.passed = np.zeros(self.k)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 1.0

    @property
    def proposal_rate(self) -> float:
        return self.proposing_steps / self.steps if self.steps else 0.0

    def conditional_rates(self) -> list[float | None]:
        """``passed[i] / tried[i]``; None where no step got that far."""
        return [
            float(p / t) if t > 0 else None for p, t in zip(self.passed, self.tried, strict=True)
        ]

    def unconditional_rates(self) -> list[float]:
        """vLLM's per-position acceptance: share of steps whose first i + 1 drafts passed."""
        return [float(p / self.steps) if self.steps else 0.0 for p in self.passed]


def walk(scored: Scored, k: int, totals: WalkTotals | None = None) -> WalkTotals:
    """Add the expected counts of window-``k`` steps over one request to ``totals``."""
    return walk_all([scored], k, totals)


def _stack(requests: Sequence[Scored], k: int):
    """Requests padded to one array: accept [R, L, k], drafts [R, L], lengths [R]."""
    longest = max(r.length for r in requests)
    accept = np.zeros((len(requests), longest, k))
    drafts = np.zeros((len(requests), longest), dtype=np.int64)
    for row, r in enumerate(requests):
        width = min(k, r.accept.shape[1])
        accept[row, : r.length, :width] = r.accept[:, :width]
        drafts[row, : r.length] = np.minimum(r.drafts, width)
    return accept, drafts, np.array([r.length for r in requests])


def walk_all(requests: Sequence[Scored], k: int, totals: WalkTotals | None = None) -> WalkTotals:
    """Expected counts of window-``k`` steps over ``requests``, all walked together (the loop
    runs over positions and depths; requests are the vectorised axis)."""
    totals = totals or WalkTotals(k)
    if not requests:
        return totals
    accept, drafts, lengths = _stack(requests, k)
    rows, longest = drafts.shape
    start = np.zeros((rows, longest + k + 2))
    start[:, 0] = 1.0
    every = np.arange(rows)
    for s in range(longest):
        active = s < lengths
        w = np.where(active, start[:, s], 0.0)
        offered = np.minimum(k, drafts[:, s])
        d = np.clip(np.minimum(offered, lengths - s), 0, None)
        counted = active & (d == offered)  # the window fits in the scored text
        wc = np.where(counted, w, 0.0)
        totals.steps += wc.sum()
        totals.proposing_steps += wc[d > 0].sum()
        totals.drafted += (wc * d).sum()
        reach = np.ones(rows)
        for i in range(k):
            has = i < d
            a = accept[:, s, i]
            start[:, s + i + 1] += np.where(has, w * reach * (1.0 - a), 0.0)
            totals.tried[i] += np.where(has, wc * reach, 0.0).sum()
            reach = np.where(has, reach * a, reach)
            passed = np.where(has, wc * reach, 0.0).sum()
            totals.passed[i] += passed
            totals.accepted += passed
        start[every, s + d + 1] += w * reach
    return totals


@dataclass(frozen=True)
class ChainStats:
    per_position: list[float]
    mean_acceptance_length: dict[int, float]
    proposal_rate: float
    positions: int


def chain_statistics(requests: Sequence[Scored], max_k: int = MAX_K) -> ChainStats | None:
    """Conditional per-position rates from the window-``max_k`` walk and the mean acceptance
    length for every k = 1..max_k (each from its own walk: step boundaries depend on k).

    None when no step ever proposed a draft (nothing to say about acceptance). Depths no step
    reached repeat the last measured rate.
    """
    widest = walk_all(requests, max_k)
    rates = widest.conditional_rates()
    if rates[0] is None:
        return None
    per_position: list[float] = []
    for rate in rates:
        per_position.append(per_position[-1] if rate is None else rate)
    lengths = {k: walk_all(requests, k).mean_acceptance_length for k in range(1, max_k + 1)}
    return ChainStats(
        per_position=per_position,
        mean_acceptance_length=lengths,
        proposal_rate=widest.proposal_rate,
        positions=sum(r.length for r in requests),
    )


def run_lengths(accept: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """Greedy (0/1) acceptance: tokens a step starting at each position would emit with
    unlimited k: 1 + the number of consecutive accepted drafts (within what is offered)."""
    accept = np.asarray(accept) > 0.5
    n, width = accept.shape
    offered = np.minimum(drafts, width)
    out = np.ones(n, dtype=np.int64)
    for s in range(n):
        run = 0
        while run < offered[s] and accept[s, run]:
            run += 1
        out[s] = 1 + run
    return out


def run_lengths_from_matches(match: np.ndarray) -> np.ndarray:
    """Draft model under greedy verification: from 0/1 matches per position, the run of
    consecutive matches starting at each position, plus one (computed backwards in O(L))."""
    match = np.asarray(match) > 0.5
    out = np.ones(len(match), dtype=np.int64)
    run = 0
    for s in range(len(match) - 1, -1, -1):
        run = run + 1 if match[s] else 0
        out[s] = 1 + run
    return out


def request_concentration(betas: Sequence[np.ndarray]) -> float | None:
    """Heterogeneity across requests as a Beta concentration (method of moments).

    Each request's mean acceptance m_j varies around the overall mean m; the part of that
    variance not explained by position-to-position noise within requests is the between-request
    variance v, and a Beta with mean m and variance v has concentration m (1 - m) / v - 1.
    None when requests are indistinguishable (v <= 0, or so small that the concentration is
    past the schema's bound: a Beta that narrow is the same as none) or there are fewer than 4.
    """
    usable = [np.asarray(b, dtype=np.float64) for b in betas if len(b) >= 2]
    if len(usable) < 4:
        return None
    means = np.array([b.mean() for b in usable])
    within = np.mean([b.var(ddof=1) / len(b) for b in usable])
    between = means.var(ddof=1) - within
    m = float(np.mean(np.concatenate(usable)))
    if between <= 0 or not 0 < m < 1:
        return None
    concentration = m * (1 - m) / between - 1.0
    return None if concentration > MAX_FACTOR else float(max(concentration, 1e-3))


def format_sequences(rows: Sequence[np.ndarray], kind: str) -> str:
    """The ``AcceptanceSequences`` text: one request per line, one value per position."""
    lines = []
    for row in rows:
        if kind == "run_length":
            lines.append(" ".join(str(int(v)) for v in row))
        else:
            lines.append(" ".join(f"{float(v):.4f}" for v in row))
    return "\n".join(lines) + "\n"
