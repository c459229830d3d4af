"""Monte Carlo runs of a real (torch) tree verifier on the checker's toy problem.

Each row drafts a whole tree from the prompt, node by node in breadth-first order: a node's token
is drawn from its parent's q, i.i.d. or without replacement among its siblings (inverse CDF), or
is the parent's rank-r token of q for a deterministic drafter (top-k children). The verifier
under test runs one tree step (the ``tree_verifiers`` signature), its output is checked against
the contract, and the target alone continues each row to D + 1 tokens: what
``tree_reference.tree_step`` and ``reference.first_step_window`` give in closed form. The result
is a table of counts of the D + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specsim.sampling.harness import Malformed
from specsim.sampling.logits import inverse_cdf
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.randomness import draw_randomness
from specsim.tree import TreeShape

CHUNK_ROWS = 1 << 14  # rows per batch; fixed so results do not depend on the machine
EXAMPLE_ROWS = 3


def run_tree_monte_carlo(
    verifier: Callable,
    tables,
    tree: TreeShape,
    drafts: str,
    samples: int,
    seed: int,
    *,
    deterministic: bool = False,
) -> np.ndarray | Malformed:
    """Counts ``[V]*(D+1)`` over ``samples`` rows, or the first contract breach as
    ``Malformed``. ``tables``: a ``TreeTables``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    try:
        generator = torch.Generator().manual_seed(seed)
        window = tree.depth + 1
        vocab = tables.vocab
        counts = torch.zeros(vocab**window, dtype=torch.long)
        done = 0
        while done < samples:
            rows = min(CHUNK_ROWS, samples - done)
            emitted = _rows(verifier, tables, tree, drafts, deterministic, rows, generator)
            if isinstance(emitted, Malformed):
                return emitted
            flat = torch.zeros(rows, dtype=torch.long)
            for j in range(window):
                flat = flat * vocab + emitted[:, j]
            counts += torch.bincount(flat, minlength=vocab**window)
            done += rows
        return counts.numpy().reshape((vocab,) * window)
    finally:
        torch.set_num_threads(threads)


class TreeTables:
    """What the drafter samples from, what the verifier is given, and the target that
    continues: tables ``[V, V, V]`` indexed by the last two context tokens."""

    def __init__(self, p_verify, q_verify, q_draft, p_continue, ranked, prompt):
        self.p_verify, self.q_verify, self.q_draft = p_verify, q_verify, q_draft
        self.p_continue, self.ranked, self.prompt = p_continue, ranked, prompt

    @property
    def vocab(self) -> int:
        return self.q_draft.shape[-1]


def tree_tables(
    models: ToyModels, processing: Processing, dtype: str, greedy: bool = False,
    logits: bool = False,
):  # fmt: skip
    """The walks' tables: the verifier's inputs in ``dtype`` (processed p and q, or the raw
    logits with ``logits``), the drafter's and the continuing target's in float64 (its argmax
    with ``greedy``: the greedy reference), and the top-k ranking of the closed form."""
    from specsim.sampling import reference
    from specsim.sampling.harness import DTYPES

    tables = models.tables(processing)
    p, q = torch.from_numpy(tables.p), torch.from_numpy(tables.q_draft)
    ranked = torch.from_numpy(np.argsort(-tables.q_draft, axis=-1, kind="stable"))
    cast = DTYPES[dtype]
    target = torch.from_numpy(reference.one_hot_argmax(tables.p)) if greedy else p
    p_in, q_in = p, q
    if logits:
        p_in, q_in = torch.from_numpy(models.target_logits), torch.from_numpy(models.drafter_logits)
    return TreeTables(p_in.to(cast), q_in.to(cast), q, target, ranked, models.prompt)


def _rows(verifier, tables, tree, drafts, deterministic, rows, generator):
    start = torch.tensor(tables.prompt, dtype=torch.long).expand(rows, 2)
    tokens, context_a, context_b = draft_tree(
        tables, tree, drafts, deterministic, start[:, 0], start[:, 1], generator
    )
    n = tree.num_nodes
    p = tables.p_verify[context_a, context_b]
    q = None if deterministic else tables.q_verify[context_a, context_b]
    randomness = draw_randomness(generator, rows, n)
    try:
        result = verifier(p, q, tokens, tree, randomness)
    except Exception as exc:
        message = (str(exc).strip().splitlines() or [""])[0]
        return Malformed(f"the verifier raised {type(exc).__name__}: {message}", [])
    step = read_tree_output(result, tokens, tree, tables.vocab)
    if isinstance(step, Malformed):
        return step
    emitted, counts = step
    return _continue(tables, emitted, counts, context_a[:, 0], context_b[:, 0], generator)


def draft_tree(tables, tree: TreeShape, drafts: str, deterministic: bool, a, b, generator):
    """Draft a whole tree per row after the context (a, b) [R]: the node tokens [R, N] and
    each row's context pair [R, N+1] (column 0 the root's, column i+1 after node i)."""
    rows, n = a.shape[0], tree.num_nodes
    parents = (torch.from_numpy(tree.parents) + 1).tolist()
    ranks = [path[-1] for path in tree.paths]
    context_a = a.unsqueeze(1).repeat(1, n + 1)
    context_b = b.unsqueeze(1).repeat(1, n + 1)
    tokens = torch.zeros((rows, n), dtype=torch.long)
    index = torch.arange(rows)
    for node in range(n):
        pa, pb = context_a[:, parents[node]], context_b[:, parents[node]]
        if deterministic:
            token = tables.ranked[pa, pb, ranks[node]]
        else:
            weights = tables.q_draft[pa, pb]
            if drafts == "without-replacement":
                for sibling in range(node):
                    if parents[sibling] == parents[node]:
                        weights[index, tokens[:, sibling]] = 0.0
            u = torch.rand(rows, generator=generator, dtype=torch.float64)
            token, _ = inverse_cdf(weights, u)
        tokens[:, node] = token
        context_a[:, node + 1], context_b[:, node + 1] = pb, token
    return tokens, context_a, context_b


def _continue(tables, emitted, counts, a, b, generator):
    """Fill each row to D + 1 tokens by sampling the target from where the step left it."""
    rows, window = emitted.shape
    out = torch.full_like(emitted, -1)
    for j in range(window):
        from_step = j < counts
        if bool((~from_step).any()):
            u = torch.rand(rows, generator=generator, dtype=torch.float64)
            sampled, _ = inverse_cdf(tables.p_continue[a, b], u)
        else:
            sampled = emitted[:, j]
        token = torch.where(from_step, emitted[:, j], sampled)
        out[:, j] = token
        a, b = b, token
    return out


def read_tree_output(result, drafts: torch.Tensor, tree: TreeShape, vocab: int):
    """(emitted tokens [R, D+1], counts [R]) or a ``Malformed`` verdict: ``.path`` must be a
    path from the root, ``.tokens`` its drafts then one token in [0, V)."""
    rows, depth = drafts.shape[0], tree.depth
    accepted = getattr(result, "accepted", None)
    tokens = getattr(result, "tokens", None)
    path = getattr(result, "path", None)
    shapes = ((accepted, (rows,)), (tokens, (rows, depth + 1)), (path, (rows, depth)))
    for value, shape in shapes:
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            return Malformed(
                "expected .accepted [B], .path [B, D] and .tokens [B, D+1] integer tensors", []
            )
    accepted, tokens, path = accepted.long(), tokens.long(), path.long()
    bad = (accepted < 0) | (accepted > depth)
    parents = torch.from_numpy(tree.parents)
    previous = torch.full((rows,), -1, dtype=torch.long)
    for level in range(depth):
        inside = level < accepted
        node = path[:, level].clamp(0, tree.num_nodes - 1)
        bad |= inside & ((path[:, level] < 0) | (parents[node] != previous))
        bad |= inside & (tokens[:, level] != drafts.gather(1, node.unsqueeze(1)).squeeze(1))
        previous = torch.where(inside, node, previous)
    last = tokens.gather(1, accepted.clamp(0, depth).unsqueeze(1)).squeeze(1)
    bad |= (last < 0) | (last >= vocab)
    if bool(bad.any()):
        examples = [
            {"row": int(r), "accepted": int(accepted[r]), "path": path[r].tolist(),
             "tokens": tokens[r].tolist(), "drafts": drafts[r].tolist()}
            for r in bad.nonzero().squeeze(-1)[:EXAMPLE_ROWS].tolist()
        ]  # fmt: skip
        return Malformed(
            f"an accepted path that is not a path of the tree, tokens that differ from its "
            f"drafts, or a final token outside [0, {vocab}) ({int(bad.sum())} of {rows} rows)",
            examples,
        )
    return tokens, accepted + 1
