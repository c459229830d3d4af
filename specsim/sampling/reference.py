"""Closed-form reference (numpy, float64): the exact output distribution of a verifier.

For a small vocabulary (V <= 16) and window (k <= 4), ``step_distribution`` enumerates every draft
path x_1..x_n with its probability under the drafter's q, and every accept/reject outcome, to give
the exact distribution of the tokens one speculative step emits. ``first_tokens_distribution``
chains steps (a step that emits one token is followed by another step from the longer context) to
give the joint distribution of the first m emitted tokens, to compare with what the target alone
produces (``target_distribution``). Nothing here imports torch.

A verifier is described by a ``ClosedFormRule``: the probability of accepting each candidate draft
x given p and the q the verifier sees, the distribution of the corrected token on a rejection, the
distribution of the bonus token, and whether one uniform is shared by all positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# Medusa's typical-acceptance threshold min(epsilon, delta exp(-H(p))): this closed form, the
# torch verifier and the profiler's scoring all read it from here.
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3


def process_logits_np(
    logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """float64 twin of ``logits.process_logits`` (same order, same tie-breaking), last axis."""
    x = np.asarray(logits, dtype=np.float64)
    vocab = x.shape[-1]
    if temperature == 0:
        return np.eye(vocab)[x.argmax(axis=-1)]
    scaled = x / temperature
    if (0 < top_k < vocab) or top_p < 1:
        order = np.argsort(-scaled, axis=-1, kind="stable")
        sorted_logits = np.take_along_axis(scaled, order, axis=-1)
        keep = np.ones(sorted_logits.shape, dtype=bool)
        if 0 < top_k < vocab:
            keep[..., top_k:] = False
        if top_p < 1:
            probs = _softmax(np.where(keep, sorted_logits, -np.inf))
            keep &= (np.cumsum(probs, axis=-1) - probs) < top_p
        keep_by_token = np.empty_like(keep)
        np.put_along_axis(keep_by_token, order, keep, axis=-1)
        scaled = np.where(keep_by_token, scaled, -np.inf)
    return _softmax(scaled)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------------------------
# Verifier rules. Arrays carry any leading shape; the last axis is the vocabulary.


def one_hot_argmax(p: np.ndarray) -> np.ndarray:
    return np.eye(p.shape[-1])[p.argmax(axis=-1)]


def exact_accept(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """min(1, p/q) per candidate x; with q(x) = 0 accept iff p(x) > 0 (as ``u*q < p``)."""
    safe_q = np.where(q > 0, q, 1.0)
    return np.where(q > 0, np.minimum(1.0, p / safe_q), (p > 0).astype(np.float64))


def normalised_or_p(residual: np.ndarray, p: np.ndarray) -> np.ndarray:
    mass = residual.sum(axis=-1, keepdims=True)
    return np.where(mass > 0, residual / np.where(mass > 0, mass, 1.0), p)


def exact_residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return normalised_or_p(np.maximum(0.0, p - q), p)


def greedy_accept(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return one_hot_argmax(p)


def typical_accept(
    p: np.ndarray, q: np.ndarray, epsilon: float = TYPICAL_EPSILON, delta: float = TYPICAL_DELTA
) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    threshold = np.minimum(epsilon, delta * np.exp(-entropy))[..., None]
    return (p > threshold).astype(np.float64)


@dataclass(frozen=True)
class ClosedFormRule:
    """A verifier's behaviour at one position, in closed form.

    ``accept(p, q) -> [..., V]``: probability of accepting each candidate draft x.
    ``residual(p, q) -> [..., V]``: distribution of the token emitted on a rejection.
    ``bonus(p) -> [..., V]``: distribution of the token emitted when every draft passes.
    ``shared_uniform``: one uniform decides every position (a known bug, kept as a control);
    then P(accept the first j) = min(a_1..a_j) instead of a_1 * ... * a_j.
    ``stale_bonus``: the bonus token is drawn at the last draft's position instead of the one
    after it (a known bug, kept as a control).
    """

    name: str
    accept: Callable[[np.ndarray, np.ndarray], np.ndarray]
    residual: Callable[[np.ndarray, np.ndarray], np.ndarray]
    bonus: Callable[[np.ndarray], np.ndarray] = field(default=lambda p: p)
    shared_uniform: bool = False
    stale_bonus: bool = False


REJECTION = ClosedFormRule("rejection", exact_accept, exact_residual)
GREEDY = ClosedFormRule(
    "greedy", greedy_accept, lambda p, q: one_hot_argmax(p), bonus=one_hot_argmax
)
TYPICAL = ClosedFormRule("typical", typical_accept, lambda p, q: one_hot_argmax(p))


# ----------------------------------------------------------------------------------------------
# Enumeration over an order-2 context model: distributions are tables [V, V, V] indexed by the
# last two tokens of the context, so every draft path has an exact, finite description.


@dataclass(frozen=True)
class Tables:
    """Next-token distributions indexed by the last two context tokens: ``table[a, b] -> [V]``.

    ``p`` is the target's (processed), ``q_draft`` what the drafter samples from, ``q_verify``
    what the verifier is given (equal to ``q_draft`` unless a control plants a mismatch).
    """

    p: np.ndarray
    q_draft: np.ndarray
    q_verify: np.ndarray

    @property
    def vocab(self) -> int:
        return self.p.shape[-1]


def _node_table(table: np.ndarray, context: tuple[int, int] | None, depth: int) -> np.ndarray:
    """Distribution after the context plus a free path x_1..x_depth: shape [V]*depth + [V].

    ``context=None`` leaves the context free too: two leading axes (a, b), shape
    [V]*(depth + 2) + [V], so one enumeration covers every starting context at once.
    """
    vocab = table.shape[-1]
    if context is None:
        return table.reshape((1,) * depth + (vocab, vocab, vocab))
    a, b = context
    if depth == 0:
        return table[a, b]
    if depth == 1:
        return table[b]
    return table.reshape((1,) * (depth - 2) + (vocab, vocab, vocab))


@dataclass
class Emitted:
    """What one step emits, up to ``longest`` tokens: ``exact[L-1]`` is the probability of
    emitting exactly the L tokens s (L < longest); ``at_least`` that of emitting ``longest`` or
    more tokens that begin with s. Leading context axes come first when the context is free."""

    exact: list[np.ndarray]
    at_least: np.ndarray
    longest: int

    def truncated(self, longest: int) -> Emitted:
        """The same step seen up to fewer tokens: longer emissions summed to their first ones."""
        at_least = self.at_least
        for part in reversed(self.exact[longest - 1 :]):
            at_least = part + at_least.sum(axis=-1)
        return Emitted(self.exact[: longest - 1], at_least, longest)

    def mixed(self, other: Emitted, weight: float) -> Emitted:
        exact = [a + weight * b for a, b in zip(self.exact, other.exact, strict=True)]
        return Emitted(exact, self.at_least + weight * other.at_least, self.longest)


def _step_parts(
    tables: Tables,
    context: tuple[int, int] | None,
    n_drafts: int,
    rule: ClosedFormRule,
    longest: int,
) -> Emitted:
    """Enumerate one step's draft paths and outcomes (see ``step_distribution``), keeping the
    emitted tokens up to ``longest``: longer emissions are summed before they are built, so
    memory follows V^longest, not V^(k+1)."""
    lead = 2 if context is None else 0
    zero = np.zeros((tables.vocab,) * (lead + longest))
    emitted = Emitted(
        [np.zeros((tables.vocab,) * (lead + n)) for n in range(1, longest)], zero, longest
    )

    def record(mass: np.ndarray, token: np.ndarray) -> None:
        """Add ``mass`` [.., path] times the last token's distribution ``token`` [.., V]."""
        length = mass.ndim - lead + 1
        if length < longest:
            emitted.exact[length - 1] += mass[..., None] * token
        elif length == longest:
            emitted.at_least += mass[..., None] * token
        else:
            reduced = mass * token.sum(axis=-1)
            emitted.at_least += reduced.sum(axis=tuple(range(lead + longest, reduced.ndim)))

    path_q = np.ones((1,) * lead)  # P_q(x_1..x_d), shape [V]*d
    path_accept = np.ones((1,) * lead)  # P(first d drafts accepted | path), shape [V]*d
    for depth in range(n_drafts):
        p_node = _node_table(tables.p, context, depth)
        q_verify = _node_table(tables.q_verify, context, depth)
        accept = rule.accept(p_node, q_verify)
        next_q = path_q[..., None] * _node_table(tables.q_draft, context, depth)
        if rule.shared_uniform:
            next_accept = np.minimum(path_accept[..., None], accept)
        else:
            next_accept = path_accept[..., None] * accept
        reject_here = (next_q * (path_accept[..., None] - next_accept)).sum(axis=-1)
        record(reject_here, rule.residual(p_node, q_verify))
        path_q, path_accept = next_q, next_accept
    bonus_depth = n_drafts - 1 if rule.stale_bonus and n_drafts > 0 else n_drafts
    bonus_p = _node_table(tables.p, context, bonus_depth)
    if bonus_depth < n_drafts:
        bonus_p = np.expand_dims(bonus_p, -2)  # the last draft's position, one step stale
    record(path_q * path_accept, rule.bonus(bonus_p))
    return emitted


def step_distribution(
    tables: Tables, context: tuple[int, int], n_drafts: int, rule: ClosedFormRule
) -> list[np.ndarray]:
    """Exact distribution of what one step emits: ``E[L-1]`` has shape [V]*L, L = 1..n+1.

    ``E[L-1][s]`` is the probability that the step emits exactly the sequence s. Every draft
    path is enumerated with its q-probability; the outcomes are "first rejection at position
    j+1" (emit x_1..x_j then a residual token) and "all accepted" (emit the path and a bonus).
    The arrays sum to 1 over all L.
    """
    return _step_parts(tables, context, n_drafts, rule, n_drafts + 2).exact


def _mixed_step(tables, context, draft_counts, rule, longest) -> Emitted:
    """A step whose number of drafts is drawn uniformly from ``draft_counts``."""
    steps = [_step_parts(tables, context, n, rule, longest) for n in draft_counts]
    mixed = steps[0]
    for step in steps[1:]:
        mixed = mixed.mixed(step, 1.0)
    scale = 1.0 / len(draft_counts)
    return Emitted([part * scale for part in mixed.exact], mixed.at_least * scale, longest)


def _continue(part: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Emitted tokens ``part`` (its last two axes: the context the next step starts from)
    followed by ``rest`` [V, V] + [V]*r, the next steps' first r tokens from each context."""
    r = rest.ndim - 2
    return part.reshape(part.shape + (1,) * r) * rest.reshape((1,) * (part.ndim - 2) + rest.shape)


def chain_steps(step: Emitted, chained: dict[int, np.ndarray], context) -> np.ndarray:
    """First ``step.longest`` tokens: the step's own, then the next steps' for what it left."""
    m = step.longest
    out = step.at_least.copy()
    for length, part in enumerate(step.exact, start=1):
        if context is not None and length == 1:
            lifted = np.zeros((part.shape[-1],) * 2)  # the next step starts from (b, s_1)
            lifted[context[1]] = part
            out += _continue(lifted, chained[m - 1]).sum(axis=0)
        else:
            out += _continue(part, chained[m - length])
    return out


def first_tokens_distribution(
    tables: Tables,
    context: tuple[int, int],
    draft_counts: tuple[int, ...],
    rule: ClosedFormRule,
    n_tokens: int = 2,
) -> np.ndarray:
    """Exact joint distribution ``[V]*n_tokens`` of the first emitted tokens.

    Each step drafts ``n`` tokens with n drawn uniformly from ``draft_counts`` (one value: a
    fixed window; several: ragged windows). A step that emits fewer than ``n_tokens`` tokens is
    followed by further steps from the extended context: the first j < n_tokens tokens from
    every context are computed once, all contexts at a time, and chained.
    """
    chained: dict[int, np.ndarray] = {}
    if n_tokens > 1:
        every = _mixed_step(tables, None, draft_counts, rule, n_tokens - 1)
        for j in range(1, n_tokens):
            chained[j] = chain_steps(every.truncated(j), chained, None)
    here = _mixed_step(tables, context, draft_counts, rule, n_tokens)
    return chain_steps(here, chained, context)


def target_every_context(p_table: np.ndarray, n_tokens: int, greedy: bool = False) -> np.ndarray:
    """What the target alone emits first from every context: [V, V] + [V]*n_tokens."""
    table = one_hot_argmax(p_table) if greedy else p_table
    out = table
    for depth in range(1, n_tokens):
        out = out[..., None] * _node_table(table, None, depth)
    return out


def first_step_window(
    step: Emitted, p_table: np.ndarray, context: tuple[int, int], greedy: bool = False
) -> np.ndarray:
    """The first ``step.longest`` tokens when this step starts from ``context`` and the target
    alone continues: equal to ``target_distribution`` exactly when the step is lossless there."""
    chained = {j: target_every_context(p_table, j, greedy) for j in range(1, step.longest)}
    return chain_steps(step, chained, context)


def rule_first_step_window(
    tables: Tables,
    context: tuple[int, int],
    draft_counts: tuple[int, ...],
    rule: ClosedFormRule,
    n_tokens: int,
    greedy: bool = False,
) -> np.ndarray:
    """``first_step_window`` of a closed-form rule's step (what enumerating it must give)."""
    step = _mixed_step(tables, context, draft_counts, rule, n_tokens)
    return first_step_window(step, tables.p, context, greedy)


def target_distribution(
    p_table: np.ndarray, context: tuple[int, int], n_tokens: int = 2, greedy: bool = False
) -> np.ndarray:
    """What the target alone emits: p(x_1) p(x_2 | x_1) ... as ``[V]*n_tokens``.

    With ``greedy`` the target decodes by argmax at every step: a point mass on one path.
    """
    table = one_hot_argmax(p_table) if greedy else p_table
    out = _node_table(table, context, 0)
    for depth in range(1, n_tokens):
        out = out[..., None] * _node_table(table, context, depth)
    return out


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())
