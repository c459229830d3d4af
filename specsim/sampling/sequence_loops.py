"""Whole runs of speculative steps on the checker's toy models (torch): the loops ``sequences``
judges, the toy KV cache a step function owns, and the exact step and its planted bugs.

Two loops generate R sequences of n tokens from the prompt, all rows stepping together:

- ``verifier``: specsim drafts a tree (a chain is a tree of width 1) after each row's last two
  tokens, hands p and q to the verifier with fresh uniforms, and commits what it emits;
- ``step``: your step function owns the cache and is called as
  ``step(target, drafter, cache, last, randomness) -> (accepted [B], tokens [B, k+1])``:
  ``cache`` (``ToyCache``) holds the KV entries of every committed token but the last one,
  ``last`` [B]; ``target(cache, tokens [B, m])`` appends m entries and returns p [B, m, V], row
  j the next-token distribution after tokens[:, j] (the toy target reads the entry before each
  token: its order-2 context); ``drafter(a, b)`` returns q [B, V] after the pair (a, b);
  ``randomness`` has ``draft`` [B, k], ``accept`` [B, k] and ``sample`` [B]. The step must set
  ``cache.length`` to keep the entries of ``last`` and the accepted drafts (the rollback).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specsim.sampling.harness import Malformed
from specsim.sampling.logits import inverse_cdf
from specsim.sampling.randomness import VerifierRandomness, draw_randomness
from specsim.sampling.tree_montecarlo import draft_tree, read_tree_output
from specsim.tree import TreeShape

CHUNK_ROWS = 1 << 14  # rows per batch; fixed so that results do not depend on the machine


@dataclass
class ToyCache:
    """Per row, the token whose KV entry sits at each position, and how many are live."""

    tokens: torch.Tensor  # [B, L] int64
    length: torch.Tensor  # [B] int64


@dataclass(frozen=True)
class StepRandomness:
    draft: torch.Tensor  # [B, k]: one uniform per drafted token (inverse CDF of q)
    accept: torch.Tensor  # [B, k]
    sample: torch.Tensor  # [B]


class ToyTarget:
    """The target as a step function sees it: a forward pass over new tokens with a cache."""

    def __init__(self, p_table: torch.Tensor):
        self.p = p_table

    def __call__(self, cache: ToyCache, tokens: torch.Tensor) -> torch.Tensor:
        index = torch.arange(tokens.shape[0])
        before = cache.tokens[index, cache.length - 1]
        rows = []
        for j in range(tokens.shape[1]):
            rows.append(self.p[before, tokens[:, j]])
            before = tokens[:, j]
        cache.tokens[
            index.unsqueeze(1), cache.length.unsqueeze(1) + torch.arange(tokens.shape[1])
        ] = tokens
        cache.length = cache.length + tokens.shape[1]
        return torch.stack(rows, dim=1)


def run_verifier_loop(verify, tables, tree: TreeShape, drafts, deterministic, n, rows, generator):
    """Sequences [R, n] of the verifier-in-the-loop run, or a ``Malformed`` verdict."""
    a = torch.full((rows,), tables.prompt[0], dtype=torch.long)
    b = torch.full((rows,), tables.prompt[1], dtype=torch.long)
    out = torch.full((rows, n), -1, dtype=torch.long)
    filled = torch.zeros(rows, dtype=torch.long)
    while bool((filled < n).any()):
        drafted, ca, cb = draft_tree(tables, tree, drafts, deterministic, a, b, generator)
        p = tables.p_verify[ca, cb]
        q = None if deterministic else tables.q_verify[ca, cb]
        randomness = draw_randomness(generator, rows, tree.num_nodes)
        try:
            result = verify(p, q, drafted, tree, randomness)
        except Exception as exc:
            return _raised(exc)
        step = read_tree_output(result, drafted, tree, tables.vocab)
        if isinstance(step, Malformed):
            return step
        emitted, counts = step
        a, b = _commit(out, filled, emitted, counts, b)
        filled = filled + counts
    return out


def run_step_loop(step: Callable, tables, k: int, n: int, rows: int, generator):
    """Sequences [R, n] of the step-function run, or a ``Malformed`` verdict."""
    target, q = ToyTarget(tables.p_verify), tables.q_draft
    cache = ToyCache(
        torch.zeros((rows, 2 + n * (k + 2)), dtype=torch.long), torch.ones(rows, dtype=torch.long)
    )
    cache.tokens[:, 0] = tables.prompt[0]
    last = torch.full((rows,), tables.prompt[1], dtype=torch.long)
    out = torch.full((rows, n), -1, dtype=torch.long)
    filled = torch.zeros(rows, dtype=torch.long)
    while bool((filled < n).any()):
        uniforms = torch.rand((rows, 2 * k + 1), generator=generator, dtype=torch.float64)
        randomness = StepRandomness(uniforms[:, :k], uniforms[:, k : 2 * k], uniforms[:, 2 * k])
        try:
            accepted, tokens = _pair(step(target, lambda x, y: q[x, y], cache, last, randomness))
        except Exception as exc:
            return _raised(exc)
        bad = _step_breach(accepted, tokens, rows, k, tables.vocab)
        if bad is not None:
            return bad
        counts = accepted.long() + 1
        emitted = tokens.long()
        _, last = _commit(out, filled, emitted, counts, last)
        filled = filled + counts
    return out


def _commit(out, filled, emitted, counts, b):
    """Write each row's emitted tokens after what it has; its new last two tokens."""
    rows, n = out.shape
    index = torch.arange(rows)
    for j in range(emitted.shape[1]):
        put = (j < counts) & (filled + j < n)
        out[index[put], (filled + j)[put]] = emitted[put, j]
    last = emitted.gather(1, (counts - 1).unsqueeze(1)).squeeze(1)
    before = emitted.gather(1, (counts - 2).clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(counts >= 2, before, b), last


def _pair(result):
    if isinstance(result, tuple) and len(result) == 2:
        return result
    return result.accepted, result.tokens


def _step_breach(accepted, tokens, rows, k, vocab) -> Malformed | None:
    if not (isinstance(tokens, torch.Tensor) and tuple(tokens.shape) == (rows, k + 1)):
        return Malformed(f"the step must return (accepted [B], tokens [B, {k + 1}])", [])
    if not (isinstance(accepted, torch.Tensor) and tuple(accepted.shape) == (rows,)):
        return Malformed(f"the step must return (accepted [B], tokens [B, {k + 1}])", [])
    count = accepted.long() + 1
    emitted = torch.arange(k + 1) < count.unsqueeze(1)
    out = (accepted < 0) | (accepted > k) | (emitted & ((tokens < 0) | (tokens >= vocab))).any(1)
    if bool(out.any()):
        return Malformed(
            f"accepted counts outside [0, {k}] or emitted tokens outside [0, {vocab}) "
            f"({int(out.sum())} of {rows} rows)",
            [],
        )
    return None


def _raised(exc: Exception) -> Malformed:
    message = (str(exc).strip().splitlines() or [""])[0]
    return Malformed(f"raised {type(exc).__name__}: {message}", [])


# ----------------------------------------------------------------------------------------------
# The exact step with its cache, and its planted bugs (``sequences.SEQUENCE_CONTROLS``)


def make_step(kept_rejected_entry: bool = False, stale_bonus: bool = False) -> Callable:
    """The exact chain step (draft k tokens from q, one target pass over [last, drafts],
    modified rejection sampling, roll the cache back to the accepted prefix), or one bug."""
    from specsim.sampling.verifiers import verify_rejection

    def step(target, drafter, cache, last, randomness):
        k = randomness.accept.shape[1]
        index = torch.arange(last.shape[0])
        a, b = cache.tokens[index, cache.length - 1], last
        drafts, qs = [], []
        for j in range(k):
            q = drafter(a, b)
            x, _ = inverse_cdf(q, randomness.draft[:, j])
            drafts.append(x)
            qs.append(q)
            a, b = b, x
        start = cache.length.clone()
        p = target(cache, torch.stack([last, *drafts], dim=1))
        if stale_bonus:  # the bonus read one position early
            p = torch.cat([p[:, :k], p[:, k - 1 : k]], dim=1)
        drafted = torch.stack(drafts, dim=1)
        out = verify_rejection(
            p, torch.stack(qs, dim=1), drafted, None,
            VerifierRandomness(randomness.accept, randomness.sample), validate=False,
        )  # fmt: skip
        keep = 1 + out.accepted
        if kept_rejected_entry:  # the rejected draft's entry stays in the cache
            keep = keep + (out.accepted < k).long()
        cache.length = start + keep
        return out.accepted, out.tokens

    return step


def uniforms_reused(verify: Callable) -> Callable:
    """``verify`` handed the uniforms of its first call at every later step of the run."""
    first: list[VerifierRandomness] = []

    def reusing(p, q, draft_tokens, tree, randomness):
        if not first or first[0].accept.shape != randomness.accept.shape:
            first[:] = [randomness]
        return verify(p, q, draft_tokens, tree, first[0])

    return reusing


def to_numpy_counts(sequences: torch.Tensor, vocab: int) -> np.ndarray:
    n = sequences.shape[1]
    flat = torch.zeros(sequences.shape[0], dtype=torch.long)
    for j in range(n):
        flat = flat * vocab + sequences[:, j]
    return torch.bincount(flat, minlength=vocab**n).numpy().reshape((vocab,) * n)
