"""Monte Carlo runs of a real (torch) verifier on the checker's toy problem.

Many independent generations run at once, one per row: each row drafts from q (sampled by inverse
CDF, or argmax for a deterministic drafter), the verifier under test scores the drafts against p
(called as ``harness`` describes), and rows that have emitted fewer than ``n_tokens`` tokens take
another step from their extended context. The result is a table of counts of the first
``n_tokens`` emitted tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specsim.sampling.harness import Malformed, VerifierTables, call_verifier
from specsim.sampling.logits import sample_from_probs
from specsim.sampling.randomness import draw_randomness

CHUNK_ROWS = 1 << 15  # rows per batch; fixed so results do not depend on the machine


def run_monte_carlo(
    verifier: Callable,
    tables: VerifierTables,
    prompt: tuple[int, int],
    k: int,
    samples: int,
    seed: int,
    *,
    n_tokens: int = 2,
    ragged: bool = False,
) -> np.ndarray | Malformed:
    """Counts ``[V]*n_tokens`` (int64) of the first emitted tokens over ``samples`` generations,
    or the ``Malformed`` verdict of the first output that breaks the verifier contract.

    Runs on one thread: the tensors are small (V <= 16), so intra-op threads only add contention.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _count(verifier, tables, prompt, k, samples, seed, n_tokens, ragged)
    finally:
        torch.set_num_threads(threads)


def _count(verifier, tables, prompt, k, samples, seed, n_tokens, ragged):
    vocab = tables.vocab
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab**n_tokens, dtype=torch.long)
    done = 0
    while done < samples:
        rows = min(CHUNK_ROWS, samples - done)
        emitted = _generate(verifier, tables, prompt, k, rows, n_tokens, ragged, generator)
        if isinstance(emitted, Malformed):
            return emitted
        flat = torch.zeros(rows, dtype=torch.long)
        for j in range(n_tokens):
            flat = flat * vocab + emitted[:, j]
        counts += torch.bincount(flat, minlength=vocab**n_tokens)
        done += rows
    return counts.numpy().reshape((vocab,) * n_tokens)


def _generate(verifier, tables, prompt, k, rows, n_tokens, ragged, generator):
    emitted = torch.full((rows, n_tokens), -1, dtype=torch.long)
    have = torch.zeros(rows, dtype=torch.long)
    context = torch.tensor(prompt, dtype=torch.long).expand(rows, 2).clone()
    while bool((have < n_tokens).any()):
        active = (have < n_tokens).nonzero().squeeze(-1)
        step = _one_step(verifier, tables, context[active], k, ragged, generator)
        if isinstance(step, Malformed):
            return step
        tokens, counts = step
        for j in range(k + 1):
            # Append the step's j-th token where the row emitted it and still needs tokens.
            write = (j < counts) & (have[active] < n_tokens)
            rows_w = active[write]
            emitted[rows_w, have[rows_w]] = tokens[write, j]
            have[rows_w] += 1
            context[rows_w] = torch.stack([context[rows_w, 1], tokens[write, j]], dim=1)
    return emitted


def _one_step(verifier, tables, context, k, ragged, generator):
    """Draft from the processed q, call the verifier, read its output (see ``harness``)."""
    rows = context.shape[0]
    if ragged:
        n_drafts = torch.randint(0, k + 1, (rows,), generator=generator)
    else:
        n_drafts = torch.full((rows,), k, dtype=torch.long)
    a, b = context[:, 0], context[:, 1]
    drafts = []
    for _ in range(k):
        u = torch.rand(rows, generator=generator, dtype=torch.float64)
        x = sample_from_probs(tables.q_draft[a, b], u)
        drafts.append(x)
        a, b = b, x
    draft = torch.stack(drafts, dim=1) if k else torch.zeros((rows, 0), dtype=torch.long)
    # Positions past a row's window are padding, as an engine would pass them.
    draft = torch.where(torch.arange(k) < n_drafts.unsqueeze(1), draft, torch.full_like(draft, -1))
    randomness = draw_randomness(generator, rows, k)
    return call_verifier(verifier, tables, context, draft, n_drafts, randomness)
