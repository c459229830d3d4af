"""The serving engine's decode step, chain or tree: the drafts per row, the target pass's shape
(new tokens, context read, query-key pairs) for the iteration log, and the step's result."""

from __future__ import annotations

import torch

from specsim.engine.mtp_step import is_mtp
from specsim.engine.step import StepUniforms, speculative_step
from specsim.engine.tree_step import TreeUniforms, tree_step, tree_verifier
from specsim.errors import SpecsimError


def check_tree_engine(options, drafter) -> None:
    """A tree engine's options (``EngineOptions.tree`` set), refused in one line where wrong."""
    if is_mtp(drafter):
        raise SpecsimError(
            "the MTP drafter drafts chains only",
            key="speculation.tree",
            fix="remove speculation.tree for the mtp drafter",
        )
    if drafter is None or options.ngram is not None or options.k_max != options.tree.depth:
        raise SpecsimError(
            "a tree step needs a draft model and k_max = the tree's depth",
            key="speculation.tree",
            fix="draft the tree with a draft model (not prompt lookup), k its depth",
        )
    tree_verifier(options.sampling.verifier, options.tree_drafts)  # a one-line error


def chain_step(engine, owed: torch.Tensor):
    """(k, drafts per row, the target pass's shape, the step's result) of a chain step."""
    size = engine.batch.size
    k = engine.opt.window(size)
    n_drafts = torch.clamp(torch.minimum(owed - 1, torch.full_like(owed, k)), min=0)
    proposals = None
    if engine.opt.ngram is not None and k:
        proposals = torch.zeros((size, k), dtype=torch.long)
        for slot, lookup in enumerate(engine.lookups):
            found = lookup.propose(int(n_drafts[slot]))
            proposals[slot, : len(found)] = torch.as_tensor(found, dtype=torch.long)
            n_drafts[slot] = len(found)
    new = n_drafts + 1
    # Attention runs over every row's cache to the longest row's length (a padded batch):
    # the pass reads, and pairs each new token with, that many cached positions per row.
    longest = int(engine.batch.target_cache.lengths[:size].max())
    pairs = float(new.sum()) * longest + float((new * (new + 1)).sum()) / 2
    pass_shape = (int(new.sum()), size * longest, pairs)
    result = speculative_step(
        engine.target,
        engine.drafter,
        engine.batch.rows(),
        n_drafts,
        engine.opt.sampling,
        StepUniforms.per_row(engine.streams, engine.opt.k_max),
        engine.opt.faults,
        proposals,
    )
    return k, n_drafts, pass_shape, result


def engine_tree_step(engine, owed: torch.Tensor):
    """(k, drafts per row, the target pass's shape, the step's result) of a tree step.

    Every row verifies the root and all nodes; its drafts are ``min(depth, owed - 1)``, as
    a chain row's (the cap on what it accepts, and what the simulator counts)."""
    shape = engine.opt.tree
    size = engine.batch.size
    k = shape.depth
    n_drafts = torch.clamp(torch.minimum(owed - 1, torch.full_like(owed, k)), min=0)
    longest = int(engine.batch.target_cache.lengths[:size].max())
    fed = shape.num_nodes + 1
    # The pass's query-key pairs: each row's fed tokens with the cached context, and among
    # themselves the root and each node with itself and its ancestors (the cost model's count).
    own_pairs = 1.0 + float((shape.depths + 1).sum())
    pairs = float(size * fed * longest) + size * own_pairs
    pass_shape = (size * fed, size * longest, pairs)
    result = tree_step(
        engine.target,
        engine.drafter,
        engine.batch.rows(),
        shape,
        engine.opt.sampling,
        engine.opt.faults,
        engine.opt.tree_faults,
        owed,
        engine.opt.tree_drafts,
        TreeUniforms.per_row(engine.streams, shape.num_nodes),
    )
    return k, n_drafts, pass_shape, result
