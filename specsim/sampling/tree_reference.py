"""Closed form of one tree step (numpy, float64): the exact distribution of what it emits.

On the checker's order-2 toy problem (``reference.Tables``: p and q indexed by the last two
context tokens) the distribution a node's subtree emits depends only on the node's own two-token
context, so it is computed once per node for every context at once, leaves first. At a node the
children are tried in rank order; the state before child j is enumerated exactly over the tokens
of the j - 1 siblings rejected before it (one array axis each): the probability of getting there,
the residual target p', the proposal, and (for the shared-uniform control) the largest accept
threshold so far. A child accepted with token x continues with its own subtree from context
(b, x). Sizes: arrays of V^(W + 3) cells for a node of W children and V^(h + 3) for a subtree of
height h, so ``MAX_CELLS`` bounds V^(max(W, D) + 3); within it the result is exact to float64
rounding. ``tree_step`` gives the step from the prompt in ``reference.Emitted`` form, which
``reference.first_step_window`` continues with the target alone to the whole window of D + 1
tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specsim.sampling.reference import (
    Emitted,
    Tables,
    exact_accept,
    exact_residual,
    normalised_or_p,
    one_hot_argmax,
    typical_accept,
)
from specsim.tree import TreeShape

MAX_CELLS = 1 << 24  # float64 cells in the largest array (128 MiB)
DRAFTS = ("iid", "without-replacement")  # how a sampling drafter draws a node's children


@dataclass(frozen=True)
class TreeRule:
    """A tree verifier's behaviour at one node, in closed form (arrays: any leading shape).

    ``accept(p_node, p_cur, q_cur)``: probability of accepting each candidate x, given the
    node's p, the current residual target p' and the proposal the verifier uses for this child.
    ``update(p_cur, q_cur)``: p' after a rejection. ``final(p_node, p_cur, q_node, leaf)``: the
    distribution of the token emitted where the walk stops. ``proposal``: the verifier's
    proposal for child j, q as drafted (``iid``) or q without the earlier siblings' tokens.
    ``sibling_uniform``: every sibling reuses one accept uniform (a control).
    """

    name: str
    accept: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    update: Callable[[np.ndarray, np.ndarray], np.ndarray]
    final: Callable[[np.ndarray, np.ndarray, np.ndarray, bool], np.ndarray]
    proposal: str = "iid"
    sibling_uniform: bool = False


def _keep(p_cur, q_cur):
    return p_cur


def _exact_final(p_node, p_cur, q_node, leaf):
    return p_cur


def _greedy_final(p_node, p_cur, q_node, leaf):
    return one_hot_argmax(p_node)


def _typical_final(p_node, p_cur, q_node, leaf):
    return p_node if leaf else one_hot_argmax(p_node)


def _stale_final(p_node, p_cur, q_node, leaf):
    return p_node if leaf else exact_residual(p_node, q_node)


def _exact(p_node, p_cur, q_cur):
    return exact_accept(p_cur, q_cur)


TREE_REJECTION = TreeRule("rejection-iid", _exact, exact_residual, _exact_final)
TREE_WITHOUT_REPLACEMENT = TreeRule(
    "rejection-without-replacement", _exact, exact_residual, _exact_final, "without-replacement"
)
TREE_GREEDY = TreeRule(
    "greedy", lambda p_node, p_cur, q_cur: one_hot_argmax(p_node), _keep, _greedy_final
)
TREE_TYPICAL = TreeRule(
    "typical", lambda p_node, p_cur, q_cur: typical_accept(p_node, q_cur), _keep, _typical_final
)
# The controls' rules (``tree_controls``).
TREE_STALE_RESIDUAL = TreeRule("tree-stale-residual", _exact, _keep, _stale_final)
TREE_SIBLING_UNIFORM = TreeRule(
    "tree-sibling-uniform", _exact, exact_residual, _exact_final, sibling_uniform=True
)


def enumeration_cells(tree: TreeShape, vocab: int) -> int:
    """Cells of the largest array the closed form builds (see the module docstring)."""
    width = max(len(tree.children(node)) for node in range(-1, tree.num_nodes))
    return vocab ** (max(width, tree.depth) + 3)


def tree_step(
    tables: Tables,
    tree: TreeShape,
    rule: TreeRule,
    drafts: str,
    prompt: tuple[int, int],
    deterministic: bool = False,
) -> Emitted:
    """What one tree step from ``prompt`` emits, up to D + 1 tokens. ``drafts``: how the
    drafter drew each node's children from q (``DRAFTS``); ``deterministic``: the top-k children
    of q instead (a deterministic drafter; every proposal is then a point mass)."""
    subtree = _Subtrees(tables, tree, rule, drafts, deterministic)
    emitted = [part[prompt] for part in subtree.emitted(-1)]
    return Emitted(emitted[:-1], emitted[-1], tree.depth + 1)


class _Subtrees:
    def __init__(self, tables, tree, rule, drafts, deterministic):
        self.p, self.q = tables.p, tables.q_draft
        self.vocab = tables.vocab
        self.tree, self.rule, self.drafts, self.deterministic = tree, rule, drafts, deterministic
        # The rank-j token of q in every context: top-k children, ties to the lower token.
        self.ranked = np.argsort(-self.q, axis=-1, kind="stable")

    def emitted(self, node: int) -> list[np.ndarray]:
        """What the subtree under ``node`` emits from each context (a, b):
        ``out[L-1]`` ``[V, V] + [V]*L``, L = 1..height + 1."""
        vocab, rule = self.vocab, self.rule
        kids = self.tree.children(node)
        parts: list[np.ndarray] = [np.zeros((vocab,) * 3)]
        reach = np.ones((vocab, vocab))  # [a, b] + earlier siblings' tokens
        p_cur = self.p
        taken = np.zeros_like(self.q)  # earlier siblings' tokens, one-hot summed
        threshold = np.zeros((vocab, vocab))
        for rank, child in enumerate(kids):
            hist = rank
            p_node = _lift(self.p, hist)
            q_node = _lift(self.q, hist)
            draft, proposal = self._proposals(q_node, taken, rank, hist)
            accept = raw_accept = rule.accept(p_node, p_cur, proposal)
            if rule.sibling_uniform:
                # One uniform u for all siblings: child j is reached with u >= every earlier
                # threshold, so it passes with P(u < a | u >= m) = max(0, a - m) / (1 - m).
                room = 1.0 - threshold[..., None]
                safe = np.where(room > 0, room, 1.0)
                above = np.clip((accept - threshold[..., None]) / safe, 0.0, 1.0)
                accept = np.where(room > 0, above, 0.0)
            weight = reach[..., None] * draft
            taken_tokens = (weight * accept).sum(axis=tuple(range(2, 2 + hist)))  # [a, b, x]
            for length, below in enumerate(self.emitted(child), start=1):
                while len(parts) <= length:
                    parts.append(np.zeros((vocab,) * (len(parts) + 3)))
                # The child's subtree starts from context (b, x).
                parts[length] += taken_tokens.reshape(taken_tokens.shape + (1,) * length) * below
            reach = weight * (1.0 - accept)
            p_cur = _append_axis(rule.update(p_cur, proposal))
            taken = np.maximum(_append_axis(taken), np.eye(vocab))
            if rule.sibling_uniform:
                threshold = np.maximum(threshold[..., None], raw_accept)
        final = rule.final(_lift(self.p, len(kids)), p_cur, _lift(self.q, len(kids)), not kids)
        parts[0] += (reach[..., None] * final).sum(axis=tuple(range(2, 2 + len(kids))))
        return parts

    def _proposals(self, q_node, taken, rank, hist):
        """The distribution child ``rank`` was drafted from and the one the verifier uses."""
        if self.deterministic:
            token = self.ranked[..., rank]
            point = np.eye(self.vocab)[token].reshape((self.vocab,) * 2 + (1,) * hist + (-1,))
            point = np.broadcast_to(point, q_node.shape[:2] + taken.shape[2:])
            return point, point
        remaining = normalised_or_p(q_node * (1.0 - taken), q_node)
        draft = q_node * np.ones_like(taken) if self.drafts == "iid" else remaining
        if self.rule.proposal == "iid":
            return draft, q_node * np.ones_like(taken)
        return draft, remaining


def _lift(table: np.ndarray, hist: int) -> np.ndarray:
    """A [V, V, V] table with ``hist`` sibling axes inserted before the token axis."""
    vocab = table.shape[-1]
    return table.reshape((vocab, vocab) + (1,) * hist + (vocab,))


def _append_axis(x: np.ndarray) -> np.ndarray:
    """[..., V] -> [..., V(the rejected sibling's token), V]: the same for every token."""
    return np.broadcast_to(x[..., None, :], x.shape[:-1] + (x.shape[-1],) * 2)
