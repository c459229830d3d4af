"""Exact enumeration of a tree verifier callable's step (torch), with ``enumeration.Probe``.

A case is one whole drafted tree from the prompt: every node's token, drawn from its parent's q
(i.i.d. or without replacement among its siblings) or the parent's rank-r token of q (top-k
children, one case). Its weight is the drafter's probability of that tree. The step's N accept
uniforms (one per node) and its sample uniform are then cut and integrated as for a chain, and
the step is continued by the target over the tree's depth + 1 tokens. The number of cases grows
as V^N, so only small trees (or top-k children) have an exact result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specsim.sampling.enumeration import Enumerated, Probe, enumerate_probe
from specsim.sampling.harness import Malformed
from specsim.sampling.randomness import VerifierRandomness
from specsim.sampling.tree_montecarlo import TreeTables, read_tree_output
from specsim.tree import TreeShape

MAX_CASES = 4096  # drafted trees; each is scanned along N + 1 uniforms


def tree_cases(tables: TreeTables, tree: TreeShape, drafts: str, deterministic: bool) -> int:
    """How many drafted trees the enumeration would visit (q has full support)."""
    if deterministic:
        return 1
    vocab, count = tables.vocab, 1
    for node in range(tree.num_nodes):
        earlier = tree.paths[node][-1] if drafts == "without-replacement" else 0
        count *= vocab - earlier
    return count


def enumerate_tree_step(
    verifier: Callable,
    tables: TreeTables,
    tree: TreeShape,
    drafts: str,
    deterministic: bool,
    *,
    p_table: np.ndarray,
    greedy_reference: bool = False,
    seed: int = 0,
) -> Enumerated:
    """The exact first D + 1 tokens of one tree step of ``verifier`` from the prompt, continued
    by the target; ``window`` None with a note when there are more than ``MAX_CASES`` trees."""
    count = tree_cases(tables, tree, drafts, deterministic)
    if count > MAX_CASES:
        note = (
            f"{tree.describe()} at vocab {tables.vocab} drafts {count:,} distinct trees (the "
            f"enumeration visits at most {MAX_CASES:,}): use a smaller tree or --vocab, or "
            "--drafter greedy, for an exact result"
        )
        return Enumerated(None, count, 0, note)
    tokens, weights = _drafted_trees(tables, tree, drafts, deterministic)
    p_rows, q_rows = _rows(tables, tree, tokens, deterministic)

    def call(case: np.ndarray, randomness: VerifierRandomness):
        index = torch.from_numpy(case)
        q = None if q_rows is None else q_rows[index]
        drafted = tokens[index]
        try:
            result = verifier(p_rows[index], q, drafted, tree, randomness)
        except Exception as exc:
            message = (str(exc).strip().splitlines() or [""])[0]
            return Malformed(f"the verifier raised {type(exc).__name__}: {message}", [])
        out = read_tree_output(result, drafted, tree, tables.vocab)
        if isinstance(out, Malformed):
            return out
        emitted, counts = out
        inside = torch.arange(tree.depth + 1) < counts.unsqueeze(1)
        return torch.where(inside, emitted, -1), counts

    probe = Probe(weights, tree.num_nodes, tree.depth + 1, tables.vocab, call)
    return enumerate_probe(probe, p_table, tables.prompt, greedy_reference, seed)


def _drafted_trees(tables, tree: TreeShape, drafts: str, deterministic: bool):
    """Every drafted tree (tokens [C, N]) and its probability under the drafter."""
    q = tables.q_draft.double().numpy()
    ranked = tables.ranked.numpy()
    parents = tree.parents.tolist()
    siblings = [[s for s in range(node) if parents[s] == parents[node]] for node in
                range(tree.num_nodes)]  # fmt: skip
    trees = [((), 1.0)]
    for node in range(tree.num_nodes):
        grown = []
        for tokens, weight in trees:
            a, b = _context(tables.prompt, tokens, parents, parents[node])
            if deterministic:
                grown.append(((*tokens, int(ranked[a, b, tree.paths[node][-1]])), weight))
                continue
            row = q[a, b].copy()
            if drafts == "without-replacement":
                row[[tokens[s] for s in siblings[node]]] = 0.0
            row /= row.sum()
            grown.extend(((*tokens, x), weight * float(row[x])) for x in np.flatnonzero(row > 0))
        trees = grown
    tokens = torch.tensor([t for t, _ in trees], dtype=torch.long).reshape(-1, tree.num_nodes)
    return tokens, np.array([w for _, w in trees])


def _context(prompt, tokens, parents, node: int) -> tuple[int, int]:
    """The last two tokens before ``node``'s children: (grand-parent's, node's) tokens."""
    if node < 0:
        return prompt
    parent = parents[node]
    return (prompt[1] if parent < 0 else tokens[parent]), tokens[node]


def _rows(tables, tree: TreeShape, tokens: torch.Tensor, deterministic: bool):
    """p and q rows [C, N+1, V] of every case: row 0 at the root, row i+1 after node i."""
    parents = tree.parents.tolist()
    a = torch.full((len(tokens), tree.num_nodes + 1), tables.prompt[0], dtype=torch.long)
    b = torch.full_like(a, tables.prompt[1])
    for node in range(tree.num_nodes):
        a[:, node + 1], b[:, node + 1] = b[:, parents[node] + 1], tokens[:, node]
    q = None if deterministic else tables.q_verify[a, b]
    return tables.p_verify[a, b], q
