"""A tree verifier's inputs checked and laid out, and its result (``tree_verifiers`` documents
the signature)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specsim.sampling.validation import (
    SamplingInputError,
    check_non_negative,
    check_row_sums,
    check_tokens,
    check_uniforms,
    require_float,
)
from specsim.tree import TreeShape


@dataclass(frozen=True)
class TreeVerifyResult:
    """What one tree step emitted, per row (see the module docstring)."""

    accepted: torch.Tensor  # [B] int64
    path: torch.Tensor  # [B, D] int64 node indices, -1 padded
    tokens: torch.Tensor  # [B, D+1] int64, -1 padded

    @property
    def emitted(self) -> torch.Tensor:
        return self.accepted + 1

    @property
    def last_node(self) -> torch.Tensor:
        """[B]: the node the walk stopped at (-1: the root)."""
        at = (self.accepted - 1).clamp(min=0).unsqueeze(1)
        return torch.where(self.accepted > 0, self.path.gather(1, at).squeeze(1), -1)


@dataclass(frozen=True)
class TreeStep:
    """Validated inputs and the tree's tables."""

    p: torch.Tensor
    q: torch.Tensor | None
    draft: torch.Tensor
    tree: TreeShape
    kids: torch.Tensor  # [N+1, W]: row u+1 lists node u's children in rank order, -1 padded
    active: torch.Tensor | None = None  # [B, N] bool: each row's own subtree; None: all nodes

    def children(self, rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """``[R, W]``: the children of each row's node (row ``at``), -1 where absent for it."""
        kids = self.kids[at]
        if self.active is None:
            return kids
        on = (kids >= 0) & self.active[rows.unsqueeze(1), kids.clamp(min=0)]
        return torch.where(on, kids, -1)

    @property
    def depth(self) -> int:
        return self.tree.depth


def child_table(tree: TreeShape, device=None) -> torch.Tensor:
    """``[N+1, W]``: row u+1 holds node u's children (row 0 the root's), rank order, -1 padded."""
    return _child_table(tree).to(device)


@lru_cache(maxsize=64)
def _child_table(tree: TreeShape) -> torch.Tensor:
    lists = [tree.children(node) for node in range(-1, tree.num_nodes)]
    width = max(len(kids) for kids in lists)
    table = torch.full((len(lists), width), -1, dtype=torch.long)
    for row, kids in enumerate(lists):
        table[row, : len(kids)] = torch.tensor(kids, dtype=torch.long)
    return table


def prepare_tree(
    p, q, draft_tokens, tree, randomness, validate, needs_uniforms, active=None
) -> TreeStep:
    if not isinstance(tree, TreeShape):
        raise SamplingInputError(
            f"expected a TreeShape, got {type(tree).__name__}",
            key="tree",
            fix="pass specsim.tree.TreeShape.parse('2,2,1') or TreeShape.from_paths(...)",
        )
    n = tree.num_nodes
    require_float(p, "p", 3, f"p as [B, N+1, V] with N = {n} tree nodes")
    batch, rows, vocab = p.shape
    if rows != n + 1:
        raise SamplingInputError(
            f"expected {n + 1} rows per sequence (the root and {n} nodes), got {rows}",
            key="p",
            fix="p[:, 0] is at the root, p[:, i+1] after node i",
        )
    if not isinstance(draft_tokens, torch.Tensor) or tuple(draft_tokens.shape) != (batch, n):
        shape = tuple(getattr(draft_tokens, "shape", ()))
        raise SamplingInputError(
            f"expected shape {(batch, n)}, got {shape}", key="draft_tokens", fix="one per node"
        )
    if q is not None:
        require_float(q, "q", 3, "q as [B, N+1, V], or None for a deterministic drafter")
        if tuple(q.shape) != tuple(p.shape):
            raise SamplingInputError(
                f"expected shape {tuple(p.shape)} like p, got {tuple(q.shape)}",
                key="q",
                fix="q[:, 0] is what the root's children were drafted from, q[:, i+1] node i's",
            )
    kids = child_table(tree, p.device)
    if active is not None:
        active = _check_active(active, tree, batch, p.device)
    on = torch.ones((batch, n), dtype=torch.bool, device=p.device) if active is None else active
    if validate:
        check_tokens(draft_tokens, vocab, "draft_tokens", on)
        root = torch.ones((batch, 1), dtype=torch.bool, device=p.device)
        check_row_sums(p, "p", torch.cat([root, on], dim=1))
        # p(x) and q(x) of every node at its parent's row: what the accept tests read.
        at = (torch.as_tensor(tree.parents, device=p.device) + 1).unsqueeze(0)
        row = torch.arange(batch, device=p.device).unsqueeze(1)
        x = torch.where(on, draft_tokens.long(), 0)
        check_non_negative(p[row, at, x][on], "p")
        if q is not None:
            # A row's q is read where the row's node has a child: the root, or an active node
            # whose first child is active.
            first = kids[:, 0].clamp(min=0).expand(batch, -1)
            internal = (kids[:, 0] >= 0) & on.gather(1, first)
            internal[:, 1:] &= on
            check_row_sums(q, "q", internal)
            check_non_negative(q[row, at, x][on], "q")
    if needs_uniforms:
        if randomness is None:
            raise SamplingInputError(
                "this verifier needs its random numbers",
                key="randomness",
                fix="pass draw_randomness(generator, B, N) for N tree nodes",
            )
        if validate:
            check_uniforms(randomness.accept, "randomness.accept", (batch, n))
            check_uniforms(randomness.sample, "randomness.sample", (batch,))
    draft = torch.where(on, draft_tokens.long(), 0)  # padding -> 0 so that it can index
    return TreeStep(p, q, draft, tree, kids, active)


def _check_active(active, tree: TreeShape, batch: int, device) -> torch.Tensor:
    """[B, N] bool, each active node's parent and earlier sibling active: a subtree per row."""
    if not isinstance(active, torch.Tensor) or active.dtype != torch.bool:
        raise SamplingInputError(
            "expected a bool tensor", key="active", fix="pass [B, N] bool, or None for all"
        )
    if tuple(active.shape) != (batch, tree.num_nodes):
        raise SamplingInputError(
            f"expected shape {(batch, tree.num_nodes)}, got {tuple(active.shape)}",
            key="active",
            fix="one flag per row and node",
        )
    index = {path: i for i, path in enumerate(tree.paths)}
    needs = [
        [index[path[:-1]]] if len(path) > 1 else [] for path in tree.paths
    ]  # the parent, then the previous sibling
    for i, path in enumerate(tree.paths):
        if path[-1] > 0:
            needs[i].append(index[(*path[:-1], path[-1] - 1)])
    for node, required in enumerate(needs):
        for other in required:
            if bool((active[:, node] & ~active[:, other]).any()):
                raise SamplingInputError(
                    f"node {node} is active without node {other} (its parent or previous sibling)",
                    key="active",
                    fix="switch nodes off from the leaves and the last ranks inward",
                )
    return active.to(device)


def rows_at(x: torch.Tensor, rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``x[rows, at]`` as a fresh ``[R, V]`` tensor."""
    if not x.is_contiguous():
        return x[rows, at]
    return x.view(-1, x.shape[-1]).index_select(0, rows * x.shape[1] + at)
