"""A replica's planned iteration (``Replica._plan_mixed``): its duration, the decoding rows'
drafts and accepted counts, and the prompt chunks that ride in it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specsim.simulation.admission import Chunks

# The plans are slotted classes, read-only by convention, for the reason ``PassTotals`` is.


class DecodePlan:
    """The decoding rows' part of a planned iteration (per occupied slot; -1 in empty ones)."""

    __slots__ = ("accepted", "drafts", "joined", "k", "kv", "verified", "views")

    def __init__(
        self,
        k: int,
        drafts: np.ndarray,
        accepted: np.ndarray,
        verified: float,
        kv: float,
        joined: int,
        views: SlotViews,
    ):
        self.k = k  # the window
        self.drafts = drafts  # tokens each row drafts
        self.accepted = accepted  # of those, accepted
        self.verified = verified  # positions the target verifies, all rows
        self.kv = kv  # KV-cache tokens the rows held when planned
        self.joined = joined  # rows that started decoding since the last decode iteration
        self.views = views  # the batch arrays' slots it covers


class Plan:
    """One planned engine iteration."""

    __slots__ = ("batch", "chunks", "decode", "seconds")

    def __init__(
        self, seconds: float, decode: DecodePlan | None, chunks: Chunks | None, batch: int
    ):
        self.seconds = seconds  # its duration at the median (before jitter)
        self.decode = decode  # None: no row decodes
        self.chunks = chunks  # prompt chunks that ride in it
        self.batch = batch  # sequences in it


class SlotViews(NamedTuple):
    """Views of the batch arrays' occupied prefix (they share memory with the arrays)."""

    remaining: np.ndarray
    context: np.ndarray
    level_shift: np.ndarray
    drafted: np.ndarray
    ones: np.ndarray  # for sums as dot products
