"""One tree speculation step over a batch of rows: draft a tree, verify it in one pass, keep the
accepted path.

The rows' state and its invariants are the chain step's (``specsim.engine.step``): the target's
cache holds every token of the row's sequence but the last, the drafter's at most that. A step
with tree shape S (``specsim.tree.TreeShape``, N nodes, depth D):

1. draft, depth by depth: the first drafter pass feeds the row's missing tokens and scores the
   root; each later pass feeds the nodes of one depth that have children, in one call under the
   tree attention mask (``tree_attention``), and scores them. Under a node with c children the
   drafter proposes (``drafts``) its c most likely tokens, rank 0 first (``top-k``, EAGLE-2's
   expansion: one-hot proposals), or c tokens drawn from its processed q, independently
   (``iid``, SpecInfer) or without replacement (``without-replacement``, Sequoia);
2. verify: one target pass over ``[last token, node 0, ..., node N-1]`` under the tree mask, so
   the logits at entry 0 score the root's children and those at entry 1 + i node i's; the
   sampling core's tree verifier for the sampling's verifier and the drafts
   (``specsim.sampling.kinds.tree_verifier_for``) picks the accepted path and emits its tokens
   plus one token of the target's after it;
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
from specsim.sampling.kinds import tree_verifier_for
from specsim.sampling.logits import sample_from_probs
from specsim.sampling.randomness import VerifierRandomness
from specsim.tree import TreeShape

# How a node's children are drafted (see the module docstring).
TREE_DRAFTS = ("top-k", "iid", "without-replacement")


@dataclass(frozen=True)
class TreeFaults:
    """``skip_path_compaction``: the target keeps as many tokens as it accepted but leaves the
    accepted path's keys where the tree put them (breadth-first), so the cache holds the first
    nodes of the tree instead of the path whenever the path is not those nodes."""

    skip_path_compaction: bool = False


@dataclass(frozen=True)
class TreeUniforms:
    """The random numbers of one tree step, per row: ``draft [B, N]`` to draw each node's token
    from q (sampled drafts only), ``accept [B, N]`` for each node's accept test, ``sample [B]``
    for the token the walk emits where it stops."""

    draft: torch.Tensor
    accept: torch.Tensor
    sample: torch.Tensor

    @staticmethod
    def draw(generator: torch.Generator, batch: int, nodes: int) -> TreeUniforms:
        u = torch.rand((batch, 2 * nodes + 1), generator=generator, dtype=torch.float64)
        return TreeUniforms(u[:, :nodes], u[:, nodes : 2 * nodes], u[:, 2 * nodes])

    @staticmethod
    def per_row(generators: list[torch.Generator], nodes: int) -> TreeUniforms:
        """One generator per row (per request), as ``StepUniforms.per_row``: a request's draws
        do not depend on its batch."""
        u = torch.stack(
            [torch.rand(2 * nodes + 1, generator=g, dtype=torch.float64) for g in generators]
        )
        return TreeUniforms(u[:, :nodes], u[:, nodes : 2 * nodes], u[:, 2 * nodes])


@dataclass(frozen=True)
class DraftTree:
    """``tokens [B, N]`` the drafted nodes, breadth-first as the shape numbers them; ``q
    [B, N + 1, V]`` the processed distributions their tokens were drawn from (entry 0 the
    root's children's, entry 1 + i node i's), None for top-k drafts."""

    tokens: torch.Tensor
    q: torch.Tensor | None


def tree_step(
    target: DecoderModel,
    drafter: DecoderModel,
    rows: Rows,
    shape: TreeShape,
    sampling: Sampling,
    faults: Faults | None = None,
    tree_faults: TreeFaults | None = None,
    max_emit: torch.Tensor | None = None,
    drafts: str = "top-k",
    uniforms: TreeUniforms | None = None,
) -> StepResult:
    """One tree step for every row. ``max_emit [B]`` caps the tokens a row emits (at least 1):
    a row owed fewer tokens than the path gives keeps only its first ones. ``uniforms`` (at
    least N wide) are needed unless the verifier is greedy."""
    faults, tree_faults = faults or Faults(), tree_faults or TreeFaults()
    verify = tree_verifier(sampling.verifier, drafts)
    device = rows.seq.device
    batch = rows.seq.shape[0]
    index = torch.arange(batch, device=device)
    if uniforms is None:
        if sampling.verifier != "greedy" or drafts != "top-k":
            raise SpecsimError(
                "a sampled tree step needs its uniforms",
                key="uniforms",
                fix="pass TreeUniforms.draw(generator, rows, nodes)",
            )
        zeros = torch.zeros((batch, shape.num_nodes), dtype=torch.float64, device=device)
        uniforms = TreeUniforms(zeros, zeros, zeros[:, 0])
    uniforms = TreeUniforms(
        *(u.to(device) for u in (uniforms.draft, uniforms.accept, uniforms.sample))
    )
    drafted = draft_tree(drafter, rows, shape, sampling, drafts, uniforms.draft)
    base = rows.target_cache.lengths.clone()  # the last token's slot
    last = rows.seq[index, rows.s_len - 1]
    attention = verification_attention(base, shape, target.config.sliding_window)
    inputs = torch.cat([last[:, None], drafted.tokens], dim=1)
    logits = target(inputs, rows.target_cache, tree=attention)
    randomness = VerifierRandomness(uniforms.accept[:, : shape.num_nodes], uniforms.sample)
    result = verify(
        sampling.probs(logits), drafted.q, drafted.tokens, shape, randomness, validate=False
    )
    path, accepted, tokens = result.path, result.accepted, result.tokens
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


def tree_verifier(verifier: str, drafts: str):
    """The sampling core's tree verifier for ``verifier`` over children drafted ``drafts``; a
    one-line error when there is none."""
    if drafts not in TREE_DRAFTS:
        raise SpecsimError(
            f"unknown tree drafts {drafts!r}", key="drafts", fix=f"use one of {TREE_DRAFTS}"
        )
    # Top-k children are one-hot proposals, for which either exact rule is exact.
    try:
        kind = tree_verifier_for(verifier, "iid" if drafts == "top-k" else drafts)
    except KeyError:
        raise SpecsimError(
            f"no tree verifier for {verifier!r} with {drafts} drafts",
            key="verifier",
            fix="use greedy, rejection or typical",
        ) from None
    return kind.load()


def draft_tree(
    drafter: DecoderModel,
    rows: Rows,
    shape: TreeShape,
    sampling: Sampling,
    drafts: str = "top-k",
    uniforms: torch.Tensor | None = None,
) -> DraftTree:
    """The drafter's tree: one pass for the root, one per depth below it (see the module
    docstring); ``uniforms [B, N]`` draw sampled drafts, one per node."""
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
    q = None
    if drafts != "top-k":
        vocab = drafter.config.vocab_size
        q = torch.zeros((batch, shape.num_nodes + 1, vocab), dtype=torch.float32, device=device)
    expand = _Expand(tokens, q, shape, sampling, drafts, uniforms)
    expand([-1], root[:, None])
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
        expand([int(i) for i in parents], logits)
    return DraftTree(tokens, q)


@dataclass
class _Expand:
    """Writes the children of some parents from their logits ``[B, parents, V]``."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    shape: TreeShape
    sampling: Sampling
    drafts: str
    uniforms: torch.Tensor | None

    def __call__(self, parents: list[int], logits: torch.Tensor) -> None:
        for column, parent in enumerate(parents):
            children = self.shape.children(parent)
            if self.drafts == "top-k":
                top = torch.topk(logits[:, column], len(children), dim=-1).indices
                self.tokens[:, children] = top
                continue
            q = self.sampling.probs(logits[:, column])
            self.q[:, parent + 1] = q
            left = q.clone()
            for child in children:
                if self.drafts == "without-replacement" and not bool((left.sum(-1) > 0).all()):
                    raise SpecsimError(
                        f"a node has {len(children)} children but the drafter's processed q "
                        "holds fewer tokens",
                        key="tree",
                        fix="use fewer children per node, a larger top_k, or top-k drafts",
                    )
                token = sample_from_probs(left, self.uniforms[:, child], validate=False)
                self.tokens[:, child] = token
                if self.drafts == "without-replacement":
                    left.scatter_(1, token[:, None], 0.0)


def _keep_path(cache, base: torch.Tensor, path: torch.Tensor, accepted: torch.Tensor) -> None:
    """Move the accepted nodes' keys and values to the slots right after the last token's."""
    depth = path.shape[1]
    steps = torch.arange(depth, device=path.device)[None, :]
    used = steps < accepted[:, None]
    spare = torch.full_like(path, cache.max_len)
    src = torch.where(used, base[:, None] + 1 + path.clamp(min=0), spare)
    dst = torch.where(used, base[:, None] + 1 + steps, spare)
    cache.copy_slots(src, dst)
