"""Where a cached call's tokens go and what each query may attend to: causal, within a sliding
window, or laid out as a speculation tree (``TreeAttention``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.models.cache import KVCache


@dataclass(frozen=True)
class TreeAttention:
    """A cached call's tokens as tree nodes: ``positions [B, T]`` (rotary positions) and
    ``visible [B, T, S]`` (the cache slots each token attends to, its own slot included; S at
    least the longest row's end). Built by ``specsim.engine.tree_attention``; a sliding window,
    if any, is the caller's to apply."""

    positions: torch.Tensor
    visible: torch.Tensor


class CacheStep:
    """Where one call's tokens go in the cache, and what each query may attend to.

    Real tokens go to their row's next slots; padding goes to the cache's spare slot (index
    ``max_len``), which no query ever sees. So writing needs no data-dependent indexing and the
    whole call costs one device-to-host sync (``kv_len``, read together with the input checks).
    """

    def __init__(
        self,
        cache: KVCache,
        real: torch.Tensor,
        kv_len: int,
        window: int | None,
        tree: TreeAttention | None = None,
    ):
        t = real.shape[1]
        self.positions_bt = cache.lengths[:, None] + torch.arange(t, device=cache.device)
        self.slots = torch.where(real, self.positions_bt, cache.max_len)
        # Attend up to the longest row's new end; at least one slot, so a query that is all
        # padding still has a (finite) key and no NaN appears.
        self.kv_len = max(kv_len, 1)
        if tree is not None:
            self.positions_bt = tree.positions.to(cache.device)
            self.mask = tree.visible[:, :, : self.kv_len].to(cache.device)[:, None]
            return
        visible = torch.arange(self.kv_len, device=cache.device)
        self.mask = _visible(visible[None, None, :], self.positions_bt[:, :, None], window)[:, None]


class WindowMask:
    """A cache-free pass over more tokens than the sliding window: an explicit mask."""

    def __init__(self, t: int, window: int, device: torch.device):
        positions = torch.arange(t, device=device)
        self.mask = _visible(positions[None, :], positions[:, None], window)[None, None]


def _visible(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal visibility; with a sliding window, only the last ``window`` positions (the query's
    own included), as Mistral defines it."""
    seen = key_pos <= query_pos
    return seen if window is None else seen & (key_pos > query_pos - window)
