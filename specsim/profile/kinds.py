"""The kinds of model a profile describes: the target, and each kind of drafter.

One registry: the profile schema's ``kind`` values and its reference page come from it, and the
cost model (``specsim.costs.drafters``) has one class per drafter kind, checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelKind:
    name: str
    description: str
    needs_latency: bool  # it must have a latency fit (else draft_step_s may stand in)


TARGET = ModelKind("target", "the model being served", needs_latency=True)

DRAFTER_KINDS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        ModelKind(
            "draft_model",
            "a separate smaller model with its own KV cache: k one-token passes per step, its "
            "own prompt pass, and a pass at k = 0 to keep its cache in step",
            needs_latency=True,
        ),
        ModelKind(
            "ngram",
            "prompt lookup: proposes what followed the context's last n-gram; no model pass",
            needs_latency=False,
        ),
        ModelKind(
            "heads",
            "extra decoding heads on the target's hidden states, no prompt pass of their own; "
            "their passes key says how they draft: parallel (Medusa, the default) one pass per "
            "step for a chain or a tree, autoregressive (EAGLE, EAGLE-3, MTP) one pass per "
            "drafted depth (a tree's over the nodes that expand there)",
            needs_latency=False,
        ),
    )
}

MODEL_KINDS: dict[str, ModelKind] = {TARGET.name: TARGET, **DRAFTER_KINDS}
