"""The compiled kernels (numba): loaded only when ``compiled.active()`` says they run.

Each does what the numpy code it stands in for does, value for value (see ``compiled.py``).
Compiled once per machine into numba's on-disk cache (``compiled.cache_folder``).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)
# Kernels only other kernels call: no CPython wrapper to compile for each.
_inner = numba.njit(cache=True, nogil=True, no_cpython_wrapper=True)


@_inner
def _search_left(table, value):
    """``table.searchsorted(value, side="left")`` for a sorted 1-D table."""
    low, high = 0, table.shape[0]
    while low < high:
        middle = (low + high) >> 1
        if table[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


@_jit
def stretch_rows(
    uniforms,
    per_iteration,
    capacity,
    thresholds,
    counts,
    proposal_rate,
    k,
    shift,
    remaining,
    context,
    m,
    through,
    decode_kv,
):
    """The rows of a stretch of up to ``m`` iterations (``plan_stretch``'s first part), from
    ``m * per_iteration`` uniforms (a slot's acceptance uniform at ``j``, its proposal uniform
    at ``capacity + j``): how many iterations it computed; per field, iteration and slot the
    tokens left, drafts, accepted drafts and context (``per_slot``); whether each row is done;
    per field and iteration the batch size, tokens emitted, new positions, own-span pairs, KV
    tokens and query-key pairs (``per_step``). Few arrays: numba boxes each one it returns."""
    return _stretch_rows(
        uniforms,
        per_iteration,
        capacity,
        thresholds,
        counts,
        proposal_rate,
        k,
        shift,
        remaining,
        context,
        m,
        through,
        decode_kv,
    )


# A kernel called from Python is never called from another kernel: numba's cache then stores it
# without what it needs to hand arrays back to Python ('descr' is NULL in a later process).
@_inner
def _stretch_rows(
    uniforms,
    per_iteration,
    capacity,
    thresholds,
    counts,
    proposal_rate,
    k,
    shift,
    remaining,
    context,
    m,
    through,
    decode_kv,
):
    used = remaining.shape[0]
    per_slot = np.empty((4, m, used))
    done = np.zeros((m, used), dtype=np.bool_)
    per_step = np.zeros((6, m))
    n = _rows(
        uniforms,
        per_iteration,
        capacity,
        thresholds,
        counts,
        proposal_rate,
        k,
        shift,
        remaining,
        context,
        m,
        through,
        decode_kv,
        per_slot,
        done,
        per_step,
    )
    return n, per_slot[:, :n], done[:n], per_step[:, :n]


@_jit
def stretch_rows_drawn(
    words,
    blocks,
    capacity,
    thresholds,
    counts,
    proposal_rate,
    k,
    shift,
    remaining,
    context,
    m,
    through,
    decode_kv,
):
    """``stretch_rows`` with the occupied slots' uniforms drawn here from the PCG64 state
    ``words`` (``pcg_slot_uniforms``: ``blocks`` blocks of ``capacity`` per iteration)."""
    used = remaining.shape[0]
    uniforms = _slot_uniforms(words, m, blocks, capacity, used)
    return _stretch_rows(
        uniforms,
        blocks * used,
        used,
        thresholds,
        counts,
        proposal_rate,
        k,
        shift,
        remaining,
        context,
        m,
        through,
        decode_kv,
    )


@_inner
def _rows(
    uniforms,
    per_iteration,
    capacity,
    thresholds,
    counts,
    proposal_rate,
    k,
    shift,
    remaining,
    context,
    m,
    through,
    decode_kv,
    per_slot,
    done,
    per_step,
):
    used = remaining.shape[0]
    proposals = proposal_rate < 1.0
    window = np.float64(k)
    widest = k + 1.0
    left, drafts, accepted, contexts = per_slot[0], per_slot[1], per_slot[2], per_slot[3]
    rows, totals, new, own_span, kv, pairs = (
        per_step[0],
        per_step[1],
        per_step[2],
        per_step[3],
        per_step[4],
        per_step[5],
    )
    emitted_by = np.zeros(used)  # tokens each row has emitted before the step
    emitted_total = 0.0  # tokens emitted before the step, all rows (for KV without finishes)
    n = m
    for i in range(m):
        base = i * per_iteration
        alive_rows = 0.0
        finished = False
        accepted_sum = drafted = squares = drafts_by_context = kv_sum = 0.0
        for j in range(used):
            occupied = remaining[j] > 0.0
            raw = 0.0
            cap = 0.0
            if k == 0:
                uncapped = 1.0 if occupied else 0.0
            else:
                raw = counts[_search_left(thresholds, shift[j] + uniforms[base + j])]
                if proposals:
                    cap = window if uniforms[base + capacity + j] < proposal_rate else 0.0
                    uncapped = min(raw, cap)
                else:
                    uncapped = min(raw, window)
                uncapped = (uncapped + 1.0) * (1.0 if occupied else 0.0)
            before = emitted_by[j]
            emitted_by[j] = before + uncapped
            if emitted_by[j] >= (remaining[j] if occupied else np.inf):
                done[i, j] = True
                finished = True
            alive = before < remaining[j]
            row_left = remaining[j] - before
            if through:
                row_left = max(row_left, 0.0)
                if alive:
                    alive_rows += 1.0
            drafted_j = min(row_left, widest) - 1.0
            if proposals and k != 0:
                drafted_j = min(drafted_j, cap)
            accepted_j = drafted_j if k == 0 else min(raw, drafted_j)
            row_context = context[j] + before
            if through and not alive:
                row_context = 0.0  # a slot whose row has left holds no context
            left[i, j] = row_left
            drafts[i, j] = drafted_j
            accepted[i, j] = accepted_j
            contexts[i, j] = row_context
            accepted_sum += accepted_j
            drafted += drafted_j
            squares += drafted_j * drafted_j
            drafts_by_context += drafted_j * row_context
            kv_sum += row_context
        if through:
            rows[i] = alive_rows
            if alive_rows == 0.0:  # the last row has left: the stretch stops before this step
                n = i
                break
        totals[i] = accepted_sum + used
        new[i] = drafted + used
        own_span[i] = 0.5 * (squares + 2.0 * drafted + used + new[i])
        if through:
            kv[i] = kv_sum
        else:
            kv[i] = decode_kv + emitted_total
            emitted_total += totals[i]
        pairs[i] = drafts_by_context + kv[i] + own_span[i]
        if finished and not through:  # up to the first finish
            n = i + 1
            break
    return n


# PCG64 as numpy runs it (pcg64.h): a 128-bit LCG, state = state * MULTIPLIER + inc, stepped
# before each output; the output is XSL-RR of the new state; random() is (x >> 11) * 2^-53.
# 128-bit numbers are (high, low) pairs of uint64; every constant is a uint64 so that numba
# never mixes in a signed integer (which would turn the arithmetic into floats).
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_S58 = np.uint64(58)
_S63 = np.uint64(63)
_S64 = np.uint64(64)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_MULT_HIGH = np.uint64(2549297995355413924)
_MULT_LOW = np.uint64(4865540595714422341)
_TO_DOUBLE = 1.0 / 9007199254740992.0


@_inner
def _mul_high(a, b):
    """The high 64 bits of the 128-bit product of two uint64."""
    a0, a1 = a & _MASK32, a >> _S32
    b0, b1 = b & _MASK32, b >> _S32
    t = a0 * b0
    k = t >> _S32
    t = a1 * b0 + k
    w1, w2 = t & _MASK32, t >> _S32
    t = a0 * b1 + w1
    return a1 * b1 + w2 + (t >> _S32)


@_inner
def _mul128(a_high, a_low, b_high, b_low):
    return _mul_high(a_low, b_low) + a_high * b_low + a_low * b_high, a_low * b_low


@_inner
def _add128(a_high, a_low, b_high, b_low):
    low = a_low + b_low
    carry = _U1 if low < a_low else _U0
    return a_high + b_high + carry, low


@_inner
def _jump(inc_high, inc_low, delta):
    """(multiplier, increment) that advance the LCG by ``delta`` steps at once (the
    jump-ahead numpy's ``PCG64.advance`` uses)."""
    mult_high, mult_low = _MULT_HIGH, _MULT_LOW
    plus_high, plus_low = inc_high, inc_low
    acc_mult_high, acc_mult_low = _U0, _U1
    acc_plus_high, acc_plus_low = _U0, _U0
    while delta > 0:
        if delta & 1:
            acc_mult_high, acc_mult_low = _mul128(acc_mult_high, acc_mult_low, mult_high, mult_low)
            h, lo = _mul128(acc_plus_high, acc_plus_low, mult_high, mult_low)
            acc_plus_high, acc_plus_low = _add128(h, lo, plus_high, plus_low)
        h, lo = _add128(mult_high, mult_low, _U0, _U1)
        plus_high, plus_low = _mul128(h, lo, plus_high, plus_low)
        mult_high, mult_low = _mul128(mult_high, mult_low, mult_high, mult_low)
        delta >>= 1
    return acc_mult_high, acc_mult_low, acc_plus_high, acc_plus_low


@_inner
def _apply(words, mult_high, mult_low, plus_high, plus_low):
    h, lo = _mul128(words[0], words[1], mult_high, mult_low)
    words[0], words[1] = _add128(h, lo, plus_high, plus_low)


@_jit
def pcg_advance(words, delta):
    """Advance the state ``words`` (state high, low, inc high, low) by ``delta`` draws."""
    if delta > 0:
        mult_high, mult_low, plus_high, plus_low = _jump(words[2], words[3], np.uint64(delta))
        _apply(words, mult_high, mult_low, plus_high, plus_low)


@_inner
def _next_double(words):
    high, low = _mul128(words[0], words[1], _MULT_HIGH, _MULT_LOW)
    high, low = _add128(high, low, words[2], words[3])
    words[0], words[1] = high, low
    rotation = high >> _S58
    x = high ^ low
    x = (x >> rotation) | (x << ((_S64 - rotation) & _S63))
    return np.float64(x >> _S11) * _TO_DOUBLE


@_jit
def pcg_random(words, out):
    """Fill ``out`` with the next doubles, as ``Generator.random`` would."""
    for i in range(out.shape[0]):
        out[i] = _next_double(words)


@_jit
def pcg_slot_uniforms(words, m, blocks, capacity, used):
    """``_slot_uniforms`` (for Python callers: see ``_stretch_rows``)."""
    return _slot_uniforms(words, m, blocks, capacity, used)


@_inner
def _slot_uniforms(words, m, blocks, capacity, used):
    """The doubles of the first ``used`` slots of ``m`` iterations that each draw ``blocks``
    blocks of ``capacity`` (``(m, blocks * used)``, flat), jumping over the other slots' draws;
    ``words`` is left where the ``m * blocks * capacity`` draws would leave it."""
    out = np.empty(m * blocks * used)
    skip = np.uint64(capacity - used)
    mult_high, mult_low, plus_high, plus_low = _jump(words[2], words[3], skip)
    at = 0
    for _ in range(m * blocks):
        for _ in range(used):
            out[at] = _next_double(words)
            at += 1
        if skip > 0:
            _apply(words, mult_high, mult_low, plus_high, plus_low)
    return out
