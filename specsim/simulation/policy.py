"""Window policies: which k the engine uses for the next iteration, one class per name a
scenario may give ``speculation.policy`` (``specsim.choices.WINDOW_POLICIES``).

- ``FixedWindow``: always k.
- ``BatchTableWindow``: k from a table by running batch size (above the table: k = 0).
- ``AdaptiveStepsWindow`` (``policy: adaptive_steps``): SGLang's adaptive steps,
  ``AcceptanceGate``, TensorRT-LLM's acceptance off-switch around a fixed or by-batch policy,
  and ``AdaptiveVerification`` (``policy: adaptive_verification``), vLLM's per-row verify
  budget (all in ``engine_policies.py``; the off-switch runs on the serving kernel too).
- ``GoodputWindow`` (``policy: adaptive``): before each iteration, the k in 0..k_max that saves
  the most time. It evaluates the engine's own cost function (``StepCosts.iteration_s``) on the
  batch as it stands, with each row's ragged window near the end of its request. A decode-only
  iteration takes the k with the most expected tokens per second of step time. When prompt
  chunks ride in the same pass, the pass's fixed cost is paid for them anyway and verification
  tokens land past the compute knee, so the choice weighs the seconds the decoding rows add
  against what their tokens are worth: the seconds per token of the batch decoding on its own at
  its best window (what those tokens would cost in a later iteration). Expected tokens per row
  are the acceptance model's running-batch mean (``row_expected_emitted``), not the per-request
  mean: poorly accepting requests stay in the batch longer, so a batch holds more of them than
  the arrivals do.

What no per-iteration choice of k can avoid is the cost of having a drafter deployed at all: its
weights and KV cache take memory (fewer KV-cache tokens) and a draft model prefills every prompt.
Static k = 0 (``speculation.k: 0``) deploys no drafter, so near saturation it can beat any policy
that keeps one, adaptive included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from specsim.choices import WINDOW_POLICIES, check_implemented
from specsim.costs import NO_ROWS, PassTotals
from specsim.scenario import Speculation
from specsim.simulation.engine_policies import (
    AcceptanceGate,
    AdaptiveStepsWindow,
    AdaptiveVerification,
)
from specsim.simulation.serving_policy import MOST_GATE_WINDOW


class FixedWindow:
    name: ClassVar[str] = "fixed"
    fixed: ClassVar[bool] = True  # the same k whatever the batch

    def __init__(self, k: int):
        self.k = k
        self.k_max = k

    @classmethod
    def build(cls, speculation: Speculation, max_batch: int) -> FixedWindow:
        return cls(speculation.k)

    def choose(self, rows: int, kv_tokens: float) -> int:
        return self.k


class BatchTableWindow:
    name: ClassVar[str] = "by_batch"
    fixed: ClassVar[bool] = False

    def __init__(self, table: list[tuple[int, int]], max_batch: int):
        self.k_max = max(k for _, k in table)
        by_size = []
        for size in range(max_batch + 1):
            k = next((k for limit, k in table if size <= limit), 0)
            by_size.append(k)
        self._by_size = by_size

    @classmethod
    def build(cls, speculation: Speculation, max_batch: int) -> BatchTableWindow:
        return cls([(row.max_batch, row.k) for row in speculation.k_by_batch], max_batch)

    def choose(self, rows: int, kv_tokens: float) -> int:
        return self._by_size[min(rows, len(self._by_size) - 1)]


class GoodputWindow:
    """argmax over k of mu x E[tokens emitted by the decoding rows](k) - seconds they add(k).

    ``attach`` binds the engine's cost model and acceptance model (the replica does it);
    ``choose_batch`` is called before every iteration with the batch's arrays.
    """

    name: ClassVar[str] = "adaptive"
    fixed: ClassVar[bool] = False

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.costs = None
        self._row_tokens: list[float] = []
        self._proposal = 1.0
        self._row_new: list[float] = []
        self._row_pairs: list[float] = []
        self._bonus_pairs: list[float] = []

    @classmethod
    def build(cls, speculation: Speculation, max_batch: int) -> GoodputWindow:
        # The replica attaches its cost and acceptance models (``attach``), so the choice is
        # made against exactly what the engine charges.
        return cls(speculation.k)

    def attach(self, costs, acceptance) -> None:
        self.costs = costs
        self._row_tokens = [acceptance.row_expected_emitted(k) for k in range(self.k_max + 1)]
        p = self._proposal = float(acceptance.proposal_rate)
        # Per-window terms of ``_expected_decode``, computed once with the same operations (so
        # the sums below are bit-for-bit what evaluating them each iteration would give).
        windows = range(self.k_max + 1)
        self._row_new = [1.0 + p * k for k in windows]
        self._bonus_pairs = [p * (k + 1.0) * (k + 2.0) / 2.0 for k in windows]
        self._row_pairs = [b + 1.0 - p for b in self._bonus_pairs]

    def choose_batch(
        self,
        rows: int,
        kv_tokens: float,
        remaining: np.ndarray,
        context: np.ndarray,
        prefill: Callable[[float], PassTotals] | None,
        token_budget: float,
    ) -> int:
        """The best k for this iteration (ties go to the smaller k).

        ``remaining`` and ``context`` are the batch arrays (0 in empty slots); ``prefill(budget)``
        gives the totals of the prompt chunks the engine would schedule in what the decoding
        rows leave of ``token_budget`` (None: no chunks).
        """
        if rows == 0:
            return 0
        scores = self.scores(rows, kv_tokens, remaining, context, prefill, token_budget)
        return scores.index(max(scores))  # the first of equal scores: the smaller k

    def scores(self, rows, kv_tokens, remaining, context, prefill, token_budget) -> list[float]:
        """Expected seconds saved by each k in 0..k_max (the policy takes the largest).

        An emitted token is worth ``mu``, the seconds per token of this batch decoding on its own
        at its best window (the price of producing the token in a later, decode-only
        iteration); a window saves mu x its expected tokens minus the seconds the decoding rows
        add to this iteration. Without prompt chunks the rows pay the whole pass and the argmax
        is the k with the most tokens per second of step time.
        """
        k_max = self.k_max
        # Rows within k_max tokens of their end draft fewer than k: min(k, remaining - 1).
        short = np.flatnonzero((remaining > 0) & (remaining <= k_max))
        short_left = remaining[short].tolist()
        short_context = context[short].tolist()
        long_rows = rows - len(short_left)
        long_context = kv_tokens - sum(short_context)
        costs = self.costs
        p = self._proposal
        windows = []
        for k in range(k_max + 1):
            tokens, new, pairs = self._expected_decode(
                k, long_rows, long_context, short_left, short_context, p
            )
            alone = costs.decode_iteration_s(k, rows, new, kv_tokens, pairs)
            windows.append((tokens, new, pairs, alone))
        mu = min(alone / tokens for tokens, _, _, alone in windows)
        if prefill is None:
            return [mu * tokens - alone for tokens, _, _, alone in windows]
        scores = []
        fixed_chunk = None
        for k, (tokens, new, pairs, _) in enumerate(windows):
            decode = PassTotals(rows, new, kv_tokens, pairs)
            chunk = fixed_chunk or prefill(token_budget - new)
            if chunk.tokens < token_budget - rows * (k_max + 1.0):
                fixed_chunk = chunk  # every window leaves room for all of it
            added = costs.iteration_s(k, decode, chunk)
            if chunk.rows:
                added -= costs.iteration_s(0, NO_ROWS, chunk)
            scores.append(mu * tokens - added)
        return scores

    def _expected_decode(self, k, long_rows, long_context, short_left, short_context, p):
        """Expected (tokens emitted, positions verified, query-key pairs) of the decoding rows.

        A row drafting d verifies 1 + d positions when it has a proposal (probability p) and 1
        otherwise; its pairs are new x (context + (new + 1) / 2), as the engine counts them.
        """
        row_tokens = self._row_tokens
        row_new = self._row_new
        bonus = self._bonus_pairs
        tokens = long_rows * row_tokens[k]
        new = long_rows * row_new[k]
        pairs = row_new[k] * long_context + long_rows * self._row_pairs[k]
        for left, ctx in zip(short_left, short_context, strict=True):
            d = min(k, int(left) - 1)
            tokens += row_tokens[d]
            new += row_new[d]
            pairs += row_new[d] * ctx + bonus[d] + 1.0 - p
        return tokens, new, pairs


WindowPolicy = (
    FixedWindow | BatchTableWindow | GoodputWindow | AdaptiveStepsWindow | AdaptiveVerification
)

# The implementation of each policy a scenario may name (``specsim.choices.WINDOW_POLICIES``).
WINDOW_POLICY_CLASSES: dict[str, type[WindowPolicy]] = {
    cls.name: cls
    for cls in (
        FixedWindow,
        BatchTableWindow,
        GoodputWindow,
        AdaptiveStepsWindow,
        AdaptiveVerification,
    )
}
check_implemented(WINDOW_POLICIES, WINDOW_POLICY_CLASSES, "window policies")


def build_policy(speculation: Speculation, max_batch: int) -> WindowPolicy | AcceptanceGate:
    """The scenario's policy; ``max_concurrency`` makes a fixed k the table {max_concurrency:
    k} (TensorRT-LLM's own translation, ``engine_policies``), and ``acceptance_gate`` wraps it
    in the off-switch."""
    if not speculation.enabled:
        return FixedWindow(0)
    if speculation.max_concurrency is not None:
        policy = BatchTableWindow([(speculation.max_concurrency, speculation.k)], max_batch)
    else:
        policy = WINDOW_POLICY_CLASSES[speculation.policy].build(speculation, max_batch)
    if speculation.acceptance_gate is not None:
        return AcceptanceGate(policy, speculation.acceptance_gate)
    return policy


def window_terms(policy) -> tuple[np.ndarray, np.ndarray] | None:
    """The window policy as the kernel reads it (``compiled_step_kernel._window``): k by batch
    size, or (none) the goodput policy's per-window terms; None for another policy. An
    off-switch around a fixed or by-batch policy is the inner policy's table (the kernel
    carries the switch's state, ``compiled_policy_kernel``)."""
    if isinstance(policy, AcceptanceGate):
        if policy.window > MOST_GATE_WINDOW or type(policy.inner) not in (
            FixedWindow,
            BatchTableWindow,
        ):
            return None
        return window_terms(policy.inner)
    kind = type(policy)
    if kind is AdaptiveStepsWindow:  # its tiers are the kernel's state (``serving_policy``)
        return np.zeros(1, dtype=np.int64), np.zeros((5, 1))
    if kind is FixedWindow:
        return np.array([policy.k], dtype=np.int64), np.zeros((5, 1))
    if kind is BatchTableWindow:
        return np.array(policy._by_size, dtype=np.int64), np.zeros((5, 1))
    if kind is GoodputWindow:
        terms = [policy._row_tokens, policy._row_new, policy._row_pairs, policy._bonus_pairs]
        goodput = np.zeros((5, policy.k_max + 1))
        goodput[:4] = terms
        goodput[4, 0] = policy._proposal
        return np.zeros(0, dtype=np.int64), goodput
    return None
