"""Measuring tree acceptance on the target's text: the profile's ``tree_acceptance`` entries.

For each draft model and tree shape, on the text the chain measurement generated
(``acceptance_measure``): greedy verification with top-k children on greedy (T = 0) text, and
exact rejection at each T > 0 with top-k children and with i.i.d. children on text sampled at
T (the scores: ``tree_scoring``; the walk: ``tree_acceptance``). Rejection at T = 0 is greedy
verification and is written only when T = 0 is requested, with top-k children (i.i.d. draws
from a one-hot q all hold one token). Typical acceptance is lossy, so its output is not the
target's text and the walk cannot condition on it; it is not measured for trees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specsim.profiling.tree_acceptance import tree_walk
from specsim.tree import TreeShape

TREE_VERIFIERS = ("greedy", "rejection")


def tree_runs(verifiers: Sequence[str], temperature: float) -> list[tuple[str, str]]:
    """(verifier, drafts) measured on text sampled at ``temperature``."""
    runs = []
    for verifier in verifiers:
        if verifier not in TREE_VERIFIERS:
            continue
        runs.append((verifier, "top-k"))
        if verifier == "rejection" and temperature > 0:
            runs.append((verifier, "iid"))
    return runs


def tree_entries(
    drafter: str,
    q_logits: Sequence,
    generations: Sequence,
    temperature: float,
    verifiers: Sequence[str],
    shapes: Sequence[TreeShape],
) -> list[dict]:
    """Entries for one draft model (``q_logits``: its logits along each generation's text)."""
    from specsim.profiling.tree_scoring import iid_accept, top_k_accept

    runs = tree_runs(verifiers, temperature)
    if not runs or not shapes:
        return []
    width = max(len(s.children(v)) for s in shapes for v in range(-1, s.num_nodes))
    scores: dict[str, list[np.ndarray]] = {"top-k": [], "iid": []}
    for g, q in zip(generations, q_logits, strict=True):
        scores["top-k"].append(top_k_accept(q, g.tokens, width))
        if any(drafts == "iid" for _, drafts in runs):
            scores["iid"].append(iid_accept(g.logits, q, temperature, g.tokens, width))
    entries = []
    for verifier, drafts in runs:
        for shape in shapes:
            totals = tree_walk(scores[drafts], shape)
            if totals.steps == 0:
                continue
            dist = totals.distribution
            entries.append(
                {
                    "drafter": drafter,
                    "verifier": verifier,
                    "temperature": temperature,
                    "tree": shape.to_paths(),
                    "drafts": drafts,
                    "accepted_length": [float(p) for p in dist],
                    "mean_acceptance_length": totals.mean_acceptance_length,
                    "rates": totals.conditional_rates(),
                    "source": "measured",
                    "tokens_scored": int(sum(len(g.tokens) for g in generations)),
                }
            )
    return entries
