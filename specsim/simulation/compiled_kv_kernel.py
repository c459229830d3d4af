"""The serving kernel's KV-cache rules (numba): what the sequences hold of the cache, counted in
tokens or, with ``engine.block_size`` (``ct[BLOCK_SIZE]``), in whole blocks; and a shared
prefix (``ct[SHARED]``: a system prompt) held once for all the sequences that hit it.

Each kernel stands in for the Python method its docstring names (``admission.py``,
``replica_batch.py``), in the same operations and order: every count is a whole number below
2^53, so the floats here are exact.
"""

from __future__ import annotations

from specsim.simulation.compiled_kernels import _inner
from specsim.simulation.compiled_layout import (
    BLOCK_SIZE,
    DECODE_KV,
    DECODING,
    HIGH,
    HIT,
    PREFILLED,
    RESERVED,
    RID,
    SHARED,
    SHARED_HELD,
    SHARED_TOP,
    SHARED_TOTAL,
    TARGET,
)


@_inner
def _slots(tokens, ct):
    """``Admission.slots``: the cache ``tokens`` slots take (cdiv into blocks, with a size)."""
    size = ct[BLOCK_SIZE]
    if size == 0:
        return tokens
    return -(-tokens // size)


@_inner
def _reservation(req, c, ct, lookahead):
    """``Admission.reservation``: what an admitted prompt holds while in prefill."""
    return _slots(req[c, TARGET] + lookahead, ct)


@_inner
def _kv_in_use(batch, st, ct, lookahead):
    """``Admission.kv_in_use`` of the decoding rows (``BatchRows._held``: their context and
    lookahead, or with a block size ``decode_blocks``, cdiv(context + lookahead) each) and the
    prompts' reservations, a shared prefix counted once."""
    size = ct[BLOCK_SIZE]
    if size == 0:
        used = st[DECODE_KV] + ct[DECODING] * lookahead + st[RESERVED]
    else:
        remaining, context = batch[0], batch[1]
        blocks = 0.0
        for s in range(ct[HIGH]):
            if remaining[s] > 0:
                blocks += -(-(context[s] + lookahead) // size)
        used = blocks + st[RESERVED]
    if ct[SHARED]:
        used -= st[SHARED_TOTAL] - st[SHARED_TOP]
    return used


@_inner
def _overlap(req, c, st, ct):
    """``SharedPrefix.overlap`` of the request's hit (``Admission._shared_size``): what of it the
    holders already hold, which its admission does not need (0 without a shared prefix)."""
    if not ct[SHARED]:
        return 0.0
    return min(req[c, HIT] // max(ct[BLOCK_SIZE], 1), st[SHARED_TOP])


@_inner
def _hold(req, c, st, ct):
    """``SharedPrefix.hold`` for a request whose prefill starts past a hit (``PREFILLED``): it
    holds the hit's blocks (tokens, without a block size) of the shared prefix."""
    if not (ct[SHARED] and req[c, PREFILLED]):
        return
    size = req[c, PREFILLED] // max(ct[BLOCK_SIZE], 1)
    req[c, SHARED_HELD] = size
    st[SHARED_TOTAL] += size
    st[SHARED_TOP] = max(st[SHARED_TOP], size)


@_inner
def _release(req, c, st):
    """``SharedPrefix.release``: the request's hold goes; the physical copy is then the largest
    hold left (among the requests in the table)."""
    size = req[c, SHARED_HELD]
    if size == 0:
        return
    req[c, SHARED_HELD] = 0.0
    st[SHARED_TOTAL] -= size
    if size == st[SHARED_TOP]:
        top = 0.0
        for row in range(req.shape[0]):
            if req[row, RID] >= 0:
                top = max(top, req[row, SHARED_HELD])
        st[SHARED_TOP] = top
