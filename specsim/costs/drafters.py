"""What a drafter costs per engine iteration, from its kind's passes (``DraftPasses``).

One formula for every kind: a step at window k runs ``passes(k)`` forward passes of the
drafter, each over ``rows x queries(k)`` tokens; passes one per drafted token read a context one
token longer per row each time (their mean is exact, the fit being linear in context). Seconds
come from the drafter's latency fit (or its fixed ``draft_step_s`` per pass), FLOPs from its
per-token and attention FLOPs. Speculation off (no drafter deployed) is ``NoDrafterCost``: free.
This is the specification the per-iteration reference charges; the compiled kernels
(``simulation/compiled_step_kernel.py``) do the same operations, and the identity tests hold
them together.
"""

from __future__ import annotations

from specsim.errors import SpecsimError
from specsim.profile import LatencyModel, LoadedProfile, ModelSpec
from specsim.profile.kinds import DraftPasses, draft_passes


class NoDrafterCost:
    """No drafter deployed: drafting, its prompt pass and its FLOPs cost nothing."""

    kind: str | None = None
    passes: DraftPasses | None = None
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


class DrafterCost(NoDrafterCost):
    """A deployed drafter, priced by its kind's ``DraftPasses``."""

    def __init__(self, spec: ModelSpec, latency: LatencyModel | None):
        super().__init__(spec, latency)
        self.kind = spec.kind
        self.passes = draft_passes(spec.kind, spec.head_passes)
        self.checks_range = self.passes.own_cache and latency.latency.valid_range is not None

    def pass_count(self, k: int) -> int:
        """Forward passes per step at window ``k``."""
        if k == 0:
            return 1 if self.passes.own_cache else 0
        return k if self.passes.per_draft else 1

    def _pass(self, rows: int, k: int, kv: float) -> tuple[int, float, float, float]:
        """(passes, tokens per pass, mean KV read per pass, query-key pairs per pass)."""
        passes = self.pass_count(k)
        queries = k + 1 if self.passes.block and k else 1
        mean_kv = kv + rows * (passes - 1) / 2.0 if self.passes.per_draft else kv
        pairs = queries * mean_kv + rows * queries * (queries + 1) / 2.0
        return passes, rows * queries, mean_kv, pairs

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        if rows == 0:
            return 0.0
        passes, tokens, mean_kv, pairs = self._pass(rows, k, kv)
        if passes == 0:
            return 0.0
        if self.latency is None:
            return passes * self.step_s
        return passes * self.latency.seconds_from_totals(rows, tokens, mean_kv, pairs)

    def prefill_s(self, rows: int, tokens: float, kv: float, pairs: float) -> float:
        if rows == 0 or not self.passes.own_cache:
            return 0.0
        return self.latency.seconds_from_totals(rows, tokens, kv, pairs)

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or not self.passes.model:
            return 0.0
        passes, tokens, _, pairs = self._pass(rows, k, kv)
        if passes == 0:
            return 0.0
        if self.passes.mlp_heads:
            return self.flops_per_token * rows * k
        return passes * (self.flops_per_token * tokens + self.attn_flops * pairs)

    def prefill_flops(self, tokens: float, pairs: float) -> float:
        if not self.passes.own_cache:
            return 0.0
        return self.flops_per_token * tokens + self.attn_flops * pairs

    def wasted_flops_per_position(self, mean_context: float) -> float:
        if not self.passes.model:
            return 0.0
        if self.passes.mlp_heads:
            return self.flops_per_token
        draft = self.flops_per_token
        draft += self.attn_flops * mean_context
        return draft

    def check_range(self, batch: int, max_context: float) -> None:
        if self.checks_range:
            self.latency.check_range(batch, max_context, 1, 1)


def drafter_cost(profile: LoadedProfile, name: str | None) -> NoDrafterCost:
    """The cost of drafter ``name`` of the profile (``NoDrafterCost`` for None)."""
    if name is None:
        return NoDrafterCost()
    spec = profile.drafter(name)
    latency = profile.latency_model(name) if spec.latency is not None else None
    return DrafterCost(spec, latency)


def check_window(spec: ModelSpec, name: str, k: int, policy: str, where: str | None) -> None:
    """A block drafter drafts at most its ``max_k`` per pass, and DSpark at a fixed window
    (or verifying adaptively from it) exactly that many (vLLM 0.33 ``SpeculativeConfig``:
    DSpark's width is its trained block)."""
    if spec.kind != "block" or k == 0:
        return
    limit = spec.max_k
    at_block = policy in ("fixed", "adaptive_verification")  # the block drafted, whole
    if k > limit or (spec.method == "dspark" and at_block and k != limit):
        rule = f"exactly {limit}" if spec.method == "dspark" else f"at most {limit}"
        raise SpecsimError(
            f"drafter {name!r} ({spec.method}) drafts {rule} per step, not k = {k}",
            file=where,
            key="speculation.k",
            fix=f"set speculation.k to {rule} (the drafter's max_k in its profile)",
        )
