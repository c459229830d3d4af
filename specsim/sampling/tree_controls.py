"""Negative controls for tree verification: known-wrong tree verifiers the checker must flag.

Each is a bug a tree implementation can plausibly have, with its torch verifier (the tree
signature of ``tree_verifiers``) and its closed form (a ``tree_reference.TreeRule``), and the way
its children are drafted:

- ``tree-stale-residual``: rejected siblings do not update the residual: every child is tested
  against the node's p, and the residual norm(max(0, p - q)) is built once, where the walk stops;
- ``tree-iid-proposal``: children drafted without replacement, verified with the i.i.d. rule
  (q instead of the without-replacement proposal);
- ``tree-sibling-uniform``: every sibling reuses the first sibling's accept uniform (uniforms
  indexed by depth, as a chain's are, instead of by node). Invisible on a chain.

The first two need a sampling drafter (with top-k children every proposal is a point mass, and
the second coincides with the exact rule); the third is a bug under either, and shows most with
top-k children (``--drafter greedy``), where a rejected sibling's threshold is p'(x) itself.
Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specsim.sampling import tree_reference as rules


def _walk(**variant) -> Callable[..., Any]:
    def verify(p, q, draft_tokens, tree, randomness, *, validate=True):
        from specsim.sampling import tree_verifiers as v

        step = v._prepare(p, q, draft_tokens, tree, randomness, validate, True)
        return v._rejection_walk(step, randomness, v._ExactRule("iid", **variant))

    return verify


@dataclass(frozen=True)
class TreeControl:
    name: str
    description: str
    drafts: str  # how its children are drafted (tree_reference.DRAFTS)
    verifier: Callable[..., Any]
    rule: rules.TreeRule
    drafters: tuple[str, ...] = ("sample",)  # problem.DRAFTERS it is a bug under


TREE_CONTROLS: dict[str, TreeControl] = {
    c.name: c
    for c in (
        TreeControl(
            "tree-stale-residual",
            "rejected siblings leave the residual as it was (every child tested against p)",
            "iid",
            _walk(update_residual=False),
            rules.TREE_STALE_RESIDUAL,
        ),
        TreeControl(
            "tree-iid-proposal",
            "children drafted without replacement, verified against q (the i.i.d. rule)",
            "without-replacement",
            _walk(),
            rules.TREE_REJECTION,
        ),
        TreeControl(
            "tree-sibling-uniform",
            "every sibling reuses the first sibling's accept uniform",
            "iid",
            _walk(sibling_uniform=True),
            rules.TREE_SIBLING_UNIFORM,
            drafters=("sample", "greedy"),
        ),
    )
}
