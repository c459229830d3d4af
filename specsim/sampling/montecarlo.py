"""Monte Carlo runs of a real (torch) verifier on the checker's toy problem.

Many independent generations run at once, one per row: each row drafts from q (sampled by inverse
CDF, or argmax for a deterministic drafter), the verifier under test scores the drafts against p,
and rows that have emitted fewer than ``n_tokens`` tokens take another step from their extended
context. The result is a table of counts of the first ``n_tokens`` emitted tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specsim.errors import SpecsimError
from specsim.sampling.logits import process_logits, sample_from_probs
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.randomness import draw_randomness

CHUNK_ROWS = 1 << 15  # rows per batch; fixed so results do not depend on the machine


@dataclass(frozen=True)
class TorchTables:
    """Probability tables ``[V, V, V]`` on the torch side, as the verifier and drafter see them."""

    p: torch.Tensor
    q_draft: torch.Tensor
    q_verify: torch.Tensor | None  # None: deterministic drafter, the verifier gets q=None


def torch_tables(
    models: ToyModels,
    processing: Processing,
    drafter: str = "sample",
    verify_with_raw_q: bool = False,
    dtype: torch.dtype = torch.float32,
) -> TorchTables:
    """Process the toy logits with the real ``process_logits`` (in float64, then cast)."""
    args = (processing.temperature, processing.top_k, processing.top_p)
    p = process_logits(torch.from_numpy(models.target_logits), *args)
    q = process_logits(torch.from_numpy(models.drafter_logits), *args)
    q_verify = process_logits(torch.from_numpy(models.drafter_logits)) if verify_with_raw_q else q
    if drafter == "greedy":
        q = torch.zeros_like(q).scatter_(-1, q.argmax(dim=-1, keepdim=True), 1.0)
        q_verify = None
    return TorchTables(
        p=p.to(dtype),
        q_draft=q.to(dtype),
        q_verify=None if q_verify is None else q_verify.to(dtype),
    )


def run_monte_carlo(
    verifier: Callable,
    tables: TorchTables,
    prompt: tuple[int, int],
    k: int,
    samples: int,
    seed: int,
    *,
    n_tokens: int = 2,
    ragged: bool = False,
) -> np.ndarray:
    """Counts ``[V]*n_tokens`` (int64) of the first emitted tokens over ``samples`` generations.

    Runs on one thread: the tensors are small (V <= 16), so intra-op threads only add contention.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _count(verifier, tables, prompt, k, samples, seed, n_tokens, ragged)
    finally:
        torch.set_num_threads(threads)


def _count(verifier, tables, prompt, k, samples, seed, n_tokens, ragged) -> np.ndarray:
    vocab = tables.p.shape[-1]
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab**n_tokens, dtype=torch.long)
    done = 0
    while done < samples:
        rows = min(CHUNK_ROWS, samples - done)
        emitted = _generate(verifier, tables, prompt, k, rows, n_tokens, ragged, generator)
        flat = torch.zeros(rows, dtype=torch.long)
        for j in range(n_tokens):
            flat = flat * vocab + emitted[:, j]
        counts += torch.bincount(flat, minlength=vocab**n_tokens)
        done += rows
    return counts.numpy().reshape((vocab,) * n_tokens)


def _generate(verifier, tables, prompt, k, rows, n_tokens, ragged, generator) -> torch.Tensor:
    emitted = torch.full((rows, n_tokens), -1, dtype=torch.long)
    have = torch.zeros(rows, dtype=torch.long)
    context = torch.tensor(prompt, dtype=torch.long).expand(rows, 2).clone()
    while bool((have < n_tokens).any()):
        active = (have < n_tokens).nonzero().squeeze(-1)
        tokens, counts = _one_step(verifier, tables, context[active], k, ragged, generator)
        for j in range(k + 1):
            # Append the step's j-th token where the row emitted it and still needs tokens.
            write = (j < counts) & (have[active] < n_tokens)
            rows_w = active[write]
            emitted[rows_w, have[rows_w]] = tokens[write, j]
            have[rows_w] += 1
            context[rows_w] = torch.stack([context[rows_w, 1], tokens[write, j]], dim=1)
    return emitted


def _one_step(verifier, tables, context, k, ragged, generator):
    """Draft, verify, and check the verifier's output. Returns (tokens [R, k+1], counts [R])."""
    rows, vocab = context.shape[0], tables.p.shape[-1]
    if ragged:
        n_drafts = torch.randint(0, k + 1, (rows,), generator=generator)
    else:
        n_drafts = torch.full((rows,), k, dtype=torch.long)
    a, b = context[:, 0], context[:, 1]
    p_rows, q_rows, drafts = [], [], []
    for _ in range(k):
        p_rows.append(tables.p[a, b])
        q_here = tables.q_draft[a, b]
        if tables.q_verify is not None:
            q_rows.append(tables.q_verify[a, b])
        x = sample_from_probs(q_here, torch.rand(rows, generator=generator, dtype=torch.float64))
        drafts.append(x)
        a, b = b, x
    p_rows.append(tables.p[a, b])
    p = torch.stack(p_rows, dim=1)
    q = torch.stack(q_rows, dim=1) if tables.q_verify is not None else None
    draft = torch.stack(drafts, dim=1) if k else torch.zeros((rows, 0), dtype=torch.long)
    # Positions past a row's window are padding, as an engine would pass them.
    draft = torch.where(torch.arange(k) < n_drafts.unsqueeze(1), draft, torch.full_like(draft, -1))
    randomness = draw_randomness(generator, rows, k)
    result = verifier(p, q, draft, n_drafts, randomness)
    return _checked_output(result, draft, n_drafts, vocab, k)


def _checked_output(result, draft, n_drafts, vocab, k):
    """The verifier's tokens and emitted counts, or a clear error if its output is malformed."""
    tokens, accepted = getattr(result, "tokens", None), getattr(result, "accepted", None)
    rows = draft.shape[0]
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (rows, k + 1):
        raise SpecsimError(
            f"verifier returned tokens of shape {getattr(tokens, 'shape', None)}, "
            f"expected {(rows, k + 1)}",
            key="verifier",
            fix="return an object with .accepted [B] and .tokens [B, k+1] (see checker docs)",
        )
    accepted = torch.as_tensor(accepted).long()
    if tuple(accepted.shape) != (rows,) or bool(((accepted < 0) | (accepted > n_drafts)).any()):
        raise SpecsimError(
            "verifier returned accepted counts outside [0, n_drafts]",
            key="verifier",
            fix="accepted[b] counts the accepted drafts of row b",
        )
    counts = accepted + 1
    position = torch.arange(k + 1)
    inside = position < counts.unsqueeze(1)
    tokens = tokens.long()
    bad_range = inside & ((tokens < 0) | (tokens >= vocab))
    bad_prefix = (position[:k] < accepted.unsqueeze(1)) & (tokens[:, :k] != draft)
    if bool(bad_range.any()) or bool(bad_prefix.any()):
        raise SpecsimError(
            "verifier emitted tokens outside the vocabulary, or an accepted prefix that differs "
            "from the drafts",
            key="verifier",
            fix="tokens[b, :accepted[b]] must be the drafts, then one token in [0, V)",
        )
    return tokens, counts
