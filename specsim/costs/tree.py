"""What a speculation tree costs per step: its verification widths and its drafter's passes.

A tree step verifies, per row, the last committed token (the root) and every drafted node in
one target pass under the tree attention mask: each of those tokens attends to the row's cached
context, to its ancestors and to itself. A row that needs only d more drafts verifies the nodes
of depth <= d (the tree cut at depth d). A chain of k drafts is the tree with one node per
depth, and every count below is then the chain's (d + 1 positions, (d + 1)(d + 2) / 2 pairs of
their own): the chain's closed forms are the same numbers (``tests/test_costs_tree.py``).

A drafter that drafts depth by depth runs one pass per depth over the nodes that expand it
(the root, then the depth-1 nodes, ...), each attending to the context plus its ancestors and
itself, and reading the step's nodes drafted so far from its cache: a draft model with its own
fit, and decoding heads with ``passes: autoregressive`` (EAGLE-style: a node's top-k children
come from the head's pass over that node's token, EAGLE-2's expansion, so depth j + 1 cannot
be drafted before depth j). Heads with a latency fit price each pass by it; heads with only
``draft_step_s`` pay it per pass. FLOPs are per fed token (and attention pair). Passes of equal
width are summed as their count times their mean pass (exact: the fits are linear in the
cached tokens and the pairs), which for a chain is the chain's own formula. Heads with
``passes: parallel`` (Medusa, the default) draft every depth in one pass over the target's
hidden states, each head's top-k giving that depth's candidates, so a tree costs them what a
chain of its depth does. Either way a chain of k is the tree ``1,...,1`` of depth k, to the bit
(see docs/notes/2026-12-01-tree-acceptance.md).
"""

from __future__ import annotations

import numpy as np

from specsim.costs import formula
from specsim.costs.drafters import NoDrafterCost
from specsim.errors import SpecsimError
from specsim.tree import TreeShape


class TreeRows:
    """Per-row verification counts of a tree step, by the drafts the row has room for.

    ``verified[d + 1]`` and ``own_pairs[d + 1]`` for d = -1 (an empty slot: nothing) .. depth:
    the positions the row feeds the target (root + nodes of depth <= d) and their query-key
    pairs among themselves (each: its ancestors, the root and itself).
    """

    def __init__(self, shape: TreeShape):
        self.shape = shape
        depths = shape.depths
        verified = [0.0]
        own = [0.0]
        for d in range(shape.depth + 1):
            inside = depths <= d
            verified.append(1.0 + float(np.count_nonzero(inside)))
            own.append(1.0 + float((depths[inside] + 1).sum()))
        self.verified = np.asarray(verified)
        self.own_pairs = np.asarray(own)

    def totals(self, drafts: np.ndarray, context: np.ndarray) -> tuple[float, float]:
        """(positions verified, query-key pairs) of the rows: ``drafts`` per row (-1 in empty
        slots, whose context is 0), ``context`` their cached tokens. Whole numbers: exact."""
        index = drafts.astype(np.int64) + 1
        verified = self.verified[index]
        return float(verified.sum()), float(verified.dot(context) + self.own_pairs[index].sum())

    def own_span(self, drafts: np.ndarray) -> float:
        """The rows' query-key pairs among their own fed tokens (padded attention adds the
        longest row's context to every position instead of each row's own)."""
        return float(self.own_pairs[drafts.astype(np.int64) + 1].sum())


def expanding_at(shape: TreeShape, depth: int) -> int:
    """The nodes at ``depth`` (1: the root's children) that have children of their own."""
    return sum(1 for v in range(shape.num_nodes) if shape.depths[v] == depth and shape.children(v))


class TreeDrafterCost(NoDrafterCost):
    """A drafter's cost for tree steps; ``k`` (the tree's depth) is taken from the shape. Its
    passes are priced by ``formula.draft_s`` and ``draft_flops`` from the cost vector's tree
    section (``terms``), which every path reads, the compiled kernels too."""

    def __init__(self, base: NoDrafterCost, shape: TreeShape):
        # Prompt lookup proposes one continuation: its only tree is the chain (top-k 1).
        passes = base.passes
        branching = passes is not None and passes.model and not passes.block
        if not branching and not shape.is_chain:
            raise SpecsimError(
                f"branching trees are priced for draft models and decoding heads, not "
                f"{base.kind!r}",
                key="speculation.tree",
                fix="use a draft model or heads drafter, or remove speculation.tree",
            )
        super().__init__(base.spec, base.latency)
        self.base = base
        self.kind = base.kind
        self.passes = passes
        self.checks_range = base.checks_range
        self.shape = shape
        # Parallel heads (and prompt lookup's chain): the whole tree in the chain's one pass,
        # its k the tree's depth.
        self.one_pass = not passes.per_draft
        # (passes, tokens per row, nodes fed before the group, mean depth + 1 of a fed token):
        # pass j feeds the nodes at depth j that have children (the root at j = 0), grouped by
        # equal width.
        widths = [1] + [expanding_at(shape, d) for d in range(1, shape.depth)]
        self.groups: list[tuple[int, int, int, float]] = []
        fed = 0
        j = 0
        while j < len(widths):
            end = j
            while end < len(widths) and widths[end] == widths[j]:
                end += 1
            count = end - j
            self.groups.append((count, widths[j], fed, (j + end - 1) / 2.0 + 1.0))
            fed += widths[j] * count
            j = end

    def terms(self, chain: list[float]) -> list[float]:
        """The cost vector for tree steps, from the chain's (``formula.with_tree``)."""
        rows = TreeRows(self.shape)
        return formula.with_tree(chain, self.shape.depth, self.one_pass, rows, self.groups)

    def check_range(self, batch: int, max_context: float) -> None:
        self.base.check_range(batch, max_context)
