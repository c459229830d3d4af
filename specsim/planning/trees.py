"""The tree shapes ``plan window`` tries beside chain k: given ones, and SGLang's search space.

A shape is given as widths per depth (``2,2,1``) or a list of paths (``--trees``), or comes
from SGLang's three knobs (``--tree-steps``, ``--tree-topk``, ``--tree-tokens``, swept as
SGLang's ``bench_speculative`` sweeps them). SGLang builds its tree afresh every step: depth 1
holds the root's ``topk`` best children; at each later depth every one of the ``topk`` best
nodes of the depth above (its beams) proposes ``topk`` children; and the ``num_draft_tokens -
1`` best nodes of all those candidates are verified (the root is the last token). The simulator
needs one static shape per setting, so ``sglang_tree`` makes that choice once, with each
node's score its probability of being accepted under the profile's tree model (the rates
``Profile.tree_acceptance_for`` derives unmeasured shapes from), where SGLang ranks by the
drafter's own cumulative probability: the tree it would build when the drafter's confidence is
what acceptance turns out to be. Combinations SGLang refuses or rewrites are skipped, as
``bench_speculative`` skips them: ``num_draft_tokens`` above ``num_steps * topk + 1``, and
topk 1 with draft tokens other than steps + 1 (SGLang resets them; topk 1 is the chain k =
steps, already in the grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specsim.bounds import MAX_K
from specsim.errors import SpecsimError
from specsim.planning.common import parse_counts
from specsim.profile.acceptance import tree_base_rates
from specsim.tree import MAX_TREE_NODES, TreeShape

# bench_speculative's defaults without its 0 (the no-speculation baseline, k = 0 here).
SGLANG_STEPS = (1, 3, 5, 7)
SGLANG_TOPK = (1, 2, 4, 8)
SGLANG_TOKENS = (2, 4, 8, 16, 32)
MAX_TOPK = 64


@dataclass(frozen=True)
class TreeCandidate:
    """One tree the sweep runs: its shape, its name in tables (``config``), and SGLang's
    (num_steps, topk, num_draft_tokens) when it came from that space."""

    shape: TreeShape
    config: str
    sglang: tuple[int, int, int] | None = None

    @property
    def text(self) -> str:
        """The shape as ``speculation.tree`` takes it: widths when full, else its paths."""
        widths = self.shape.full_branching
        if widths is not None:
            return ",".join(str(w) for w in widths)
        return "[" + ", ".join("[" + ", ".join(map(str, p)) + "]" for p in self.shape.paths) + "]"

    def json(self) -> dict:
        return {
            "config": self.config,
            "tree": self.shape.to_paths(),
            "nodes": self.shape.num_nodes,
            "depth": self.shape.depth,
            "nodes_per_depth": [self.shape.width_at(d) for d in range(1, self.shape.depth + 1)],
            "sglang": None
            if self.sglang is None
            else dict(zip(("num_steps", "topk", "num_draft_tokens"), self.sglang, strict=True)),
        }


def given_tree(text: str) -> TreeCandidate:
    """``--trees`` entry: widths per depth or a list of paths."""
    shape = TreeShape.parse(text)
    candidate = TreeCandidate(shape, "")
    return TreeCandidate(shape, f"tree={candidate.text}")


def given_trees(texts, option: str = "--trees") -> list[TreeCandidate]:
    """``--trees`` entries (None: none), errors naming the option."""
    out = []
    for text in texts or []:
        try:
            out.append(given_tree(str(text)))
        except SpecsimError as exc:
            raise SpecsimError(exc.message, key=option, fix=exc.fix) from None
    return out


def parse_tree_drafter(text: str, option: str = "--tree-drafter"):
    """``NAME=SHAPE``: a drafter of the profile and the tree it drafts."""
    name, _, shape = str(text).rpartition("=")
    if not name.strip() or not shape.strip():
        raise SpecsimError(f"{text!r} is not NAME=SHAPE", key=option, fix="write e.g. small=2,2,1")
    [tree] = given_trees([shape.strip()], option)
    if tree.shape.is_chain:
        raise SpecsimError(
            f"tree {tree.text} is a chain: drafter {name.strip()!r} at k = {tree.shape.depth}",
            key=option,
            fix=f"compare chains with --drafter {name.strip()}, or give a wider tree",
        )
    return name.strip(), tree


@dataclass(frozen=True)
class SglangSpace:
    """The (num_steps, topk, num_draft_tokens) grid; None: bench_speculative's default."""

    steps: tuple[int, ...] = SGLANG_STEPS
    topk: tuple[int, ...] = SGLANG_TOPK
    tokens: tuple[int, ...] = SGLANG_TOKENS

    @classmethod
    def parse(cls, steps: str | None, topk: str | None, tokens: str | None) -> SglangSpace | None:
        """From the three options (None when none is given: no search)."""
        if steps is None and topk is None and tokens is None:
            return None
        parsed = (
            parse_counts(steps, "--tree-steps", 1, MAX_K),
            parse_counts(topk, "--tree-topk", 1, MAX_TOPK),
            parse_counts(tokens, "--tree-tokens", 2, MAX_TREE_NODES + 1),
        )
        defaults = (SGLANG_STEPS, SGLANG_TOPK, SGLANG_TOKENS)
        return cls(
            *(tuple(p) if p is not None else d for p, d in zip(parsed, defaults, strict=True))
        )


def acceptance_rates(profile, speculation, drafts: str) -> tuple[list[list[float | None]], bool]:
    """The ``rates[depth][rank]`` ``Profile.tree_acceptance_for`` derives unmeasured trees of
    this drafter, verifier, temperature and drafting from (``profile.acceptance.tree_base_rates``),
    and whether they are a measured tree's (else the chain's)."""
    rates, _, measured = tree_base_rates(
        profile.profile, speculation.drafter, speculation.verifier, speculation.temperature, drafts
    )
    return [list(row) for row in rates], measured


def _rate(rates: list[list[float | None]], depth: int, rank: int) -> float:
    row = rates[min(depth, len(rates) - 1)]
    value = row[rank] if rank < len(row) else None
    return 0.0 if value is None else float(value)


def sglang_tree(steps: int, topk: int, tokens: int, rates: list[list[float | None]]) -> TreeShape:
    """The static tree SGLang's (steps, topk, tokens) verifies, scored by ``rates`` (module)."""
    score: dict[tuple[int, ...], float] = {(): 1.0}

    def children(parent: tuple[int, ...]) -> list[tuple[int, ...]]:
        out, left = [], score[parent]
        for rank in range(topk):
            rate = _rate(rates, len(parent), rank)
            child = (*parent, rank)
            score[child] = left * rate
            left *= 1.0 - rate
            out.append(child)
        return out

    order = lambda path: (-score[path], len(path), path)  # noqa: E731
    candidates = set(children(()))
    beams = sorted(candidates, key=order)[:topk]
    for _ in range(1, steps):
        level = [child for beam in beams for child in children(beam)]
        candidates.update(level)
        beams = sorted(level, key=order)[:topk]
    # Best first, each node after its parent and its elder sibling, so the tree is well formed.
    chosen: list[tuple[int, ...]] = []
    frontier = {(0,)}
    while frontier and len(chosen) < tokens - 1:
        best = min(frontier, key=order)
        frontier.remove(best)
        chosen.append(best)
        for after in ((*best, 0), (*best[:-1], best[-1] + 1)):
            if after in candidates:
                frontier.add(after)
    return TreeShape.from_paths(chosen)


def sglang_candidates(space: SglangSpace, rates) -> tuple[list[TreeCandidate], list[str]]:
    """One candidate per distinct shape (the first triple that builds it names it), and why
    each other triple of the space is not run."""
    seen: dict[TreeShape, TreeCandidate] = {}
    skipped = []
    for steps in space.steps:
        for topk in space.topk:
            for tokens in space.tokens:
                name = f"sglang={steps},{topk},{tokens}"
                if topk == 1:
                    if tokens == steps + 1:
                        skipped.append(f"{name}: topk 1 is the chain k = {steps} (--k)")
                    continue  # SGLang resets the draft tokens to steps + 1: the same chain
                if tokens > steps * topk + 1:
                    # More than the nodes it drafts: bench_speculative skips it too.
                    skipped.append(f"{name}: more draft tokens than steps x topk + 1")
                    continue
                shape = sglang_tree(steps, topk, tokens, rates)
                if shape.is_chain:
                    skipped.append(f"{name}: its tree is the chain k = {shape.depth} (--k)")
                elif shape in seen:
                    skipped.append(f"{name}: the same tree as {seen[shape].config}")
                else:
                    seen[shape] = TreeCandidate(shape, name, (steps, topk, tokens))
    return list(seen.values()), skipped


def merge(given: Sequence[TreeCandidate], searched: Sequence[TreeCandidate]) -> list[TreeCandidate]:
    """Given trees first, then the searched ones whose shape is new; chains are refused
    (they are chain k: use --k)."""
    out: dict[TreeShape, TreeCandidate] = {}
    for candidate in given:
        if candidate.shape.is_chain:
            raise SpecsimError(
                f"tree {candidate.text} is a chain (one child per node): it is k = "
                f"{candidate.shape.depth}",
                key="--trees",
                fix=f"sweep it with --k (include {candidate.shape.depth}), or give a wider tree",
            )
        if candidate.shape in out:
            raise SpecsimError(
                f"tree {candidate.text} is given twice", key="--trees", fix="give each tree once"
            )
        out[candidate.shape] = candidate
    for candidate in searched:
        out.setdefault(candidate.shape, candidate)
    return list(out.values())
