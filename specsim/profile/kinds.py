"""The kinds of model a profile describes: the target, and each kind of drafter.

One registry: the profile schema's ``kind`` values and its reference page come from it, and the
cost model (``specsim.costs.drafters``, and its compiled copy) prices every drafter from its
kind's ``DraftPasses``: adding a kind is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftPasses:
    """How a drafter runs its passes in one step, which is all its cost follows from.

    At window k > 0 it runs k passes (``per_draft``: one per drafted token, each row's context
    one longer than the last's) or one; a pass carries one query token per row, or the row's
    k + 1 (``block``: the last verified token and k mask slots, all drafted at once). With
    ``own_cache`` it keeps a KV cache of its own: one pass at k = 0 keeps it in step, and it
    passes over prompt chunks. ``model``: a forward pass with FLOPs (prompt lookup is a CPU
    search). ``mlp_heads``: Medusa, one MLP head per depth from one pass: k heads' FLOPs per
    row and no attention.
    """

    per_draft: bool
    block: bool = False
    own_cache: bool = False
    model: bool = True
    mlp_heads: bool = False


@dataclass(frozen=True)
class ModelKind:
    name: str
    description: str
    needs_latency: bool  # it must have a latency fit (else draft_step_s may stand in)
    passes: DraftPasses | None = None  # a drafter's passes (heads: by their ``passes`` key)
    methods: tuple[str, ...] = ()  # the engine methods a profile's ``method`` may name


TARGET = ModelKind("target", "the model being served", needs_latency=True)

# Decoding heads by their ``passes`` key.
HEAD_PASSES = {
    "parallel": DraftPasses(per_draft=False, mlp_heads=True),
    "autoregressive": DraftPasses(per_draft=True),
}

DRAFTER_KINDS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        ModelKind(
            "draft_model",
            "a separate smaller model with its own KV cache: k one-token passes per step, its "
            "own prompt pass, and a pass at k = 0 to keep its cache in step",
            needs_latency=True,
            passes=DraftPasses(per_draft=True, own_cache=True),
            methods=("mtp",),
        ),
        ModelKind(
            "ngram",
            "prompt lookup: proposes what followed the context's last n-gram; no model pass",
            needs_latency=False,
            passes=DraftPasses(per_draft=False, model=False),
        ),
        ModelKind(
            "heads",
            "extra decoding heads on the target's hidden states, no prompt pass of their own; "
            "their passes key says how they draft: parallel (Medusa, the default) one pass per "
            "step for a chain or a tree, autoregressive (EAGLE, EAGLE-3, MTP) one pass per "
            "drafted depth (a tree's over the nodes that expand there)",
            needs_latency=False,
        ),
        ModelKind(
            "block",
            "a parallel drafter (DFlash, DSpark, P-EAGLE, PARD): one pass per step drafts the "
            "whole window, k + 1 query tokens per row (the last token and k mask slots), over "
            "a KV cache of its own (a pass over prompts, and one at k = 0 to keep it in step); "
            "its method key names which, its max_k the most drafts its trained block holds",
            needs_latency=True,
            passes=DraftPasses(per_draft=False, block=True, own_cache=True),
            methods=("dflash", "dspark", "p_eagle", "pard"),
        ),
    )
}

MODEL_KINDS: dict[str, ModelKind] = {TARGET.name: TARGET, **DRAFTER_KINDS}
DRAFTER_METHODS = tuple(m for kind in DRAFTER_KINDS.values() for m in kind.methods)


def reads_hidden_states(kind: str, method: str | None = None) -> bool:
    """Whether the drafter drafts from the target's hidden states (decoding heads, and the
    block drafters but PARD, a draft model of its own), which a split fleet's handover must
    carry beside the KV cache."""
    return kind == "heads" or (kind == "block" and method != "pard")


def draft_passes(kind: str, head_passes: str = "parallel") -> DraftPasses:
    """The passes of a drafter of ``kind`` (heads: by their ``passes`` key)."""
    passes = DRAFTER_KINDS[kind].passes
    return HEAD_PASSES[head_passes] if passes is None else passes
