"""What each kind of drafter costs per engine iteration: one class per kind in ``DRAFTER_KINDS``.

Seconds come from the drafter's latency fit (or its fixed ``draft_step_s``); FLOPs from its
per-token and attention FLOPs. Speculation off (no drafter deployed) is ``NoDrafterCost``: free.
These are the specification the per-iteration reference charges; the compiled kernels
(``simulation/compiled_step_kernel.py``) do the same operations, and the identity tests hold
them together.
"""

from __future__ import annotations

from typing import ClassVar

from specsim.profile import LatencyModel, LoadedProfile, ModelSpec
from specsim.profile.kinds import DRAFTER_KINDS


class NoDrafterCost:
    """No drafter deployed: drafting, its prompt pass and its FLOPs cost nothing."""

    kind: ClassVar[str | None] = None
    checks_range = False

    def __init__(self, spec: ModelSpec | None = None, latency: LatencyModel | None = None):
        self.spec, self.latency = spec, latency
        self.step_s = 0.0 if spec is None else (spec.draft_step_s or 0.0)
        self.flops_per_token = 0.0 if spec is None else spec.flops_per_token
        self.attn_flops = 0.0 if spec is None else spec.attention_flops_per_context_token

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        """Seconds of one step's drafting for ``rows`` sequences holding ``kv`` context."""
        return 0.0

    def prefill_s(self, rows: int, tokens: float, kv: float, pairs: float) -> float:
        """Seconds of the drafter's own pass over prompt chunks."""
        return 0.0

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        return 0.0

    def prefill_flops(self, tokens: float, pairs: float) -> float:
        return 0.0

    def wasted_flops_per_position(self, mean_context: float) -> float:
        """The drafter's FLOPs for one position that was then rejected."""
        return 0.0

    def check_range(self, batch: int, max_context: float) -> None:
        """The latency fit's rule for queries outside its measured range."""


class DraftModelCost(NoDrafterCost):
    """A separate model with its own KV cache.

    k sequential one-token passes per step (context grows by one per pass; the sum is exact
    because the fit is linear in context). At k = 0 it still runs one pass over the step's token
    so that its KV cache stays in step with the target's (as vLLM does when it turns speculation
    off; without it the drafter could not resume). It builds its own cache for prompt chunks.
    """

    kind = "draft_model"

    def __init__(self, spec: ModelSpec, latency: LatencyModel):
        super().__init__(spec, latency)
        self.checks_range = latency.latency.valid_range is not None

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        if rows == 0:
            return 0.0
        if k == 0:
            return self.latency.seconds_from_totals(rows, rows, kv, kv + rows)
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * self.latency.seconds_from_totals(rows, rows, mean_kv, mean_kv + rows)

    def prefill_s(self, rows: int, tokens: float, kv: float, pairs: float) -> float:
        if rows == 0:
            return 0.0
        return self.latency.seconds_from_totals(rows, tokens, kv, pairs)

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if rows == 0:
            return 0.0
        if k == 0:  # the KV-sync pass (see draft_s)
            return self.flops_per_token * rows + self.attn_flops * (kv + rows)
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * (self.flops_per_token * rows + self.attn_flops * (mean_kv + rows))

    def prefill_flops(self, tokens: float, pairs: float) -> float:
        return self.flops_per_token * tokens + self.attn_flops * pairs

    def wasted_flops_per_position(self, mean_context: float) -> float:
        draft = self.flops_per_token
        draft += self.attn_flops * mean_context
        return draft

    def check_range(self, batch: int, max_context: float) -> None:
        if self.checks_range:
            self.latency.check_range(batch, max_context, 1, 1)


class PromptLookupCost(NoDrafterCost):
    """Prompt lookup (n-gram): its ``draft_step_s`` per step, or one pass of its own fit when it
    has one; nothing at k = 0, no FLOPs and no prompt pass."""

    kind = "ngram"

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or k == 0:
            return 0.0
        if self.latency is not None:
            return self.latency.seconds_from_totals(rows, rows, kv, kv + rows)
        return self.step_s


class HeadsCost(PromptLookupCost):
    """Decoding heads on the target's hidden states, ``passes: parallel`` (Medusa): one head
    per depth, all from one pass, so priced like prompt lookup per step, with the heads'
    per-token FLOPs for each drafted position."""

    kind = "heads"

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or k == 0:
            return 0.0
        return self.flops_per_token * rows * k

    def wasted_flops_per_position(self, mean_context: float) -> float:
        return self.flops_per_token


class AutoregressiveHeadsCost(HeadsCost):
    """Decoding heads, ``passes: autoregressive`` (EAGLE, EAGLE-3, MTP): depth j + 1 is drafted
    from the head's pass over depth j's token, so k one-token passes per step, priced as a
    draft model's (context growing by one per pass) or ``draft_step_s`` each; no pass at
    k = 0 and none over prompts (their features come from the target's own pass)."""

    def _mean_kv(self, rows, k: int, kv):
        return kv + rows * (k - 1) / 2.0

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or k == 0:
            return 0.0
        if self.latency is None:
            return k * self.step_s
        mean_kv = self._mean_kv(rows, k, kv)
        return k * self.latency.seconds_from_totals(rows, rows, mean_kv, mean_kv + rows)

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or k == 0:
            return 0.0
        mean_kv = self._mean_kv(rows, k, kv)
        return k * (self.flops_per_token * rows + self.attn_flops * (mean_kv + rows))


DRAFTER_COSTS: dict[str, type[NoDrafterCost]] = {
    c.kind: c for c in (DraftModelCost, PromptLookupCost, HeadsCost)
}
if set(DRAFTER_COSTS) != set(DRAFTER_KINDS):  # every kind a profile may name has a price
    raise ImportError(f"drafter kinds and cost classes differ: {set(DRAFTER_KINDS)}")


def drafter_cost(profile: LoadedProfile, name: str | None) -> NoDrafterCost:
    """The cost of drafter ``name`` of the profile (``NoDrafterCost`` for None)."""
    if name is None:
        return NoDrafterCost()
    spec = profile.drafter(name)
    latency = profile.latency_model(name) if spec.latency is not None else None
    if spec.kind == "heads" and spec.head_passes == "autoregressive":
        return AutoregressiveHeadsCost(spec, latency)
    return DRAFTER_COSTS[spec.kind](spec, latency)
