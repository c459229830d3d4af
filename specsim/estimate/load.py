"""A serving replica under load, in closed form: Little's law on the iteration-cost model.

With arrivals at rate lambda per replica, a request spends S steps decoding (the acceptance
chains' expected steps for its output) and each step is one engine iteration, so the mean
decoding batch b satisfies b = lambda E[S] t(b) (Little's law), where t(b) is the mean
iteration time of a batch of b rows: the decode iteration ``StepCosts.iteration_s`` charges,
stretched by the share of time prompts take (t = t_decode / (1 - lambda E[seconds per prompt])).
The smallest b that solves it is the operating point; when none does within the batch and KV
limits, the replica is saturated and serves at most mu = B / (E[S] t_decode(B) + B E[prompt])
requests per second.

Per request: TTFT is the residual of the iteration under way at its arrival, the iterations its
prompt's chunks ride in and the seconds they add, plus the wait for a free slot (Erlang C with
the batch limit as servers, near the limits); TPOT is its steps over its tokens at t; E2E their
sum. A saturated open-loop run of N requests queues: requests wait (N / 2)(1 / mu - 1 / lambda)
on average and the few that arrive before the queue passes the TTFT limit meet the SLO. A
closed loop of C clients paces itself: lambda = C / (E2E(lambda) + think time), by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specsim.estimate.acceptance import AcceptanceChains
from specsim.estimate.passes import Passes
from specsim.estimate.traffic import Traffic

PROMPT_QUANTILES = 256  # prompts priced per operating point (order statistics of the sample)
LATENCY_SAMPLE = 1024  # requests whose latencies the SLO attainment is counted over
_GRID = 24  # batch sizes tried before the crossing is bisected


@dataclass(frozen=True)
class Window:
    """One window's per-request figures: mean steps and drafted positions per request, the
    time-weighted context of a decoding row, steps per output token for each (request, level)
    of the latency sample, and the chain's tokens per step."""

    k: int
    steps: float
    drafts_per_step: float
    context: float
    steps_per_token: np.ndarray
    sample_steps: np.ndarray
    tokens_per_step: float
    proposal_rate: float

    @classmethod
    def build(cls, k: int, chains: AcceptanceChains, traffic: Traffic) -> Window:
        remaining = np.maximum(traffic.output - 1.0, 0.0)
        steps, drafts = chains.steps(remaining)
        total = float(steps.sum())
        # A row's context grows from its prompt to prompt + output while it decodes.
        mid = traffic.prompt + traffic.output / 2.0
        context = float((steps.sum(axis=1) * mid).sum() / total) if total else 0.0
        n = min(LATENCY_SAMPLE, remaining.shape[0])
        sample = steps[:n]
        per_token = sample / np.maximum(remaining[:n], 1.0)[:, None]
        per_token[remaining[:n] < 1.0] = 0.0  # one-token outputs: TPOT counts as 0
        return cls(
            k=k,
            steps=float(steps.mean()),
            drafts_per_step=float(drafts.sum() / total) if total else 0.0,
            context=context,
            steps_per_token=per_token,
            sample_steps=sample,
            tokens_per_step=chains.tokens_per_step,
            proposal_rate=chains.proposal_rate,
        )


@dataclass(frozen=True)
class OperatingPoint:
    """One replica's steady state at ``rate`` requests per second."""

    rate: float
    saturated: bool
    service_rate: float  # requests per second at the batch / KV limit
    batch: float  # mean decoding rows
    batch_limit: float
    k: int
    decode_s: float  # a decode-only iteration of that batch
    iteration_s: float  # the mean iteration, prompts included
    prompt_share: float  # share of time the prompts take


class Replica:
    """One replica's cost and acceptance model, solved at any arrival rate."""

    def __init__(
        self,
        passes: Passes,
        windows: dict[int, Window],
        traffic: Traffic,
        choose_k,
        kv_capacity: float,
        lookahead: int,
        max_batch: int,
        padded: bool,
        block_size: int | None = None,
        prefix=None,
    ):
        self.passes = passes
        self.windows = windows
        self.traffic = traffic
        self.choose_k = choose_k  # batch size -> k, given the decode seconds per k
        self.kv_capacity = float(kv_capacity)
        self.lookahead = lookahead
        self.max_batch = float(max_batch)
        self.padded = padded
        order = np.sort(traffic.prompt)
        picks = (np.arange(PROMPT_QUANTILES) + 0.5) / PROMPT_QUANTILES * order.shape[0]
        self.prompts = order[np.minimum(picks.astype(np.int64), order.shape[0] - 1)]
        self.longest_context = float(np.max(traffic.prompt + traffic.output))
        # KV capacity in blocks (``kv_capacity`` is then blocks); prefix hits (``PrefixHits``).
        self.block_size = block_size
        self.prefix = prefix
        if prefix is not None:
            self.prompt_hits = prefix.cached(self.prompts)
            self.shared_per_row, self.shared_copy = prefix.shared_units(traffic.prompt)

    # -- one iteration -------------------------------------------------------------------------
    def decode_totals(self, window: Window, rows: float) -> tuple[float, float, float]:
        """Positions verified, KV tokens read and query-key pairs of a decode iteration."""
        new = 1.0 + window.drafts_per_step
        context = window.context
        kv = rows * (self.longest_context if self.padded else context)
        p, k = window.proposal_rate, window.k
        span = p * (k + 1.0) * (k + 2.0) / 2.0 + 1.0 - p if k else 1.0
        return rows * new, kv, rows * (new * context + span)

    def decode_s(self, k: int, rows: float) -> float:
        tokens, kv, pairs = self.decode_totals(self.windows[k], rows)
        return self.passes.decode_s(k, rows, tokens, kv, pairs)

    def prompt_s(self, k: int, rows: float) -> float:
        """Mean seconds a prompt adds, beside a decode batch of ``rows``."""
        tokens = self.decode_totals(self.windows[k], rows)[0] if rows > 0 else 0.0
        seconds = float(self.passes.prompt_s(self.prompts, tokens).mean())
        if self.prefix is None:
            return seconds
        hit = float(self.passes.prompt_s(self.prompts, tokens, self.prompt_hits).mean())
        p = self.prefix.hit_rate
        return p * hit + (1.0 - p) * seconds

    def batch_limit(self, k: int) -> float:
        per_row = self.windows[k].context + self.lookahead
        capacity = self.kv_capacity
        if self.block_size is not None:
            # cdiv(slots, b) = (slots + r) / b with r uniform on 0..b-1 as a row grows: a mean
            # of (b - 1) / 2 slots lost to the last block.
            per_row = (per_row + (self.block_size - 1) / 2.0) / self.block_size
        if self.prefix is not None and self.prefix.shared:
            # A system prompt's blocks are one copy per replica: rows that hit hold only their own.
            per_row -= self.prefix.hit_rate * self.shared_per_row
            capacity -= self.shared_copy
        return max(1.0, min(self.max_batch, capacity / per_row))

    # -- the operating point -------------------------------------------------------------------
    def _needed(self, rate: float, rows: float) -> tuple[float, int, float, float]:
        """Rows Little's law asks for at a mean batch of ``rows``, with the window, and the
        decode and prompt seconds. A row decodes beside the others (as many as the mean, in a
        batch whose size is Poisson below the limits), so its iterations run ``rows + 1``."""
        seen = min(rows + 1.0, self.batch_limit(self.choose_k(self, rows)))
        k = self.choose_k(self, seen)
        decode = self.decode_s(k, seen)
        prompt = self.prompt_s(k, rows)
        busy = rate * prompt
        if busy >= 1.0:
            return math.inf, k, decode, prompt
        return rate * self.windows[k].steps * decode / (1.0 - busy), k, decode, prompt

    def service_rate(self) -> tuple[float, float, int]:
        """Requests per second at the batch / KV limit, the limit and its window."""
        top = self.batch_limit(self.choose_k(self, self.max_batch))
        k = self.choose_k(self, top)
        top = self.batch_limit(k)
        decode, prompt = self.decode_s(k, top), self.prompt_s(k, top)
        return top / (self.windows[k].steps * decode + top * prompt), top, k

    def operating_point(self, rate: float) -> OperatingPoint:
        mu, top, top_k = self.service_rate()
        grid = np.unique(np.concatenate([np.geomspace(1e-3, top, _GRID), [top]]))
        low = 0.0
        found = None
        for rows in grid.tolist():
            needed = self._needed(rate, rows)[0]
            if needed <= rows:
                found = rows
                break
            low = rows
        if found is None:
            decode = self.decode_s(top_k, top)
            return OperatingPoint(rate, True, mu, top, top, top_k, decode, math.inf, 1.0)
        high = found
        for _ in range(30):
            if high - low <= 1e-3 * max(high, 1e-3):
                break
            mid = 0.5 * (low + high)
            if self._needed(rate, mid)[0] <= mid:
                high = mid
            else:
                low = mid
        needed, k, decode, prompt = self._needed(rate, high)
        busy = rate * prompt
        return OperatingPoint(rate, False, mu, needed, top, k, decode, decode / (1.0 - busy), busy)
