"""Measuring tree acceptance on the target's text: the profile's ``tree_acceptance`` entries.

For each draft model and tree shape, on the text the chain measurement generated
(``acceptance_measure``): greedy verification with top-k children on greedy (T = 0) text, and
exact rejection at each T > 0 with top-k children, i.i.d. children and children drawn without
replacement on text sampled at T (the scores: ``tree_scoring``, ``tree_without_replacement``;
the walk: ``tree_acceptance``). Rejection at T = 0 is greedy verification and is written only
when T = 0 is requested, with top-k children (sampled draws from a one-hot q all hold one
token). Without-replacement scores of a node with more than three children are estimated:
those entries carry ``monte_carlo`` (the seed, histories per position, and the standard error
of the mean acceptance length from the replicates' walks). Typical acceptance is lossy, so its
output is not the target's text and the walk cannot condition on it; it is not measured for
trees.
"""

from __future__ import annotations

import warnings
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
            runs += [(verifier, "iid"), (verifier, "without-replacement")]
    return runs


def tree_entries(
    drafter: str,
    q_logits: Sequence,
    generations: Sequence,
    temperature: float,
    verifiers: Sequence[str],
    shapes: Sequence[TreeShape],
    seed: int = 0,
) -> list[dict]:
    """Entries for one draft model (``q_logits``: its logits along each generation's text);
    ``seed`` seeds the without-replacement estimates of wide nodes."""
    from specsim.profiling.tree_without_replacement import affordable

    runs = tree_runs(verifiers, temperature)
    if not runs or not shapes:
        return []
    width = max(len(s.children(v)) for s in shapes for v in range(-1, s.num_nodes))
    vocab = int(q_logits[0].shape[-1]) if len(q_logits) else 0
    if not affordable(vocab, width) and any(d == "without-replacement" for _, d in runs):
        warnings.warn(
            f"{drafter}: without-replacement tree entries left out: a node of {width} children "
            f"over {vocab} tokens needs the exact rank-2 sum's [{vocab}, {vocab}] tensors per "
            "position; measure trees of at most 2 children for them",
            stacklevel=2,
        )
        runs = [(v, d) for v, d in runs if d != "without-replacement"]
    scores = _scores(q_logits, generations, temperature, {d for _, d in runs}, width, seed)
    entries = []
    for verifier, drafts in runs:
        for shape in shapes:
            pooled, replicates = scores[drafts]
            totals = tree_walk(pooled, shape)
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
                    **_monte_carlo(shape, replicates, seed),
                }
            )
    return entries


def _scores(q_logits, generations, temperature, draftings, width, seed):
    """Per drafting: (the requests' scores ``[L, W]``, and where wide without-replacement
    nodes were estimated the same list per replicate, else None)."""
    import torch

    from specsim.profiling.tree_scoring import iid_accept, top_k_accept
    from specsim.profiling.tree_without_replacement import without_replacement_accept

    texts = list(zip(generations, q_logits, strict=True))
    scores: dict[str, tuple[list, list | None]] = {}
    if "top-k" in draftings:
        scores["top-k"] = ([top_k_accept(q, g.tokens, width) for g, q in texts], None)
    if "iid" in draftings:
        iid = [iid_accept(g.logits, q, temperature, g.tokens, width) for g, q in texts]
        scores["iid"] = (iid, None)
    if "without-replacement" in draftings:
        generator = torch.Generator().manual_seed(seed)
        rows = [
            without_replacement_accept(g.logits, q, temperature, g.tokens, width, generator)
            for g, q in texts
        ]
        if rows and rows[0].ndim == 3:  # [replicates, L, W]: some ranks were estimated
            replicates = [[r[k] for r in rows] for k in range(rows[0].shape[0])]
            scores["without-replacement"] = ([r.mean(0) for r in rows], replicates)
        else:
            scores["without-replacement"] = (rows, None)
    return scores


def _monte_carlo(shape: TreeShape, replicates: list | None, seed: int) -> dict:
    """The ``monte_carlo`` key of an entry whose walk read estimated ranks (else nothing): the
    standard error of the mean acceptance length, from the replicates' own walks."""
    from specsim.profiling.tree_without_replacement import EXACT_RANKS, SAMPLES

    widest = max(len(shape.children(v)) for v in range(-1, shape.num_nodes))
    if replicates is None or widest <= EXACT_RANKS:
        return {}
    lengths = [tree_walk(r, shape).mean_acceptance_length for r in replicates]
    error = float(np.std(lengths, ddof=1) / np.sqrt(len(lengths)))
    return {"monte_carlo": {"seed": seed, "samples": SAMPLES, "standard_error": error}}
