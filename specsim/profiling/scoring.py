"""Scoring drafters on the target's own text (torch).

The target generates a continuation of each prompt at temperature T; its next-token
distributions p along that text come with the generation. A draft model is run once over the same
text (one batched pass) for its distributions q. At every generated position that gives:

* exact rejection sampling: beta = sum_x min(p(x), q(x)), the probability a draft x ~ q is
  accepted (at T = 0 both are one-hot, so beta is 1 where the argmaxes agree), and
  ``text_accept`` = min(1, q(t) / p(t)) at the text's own token t, the probability that the
  draft was accepted given that the emitted token is t (below);
* greedy verification: whether argmax q == argmax p;
* typical acceptance (lossy): the probability that x ~ q passes p(x) > min(eps, delta exp(-H(p))),
  and the total-variation distance of the token it emits first from p.

Exact rejection sampling is lossless, so the text a speculative run emits is distributed as the
target's own text, and the walk may condition on it. Given that the token emitted at a position
is t, the step's draft there was accepted (and was t) with probability
min(p(t), q(t)) / p(t), independently of the other positions, and after an acceptance the next
draft sees the text's own prefix. The chain statistics of a draft model under exact rejection
walk ``text_accept``: their expected counts are those of the real speculative loop. Chained
beta is not: it averages each position over tokens the draft did not emit, and reads the next
position after the text's token where an accepted draft may have differed: on a two-token
Markov pair (tests/test_profiling_acceptance.py) beta reads low and this walk matches the real
loop (the figures: docs/notes/2026-11-30-acceptance-per-window.md).

A prompt-lookup drafter's proposal from each position is one-hot, so its i-th token x is accepted
with probability p(x) at that position (exact: beta), if it is argmax p (greedy), or if it passes
the typical test; given the emitted text, exact rejection accepted it exactly where x is the
text's token, and that is what its walk chains. Typical acceptance is scored along the target's
text too: it is lossy, so its output is not that text's distribution, and once it accepts a
draft that differs from the text later positions would see another prefix, which the walk
approximates by the text's own (the usual assumption behind acceptance-rate estimates).

Distributions are temperature-only (softmax(logits / T)); top-k/top-p are not profiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specsim.sampling.reference import TYPICAL_DELTA, TYPICAL_EPSILON


@dataclass
class TargetText:
    """One request: prompt ids, generated ids, and the target's logits at each generated step."""

    prompt: list[int]
    tokens: list[int]
    logits: torch.Tensor  # [L, V] float32


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T); at T = 0 the one-hot argmax."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return torch.softmax(logits / temperature, dim=-1)


def typical_threshold(p: torch.Tensor) -> torch.Tensor:
    """Medusa's typical-acceptance threshold min(eps, delta exp(-H(p))) per position."""
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return torch.minimum(
        torch.full_like(entropy, TYPICAL_EPSILON), TYPICAL_DELTA * torch.exp(-entropy)
    )


@torch.no_grad()
def generate_target_text(
    target,
    prompts: Sequence[list[int]],
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator,
    eos_id: int | None = None,
) -> list[TargetText]:
    """Batched generation with a KV cache (ragged prompts); stops each row at EOS."""
    batch = len(prompts)
    longest = max(len(p) for p in prompts)
    device = target.device
    cache = target.new_cache(batch, longest + max_new_tokens)
    padded = torch.zeros(batch, longest, dtype=torch.long)
    for row, ids in enumerate(prompts):
        padded[row, : len(ids)] = torch.tensor(ids)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    logits = target(padded.to(device), cache, n_new=lengths)
    last = logits[torch.arange(batch, device=device), lengths - 1]
    steps_logits, steps_tokens = [], []
    for _ in range(max_new_tokens):
        probs = probabilities(last, temperature)
        if temperature == 0:
            token = probs.argmax(-1)
        else:
            token = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(device)
        steps_logits.append(last.cpu())
        steps_tokens.append(token.cpu())
        last = target(token[:, None], cache)[:, 0]
    all_logits = torch.stack(steps_logits, dim=1)  # [B, L, V]
    all_tokens = torch.stack(steps_tokens, dim=1)  # [B, L]
    result = []
    for row in range(batch):
        ids = all_tokens[row].tolist()
        end = ids.index(eos_id) + 1 if eos_id is not None and eos_id in ids else len(ids)
        result.append(TargetText(list(prompts[row]), ids[:end], all_logits[row, :end]))
    return result


@torch.no_grad()
def drafter_logits(drafter, generations: Sequence[TargetText]) -> list[torch.Tensor]:
    """The drafter's logits at every generated position, from one pass over prompt + text."""
    rows = [g.prompt + g.tokens[:-1] for g in generations]
    longest = max(len(r) for r in rows)
    padded = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, ids in enumerate(rows):
        padded[i, : len(ids)] = torch.tensor(ids)
    cache = drafter.new_cache(len(rows), longest)
    n_new = torch.tensor([len(r) for r in rows], device=drafter.device)
    logits = drafter(padded.to(drafter.device), cache, n_new=n_new).cpu()
    return [
        logits[i, len(g.prompt) - 1 : len(g.prompt) - 1 + len(g.tokens)]
        for i, g in enumerate(generations)
    ]


def draft_model_scores(
    p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float, tokens: Sequence[int]
) -> dict[str, np.ndarray]:
    """Per-position scores of a draft model along the text ``tokens`` (one per position):
    ``beta`` and ``text_accept`` (exact), ``match`` (greedy), ``typical``."""
    p = probabilities(p_logits.float(), temperature)
    q = probabilities(q_logits.float(), temperature)
    beta = torch.minimum(p, q).sum(-1).clamp(0.0, 1.0)
    at = torch.as_tensor(tokens, dtype=torch.long)[:, None]
    p_text, q_text = p.gather(1, at).squeeze(1), q.gather(1, at).squeeze(1)
    # The text was sampled from p, so p_text > 0; a zero (a token p rounds to 0) accepts nothing.
    text_accept = torch.where(p_text > 0, q_text / p_text.clamp_min(1e-30), 0.0).clamp(0.0, 1.0)
    match = (p_logits.argmax(-1) == q_logits.argmax(-1)).double()
    passes = p > typical_threshold(p)[:, None]
    typical = (q * passes).sum(-1).clamp(0.0, 1.0)
    # Typical acceptance is lossy: its first emitted token is the draft where it passes, else
    # argmax p. Its distance from p, per position: TV(q * pass + (1 - typical) argmax, p).
    emitted = q * passes
    emitted[torch.arange(len(p)), p.argmax(-1)] += 1.0 - typical
    tv = 0.5 * (emitted - p).abs().sum(-1)
    return {
        "beta": beta.double().numpy(),
        "text_accept": text_accept.double().numpy(),
        "match": match.numpy(),
        "typical": typical.double().numpy(),
        "typical_tv": tv.double().numpy(),
    }


def ngram_scores(
    p_logits: torch.Tensor,
    proposal_tokens: np.ndarray,
    proposal_lengths: np.ndarray,
    temperature: float,
    text: Sequence[int],
) -> dict[str, np.ndarray]:
    """Acceptance matrices ``[L, k]`` of one-hot proposals along the text ``text`` (entries past
    a proposal are 0). Exact rejection's ``text_accept``: given the emitted text, a one-hot draft
    x was accepted exactly where x is the text's token (min(p(t), 1[x = t]) / p(t))."""
    length, width = proposal_tokens.shape
    p = probabilities(p_logits.float(), temperature).double().numpy()
    argmax = p_logits.argmax(-1).numpy()
    threshold = typical_threshold(torch.from_numpy(p)).numpy()
    # Draft i of the step at s is scored at position s + i, if the proposal has it and the text
    # goes that far.
    offset = np.arange(width)[None, :]
    position = np.arange(length)[:, None] + offset
    real = (offset < proposal_lengths[:, None]) & (position < length)
    at = np.where(real, position, 0)
    token = np.where(real, proposal_tokens, 0)
    prob = np.where(real, p[at, token], 0.0)
    beta = prob
    text_accept = np.where(real, (np.asarray(text)[at] == token).astype(float), 0.0)
    match = np.where(real, (argmax[at] == token).astype(float), 0.0)
    typical = np.where(real, (prob > threshold[at]).astype(float), 0.0)
    # Typical acceptance's first emitted token where the lookup proposes: the proposal if it
    # passes (TV from p: 1 - p(x)), else argmax p (TV: 1 - max p).
    first = real[:, 0]
    tv = np.where(typical[:, 0] > 0, 1.0 - prob[:, 0], 1.0 - p.max(-1))
    return {
        "beta": beta,
        "text_accept": text_accept,
        "match": match,
        "typical": typical,
        "typical_tv": np.where(first, tv, np.nan),
    }
