"""The attention of a tree call: which cache slots each tree node sees, and its position.

A tree step lays its nodes out in the cache as a *region* of consecutive slots per row, starting
at ``start[b]``: the verification pass writes ``[last token, node 0, node 1, ...]`` there, a
drafter pass the nodes it feeds depth by depth. Every slot before ``start[b]`` is the row's
committed sequence, which every node sees; inside the region a node sees itself and its
ancestors only (``ancestors[r, r']``: region entry r' is r or above it), the tree attention mask
SpecInfer and Medusa use. A node's rotary position is ``start[b] + offset[r]``, the position it
would have in a sequence that ran down its path, so a node's keys, values and logits are those
of a causal pass over the committed sequence plus its path.
"""

from __future__ import annotations

import numpy as np
import torch

from specsim.models.masks import TreeAttention
from specsim.tree import TreeShape


def region_attention(
    start: torch.Tensor,
    ancestors: np.ndarray | torch.Tensor,
    offsets: np.ndarray | torch.Tensor,
    queries: np.ndarray | torch.Tensor,
    window: int | None = None,
) -> TreeAttention:
    """The attention of a call feeding region entries ``queries`` (the region's last T entries,
    in order) over a region of R entries per row; ``offsets [R]`` are the entries' positions
    past ``start``. A sliding window (Mistral's) counts positions, not slots."""
    device = start.device
    ancestors = torch.as_tensor(ancestors, dtype=torch.bool, device=device)
    offsets = torch.as_tensor(offsets, dtype=torch.long, device=device)
    queries = torch.as_tensor(queries, dtype=torch.long, device=device)
    regions = ancestors.shape[0]
    slots = int(start.max()) + regions
    slot = torch.arange(slots, device=device)[None, :]
    rel = slot - start[:, None]  # [B, S]: the slot's region entry
    inside = (rel >= 0) & (rel < regions)
    seen = ancestors[queries]  # [T, R]
    batch, t = start.shape[0], queries.shape[0]
    at = rel.clamp(0, regions - 1)[:, None, :].expand(batch, t, slots)
    in_tree = seen[None].expand(batch, t, regions).gather(2, at) & inside[:, None, :]
    visible = (rel < 0)[:, None, :] | in_tree
    positions = start[:, None] + offsets[queries][None, :]
    if window is not None:
        key_positions = torch.where(inside, start[:, None] + offsets[at[:, 0]], slot)
        visible &= key_positions[:, None, :] > positions[:, :, None] - window
    return TreeAttention(positions=positions, visible=visible)


def verification_attention(
    start: torch.Tensor, shape: TreeShape, window: int | None = None
) -> TreeAttention:
    """The target's pass over ``[last token, nodes...]`` from slot ``start`` (the last token's):
    the last token is the root every node hangs under."""
    n = shape.num_nodes
    ancestors = np.zeros((n + 1, n + 1), dtype=bool)
    ancestors[:, 0] = True
    ancestors[1:, 1:] = shape.ancestors
    offsets = np.concatenate([[0], shape.depths])
    return region_attention(start, ancestors, offsets, np.arange(n + 1), window)
