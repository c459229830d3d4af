"""The serving kernel's prefill (numba): prompt chunks within the token budget, whole prompts
in an iteration of their own, the profile's range check, padded attention's charge, and the
prompts that go through leaving prefill (to finish or start decoding); and the goodput
policy's window weighed against the chunks its rows leave room for.

Each kernel stands in for the Python method its docstring names, in the same operations and
order (``compiled_serving_kernel`` runs them).
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled_admission_kernel import _finish, _hand_off, _start_decoding
from specsim.simulation.compiled_kernels import _inner, _jit
from specsim.simulation.compiled_kv_kernel import _reservation
from specsim.simulation.compiled_layout import (
    FIRST,
    GENERATED,
    HANDS_OFF,
    OUTPUT,
    P_HEAD,
    P_LEN,
    PADDED,
    PENDING,
    PREFILL_COMPUTED,
    PREFILL_FLOPS,
    PREFILLED,
    RANGE_BATCH_HI,
    RANGE_BATCH_LO,
    RANGE_CONTEXT,
    RANGE_NEW_HI,
    RANGE_NEW_LO,
    RESERVED,
    TARGET,
    TOKEN_BUDGET,
)
from specsim.simulation.compiled_step_kernel import (
    T_ATTN,
    T_FLOPS,
    _decode_s,
    _draft_prefill_flops,
    _mixed_s,
    _window,
    best_window,
    goodput_windows,
)


@_inner
def _chunks(req, prefilling, budget, chunk, st, ct):
    """``Admission.chunks``: each prompt's tokens this iteration (into ``chunk``, in order),
    and the rows, tokens, KV tokens read and query-key pairs."""
    count = req.shape[0]
    rows = 0
    tokens = kv = pairs = 0.0
    for j in range(ct[P_LEN]):
        if budget <= 0:
            break
        c = prefilling[(ct[P_HEAD] + j) % count]
        size = min(req[c, TARGET] - req[c, PREFILLED], budget)
        chunk[j] = size
        budget -= size
        tokens += size
        kv += req[c, PREFILLED]
        pairs += size * (req[c, PREFILLED] + (size + 1) / 2.0)
        rows += 1
    return rows, tokens, kv, pairs


@_jit  # (callable from Python: the tests hold it to ``Replica._check_ranges``)
def in_range(req, prefilling, rows, widest, p_rows, chunk, context, used, st, ct):
    """Whether ``Replica._check_ranges`` would pass the iteration silently: its batch, its
    largest cached context (a decoding row's, or a chunk's prompt tokens before it) and its
    rows' new tokens (1 to ``widest`` for the decoding rows, each chunk's size) within the limits
    ``StepCosts.range_limits`` gave (``st[RANGE_*]``)."""
    count = req.shape[0]
    top = 0.0
    low, high = np.inf, -np.inf
    if rows:
        for s in range(used):
            top = max(top, context[s])
        low, high = 1.0, widest
    for j in range(p_rows):
        top = max(top, req[prefilling[(ct[P_HEAD] + j) % count], PREFILLED])
        low, high = min(low, chunk[j]), max(high, chunk[j])
    batch = rows + p_rows
    return (
        st[RANGE_BATCH_LO] <= batch <= st[RANGE_BATCH_HI]
        and top <= st[RANGE_CONTEXT]
        and st[RANGE_NEW_LO] <= low
        and high <= st[RANGE_NEW_HI]
    )


@_inner
def _whole_prompts(req, prefilling, budget, chunk, ct):
    """``Admission.whole_prompts``: the prompts in prefill whole, in order, within the token
    budget (the first always), into ``chunk``; their rows, tokens, KV tokens read, query-key
    pairs, and the longest prompt and cached context."""
    count = req.shape[0]
    rows = 0
    tokens = kv = pairs = longest = reach = 0.0
    for j in range(ct[P_LEN]):
        c = prefilling[(ct[P_HEAD] + j) % count]
        size = req[c, TARGET] - req[c, PREFILLED]
        if rows and tokens + size > budget:
            break
        chunk[j] = size
        tokens += size
        kv += req[c, PREFILLED]
        pairs += size * (req[c, PREFILLED] + (size + 1) / 2.0)
        rows += 1
        longest = max(longest, size)
        reach = max(reach, req[c, PREFILLED])
    return rows, tokens, kv, pairs, longest, reach


@_inner
def _prompts_apart(whole, c, st, ct):
    """``Replica._plan_prefill_only``: an iteration of the prompts whole (``_whole_prompts``'
    totals), their FLOPs counted; returns its seconds."""
    rows, tokens, kv, pairs, longest, reach = whole
    target = c[T_FLOPS] * tokens + c[T_ATTN] * pairs
    st[PREFILL_FLOPS] += target + _draft_prefill_flops(c, tokens, pairs)
    if ct[PADDED]:  # every prompt charged at the longest one's length and cached context
        tokens = rows * longest
        kv, pairs = rows * reach, tokens * (reach + (longest + 1) / 2)
    return _mixed_s(c, 0, 0, 0.0, 0.0, 0.0, rows, tokens, kv, pairs)


@_inner
def _padded_rows(context, used, rows, new_tokens, own_span):
    """``Replica._plan_mixed``'s charge for decoding rows with padded attention: every row's
    attention (and cache read) runs to the longest context; the KV tokens and pairs."""
    longest = 0.0
    for s in range(used):
        longest = max(longest, context[s])
    return rows * longest, new_tokens * longest + own_span


@_inner
def _completing(req, prefilling, rows, chunk, ct):
    """``Admission.completing``: how many prompts the ``rows`` chunks take through."""
    count = req.shape[0]
    through = 0
    for j in range(rows):
        c = prefilling[(ct[P_HEAD] + j) % count]
        if req[c, PREFILLED] + chunk[j] >= req[c, TARGET]:
            through += 1
    return through


@_inner
def _complete(req, prefilling, rows, chunk, done, st, ct, lookahead, now):
    """``Admission.complete``: the chunks counted as run; the prompts now through leave prefill
    (into ``done``, in order) with their first token. Returns how many."""
    count = req.shape[0]
    through = 0
    for j in range(rows):
        c = prefilling[(ct[P_HEAD] + j) % count]
        req[c, PREFILLED] += chunk[j]
        st[PENDING] -= chunk[j]
        st[PREFILL_COMPUTED] += chunk[j]
        if req[c, PREFILLED] >= req[c, TARGET]:
            through += 1
    for j in range(through):  # chunks go in queue order and only the last is partial
        c = prefilling[ct[P_HEAD]]
        ct[P_HEAD] = (ct[P_HEAD] + 1) % count
        ct[P_LEN] -= 1
        done[j] = c
        st[RESERVED] -= _reservation(req, c, ct, lookahead)
        if req[c, FIRST] < 0:
            req[c, FIRST] = now
        req[c, GENERATED] += 1.0
    return through


@_inner
def _through(req, prefilling, p_rows, chunk, done, batch, places, lengths, st, ct, lookahead, end):
    """The prompts' chunks run by ``end`` (``Replica._finish_prefills``): those now through
    finish (their first token their last), or start decoding, or on a prefill replica leave
    for the decode pool (``PrefillReplica._finish_prefills``)."""
    slot_row, join_step, join_left, free, records, queue, pending, rows_free = places
    through = _complete(req, prefilling, p_rows, chunk, done, st, ct, lookahead, end)
    for j in range(through):
        client = done[j]
        if req[client, GENERATED] >= req[client, OUTPUT]:
            _finish(req, client, end, records, queue, pending, rows_free, lengths, st, ct)
        elif ct[HANDS_OFF]:
            _hand_off(req, client, end, records, rows_free, st, ct)
        else:
            _start_decoding(req, client, batch, slot_row, join_step, join_left, free, st, ct)


@_inner
def _goodput_with_chunks(
    goodput, c, rows, kv_tokens, remaining, context, used, req, prefilling, chunk, st, ct
):
    """``GoodputWindow.choose_batch`` with prompt chunks waiting, for ``rows`` > 0: each
    window's score against the chunks ``Admission.chunk_totals`` gives for what its rows leave
    of the token budget (the same chunks for every window once the widest leaves room for
    them all), and its argmax."""
    count = goodput.shape[1]
    k_max = count - 1
    windows = np.empty((4, count))
    mu = goodput_windows(goodput, c, rows, kv_tokens, remaining, context, used, windows)
    budget = st[TOKEN_BUDGET]
    scores = np.empty(count)
    fixed = False
    p_rows, p_tokens, p_kv, p_pairs = 0, 0.0, 0.0, 0.0
    for k in range(count):
        tokens, new, pairs = windows[0, k], windows[1, k], windows[2, k]
        if not fixed:
            p_rows, p_tokens, p_kv, p_pairs = _chunks(req, prefilling, budget - new, chunk, st, ct)
        if p_tokens < budget - rows * (k_max + 1.0):
            fixed = True
        if p_rows:
            added = _mixed_s(c, k, rows, new, kv_tokens, pairs, p_rows, p_tokens, p_kv, p_pairs)
            added -= _mixed_s(c, 0, 0, 0.0, 0.0, 0.0, p_rows, p_tokens, p_kv, p_pairs)
        else:
            added = _decode_s(c, k, rows, new, kv_tokens, pairs)
        scores[k] = mu * tokens - added
    return best_window(scores)


@_inner
def window_goodput(
    by_rows, goodput, c, rows, kv_tokens, remaining, context, used, req, prefilling, chunk, st, ct
):
    """``GoodputWindow.choose_batch``'s window: with prompt chunks waiting, weighed against
    them; without, ``choose_window``'s."""
    if rows == 0:
        return 0
    if ct[P_LEN]:
        return _goodput_with_chunks(
            goodput, c, rows, kv_tokens, remaining, context, used, req, prefilling, chunk, st, ct
        )
    return _window(by_rows, goodput, c, rows, kv_tokens, remaining, context, used)
