"""The running batch: preallocated caches and sequences whose live rows stay packed at the front.

A forward pass costs what its batch costs, so the engine never runs empty slots: live rows
occupy slots ``0..n-1`` and every pass runs on views of exactly those rows (slicing the cache's
first dimension is a view, so writes land in the shared storage). When a row finishes, the last
live row moves into its slot (a copy of that row's filled cache prefix, O(its tokens)).
"""

from __future__ import annotations

import torch

from specsim.engine.mtp_step import is_mtp
from specsim.engine.step import Rows
from specsim.models import DecoderModel, KVCache


def _move_row(cache: KVCache, src: int, dst: int) -> None:
    used = int(cache.lengths[src])
    for keys, values in zip(cache.keys, cache.values, strict=True):
        keys[dst, :, :used] = keys[src, :, :used]
        values[dst, :, :used] = values[src, :, :used]
    cache.lengths[dst] = cache.lengths[src]


class Batch:
    """``capacity`` slots of ``max_len`` tokens for a target and an optional draft model."""

    def __init__(
        self,
        target: DecoderModel,
        drafter: DecoderModel | None,
        capacity: int,
        max_len: int,
        draft_max_len: int | None = None,
    ):
        self.capacity = capacity
        self.max_len = max_len
        self.target_cache = target.new_cache(capacity, max_len)
        self.draft_cache = (
            None if drafter is None else drafter.new_cache(capacity, draft_max_len or max_len)
        )
        device = target.device
        self.seq = torch.zeros((capacity, max_len), dtype=torch.long, device=device)
        self.s_len = torch.zeros(capacity, dtype=torch.long, device=device)
        # An MTP drafter reads the target's last hidden state per position (one spare slot for
        # padding, as the caches have).
        self.hidden = None
        if is_mtp(drafter):
            width = target.config.hidden_size
            self.hidden = torch.zeros(
                (capacity, max_len + 1, width), dtype=target.dtype, device=device
            )
        self.size = 0  # live rows, in slots 0..size-1

    def rows(self, start: int = 0, stop: int | None = None) -> Rows:
        stop = self.size if stop is None else stop
        return Rows(
            seq=self.seq[start:stop],
            s_len=self.s_len[start:stop],
            target_cache=self.target_cache.view(start, stop),
            draft_cache=None if self.draft_cache is None else self.draft_cache.view(start, stop),
            hidden=None if self.hidden is None else self.hidden[start:stop],
        )

    def add(self, prompts: list[list[int]]) -> tuple[int, int]:
        """Put prompts into the next free slots (empty caches); returns the slot range."""
        start = self.size
        stop = start + len(prompts)
        if stop > self.capacity:
            raise RuntimeError(f"batch holds {self.capacity} rows; {stop} requested")
        for slot, ids in enumerate(prompts, start=start):
            self.seq[slot, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            self.s_len[slot] = len(ids)
        self.target_cache.reset(list(range(start, stop)))
        if self.draft_cache is not None:
            self.draft_cache.reset(list(range(start, stop)))
        self.size = stop
        return start, stop

    def append(self, slot: int, tokens: list[int]) -> None:
        at = int(self.s_len[slot])
        self.seq[slot, at : at + len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        self.s_len[slot] = at + len(tokens)

    def remove(self, slot: int) -> int | None:
        """Free ``slot``; the last live row moves into it. Returns the moved row's old slot."""
        last = self.size - 1
        moved = None
        if slot != last:
            used = int(self.s_len[last])
            self.seq[slot, :used] = self.seq[last, :used]
            self.s_len[slot] = self.s_len[last]
            _move_row(self.target_cache, last, slot)
            if self.draft_cache is not None:
                _move_row(self.draft_cache, last, slot)
            if self.hidden is not None:
                self.hidden[slot, :used] = self.hidden[last, :used]
            moved = last
        self.size = last
        return moved

    def tokens(self, slot: int) -> list[int]:
        return self.seq[slot, : int(self.s_len[slot])].tolist()
