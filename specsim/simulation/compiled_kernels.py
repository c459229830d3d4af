"""The compiled kernels (numba): loaded only when ``compiled.active()`` says they run.

Each does what the numpy code it stands in for does, value for value (see ``compiled.py``).
``cache=True``: numba keeps the machine code beside this file (or in its user cache), so a
machine compiles them once, a few seconds, and later processes load them.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
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
    """The rows of a stretch of up to ``m`` iterations (``plan_stretch``'s first part): how many
    it computed, each iteration's batch size, and per iteration and slot the tokens left,
    drafts, accepted drafts, context and whether the row is done; per iteration the tokens
    emitted, new positions, own-span pairs, KV tokens and query-key pairs."""
    used = remaining.shape[0]
    proposals = proposal_rate < 1.0
    window = np.float64(k)
    widest = k + 1.0
    rows = np.zeros(m)
    left = np.empty((m, used))
    drafts = np.empty((m, used))
    accepted = np.empty((m, used))
    contexts = np.empty((m, used))
    done = np.zeros((m, used), dtype=np.bool_)
    totals = np.empty(m)
    new = np.empty(m)
    own_span = np.empty(m)
    kv = np.empty(m)
    pairs = np.empty(m)
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
    return (
        n,
        rows[:n],
        left[:n],
        drafts[:n],
        accepted[:n],
        contexts[:n],
        done[:n],
        totals[:n],
        new[:n],
        own_span[:n],
        kv[:n],
        pairs[:n],
    )
