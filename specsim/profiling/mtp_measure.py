"""Measuring an MTP drafter (``specsim.models.deepseek_mtp``): its passes timed as the grid times
a model, and its drafts scored on the target's text (torch).

Timing: ``TimedMTP`` is the module as ``specsim.profiling.timing`` times a model, a
``(tokens, cache)`` pass, fed fixed random hidden states in place of the target's (the pass's
cost does not depend on their values). Each pass reads the module's weights and the vocabulary
head it shares with the target, as the roofline costs it.

Acceptance: a draft model's q at a position does not depend on where its step started; the MTP
module's does (draft i + 1 of a step comes from its i-th pass on its own state). So its drafts
are scored per start, as prompt lookup's are (``specsim.profiling.acceptance``'s ``A[s, i]``):
the step that drafts generated position s runs pass 1 on the target's states (entry
``P + s - 2``, P the prompt's length), then passes 2 .. K along the text (given the emitted
text, an accepted draft is the text's token), each on a copy of the module's cache that holds
the entries that step would see: the engine's ``draft_mtp`` on every start at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specsim.profiling.acceptance import MAX_K

SCORES = ("beta", "text_accept", "match", "typical", "typical_tv")


class TimedMTP:
    """The MTP drafter as a ``(tokens, cache)`` model for the timing grid."""

    def __init__(self, drafter, seed: int = 0):
        self.drafter = drafter
        self.config = drafter.config
        self.device = drafter.device
        self._generator = torch.Generator().manual_seed(seed)
        self._hidden: dict[tuple[int, int], torch.Tensor] = {}

    def new_cache(self, batch_size: int, max_len: int):
        return self.drafter.new_cache(batch_size, max_len)

    def __call__(self, tokens: torch.Tensor, cache, n_new=None) -> torch.Tensor:
        shape = tuple(tokens.shape)
        if shape not in self._hidden:
            states = torch.randn(*shape, self.config.hidden_size, generator=self._generator)
            self._hidden[shape] = states.to(self.device, self.drafter.dtype)
        n_new = torch.full((shape[0],), shape[1]) if n_new is None else n_new
        return self.drafter(tokens, self._hidden[shape], cache, n_new)[0]


@torch.no_grad()
def mtp_start_logits(drafter, prompt: list[int], tokens: list[int], depth: int = MAX_K):
    """``(q [L, depth, V], drafts [L])``: the module's logits for draft i + 1 of the step that
    drafts generated position s (position s + i), and how many drafts that step offers (0
    where the prompt is too short for an entry, else ``depth``; positions past the text are
    left as zeros and not offered by the walk's window)."""
    target, device = drafter.target, drafter.device
    seq = torch.tensor(prompt + tokens, dtype=torch.long, device=device)
    n, p_len, length = len(seq), len(prompt), len(tokens)
    if n < 3:
        return torch.zeros(length, depth, target.config.vocab_size), np.zeros(length, np.int64)
    # The target's states at positions 0 .. n - 2 (the last token is never fed before a step).
    t_cache = target.new_cache(1, n)
    _, hidden = target(seq[None, : n - 1], t_cache, return_hidden=True)
    cache = drafter.new_cache(1, n + depth)
    logits, out = drafter(seq[None, 1 : n - 1], hidden[:, : n - 2], cache, torch.tensor([n - 2]))
    starts = np.arange(length)
    first = p_len + starts - 2  # the entry that drafts generated position s
    valid = first >= 0
    rows = torch.as_tensor(first[valid], device=device)
    q = torch.zeros(length, depth, logits.shape[-1])
    q[valid, 0] = logits[0, rows].float().cpu()
    if depth > 1 and len(rows):
        many = drafter.new_cache(len(rows), n + depth)
        pairs = zip((*many.keys, *many.values), (*cache.keys, *cache.values), strict=True)
        for store, src in pairs:
            store.copy_(src.expand_as(store))
        many.lengths.copy_(rows + 1)
        state = out[0, rows][:, None]
        for i in range(1, depth):
            # Pass i + 1 writes entry rows + i, fed the text's token there and the module's
            # last state; a row whose draft would fall past the text stops.
            live = (rows + i <= n - 3).long()
            if not bool(live.any()):
                break
            fed = seq[torch.clamp(rows + i + 1, max=n - 1)][:, None]
            step_logits, step_out = drafter(fed, state, many, live)
            q[valid, i] = step_logits[:, 0].float().cpu()
            state = step_out
    return q, np.where(valid, depth, 0).astype(np.int64)


def mtp_scores(drafter, generations: Sequence, temperature: float) -> dict[str, list]:
    """Per request the start-dependent matrices ``[L, MAX_K]`` of every score, and the drafts
    offered per start (``drafts``), as ``ngram_scores`` gives them for prompt lookup."""
    from specsim.profiling.scoring import draft_model_scores

    rows: dict[str, list] = {key: [] for key in (*SCORES, "drafts")}
    for g in generations:
        q, drafts = mtp_start_logits(drafter, g.prompt, g.tokens)
        length = len(g.tokens)
        matrices = {key: np.zeros((length, MAX_K)) for key in SCORES}
        matrices["typical_tv"][:] = np.nan
        for i in range(MAX_K):
            starts = np.flatnonzero((drafts > 0) & (np.arange(length) + i < length))
            if not len(starts):
                continue
            at = starts + i
            scores = draft_model_scores(
                g.logits[at], q[starts, i], temperature, [g.tokens[j] for j in at]
            )
            for key in SCORES:
                matrices[key][starts, i] = scores[key]
        for key in SCORES:
            rows[key].append(matrices[key])
        # Typical acceptance's distance from p is its first emitted token's: depth 1 only.
        rows["typical_tv"][-1] = np.where(drafts > 0, matrices["typical_tv"][:, 0], np.nan)
        rows["drafts"].append(drafts)
    return rows
