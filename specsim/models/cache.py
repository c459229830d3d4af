"""A preallocated key/value cache with one length per row.

Rows of a batch hold different numbers of tokens, and after a partial rejection one row can give
back tokens while the others keep theirs. So the cache keeps ``lengths[b]`` per row and the model
masks everything at or beyond it; rolling back only lowers lengths (the stale keys and values stay
in memory and are overwritten by the next tokens), so it costs O(batch), never a copy.
"""

from __future__ import annotations

import torch

from specsim.errors import SpecsimError


class KVCache:
    """Keys and values of every layer, ``[batch, kv_heads, max_len + 1, head_dim]`` each (the
    values ``value_dim`` wide where it is given). Multi-head latent attention stores its
    compressed latent in ``keys`` and its rotated shared key in ``values``, one head each."""

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        value_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if batch_size < 1 or max_len < 1:
            raise SpecsimError(
                f"cache needs batch_size >= 1 and max_len >= 1 (got {batch_size}, {max_len})",
                key="new_cache",
                fix="give a positive batch size and length",
            )
        # One spare slot past max_len receives padding tokens' keys; nothing ever attends to it.
        shape = (batch_size, num_kv_heads, max_len + 1, head_dim)
        value_shape = (*shape[:-1], head_dim if value_dim is None else value_dim)
        # Zeros, not empty: masked-out slots still enter the attention matmul, so they must be
        # finite numbers (a NaN times a zero weight is still NaN).
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [
            torch.zeros(value_shape, dtype=dtype, device=device) for _ in range(num_layers)
        ]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.max_len = max_len

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    def nbytes(self) -> int:
        """Memory held by the keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def _as_lengths(self, new_lengths: torch.Tensor | list[int] | int) -> torch.Tensor:
        if isinstance(new_lengths, int):
            return torch.full_like(self.lengths, new_lengths)
        lengths = torch.as_tensor(new_lengths, dtype=torch.long, device=self.device)
        if lengths.shape != self.lengths.shape:
            raise SpecsimError(
                f"expected {self.batch_size} lengths, got shape {tuple(lengths.shape)}",
                key="rollback",
                fix="give one length per row",
            )
        return lengths

    def rollback(self, new_lengths: torch.Tensor | list[int] | int) -> None:
        """Keep only the first ``new_lengths[b]`` tokens of each row (never grows a row)."""
        lengths = self._as_lengths(new_lengths)
        if bool((lengths < 0).any()) or bool((lengths > self.lengths).any()):
            raise SpecsimError(
                f"rollback to {lengths.tolist()} but rows hold {self.lengths.tolist()}",
                key="rollback",
                fix="roll back to a length between 0 and the row's current length",
            )
        self.lengths.copy_(lengths)

    def reset(self, rows: torch.Tensor | list[int] | None = None) -> None:
        """Empty the given rows (all rows by default), e.g. to reuse a slot for a new request."""
        if rows is None:
            self.lengths.zero_()
        else:
            self.lengths[torch.as_tensor(rows, dtype=torch.long, device=self.device)] = 0

    def view(self, start: int, stop: int) -> KVCache:
        """Rows ``start:stop`` as a cache sharing this one's storage (and its lengths): passes
        and rollbacks on the view act on those rows here, with no copy."""
        view = KVCache.__new__(KVCache)
        view.keys = [k[start:stop] for k in self.keys]
        view.values = [v[start:stop] for v in self.values]
        view.lengths = self.lengths[start:stop]
        view.max_len = self.max_len
        return view

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        """Store new keys/values ``[batch, kv_heads, T, head_dim]``; token t of row b goes to
        slot ``slots[b, t]`` of its row (the spare slot ``max_len`` for padding)."""
        rows = torch.arange(self.batch_size, device=self.device)[:, None]
        self.keys[layer][rows, :, slots] = keys.transpose(1, 2)
        self.values[layer][rows, :, slots] = values.transpose(1, 2)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Row b's slots ``src[b, j]`` copied to ``dst[b, j]`` in every layer (all read before
        any is written, so the two may overlap): a tree step keeps its accepted path's nodes
        this way, moving them from where the tree laid them out to the row's next slots."""
        src, dst = src.to(self.device), dst.to(self.device)
        rows = torch.arange(self.batch_size, device=self.device)[:, None]
        for cache in (*self.keys, *self.values):
            cache[rows, :, dst] = cache[rows, :, src]
