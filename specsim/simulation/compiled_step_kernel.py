"""The compiled loops' shared parts (numba): the cost model, the window policy and a decode step.

The cost model is ``costs.formula`` compiled, the source ``StepCosts`` runs interpreted
(``cost_parts``, ``mixed_seconds`` and ``choose_window`` expose it to the tests);
``draw_rows``, ``row_totals`` and ``emit_rows`` are a decode step's parts as
``Replica._plan_mixed`` and ``_apply_mixed`` run them: the drafts and the acceptance draws from
the PCG64 state (a block of ``capacity`` doubles per draw, of which the occupied slots' are read
and the rest jumped over), the verified positions and query-key pairs, and the emitted tokens
with the step log's row. Used by ``compiled_serving_kernel`` (a replica's whole loop, queue and
all).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from specsim.costs import formula
from specsim.simulation.compiled_kernels import (
    _apply,
    _inner,
    _jit,
    _jump,
    _next_double,
    _search_left,
)
from specsim.simulation.compiled_layout import (
    DECODE_KV,
    DECODE_ROWS,
    DRAFTER_FLOPS,
    EMITTED,
    LAST_END,
    NOW,
    VERIFICATION,
    WASTED,
    WINDOW_ROWS,
)

# The cost model is ``costs.formula``'s source, compiled here: registered with numba, each of its
# functions compiles where a kernel calls it, so the kernels charge what ``StepCosts`` charges.
for _function in formula.FUNCTIONS:
    register_jitable(_function)
_decode_s, _mixed_s, _admitted_s = formula.decode_s, formula.mixed_s, formula.admitted_s
_draft_flops, _wasted_per_position = formula.draft_flops, formula.wasted_per_position
_draft_prefill_flops, _draft_prefill_s = formula.draft_prefill_flops, formula.draft_prefill_s
# The vector's slots the serving kernel reads directly.
T_ATTN, T_FLOPS, TREE_AT = formula.T_ATTN, formula.T_FLOPS, formula.TREE_AT


@_jit
def mixed_seconds(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """``formula.mixed_s`` compiled (for the tests)."""
    return _mixed_s(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs)


@_jit
def cost_parts(c, k, rows, tokens, kv, pairs, out):
    """``decode_s``, ``draft_flops`` and ``wasted_per_position(kv / rows)`` of one decode-only
    iteration compiled, into ``out`` (for the tests: the loop calls the parts itself)."""
    out[0] = _decode_s(c, k, rows, tokens, kv, pairs)
    out[1] = _draft_flops(c, rows, k, kv)
    out[2] = _wasted_per_position(c, kv / rows)


@_inner
def goodput_windows(goodput, c, rows, kv_tokens, remaining, context, used, windows):
    """``GoodputWindow.scores``' per-window terms for ``rows`` > 0 decoding rows: into
    ``windows`` each k's expected tokens, new positions, pairs and seconds alone (``goodput``:
    rows of each window's expected tokens, new positions and pairs per row, the bonus pairs,
    then the proposal rate); returns mu, the best seconds per token alone."""
    count = goodput.shape[1]
    k_max = count - 1
    row_tokens, row_new, row_pairs, bonus = goodput[0], goodput[1], goodput[2], goodput[3]
    p = goodput[4, 0]
    short = 0
    short_context = 0.0
    for s in range(used):
        if remaining[s] > 0.0 and remaining[s] <= k_max:
            short += 1
            short_context += context[s]
    long_rows = rows - short
    long_context = kv_tokens - short_context
    mu = np.inf
    for k in range(count):
        tokens = long_rows * row_tokens[k]
        new = long_rows * row_new[k]
        pairs = row_new[k] * long_context + long_rows * row_pairs[k]
        if short:
            for s in range(used):
                left = remaining[s]
                if left > 0.0 and left <= k_max:
                    d = min(k, int(left) - 1)
                    tokens += row_tokens[d]
                    new += row_new[d]
                    pairs += row_new[d] * context[s] + bonus[d] + 1.0 - p
        alone = _decode_s(c, k, rows, new, kv_tokens, pairs)
        windows[0, k], windows[1, k], windows[2, k], windows[3, k] = tokens, new, pairs, alone
        if alone / tokens < mu:
            mu = alone / tokens
    return mu


@_inner
def best_window(scores):
    """The first k of the largest score (ties go to the smaller k)."""
    best, chosen = -np.inf, 0
    for k in range(scores.shape[0]):
        if scores[k] > best:
            best, chosen = scores[k], k
    return chosen


@_inner
def _window(by_rows, goodput, c, rows, kv_tokens, remaining, context, used):
    """The window policy's k for a decode-only iteration: ``by_rows[min(rows, last)]`` (fixed
    and by-batch windows), or, where ``by_rows`` is empty, ``GoodputWindow.scores``' argmax."""
    if by_rows.shape[0]:
        return by_rows[min(rows, by_rows.shape[0] - 1)]
    windows = np.empty((4, goodput.shape[1]))
    mu = goodput_windows(goodput, c, rows, kv_tokens, remaining, context, used, windows)
    return best_window(mu * windows[0] - windows[3])


@_jit
def choose_window(by_rows, goodput, c, rows, kv_tokens, remaining, context):
    """``_window`` (for the tests)."""
    return _window(by_rows, goodput, c, rows, kv_tokens, remaining, context, remaining.shape[0])


@_inner
def draw_rows(
    words,
    jump,
    k,
    used,
    capacity,
    blocks,
    tables,
    table_at,
    proposal_rate,
    remaining,
    shift,
    drafts,
    accepted,
):
    """A decode step's drafts and accepted counts for the first ``used`` slots, at window k:
    min(k, tokens left - 1) drafts (-1 in empty slots), accepted counts from window k's tables
    (``tables[:, table_at[k]:table_at[k+1]]``: thresholds, then counts), capped at the drafts;
    with ``blocks`` 2, a second block decides whether each row proposes. ``jump`` holds the
    jump over a block's unused slots, for the ``used`` in ``jump[4]``. Returns the doubles the
    step takes from the stream (0 at k = 0: nothing is drawn)."""
    k_plus_1 = k + 1.0
    for s in range(used):
        d = min(remaining[s], k_plus_1)
        drafts[s] = d - 1.0
    if k == 0:
        for s in range(used):
            accepted[s] = drafts[s]
        return 0
    thresholds = tables[0, table_at[k] : table_at[k + 1]]
    counts = tables[1, table_at[k] : table_at[k + 1]]
    if jump[4] != used:
        jump[0], jump[1], jump[2], jump[3] = _jump(words[2], words[3], np.uint64(capacity - used))
        jump[4] = used
    for s in range(used):
        uniform = _next_double(words)
        accepted[s] = counts[_search_left(thresholds, shift[s] + uniform)]
    if capacity > used:
        _apply(words, jump[0], jump[1], jump[2], jump[3])
    if blocks == 2:  # whether each row proposes at all
        for s in range(used):
            cap = k if _next_double(words) < proposal_rate else 0
            drafts[s] = min(drafts[s], cap)
        if capacity > used:
            _apply(words, jump[0], jump[1], jump[2], jump[3])
    for s in range(used):
        accepted[s] = min(accepted[s], drafts[s])
    return blocks * capacity


@_inner
def row_totals(c, drafts, context, used, decode_kv):
    """The positions a step verifies, its query-key pairs and those among the rows' own fed
    tokens (``_plan_mixed``'s sums; a tree's from ``TreeRows``' tables in the cost vector's
    tree section, indexed by each row's drafts + 1: whole numbers, exact in any order)."""
    at = int(c[TREE_AT])
    if at:
        verified = at + 3
        own_pairs = verified + int(c[at]) + 2
        new_tokens = cross = own_span = 0.0
        for s in range(used):
            index = int(drafts[s]) + 1
            new_tokens += c[verified + index]
            cross += c[verified + index] * context[s]
            own_span += c[own_pairs + index]
        return new_tokens, cross + own_span, own_span
    drafted = 0.0
    squares = 0.0
    cross = 0.0
    for s in range(used):
        drafted += drafts[s]
        squares += drafts[s] * drafts[s]
        cross += drafts[s] * context[s]
    new_tokens = drafted + used
    own_span = 0.5 * (squares + 2.0 * drafted + used + new_tokens)
    return new_tokens, cross + decode_kv + own_span, own_span


@_jit  # (callable from Python: the tests hold it to ``Replica._check_ranges``)
def widest_row(c, k):
    """The most positions a decoding row verifies: k + 1, or a tree's nodes and its root."""
    at = int(c[TREE_AT])
    return c[at + 3 + int(c[at]) + 1] if at else k + 1.0


@_inner
def emit_rows(
    accepted, drafts, remaining, context, drafted_by_row, used, log_accepted, log_drafted, filled
):
    """Apply a step: the step log's row at ``filled``, then each row's accepted + 1 tokens
    (``accepted`` holds them after); returns the tokens emitted."""
    emitted_total = 0.0
    for s in range(used):
        log_accepted[filled + s] = accepted[s]
        log_drafted[filled + s] = drafts[s]
        emitted = accepted[s] + 1.0
        accepted[s] = emitted
        remaining[s] -= emitted
        context[s] += emitted
        drafted_by_row[s] += drafts[s]
        emitted_total += emitted
    return emitted_total


@_inner
def log_iteration(
    log_dt, log_batch, log_kv, log_itl, log_weight, i, now, end, batch, held, gap, waited, joined
):
    """``StepLog.record_iteration`` at buffer index ``i`` (its duration ``end - now``, as the
    clock measures it)."""
    log_dt[i] = end - now
    log_batch[i] = batch
    log_kv[i] = held
    log_itl[2 * i] = gap
    log_weight[2 * i] = waited
    log_itl[2 * i + 1] = end - now
    log_weight[2 * i + 1] = joined


@_inner
def apply_step(
    st,
    c,
    k,
    rows,
    used,
    new_tokens,
    pairs,
    accepted,
    drafts,
    remaining,
    context,
    drafted_by_row,
    log,
    filled,
    iteration,
    end,
    batch,
    held,
    joined,
):
    """A decode step of ``rows`` rows at window k applied, into ``st`` (``_plan_mixed``'s
    FLOPs, ``_apply_mixed``'s sums, in their order), and logged at buffer index ``iteration``
    (the step log's row at ``filled``; ``log``: its duration, batch, KV, gap and weight
    buffers, then its accepted and drafted buffers). The finishes are the caller's."""
    log_dt, log_batch, log_kv, log_itl, log_weight, log_accepted, log_drafted = log
    decode_kv = st[DECODE_KV]  # as planned
    st[VERIFICATION] += c[T_FLOPS] * new_tokens + c[T_ATTN] * pairs
    st[DRAFTER_FLOPS] += _draft_flops(c, rows, k, decode_kv)
    emitted_total = emit_rows(
        accepted,
        drafts,
        remaining,
        context,
        drafted_by_row,
        used,
        log_accepted,
        log_drafted,
        filled,
    )
    st[EMITTED] += emitted_total
    st[DECODE_KV] += emitted_total
    wasted = new_tokens - emitted_total
    if wasted:
        st[WASTED] += wasted * _wasted_per_position(c, decode_kv / rows)
    st[WINDOW_ROWS] += k * rows
    st[DECODE_ROWS] += rows
    now = st[NOW]
    log_iteration(
        log_dt,
        log_batch,
        log_kv,
        log_itl,
        log_weight,
        iteration,
        now,
        end,
        batch,
        held,
        end - st[LAST_END],
        rows - joined,
        joined,
    )
    st[LAST_END] = end
