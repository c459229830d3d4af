"""Planning one iteration of a ``Replica`` (the per-iteration reference, steps 2 and 3 of
``replica.py``'s list): the window, each decoding row's drafts and accepted counts, the prompt
chunks beside them, and the iteration's seconds and FLOPs."""

from __future__ import annotations

import numpy as np

from specsim.costs import NO_ROWS, PassTotals
from specsim.simulation.admission import Chunks
from specsim.simulation.plans import DecodePlan, Plan, SlotViews

_ONE = np.float64(1.0)
_minimum = np.minimum


class IterationPlanning:
    """``Replica``'s planning: it reads the replica's batch, admission, costs and policy."""

    def _plan_prefill_only(self) -> Plan:
        admission = self.admission
        self._kv_planned = admission.kv_in_use(self.decoding, self._held())
        chunks, prompts = admission.whole_prompts()
        costs = self.costs
        # The measured range is per sequence: the largest cached context and the chunk sizes.
        sizes = [chunk for _, chunk in chunks]
        reach = max(r.prefilled for r, _ in chunks)
        costs.check_ranges(prompts.rows, reach, max(sizes), min(sizes))
        if self.padded:  # every prompt fed at the longest one's length and cached context
            rows, longest = float(prompts.rows), max(sizes)
            charged = PassTotals(
                prompts.rows,
                rows * longest,
                rows * reach,
                rows * longest * (reach + (longest + 1) / 2),
            )
        else:
            charged = prompts
        self._count_prefill(prompts)
        return Plan(costs.iteration_s(0, NO_ROWS, charged), None, chunks, prompts.rows)

    def _choose_window(self, rows: int, decode_kv: float) -> int:
        if not self._batch_policy:
            return self.policy.choose(rows, decode_kv)
        admission = self.admission
        prefill = admission.chunk_totals if (self.chunked and admission.prefilling) else None
        views = self._prefix(self.high)
        return self.policy.choose_batch(
            rows, decode_kv, views.remaining, views.context, prefill, self.token_budget
        )

    def _plan_mixed(self) -> Plan:
        """The next iteration."""
        costs = self.costs
        admission = self.admission
        held = admission.kv_in_use(self.decoding, self._held())
        if held > self.kv_capacity:
            admission.make_room(self)
            held = admission.kv_in_use(self.decoding, self._held())
        self._kv_planned = held
        decode_kv = self.decode_kv
        rows = self.decoding
        k = self._choose_window(rows, decode_kv)
        decode = None
        new_tokens = 0.0
        pairs = charged_pairs = 0.0
        charged_kv = decode_kv
        if rows:
            views = self._prefix(self.high)
            remaining, context, shift, _, ones = views
            used = remaining.shape[0]  # slots the step covers: every occupied one
            # min(remaining - 1, k) drafts; empty slots (remaining 0) get -1, accept -1 and so
            # emit nothing. Numpy scalars and in-place operations keep this to a few microseconds.
            drafts = _minimum(remaining, self._k_plus_1[k])
            drafts -= _ONE
            if self._trims and k:
                # Prompt chunks are scheduled around every proposed draft, then the policy
                # trims the drafts it verifies (vLLM's order).
                chunks, prefill = self._prefill_chunks(float(drafts.dot(ones)) + used)
                self._trim(drafts, views, decode_kv, prefill, chunks)
            if k == 0:
                # Nothing drafted, nothing to accept: no draws. (Window policies that switch
                # speculation off for some iterations leave the stream to the steps that use it.)
                accepted, proposed = drafts.copy(), None
            elif self._by_slot:
                # One uniform per slot, one search for every row's acceptance level (see
                # RateAcceptance): the count of leading accepted drafts.
                accepted, proposed = self.acceptance.draw_slots(
                    self._draws, k, shift, self.capacity
                )
            else:
                position = self.output - self.remaining
                accepted, proposed = self.acceptance.draw(self._draws, k, self.level, position)
                accepted = accepted[:used]
            if proposed is not None:
                drafts = _minimum(drafts, proposed[:used] * k)
            accepted = _minimum(accepted, drafts)
            # Each row verifies new = drafts + 1 positions (0 for empty slots, whose drafts are
            # -1 and context 0). Query-key pairs: sum new (context + (new + 1) / 2), expanded in
            # drafts so that no temporary array is needed. Every term is a whole number well
            # below 2^53, so these sums are exact whatever the summation order or prefix length.
            if self.tree_rows is None:
                drafted = float(drafts.dot(ones))
                new_tokens = drafted + used
                own_span = 0.5 * (float(drafts.dot(drafts)) + 2.0 * drafted + used + new_tokens)
                pairs = charged_pairs = float(drafts.dot(context)) + decode_kv + own_span
            else:  # the tree cut at each row's drafts: the same sums for a chain-shaped tree
                new_tokens, pairs = self.tree_rows.totals(drafts, context)
                charged_pairs = pairs
                own_span = self.tree_rows.own_span(drafts) if self.padded else 0.0
            if self.padded:  # every row's attention (and its cache read) runs to the longest
                longest = float(context.max())
                charged_kv = rows * longest
                charged_pairs = new_tokens * longest + own_span
            decode = DecodePlan(k, drafts, accepted, new_tokens, decode_kv, self._joined, views)
            self._joined = 0
        if not (self._trims and k and rows):
            chunks, prefill = self._prefill_chunks(new_tokens)
        if costs.checks_ranges:
            self._check_ranges(rows, k, chunks or ())
        if rows and not prefill.rows:
            dt = costs.decode_iteration_s(k, rows, new_tokens, charged_kv, charged_pairs)
        else:
            dt = costs.iteration_s(
                k, PassTotals(rows, new_tokens, charged_kv, charged_pairs), prefill
            )
        if decode is not None:
            self.log.verification_flops += (
                self._flops_per_token * new_tokens + self._attn_flops * pairs
            )
            self.log.drafter_flops += costs.draft_flops(rows, k, decode_kv)
        return Plan(dt, decode, chunks, rows + prefill.rows)

    def _prefill_chunks(self, decode_tokens: float) -> tuple[Chunks | None, PassTotals]:
        """The prompt chunks that fit beside ``decode_tokens`` (their FLOPs counted)."""
        admission = self.admission
        if not admission.prefilling:
            return None, NO_ROWS
        chunks, prefill = admission.chunks(self.token_budget - decode_tokens)
        if prefill.rows:
            self._count_prefill(prefill)
        return chunks, prefill

    def _count_prefill(self, prompts: PassTotals) -> None:
        """The FLOPs of a prefill pass over ``prompts`` (the target's and a draft model's)."""
        tokens, pairs, costs = prompts.tokens, prompts.pairs, self.costs
        self.stats.flops["prefill"] += costs.target_flops(
            tokens, pairs
        ) + costs.draft_prefill_flops(tokens, pairs)

    def _trim(self, drafts, views: SlotViews, decode_kv: float, prefill, chunks) -> None:
        """The policy's verified drafts per row, in place of ``drafts``."""
        rows = self.decoding
        decode = PassTotals(rows, float(rows), decode_kv, decode_kv + rows)
        finishing = sum(1 for r, c in chunks or () if r.prefilled + c >= r.prefill_target)
        levels = (views.level_shift * 0.5).astype(np.int64)
        self.policy.admit(drafts, levels, decode, prefill, float(rows + finishing))

    def _check_ranges(self, rows: int, k: int, chunks) -> None:
        top = float(self.context.max()) if rows else 0.0
        sizes = [float(c) for _, c in chunks]
        if chunks:
            top = max(top, max(float(r.prefilled) for r, _ in chunks))
        widest = k + 1.0 if self.tree_rows is None else float(self.lookahead)
        decode_sizes = [1.0, widest] if rows else []
        low = min(decode_sizes + sizes)
        high = max(decode_sizes + sizes)
        self.costs.check_ranges(rows + len(sizes), top, high, low)
