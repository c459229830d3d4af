"""Tree acceptance from scored text: the tree walk, the accepted-length distribution per step.

Input is, per request, ``accept[s, r]``: the probability that, at a node whose next token is
the text's token at position s, the node's child of rank r was the one accepted (joint over the
ranks, so a row sums to at most 1; ``specsim.profiling.tree_scoring``). The walk is the chain
walk's (``specsim.profiling.acceptance``) with a tree inside each step: a step starts at s at the
root; at a node of depth d (its next token at s + d) it moves to child r with ``accept[s + d,
r]`` for the ranks the node has and stops otherwise, having accepted d drafts, and the next step
starts at s + d + 1. The walk carries the exact probability of each start and of each node, so
the counts are expectations, without sampling noise. A step whose deepest node would be scored
past the text is not counted, but passes its probability on.

Besides the distribution of accepted length it counts, per depth and rank, the steps that tried
a child (reached its parent with every earlier sibling rejected) and those that accepted it:
the conditional rates from which a shape that was not measured is derived
(``specsim.profile.acceptance.derive_tree_acceptance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specsim.tree import TreeShape


@dataclass
class TreeWalkTotals:
    """Expected counts of a walk with one tree shape over some requests."""

    shape: TreeShape
    steps: float = 0.0
    accepted_hist: np.ndarray = field(init=False)  # [D + 1]: steps that accepted j drafts
    tried: np.ndarray = field(init=False)  # [D, W]: steps that tried rank r at depth d + 1
    passed: np.ndarray = field(init=False)  # [D, W]: steps that accepted it

    def __post_init__(self):
        width = max(len(self.shape.children(v)) for v in range(-1, self.shape.num_nodes))
        self.accepted_hist = np.zeros(self.shape.depth + 1)
        self.tried = np.zeros((self.shape.depth, width))
        self.passed = np.zeros((self.shape.depth, width))

    @property
    def distribution(self) -> np.ndarray:
        """P(a step accepts j drafts), j = 0..D."""
        return self.accepted_hist / self.steps if self.steps else self.accepted_hist

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + float(np.dot(np.arange(len(self.distribution)), self.distribution))

    def conditional_rates(self) -> list[list[float | None]]:
        """``passed / tried`` per depth and rank; None where no step tried that child."""
        return [
            [float(p / t) if t > 0 else None for p, t in zip(prow, trow, strict=True)]
            for prow, trow in zip(self.passed, self.tried, strict=True)
        ]


def tree_walk(requests: Sequence[np.ndarray], shape: TreeShape) -> TreeWalkTotals:
    """Expected counts of ``shape``'s steps over ``requests`` (``accept [L, W]`` each), all
    walked together: the loops run over positions and nodes, requests are the vectorised axis."""
    totals = TreeWalkTotals(shape)
    if not requests:
        return totals
    width = totals.tried.shape[1]
    longest = max(len(r) for r in requests)
    depth = shape.depth
    accept = np.zeros((len(requests), longest + depth + 1, width))
    for row, r in enumerate(requests):
        cols = min(width, r.shape[1])
        accept[row, : len(r), :cols] = r[:, :cols]
    lengths = np.array([len(r) for r in requests])
    children = {v: shape.children(v) for v in range(-1, shape.num_nodes)}
    node_depth = {-1: 0, **{v: int(d) for v, d in enumerate(shape.depths)}}
    start = np.zeros((len(requests), longest + depth + 2))
    start[:, 0] = 1.0
    for s in range(longest):
        w = np.where(s < lengths, start[:, s], 0.0)
        wc = np.where(s + depth <= lengths, w, 0.0)  # the deepest node is scored in the text
        totals.steps += wc.sum()
        mass = {-1: np.ones(len(requests))}
        for v in (-1, *range(shape.num_nodes)):  # breadth-first: parents before children
            d = node_depth[v]
            here = mass.pop(v)
            left = here.copy()
            for rank, child in enumerate(children[v]):
                totals.tried[d, rank] += (wc * left).sum()
                moved = here * accept[:, s + d, rank]
                totals.passed[d, rank] += (wc * moved).sum()
                mass[child] = moved
                left = left - moved
            totals.accepted_hist[d] += (wc * left).sum()
            start[:, s + d + 1] += w * left
    return totals
