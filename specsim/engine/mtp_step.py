"""The MTP drafter's part of a step (``specsim.models.deepseek_mtp``): what it is fed, and what
its cache keeps.

The module's entry at position p is made from the target's hidden state at p and token p + 1,
so with a row's sequence of ``s_len`` tokens it can hold entries 0 .. s_len - 2. The target's
passes record their hidden states per position (``Rows.hidden``); a step's first MTP pass feeds
the entries it lacks (one after prefill, accepted + 1 after a step) and drafts the token at
s_len; passes 2 .. k feed the module's own output and its last draft. Those later entries are
made from the module's states, not the target's, so the rollback drops them whatever was
accepted: the cache keeps the first pass's entries, ``s_len - 1`` (the step's starting length).

``Faults.mtp_hidden_after_norm`` and ``Faults.mtp_keep_draft_entry`` plant known bugs here.
"""

from __future__ import annotations

import torch

from specsim.sampling.logits import sample_from_probs


def is_mtp(drafter) -> bool:
    return getattr(drafter, "is_mtp", False)


def record_hidden(target, rows, hidden, start: torch.Tensor, n_new: torch.Tensor, faults):
    """Store a target pass's hidden states ``[B, T, h]``, row b's token t at position
    ``start[b] + t`` (padding at the spare slot)."""
    store = rows.hidden
    t = hidden.shape[1]
    offsets = torch.arange(t, device=store.device)[None, :]
    spare = store.shape[1] - 1
    positions = torch.where(offsets < n_new[:, None], start[:, None] + offsets, spare)
    if faults.mtp_hidden_after_norm:
        hidden = target.model.norm(hidden)
    store[torch.arange(store.shape[0], device=store.device)[:, None], positions] = hidden.to(
        store.dtype
    )


def _catch_up_inputs(rows, n_drafts: torch.Tensor):
    """(tokens, hidden, n_new) of the first pass: the entries from the cache's length to
    s_len - 2, fed token p + 1 and hidden state p."""
    cache = rows.draft_cache
    missing = torch.clamp(rows.s_len - 1 - cache.lengths, min=1)
    width = int(missing.max())
    positions = cache.lengths[:, None] + torch.arange(width, device=cache.device)[None, :]
    last = (rows.s_len - 2).clamp(min=0)[:, None]
    positions = torch.minimum(positions, last)
    tokens = rows.seq.gather(1, positions + 1)
    index = positions[..., None].expand(-1, -1, rows.hidden.shape[-1])
    hidden = rows.hidden.gather(1, index)
    n_new = torch.where(n_drafts > 0, missing, torch.zeros_like(missing))
    return tokens, hidden, n_new


def prefill_mtp(drafter, rows) -> None:
    """The module's pass over a prompt: entries 0 .. s_len - 2 (the target's states recorded)."""
    n_new = (rows.s_len - 1).clamp(min=0)
    width = int(n_new.max())
    if width == 0:
        return
    tokens = rows.seq[:, 1 : width + 1]
    drafter(tokens, rows.hidden[:, :width], rows.draft_cache, n_new)


def draft_mtp(
    drafter,
    rows,
    n_drafts: torch.Tensor,
    k: int,
    sampling,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k module passes; returns drafts ``[B, k]`` and their processed q ``[B, k, V]``."""
    tokens, hidden, n_new = _catch_up_inputs(rows, n_drafts)
    batch = rows.seq.shape[0]
    index = torch.arange(batch, device=rows.seq.device)
    drafts, qs = [], []
    for i in range(k):
        logits, out = drafter(tokens, hidden, rows.draft_cache, n_new)
        last = (n_new - 1).clamp(min=0)
        q = sampling.probs(logits[index, last])
        draft = sample_from_probs(q, uniforms[:, i], validate=False)
        drafts.append(draft)
        qs.append(q)
        # The next pass reads the module's own state at the position it just drafted from.
        tokens, hidden = draft[:, None], out[index, last][:, None]
        n_new = (n_drafts > i + 1).long()
    return torch.stack(drafts, dim=1), torch.stack(qs, dim=1)


def mtp_keep(rows, faults) -> torch.Tensor:
    """The entries the module's cache keeps after a step (before the sequence grows)."""
    keep = rows.s_len - 1 + int(faults.mtp_keep_draft_entry)
    return torch.minimum(keep, rows.draft_cache.lengths)
