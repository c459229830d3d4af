"""The shape of a speculation tree: which drafted node hangs under which.

A tree is written the way the engines write one (Medusa's ``medusa_choices``, vLLM's
``speculative_token_tree``, TensorRT-LLM's ``eagle_choices``): one path per drafted node, each
path the child ranks from the root down, so ``(0,)`` is the first child of the last committed
token, ``(1,)`` the second, ``(0, 1)`` the second child of ``(0,)``. Every path's parent is in the
tree and its ranks are 0, 1, ... without gaps. Nodes are numbered in breadth-first order (by
depth, then by path), the order the verification pass lays them out in. A chain of k drafts is
the tree ``(0,), (0, 0), ...`` with one child per node; ``branching`` builds full trees such as
``2,2,1``. Children are tried in rank order: rank 0 is the drafter's first proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specsim.bounds import MAX_K
from specsim.errors import SpecsimError
from specsim.parsing import JSON_DECODER

MAX_TREE_NODES = 1024  # drafted nodes in one tree: past any engine's num_draft_tokens


@dataclass(frozen=True)
class TreeShape:
    """Drafted nodes as paths of child ranks, breadth-first (see the module docstring)."""

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        _check_paths(self.paths)

    @classmethod
    def from_paths(cls, paths) -> TreeShape:
        """Any order of paths; they are put in breadth-first order."""
        ordered = tuple(
            sorted((tuple(int(r) for r in p) for p in paths), key=lambda p: (len(p), p))
        )
        return cls(ordered)

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        return cls(tuple((0,) * depth for depth in range(1, k + 1)))

    @classmethod
    def branching(cls, widths) -> TreeShape:
        """A full tree: every node at depth d has ``widths[d]`` children (``2,2,1``: 10 nodes)."""
        widths = [int(w) for w in widths]
        if not widths or any(w < 1 for w in widths):
            raise SpecsimError(
                f"a branching needs one width >= 1 per depth, got {widths}",
                fix="write it as widths per depth, e.g. 2,2,1",
            )
        _check_size(sum(int(np.prod(widths[: d + 1])) for d in range(len(widths))), len(widths))
        level: list[tuple[int, ...]] = [()]
        paths: list[tuple[int, ...]] = []
        for width in widths:
            level = [(*parent, rank) for parent in level for rank in range(width)]
            paths.extend(level)
        return cls(tuple(paths))

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """``2,2,1`` (widths per depth) or a JSON list of paths (``[[0], [1], [0, 0]]``)."""
        text = text.strip()
        if text.startswith("["):
            try:
                paths = JSON_DECODER.decode(text.replace("(", "[").replace(")", "]"))
            except (ValueError, RecursionError) as exc:  # syntax, nesting, a huge integer
                problem = getattr(exc, "msg", None) or "nested too deeply"
                raise SpecsimError(
                    f"tree {text[:40]!r} is not a list of paths ({problem})",
                    fix="write e.g. [[0], [1], [0, 0]]",
                ) from None
            if not isinstance(paths, list) or not all(
                isinstance(p, list) and all(isinstance(r, int) for r in p) for p in paths
            ):
                raise SpecsimError(
                    f"tree {text!r} is not a list of lists of child ranks",
                    fix="write e.g. [[0], [1], [0, 0]]",
                )
            return cls.from_paths(paths)
        try:
            widths = [int(part) for part in text.split(",")]
        except ValueError:
            raise SpecsimError(
                f"tree {text!r} is neither widths per depth nor a list of paths",
                fix="write e.g. 2,2,1 or [[0], [1], [0, 0]]",
            ) from None
        return cls.branching(widths)

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.paths[-1]) if self.paths else 0

    @property
    def is_chain(self) -> bool:
        return all(rank == 0 for path in self.paths for rank in path)

    @cached_property
    def parents(self) -> np.ndarray:
        """parents[i]: the node index of node i's parent, -1 for a child of the root."""
        index = {path: i for i, path in enumerate(self.paths)}
        return np.array([index.get(path[:-1], -1) for path in self.paths], dtype=np.int64)

    @cached_property
    def depths(self) -> np.ndarray:
        """depths[i]: 1 for a child of the root."""
        return np.array([len(path) for path in self.paths], dtype=np.int64)

    def children(self, node: int) -> list[int]:
        """Node indices under ``node`` (-1: the root), in rank order."""
        return [int(i) for i in np.flatnonzero(self.parents == node)]

    @cached_property
    def ancestors(self) -> np.ndarray:
        """ancestors[i, j]: node j is node i or above it (the tree attention mask, nodes only)."""
        mask = np.eye(self.num_nodes, dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                mask[i] |= mask[parent]
        return mask

    @cached_property
    def full_branching(self) -> tuple[int, ...] | None:
        """Children per node at each depth when the tree is full (``2,2,1``), else None."""
        widths: list[int] = []
        for node_depth in range(self.depth):
            parents = [-1] if node_depth == 0 else np.flatnonzero(self.depths == node_depth)
            counts = {len(self.children(int(parent))) for parent in parents}
            if len(counts) != 1:
                return None
            widths.append(counts.pop())
        return tuple(widths)

    def width_at(self, depth: int) -> int:
        return int(np.count_nonzero(self.depths == depth))

    def describe(self) -> str:
        widths = ",".join(str(self.width_at(d)) for d in range(1, self.depth + 1))
        return f"{self.num_nodes} nodes, depth {self.depth}, nodes per depth {widths}"

    def to_paths(self) -> list[list[int]]:
        """The engines' list-of-paths form (JSON-ready)."""
        return [list(path) for path in self.paths]

    def summary(self) -> dict[str, object]:
        """The shape as summaries name it: its paths, nodes, depth and nodes per depth."""
        return {
            "paths": self.to_paths(),
            "nodes": self.num_nodes,
            "depth": self.depth,
            "nodes_per_depth": [self.width_at(d) for d in range(1, self.depth + 1)],
        }


def _check_size(nodes: int, depth: int) -> None:
    if nodes > MAX_TREE_NODES or depth > MAX_K:
        raise SpecsimError(
            f"a tree of {nodes} nodes and depth {depth} is past the limits "
            f"({MAX_TREE_NODES} nodes, depth {MAX_K})",
            fix="use a smaller tree",
        )


def _check_paths(paths: tuple[tuple[int, ...], ...]) -> None:
    if not paths:
        raise SpecsimError("a tree needs at least one drafted node", fix="add a path such as [0]")
    _check_size(len(paths), max(len(p) for p in paths))
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if not path or any(rank < 0 for rank in path):
            raise SpecsimError(
                f"tree path {list(path)} is empty or has a negative rank",
                fix="each path lists child ranks 0, 1, ... from the root",
            )
        if path in seen:
            raise SpecsimError(f"tree path {list(path)} appears twice", fix="list each node once")
        if len(path) > 1 and path[:-1] not in seen:
            raise SpecsimError(
                f"tree path {list(path)} has no parent {list(path[:-1])} before it",
                fix="list every node's parent, breadth-first",
            )
        if path[-1] > 0 and (*path[:-1], path[-1] - 1) not in seen:
            raise SpecsimError(
                f"tree path {list(path)} skips rank {path[-1] - 1}",
                fix="number each node's children 0, 1, ... without gaps",
            )
        seen.add(path)
    if list(paths) != sorted(paths, key=lambda p: (len(p), p)):
        raise SpecsimError(
            "tree paths are not in breadth-first order", fix="use TreeShape.from_paths"
        )
