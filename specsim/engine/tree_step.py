"""One tree speculation step over a batch of rows: draft a tree, verify it in one pass, keep the
accepted path.

The rows' state and its invariants are the chain step's (``specsim.engine.step``): the target's
cache holds every token of the row's sequence but the last, the drafter's at most that. A step
with tree shape S (``specsim.tree.TreeShape``, N nodes, depth D):

1. draft, depth by depth: the first drafter pass feeds the row's missing tokens and scores the
   root; each later pass feeds the nodes of one depth that have children, in one call under the
   tree attention mask (``tree_attention``), and scores them. Under a node with c children the
   drafter proposes its c most likely tokens, rank 0 first (EAGLE-2's top-k expansion);
2. verify: one target pass over ``[last token, node 0, ..., node N-1]`` under the tree mask, so
   the logits at entry 0 score the root's children and those at entry 1 + i node i's; the
   verifier picks the accepted path (greedy: at every depth the child equal to argmax p) and
   emits its tokens plus the target's own token after it;
3. keep: the accepted path's keys and values are moved from where the tree laid them out to the
   row's next slots (``KVCache.copy_slots``), then both caches are rolled back: the target keeps
   the sequence but its new last token, the drafter the sequence before this step (its tree
   nodes are discarded; the next step feeds what it lacks, as after a chain step).

``TreeFaults`` plants the tree's own rollback bug beside the chain's ``Faults``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specsim.engine.step import Faults, Rows, Sampling, StepResult
from specsim.engine.tree_attention import region_attention, verification_attention
from specsim.errors import SpecsimError
from specsim.models import DecoderModel
from specsim.tree import TreeShape

# Verifiers a tree step runs today; exact tree verification comes from the sampling core.
TREE_VERIFIERS = ("greedy",)


@dataclass(frozen=True)
class TreeFaults:
    """``skip_path_compaction``: the target keeps as many tokens as it accepted but leaves the
    accepted path's keys where the tree put them (breadth-first), so the cache holds the first
    nodes of the tree instead of the path whenever the path is not those nodes."""

    skip_path_compaction: bool = False


@dataclass(frozen=True)
class DraftTree:
    """``tokens [B, N]`` the drafted nodes, breadth-first as the shape numbers them."""

    tokens: torch.Tensor


def tree_step(
    target: DecoderModel,
    drafter: DecoderModel,
    rows: Rows,
    shape: TreeShape,
    sampling: Sampling,
    faults: Faults | None = None,
    tree_faults: TreeFaults | None = None,
    max_emit: torch.Tensor | None = None,
) -> StepResult:
    """One tree step for every row. ``max_emit [B]`` caps the tokens a row emits (at least 1):
    a row owed fewer tokens than the path gives keeps only its first ones."""
    if sampling.verifier not in TREE_VERIFIERS:
        raise SpecsimError(
            f"tree steps run the {', '.join(TREE_VERIFIERS)} verifier, not {sampling.verifier!r}",
            key="verifier",
            fix="use verifier greedy (temperature 0) with a tree, or a chain",
        )
    faults, tree_faults = faults or Faults(), tree_faults or TreeFaults()
    device = rows.seq.device
    batch = rows.seq.shape[0]
    index = torch.arange(batch, device=device)
    drafted = draft_tree(drafter, rows, shape)
    base = rows.target_cache.lengths.clone()  # the last token's slot
    last = rows.seq[index, rows.s_len - 1]
    attention = verification_attention(base, shape, target.config.sliding_window)
    inputs = torch.cat([last[:, None], drafted.tokens], dim=1)
    logits = target(inputs, rows.target_cache, tree=attention)
    path, accepted, tokens = verify_greedy_tree(logits, drafted.tokens, shape)
    if max_emit is not None:
        accepted = torch.minimum(accepted, (max_emit.to(device) - 1).clamp(min=0))
    width = shape.depth + 1
    tokens = tokens.masked_fill(torch.arange(width, device=device)[None, :] > accepted[:, None], -1)

    if not tree_faults.skip_path_compaction:
        _keep_path(rows.target_cache, base, path, accepted)
    keep = rows.s_len + accepted
    extra = keep + faults.target_rollback_extra
    rows.target_cache.rollback(torch.minimum(extra, rows.target_cache.lengths))
    if rows.draft_cache is not None and not faults.skip_draft_rollback:
        rows.draft_cache.rollback(torch.minimum(rows.s_len, rows.draft_cache.lengths))

    # Emitted token j is scored at entry 0 (j = 0) or at the path's node j - 1.
    entry = torch.cat([torch.zeros((batch, 1), dtype=torch.long, device=device), path + 1], 1)
    entry = entry.clamp(min=0)
    scored = logits[index[:, None], entry]  # [B, D + 1, V]
    logprob = torch.log_softmax(scored.double(), dim=-1).gather(-1, tokens.clamp(min=0)[..., None])
    logprob = logprob.squeeze(-1).masked_fill(tokens < 0, 0.0)
    drafted_n = torch.full((batch,), shape.num_nodes, dtype=torch.long, device=device)
    return StepResult(tokens, accepted, drafted_n, logprob)


def draft_tree(drafter: DecoderModel, rows: Rows, shape: TreeShape) -> DraftTree:
    """The drafter's tree: one pass for the root, one per depth below it (see the module
    docstring). Children are the parent's most likely tokens by the drafter's logits."""
    cache = rows.draft_cache
    batch, device = rows.seq.shape[0], rows.seq.device
    # What the drafter has not seen yet, as in the chain step: 1 token, more after a tree step.
    missing = torch.clamp(rows.s_len - cache.lengths, min=1)
    span = int(missing.max())
    offsets = cache.lengths[:, None] + torch.arange(span, device=cache.device)[None, :]
    feed = rows.seq.gather(1, torch.minimum(offsets, rows.s_len[:, None] - 1))
    logits = drafter(feed, cache, missing)
    root = logits[torch.arange(batch, device=device), missing - 1]
    tokens = torch.zeros((batch, shape.num_nodes), dtype=torch.long, device=device)
    _expand(tokens, shape, [-1], root[:, None])
    start = cache.lengths.clone()
    fed: list[int] = []
    for depth in range(1, shape.depth):
        parents = [i for i in np.flatnonzero(shape.depths == depth) if shape.children(int(i))]
        fed += [int(i) for i in parents]
        ancestors = shape.ancestors[np.ix_(fed, fed)]
        queries = np.arange(len(fed) - len(parents), len(fed))
        attention = region_attention(
            start, ancestors, shape.depths[fed] - 1, queries, drafter.config.sliding_window
        )
        logits = drafter(tokens[:, parents], cache, tree=attention)
        _expand(tokens, shape, [int(i) for i in parents], logits)
    return DraftTree(tokens)


def _expand(tokens: torch.Tensor, shape: TreeShape, parents: list[int], logits: torch.Tensor):
    """Write the children of ``parents`` (logits ``[B, len(parents), V]``): rank r gets the
    parent's r-th most likely token."""
    for column, parent in enumerate(parents):
        children = shape.children(parent)
        top = torch.topk(logits[:, column], len(children), dim=-1).indices
        tokens[:, children] = top


def verify_greedy_tree(
    logits: torch.Tensor, nodes: torch.Tensor, shape: TreeShape
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy tree verification: from the root, follow the child whose token is argmax p.

    ``logits [B, N + 1, V]`` of the verification pass; returns ``path [B, D]`` (node indices,
    -1 past the end), ``accepted [B]`` and ``tokens [B, D + 1]`` (the path's tokens then the
    target's argmax after it, -1 past the end). Siblings hold distinct tokens (top-k), so at
    most one child matches.
    """
    batch, device = nodes.shape[0], nodes.device
    argmax = logits.argmax(-1)  # [B, N + 1]
    parents = torch.as_tensor(shape.parents, device=device)
    index = torch.arange(batch, device=device)
    current = torch.full((batch,), -1, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, shape.depth), -1, dtype=torch.long, device=device)
    tokens = torch.full((batch, shape.depth + 1), -1, dtype=torch.long, device=device)
    for depth in range(shape.depth + 1):
        wanted = argmax[index, current + 1]
        tokens[:, depth] = torch.where(alive, wanted, tokens[:, depth])
        if depth == shape.depth:
            break
        match = (parents[None, :] == current[:, None]) & (nodes == wanted[:, None])
        found = match.any(1) & alive
        child = match.long().argmax(1)
        path[:, depth] = torch.where(found, child, -1)
        current = torch.where(found, child, current)
        alive &= found
    accepted = (path >= 0).sum(1)
    return path, accepted, tokens


def _keep_path(cache, base: torch.Tensor, path: torch.Tensor, accepted: torch.Tensor) -> None:
    """Move the accepted nodes' keys and values to the slots right after the last token's."""
    depth = path.shape[1]
    steps = torch.arange(depth, device=path.device)[None, :]
    used = steps < accepted[:, None]
    spare = torch.full_like(path, cache.max_len)
    src = torch.where(used, base[:, None] + 1 + path.clamp(min=0), spare)
    dst = torch.where(used, base[:, None] + 1 + steps, spare)
    cache.copy_slots(src, dst)
