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
