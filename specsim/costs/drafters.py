"""What a drafter's cost is made of: its kind's passes (``DraftPasses``), its latency fit or
fixed pass, its FLOPs.

One formula prices every kind (``formula.draft_s``): a step at window k runs ``passes(k)``
forward passes of the drafter, each over ``rows x queries(k)`` tokens; passes one per drafted
token read a context one token longer per row each time. Speculation off (no drafter deployed)
is ``NoDrafterCost``: free.
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

    def check_range(self, batch: int, max_context: float) -> None:
        """The latency fit's rule for queries outside its measured range."""


class DrafterCost(NoDrafterCost):
    """A deployed drafter, priced by its kind's ``DraftPasses``."""

    def __init__(self, spec: ModelSpec, latency: LatencyModel | None):
        super().__init__(spec, latency)
        self.kind = spec.kind
        self.passes = draft_passes(spec.kind, spec.head_passes)
        self.checks_range = self.passes.own_cache and latency.latency.valid_range is not None

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
