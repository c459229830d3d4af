"""The iteration-cost model at an operating point: a decode iteration of a mean batch, and what
each prompt adds to the iterations that carry it.

Decode iterations are priced by ``StepCosts.iteration_s`` itself (the function the engine
charges), for a batch of ``rows`` mean rows. A prompt's price is the same latency fits
evaluated on arrays of prompts (``specsim.profile.latency.fit_seconds``): with chunked prefill,
the seconds its chunks add to decode iterations of that batch (the target's tokens past the
compute knee, its KV reads and attention pairs, the drafter's own prefill pass, the prefill
overhead); without, the prompt-only iteration it runs in alone. Either way the iteration that
admits it pays the engine's cost per admitted request once (preemptions are not modelled).
"""

from __future__ import annotations

import numpy as np

from specsim.costs import NO_ROWS, PassTotals, StepCosts
from specsim.profile.latency import experts_seconds, fit_seconds, graphed_tokens
from specsim.scenario import Engine


class Passes:
    """Iteration seconds for one pool's costs and engine (``draft_fit`` None: no prompt pass
    of the drafter's own)."""

    def __init__(self, costs: StepCosts, engine: Engine):
        self.costs = costs
        self.engine = engine
        self.target_fit = costs.target.latency.fit
        latency = costs.drafter.latency
        passes = costs.drafter.passes
        builds_cache = passes is not None and passes.own_cache and latency is not None
        self.draft_fit = latency.latency.fit if builds_cache else None

    def decode_s(self, k: int, rows: float, tokens: float, kv: float, pairs: float) -> float:
        """One decode-only iteration of ``rows`` rows verifying ``tokens`` positions."""
        if rows <= 0.0:
            return 0.0
        return self.costs.iteration_s(k, PassTotals(rows, tokens, kv, pairs))

    def chunks(self, prompt: np.ndarray, decode_tokens: float, cached=None) -> np.ndarray:
        """Iterations each prompt's chunks ride in (1 without chunked prefill); ``cached``:
        the tokens of each prompt a prefix cache skips (None: none)."""
        if not self.engine.chunked_prefill:
            return np.ones_like(prompt)
        room = max(1.0, float(self.engine.max_batched_tokens) - decode_tokens)
        return np.ceil((prompt if cached is None else prompt - cached) / room)

    def prompt_s(self, prompt: np.ndarray, decode_tokens: float, cached=None) -> np.ndarray:
        """Seconds each prompt adds to the engine's iterations, beside decode iterations that
        verify ``decode_tokens`` positions (chunked prefill), or in an iteration of its own.
        ``cached``: tokens of each prompt a prefix cache skips; the rest are computed,
        attending over them (None: every token computed)."""
        if not self.engine.chunked_prefill:
            return self._alone_s(prompt, cached)
        computed = prompt if cached is None else prompt - cached
        budget = float(self.engine.max_batched_tokens)
        room = max(1.0, budget - decode_tokens)
        chunks = np.ceil(computed / room)
        last = computed - (chunks - 1.0) * room
        full = chunks - 1.0
        fit = self.target_fit
        knee = fit.knee_tokens
        # the pass's tokens as its CUDA graph pads them; the experts the chunk's tokens add
        base = max(0.0, float(graphed_tokens(fit, decode_tokens)) - knee)
        past_knee = full * (
            max(0.0, float(graphed_tokens(fit, decode_tokens + room)) - knee) - base
        )
        past_knee += np.maximum(0.0, graphed_tokens(fit, decode_tokens + last) - knee) - base
        alone = experts_seconds(fit, decode_tokens)
        experts = full * (experts_seconds(fit, decode_tokens + room) - alone)
        experts += experts_seconds(fit, decode_tokens + last) - alone
        read = room * chunks * (chunks - 1.0) / 2.0  # KV tokens earlier chunks left in the cache
        pairs = prompt * (prompt + 1.0) / 2.0
        if cached is not None:  # every chunk reads the cached prefix; the computed attend on
            read = read + cached * chunks
            pairs = computed * (cached + (computed + 1.0) / 2.0)
        target = (
            fit.per_sequence_s * chunks
            + fit.per_batched_token_s * past_knee
            + fit.per_kv_token_s * read
            + fit.prefill_pair_s * pairs
            + experts
        )
        costs = self.costs
        host = chunks * (costs.overhead_seq_s + costs.overhead_prefill_s)
        host += costs.overhead_prefill_token_s * computed + costs.admit_s
        seconds = target + host
        if self.draft_fit is not None:
            d = self.draft_fit
            draft_knee = full * max(0.0, float(graphed_tokens(d, room)) - d.knee_tokens)
            draft_knee += np.maximum(0.0, graphed_tokens(d, last) - d.knee_tokens)
            seconds += (
                (d.fixed_s + d.per_sequence_s) * chunks
                + d.per_batched_token_s * draft_knee
                + d.per_kv_token_s * read
                + d.prefill_pair_s * pairs
                + full * experts_seconds(d, room)
                + experts_seconds(d, last)
            )
        return seconds

    def _alone_s(self, prompt: np.ndarray, cached=None) -> np.ndarray:
        """A prompt's own prefill-only iteration (``iteration_s(0, NO_ROWS, prompt)``)."""
        costs = self.costs
        if cached is None:
            computed, kv, pairs = prompt, 0.0, prompt * (prompt + 1.0) / 2.0
        else:
            computed, kv = prompt - cached, cached
            pairs = computed * (cached + (computed + 1.0) / 2.0)
        seconds = fit_seconds(self.target_fit, 1.0, computed, kv, 0.0, pairs)
        seconds += costs.overhead_s(1) + costs.overhead_prefill_s
        seconds += costs.overhead_prefill_token_s * computed + costs.admit_s
        if self.draft_fit is not None:
            seconds += fit_seconds(self.draft_fit, 1.0, computed, kv, 0.0, pairs)
        return seconds

    def idle_s(self) -> float:
        """An iteration with nothing in it (the scale of the residual wait at low load)."""
        return self.costs.iteration_s(0, NO_ROWS)
