"""Step costs and FLOPs of one replica's engine iterations, from the profile.

A speculative step = k draft passes + one target pass over k + 1 positions per row + per-step
overhead; a tree step (``tree.py``) drafts and verifies a tree's nodes instead. Chunked prefill
rides in the same target pass. All costs are scalar arithmetic on batch totals (tokens, KV
tokens read, query-key pairs), so the engine pays a handful of float operations per iteration.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from specsim.costs import formula
from specsim.costs.drafters import drafter_cost
from specsim.costs.tree import TreeDrafterCost, TreeRows
from specsim.profile import LatencyModel, LoadedProfile, ModelSpec
from specsim.tree import TreeShape


class PassTotals:
    """A group of sequences in one target pass, in totals: the decoding rows of an iteration,
    or its prompt chunks. Read-only by convention: a slotted class rather than a NamedTuple or
    a frozen dataclass because the engine builds several per iteration, and those cost two and
    four times as much to build."""

    __slots__ = ("kv", "pairs", "rows", "tokens")

    def __init__(self, rows: int, tokens: float, kv: float, pairs: float):
        self.rows = rows  # sequences
        self.tokens = tokens  # positions fed: verified decode positions, or prompt-chunk tokens
        self.kv = kv  # KV-cache tokens read
        self.pairs = pairs  # query-key pairs of attention

    def __repr__(self) -> str:
        return f"PassTotals({self.rows}, {self.tokens}, {self.kv}, {self.pairs})"


NO_ROWS = PassTotals(0, 0.0, 0.0, 0.0)


class IterationParts(NamedTuple):
    """One engine iteration's seconds in parts (they sum to ``StepCosts.iteration_s``)."""

    target: float  # the target's pass
    draft: float  # the drafter's passes (and its pass over prompt chunks)
    host: float  # the engine's own work: the profile's overhead terms


class StepCosts:
    """Seconds and FLOPs of engine iterations for one target (+ drafter) on one device: built
    once per pool, and charged by the simulator, fitted against by the profiler's overhead fit,
    and compared with the real engine's log."""

    def __init__(self, profile: LoadedProfile, drafter: str | None, tree: TreeShape | None = None):
        self.profile = profile
        self.target_spec: ModelSpec = profile.profile.target
        self.target: LatencyModel = profile.latency_model("target")
        self.drafter_name = drafter
        self.drafter = drafter_cost(profile, drafter)
        self.draft_latency: LatencyModel | None = self.drafter.latency
        overhead = profile.profile.overhead
        self.request_s = overhead.per_request_s  # a request's way in: TTFT pays it, no pass
        own = self.drafter.spec.overhead if self.drafter.spec is not None else None
        draft_terms = own if own is not None else overhead
        t = self.target_spec
        self.target_flops_per_token = t.flops_per_token
        self.target_attn_flops = t.attention_flops_per_context_token
        # The terms as ``formula`` reads them: what every path charges, interpreted here and
        # compiled in the kernels.
        self.terms = formula.cost_vector(
            self.target,
            (
                overhead.per_step_s,
                overhead.per_sequence_s,
                own.per_speculative_step_s if own is not None else 0.0,
                own.per_speculative_sequence_s if own is not None else 0.0,
                draft_terms.per_draft_step_s,
                draft_terms.per_draft_token_s,
            ),
            self.drafter,
            (self.target_flops_per_token, self.target_attn_flops),
            (draft_terms.per_prefill_s, draft_terms.per_prefill_token_s),
            overhead.per_request_engine_s,
        )
        # Tree steps (``specsim.costs.tree``): k is the tree's depth, the drafter's passes and
        # the verification widths follow the shape; None: chain steps.
        self.tree_rows = None
        if tree is not None and drafter is not None:
            self.drafter = TreeDrafterCost(self.drafter, tree)
            self.tree_rows = TreeRows(tree)
            self.terms = self.drafter.terms(self.terms)
        self._check_target = self.target.latency.valid_range is not None
        self.checks_ranges = self._check_target or self.drafter.checks_range

    # The terms the estimate reads apart, from the vector (one copy of each).
    @property
    def overhead_seq_s(self) -> float:
        return self.terms[formula.OVERHEAD + 1]

    @property
    def admit_s(self) -> float:
        """Seconds an iteration adds for each request it admits (``formula.admitted_s``)."""
        return self.terms[formula.ADMIT_S]

    @property
    def overhead_prefill_s(self) -> float:
        return self.terms[formula.PREFILL_S]

    @property
    def overhead_prefill_token_s(self) -> float:
        return self.terms[formula.PREFILL_TOKEN_S]

    # ---- seconds -------------------------------------------------------------------------
    def target_pass_s(self, batch: int, new: float, kv: float, pairs: float) -> float:
        return self.target.seconds_from_totals(batch, new, kv, pairs)

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        """Drafting cost of one step for ``rows`` decoding sequences with ``kv`` context in all
        (see the drafter kinds in ``specsim.costs.drafters``)."""
        if not rows:
            return 0.0
        return formula.draft_s(self.terms, rows, k, kv)

    def draft_prefill_s(self, rows: int, tokens: float, kv: float, pairs: float) -> float:
        """A draft model also builds its own KV cache for prompt chunks."""
        return formula.draft_prefill_s(self.terms, rows, tokens, kv, pairs)

    def overhead_s(self, sequences: int, k: int = 0, drafting: int = 0) -> float:
        """The profile's overhead formula (see ``Overhead``): ``sequences`` in the iteration,
        ``drafting`` of them through ``k`` draft passes (the drafter's own draft terms when its
        spec has them, and its terms per speculative step)."""
        return formula.overhead_s(self.terms, sequences, k, drafting)

    def check_ranges(self, batch: int, max_context: float, max_new: float, min_new: float) -> None:
        """The profile's rule for queries outside the measured range (no-op without a range)."""
        if self._check_target:
            self.target.check_range(batch, max_context, max_new, min_new)
        self.drafter.check_range(batch, max_context)

    def iteration_s(self, k: int, decode: PassTotals, prefill: PassTotals = NO_ROWS) -> float:
        """Seconds of one engine iteration (see ``iteration_parts``): the cost the engine
        charges and the adaptive window policy maximises against (one function, so the two
        cannot drift apart)."""
        target, draft, host = self._parts(k, decode, prefill)
        return target + draft + host

    def iteration_parts(
        self, k: int, decode: PassTotals, prefill: PassTotals = NO_ROWS
    ) -> IterationParts:
        """One engine iteration's seconds in parts: the target's pass, the drafter's passes,
        and the engine's own work (the overhead terms).

        ``decode``'s rows verify its tokens over its cached KV tokens after k draft passes;
        ``prefill``'s prompt chunks ride in the same target pass (and a draft model builds its
        own cache for them, and the prefill overhead terms apply).
        """
        return IterationParts(*self._parts(k, decode, prefill))

    def _parts(self, k: int, decode: PassTotals, prefill: PassTotals) -> tuple[float, float, float]:
        totals = (decode.rows, decode.tokens, decode.kv, decode.pairs)
        chunks = (prefill.rows, prefill.tokens, prefill.kv, prefill.pairs)
        return formula.iteration_parts(self.terms, k, *totals, *chunks)

    def decode_iteration_s(self, k: int, rows: int, tokens: float, kv: float, pairs: float):
        """``iteration_s(k, PassTotals(rows, tokens, kv, pairs))`` of a decode-only iteration
        with ``rows`` > 0."""
        return formula.decode_s(self.terms, k, rows, tokens, kv, pairs)

    def range_limits(self) -> tuple[float, float, float, float, float]:
        """The region within which ``check_ranges`` can neither warn nor raise, the models that
        still report together: batch low and high, context high, new tokens low and high
        (unbounded where no model reports any more; an empty batch range where the drafter's
        range leaves out its one new token, so that every query reports)."""
        batch_lo, batch_hi, context = -math.inf, math.inf, math.inf
        new_lo, new_hi = -math.inf, math.inf
        models = [(self.target, False)]
        if self.drafter.checks_range:
            models.append((self.drafter.latency, True))
        for model, one_token in models:
            if not model.reports_outside_range():
                continue
            rng = model.latency.valid_range
            batch_lo, batch_hi = max(batch_lo, rng.batch[0]), min(batch_hi, rng.batch[1])
            context = min(context, rng.context[1])
            if not one_token:
                new_lo, new_hi = max(new_lo, rng.new_tokens[0]), min(new_hi, rng.new_tokens[1])
            elif not rng.new_tokens[0] <= 1 <= rng.new_tokens[1]:
                batch_hi = -math.inf
        return batch_lo, batch_hi, context, new_lo, new_hi

    # ---- FLOPs ---------------------------------------------------------------------------
    def target_flops(self, new: float, pairs: float) -> float:
        return self.target_flops_per_token * new + self.target_attn_flops * pairs

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if not rows:
            return 0.0
        return formula.draft_flops(self.terms, rows, k, kv)

    def draft_prefill_flops(self, tokens: float, pairs: float) -> float:
        return formula.draft_prefill_flops(self.terms, tokens, pairs)

    def wasted_flops_per_position(self, mean_context: float) -> float:
        """FLOPs of one rejected position: the target's verification plus the draft's pass."""
        return formula.wasted_per_position(self.terms, mean_context)
