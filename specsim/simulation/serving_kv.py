"""The serving table's admission rules (``serving_table.py``, for ``compiled_kv_kernel`` and
``compiled_admission_kernel``): the lengths that fit the cache, the block size, a shared
prefix's holders and the workload's acceptance shift packed into the kernel's state, and the
holders written back after a call."""

from __future__ import annotations

import numpy as np

from specsim.simulation.admission import Admission, fitting
from specsim.simulation.compiled_layout import (
    BLOCK_SIZE,
    RID,
    SHARED,
    SHARED_HELD,
    SHARED_TOP,
    SHARED_TOTAL,
    SHIFT_AT,
    SHIFT_LEVELS,
    SHIFT_RID,
)


def fitting_lengths(admission: Admission, prompts, outputs) -> np.ndarray:
    """Prompt and output lengths up to (not with) the first that never fits the cache: the
    per-iteration path refuses it when it reaches the replica, so Python takes it."""
    lengths = np.array([prompts, outputs], dtype=np.float64).reshape(2, -1)
    cache = (admission.lookahead, admission.kv_capacity, admission.block_size)
    return lengths[:, : fitting(*lengths, *cache)]


def pack_kv(admission: Admission, st: np.ndarray, ct: np.ndarray) -> None:
    """The block size (0: the cache counted in tokens), and whether the prefix is shared with
    the sum and the largest of its holders' holds."""
    ct[BLOCK_SIZE] = admission.block_size or 0
    shared = admission.shared
    ct[SHARED] = shared is not None
    if shared is not None:
        st[SHARED_TOTAL], st[SHARED_TOP] = shared.total, shared.top
    pack_shift(admission.acceptance, st, ct)


def pack_shift(acceptance, st: np.ndarray, ct: np.ndarray) -> None:
    """The workload's acceptance shift as ``RateAcceptance.request_level`` applies it: a request
    from the index or arrival time on takes its drawn level ``SHIFT_LEVELS`` further on."""
    shift = getattr(acceptance, "shift", None)
    ct[SHIFT_LEVELS] = 0 if shift is None else acceptance.base_levels
    st[SHIFT_RID] = st[SHIFT_AT] = np.inf
    if shift is not None and shift.after_requests is not None:
        st[SHIFT_RID] = shift.after_requests
    elif shift is not None:
        st[SHIFT_AT] = shift.after_s


def shared_held(admission: Admission, request) -> int:
    """What ``request`` holds of a shared prefix (0: nothing, or no shared prefix)."""
    shared = admission.shared
    return 0 if shared is None else shared.holders.get(request.rid, 0)


def unpack_holders(admission: Admission, req: np.ndarray, st: np.ndarray) -> None:
    """A shared prefix's holders as a call left them: the requests in flight that hold."""
    shared = admission.shared
    if shared is None:
        return
    rows = np.flatnonzero((req[:, RID] >= 0) & (req[:, SHARED_HELD] > 0))
    sizes = req[rows, SHARED_HELD].astype(np.int64).tolist()
    shared.holders = dict(zip(req[rows, RID].astype(np.int64).tolist(), sizes, strict=True))
    shared.total, shared.top = int(st[SHARED_TOTAL]), int(st[SHARED_TOP])
