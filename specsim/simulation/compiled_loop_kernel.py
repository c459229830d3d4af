"""The compiled replica loop (numba): a replica's iterations from one arrival to the next.

``decode_loop`` runs what ``Replica._plan_mixed`` and ``_apply_mixed`` do, iteration after
iteration, in the same operations and the same order (see ``compiled_loop.py`` for when it runs
and what Python does with its results): the window policy's choice, the drafts, the acceptance
draws from the PCG64 state (a block of ``capacity`` doubles per draw, of which the occupied
slots' are read and the rest jumped over), the query-key totals, the cost model's seconds and
FLOPs (``cost_parts``, ``mixed_seconds``), the emitted tokens, the finishes, the statistics,
and a first iteration that carries the prompts in prefill whole (their rows then decode).
"""

from __future__ import annotations

import numba
import numpy as np

from specsim.simulation.compiled_kernels import _apply, _jump, _next_double, _search_left

_jit = numba.njit(cache=False, nogil=True)

# Drafter kinds, as ``compiled_loop._DRAFTER_CODES`` numbers them.
NONE, DRAFT_MODEL, PROMPT_LOOKUP, HEADS, AUTOREGRESSIVE_HEADS = 0, 1, 2, 3, 4

# ``costs`` array layout (``compiled_loop.cost_vector``).
TARGET, OVERHEAD, DRAFTER = 0, 6, 12
KIND, HAS_LATENCY, STEP_S, D_FLOPS, D_ATTN, T_FLOPS, T_ATTN = 18, 19, 20, 21, 22, 23, 24
PREFILL_S, PREFILL_TOKEN_S = 25, 26
COSTS = 27

# ``state`` (floats in and out) and ``counts`` (ints out) layouts.
(
    DECODE_KV,
    EMITTED,
    LEFT_TOTAL,
    NOW,
    LAST_END,
    LAST_DT,
    BOUND,
    VERIFICATION,
    DRAFTER_FLOPS,
    WASTED,
    WINDOW_ROWS,
    DECODE_ROWS,
    RESERVED,
    KV_CAPACITY,
    HELD,
    FIRST_END,
) = range(16)
STATE = 16
ITERATIONS, STEPS, FINISHES, HIGH, DECODING, DRAWN, LOGGED, JOINED = range(8)


@_jit
def _latency(c, at, batch, new_tokens, kv_tokens, pairs):
    """``LatencyModel.seconds_from_totals`` with its coefficients at ``c[at:at + 6]``."""
    over = new_tokens - c[at + 3]
    if not over > 0.0:
        over = 0.0
    return c[at] + c[at + 1] * batch + c[at + 2] * over + c[at + 4] * kv_tokens + c[at + 5] * pairs


@_jit
def _draft_s(c, rows, k, kv):
    """The drafter's ``draft_s(rows, k, kv)`` for rows > 0 (``specsim.costs.drafters``)."""
    kind = c[KIND]
    if kind == NONE:
        return 0.0
    if kind == DRAFT_MODEL:
        if k == 0:
            return _latency(c, DRAFTER, rows, rows, kv, kv + rows)
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * _latency(c, DRAFTER, rows, rows, mean_kv, mean_kv + rows)
    if k == 0:
        return 0.0
    if kind == AUTOREGRESSIVE_HEADS:
        if c[HAS_LATENCY] == 0.0:
            return k * c[STEP_S]
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * _latency(c, DRAFTER, rows, rows, mean_kv, mean_kv + rows)
    if c[HAS_LATENCY] != 0.0:  # prompt lookup and parallel heads: one pass per step
        return _latency(c, DRAFTER, rows, rows, kv, kv + rows)
    return c[STEP_S]


@_jit
def _draft_flops(c, rows, k, kv):
    """The drafter's ``draft_flops(rows, k, kv)`` for rows > 0."""
    kind = c[KIND]
    if kind == DRAFT_MODEL:
        if k == 0:
            return c[D_FLOPS] * rows + c[D_ATTN] * (kv + rows)
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * (c[D_FLOPS] * rows + c[D_ATTN] * (mean_kv + rows))
    if k == 0 or kind in (NONE, PROMPT_LOOKUP):
        return 0.0
    if kind == HEADS:
        return c[D_FLOPS] * rows * k
    mean_kv = kv + rows * (k - 1) / 2.0
    return k * (c[D_FLOPS] * rows + c[D_ATTN] * (mean_kv + rows))


@_jit
def _wasted_per_position(c, mean_context):
    """``StepCosts.wasted_flops_per_position``."""
    target = c[T_FLOPS] + c[T_ATTN] * mean_context
    kind = c[KIND]
    if kind == DRAFT_MODEL:
        draft = c[D_FLOPS]
        draft += c[D_ATTN] * mean_context
        return target + draft
    if kind in (HEADS, AUTOREGRESSIVE_HEADS):
        return target + c[D_FLOPS]
    return target + 0.0


@_jit
def _overhead_s(c, rows, k):
    """``StepCosts.overhead_s(rows, k, rows)`` for rows > 0."""
    seconds = c[OVERHEAD] + c[OVERHEAD + 1] * rows
    if k:
        seconds += c[OVERHEAD + 2] + c[OVERHEAD + 3] * rows
        seconds += k * (c[OVERHEAD + 4] + c[OVERHEAD + 5] * rows)
    return seconds


@_jit
def _overhead_with(c, sequences, k, drafting):
    """``StepCosts.overhead_s(sequences, k, drafting)``."""
    seconds = c[OVERHEAD] + c[OVERHEAD + 1] * sequences
    if k and drafting:
        seconds += c[OVERHEAD + 2] + c[OVERHEAD + 3] * drafting
        seconds += k * (c[OVERHEAD + 4] + c[OVERHEAD + 5] * drafting)
    return seconds


@_jit
def _mixed_s(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """``StepCosts.iteration_s(k, PassTotals(rows, tokens, kv, pairs), prefill)`` with prompt
    chunks (``p_rows`` > 0) and ``rows`` >= 0 decoding rows (``_parts``' operations)."""
    batch = rows + p_rows
    target = _latency(c, TARGET, batch, tokens + p_tokens, kv + p_kv, pairs + p_pairs)
    host = _overhead_with(c, batch, k, rows)
    draft = _draft_s(c, rows, k, kv) if rows else 0.0
    host += c[PREFILL_S] + c[PREFILL_TOKEN_S] * p_tokens
    if c[KIND] == DRAFT_MODEL:  # the draft model builds its own cache of the prompts
        draft += _latency(c, DRAFTER, p_rows, p_tokens, p_kv, p_pairs)
    else:
        draft += 0.0
    return target + draft + host


@_jit
def mixed_seconds(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """``_mixed_s`` (for the tests)."""
    return _mixed_s(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs)


@_jit
def cost_parts(c, k, rows, tokens, kv, pairs, out):
    """``decode_iteration_s``, ``draft_flops`` and ``wasted_flops_per_position(kv / rows)`` of
    one decode-only iteration, into ``out`` (for the tests: the loop calls the parts itself)."""
    out[0] = _decode_s(c, k, rows, tokens, kv, pairs)
    out[1] = _draft_flops(c, rows, k, kv)
    out[2] = _wasted_per_position(c, kv / rows)


@_jit
def _decode_s(c, k, rows, tokens, kv, pairs):
    """``StepCosts.decode_iteration_s``."""
    target = _latency(c, TARGET, rows, tokens, kv, pairs)
    return target + _draft_s(c, rows, k, kv) + _overhead_s(c, rows, k)


@_jit
def _window(by_rows, goodput, c, rows, kv_tokens, remaining, context, used):
    """The window policy's k for a decode-only iteration: ``by_rows[min(rows, last)]`` (fixed
    and by-batch windows), or, where ``by_rows`` is empty, ``GoodputWindow.scores``' argmax
    (``goodput``: rows of each window's expected tokens, new positions and pairs per row, the
    bonus pairs, then the proposal rate)."""
    if by_rows.shape[0]:
        return by_rows[min(rows, by_rows.shape[0] - 1)]
    windows = goodput.shape[1]
    k_max = windows - 1
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
    tokens_by_k = np.empty(windows)
    alone_by_k = np.empty(windows)
    for k in range(windows):
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
        tokens_by_k[k], alone_by_k[k] = tokens, alone
        if alone / tokens < mu:
            mu = alone / tokens
    best, chosen = -np.inf, 0
    for k in range(windows):
        score = mu * tokens_by_k[k] - alone_by_k[k]
        if score > best:  # the first of equal scores: the smaller k
            best, chosen = score, k
    return chosen


@_jit
def choose_window(by_rows, goodput, c, rows, kv_tokens, remaining, context):
    """``_window`` (for the tests)."""
    return _window(by_rows, goodput, c, rows, kv_tokens, remaining, context, remaining.shape[0])


@_jit
def decode_loop(
    base_words,
    offset,
    blocks,
    capacity,
    tables,
    table_at,
    proposal_rate,
    by_rows,
    goodput,
    lookahead,
    remaining,
    context,
    shift,
    drafted_by_row,
    level,
    admit_order,
    high,
    decoding,
    joined,
    c,
    state,
    log_dt,
    log_batch,
    log_kv,
    log_itl,
    log_weight,
    log_accepted,
    log_drafted,
    logged,
    step_limit,
    finished_slot,
    finished_at,
    finished_drafted,
    finished_time,
    prefill,
    join_slot,
    join_context,
    join_left,
    join_level,
    join_order,
    join_reservation,
    out,
):
    """Decode-only iterations from ``state[NOW]`` until one would start at or after
    ``state[BOUND]``, would need more KV cache than there is, or no row is left, or the step
    log's buffers must be folded (``StepLog``: its buffers and fill levels ``logged``, as
    ``record_step`` and ``record_iteration`` fill them). The acceptance draws start ``offset``
    doubles after the PCG64 state ``base_words``. The batch arrays and ``state`` are left as the
    iterations leave them, the finishes (slot, iteration, the row's drafted total, time) are
    written to the buffers, and ``out`` gets the counts (iterations, step log entries,
    finishes, high, decoding, doubles drawn, iterations logged). Each iteration takes its
    window from ``_window`` and window k's acceptance tables from
    ``tables[:, table_at[k]:table_at[k+1]]`` (thresholds, then counts)."""
    words = base_words.copy()
    if offset > 0:
        mult_high, mult_low, plus_high, plus_low = _jump(words[2], words[3], np.uint64(offset))
        _apply(words, mult_high, mult_low, plus_high, plus_low)
    most = log_dt.shape[0]
    iteration, filled = logged[0], logged[1]
    drafts = np.empty(capacity)
    accepted = np.empty(capacity)
    decode_kv = state[DECODE_KV]
    emitted_tokens = state[EMITTED]
    left_total = state[LEFT_TOTAL]
    now = state[NOW]
    last_end = state[LAST_END]
    last_dt = state[LAST_DT]
    bound = state[BOUND]
    verification, drafter_flops, wasted_flops = (
        state[VERIFICATION],
        state[DRAFTER_FLOPS],
        state[WASTED],
    )
    window_rows, decode_rows = state[WINDOW_ROWS], state[DECODE_ROWS]
    reserved, kv_capacity = state[RESERVED], state[KV_CAPACITY]
    per_token, per_pair = c[T_FLOPS], c[T_ATTN]
    jump_for = -1
    drawn = 0
    mult_high = mult_low = plus_high = plus_low = np.uint64(0)
    n = finishes = 0
    held = first_end = 0.0
    p_rows = int(prefill[0])
    p_tokens, p_kv, p_pairs = prefill[1], prefill[2], prefill[3]
    mixed = p_rows > 0  # the first iteration carries the prompts in prefill, whole
    while (decoding > 0 or mixed) and now < bound:
        held = decode_kv + decoding * lookahead + reserved
        if held > kv_capacity:  # preemption: the per-iteration path's
            break
        used = high
        rows = decoding
        k = _window(by_rows, goodput, c, rows, decode_kv, remaining, context, used)
        new_tokens = pairs = 0.0
        if rows:
            thresholds = tables[0, table_at[k] : table_at[k + 1]]
            counts = tables[1, table_at[k] : table_at[k + 1]]
            k_plus_1 = k + 1.0
            for s in range(used):
                d = min(remaining[s], k_plus_1)
                drafts[s] = d - 1.0
            if k == 0:
                for s in range(used):
                    accepted[s] = drafts[s]
            else:
                drawn += blocks * capacity
                if jump_for != used:  # the jump over a block's unused slots
                    mult_high, mult_low, plus_high, plus_low = _jump(
                        words[2], words[3], np.uint64(capacity - used)
                    )
                    jump_for = used
                for s in range(used):
                    uniform = _next_double(words)
                    accepted[s] = counts[_search_left(thresholds, shift[s] + uniform)]
                if capacity > used:
                    _apply(words, mult_high, mult_low, plus_high, plus_low)
                if blocks == 2:  # whether each row proposes at all
                    for s in range(used):
                        cap = k if _next_double(words) < proposal_rate else 0
                        drafts[s] = min(drafts[s], cap)
                    if capacity > used:
                        _apply(words, mult_high, mult_low, plus_high, plus_low)
                for s in range(used):
                    accepted[s] = min(accepted[s], drafts[s])
            drafted = 0.0
            squares = 0.0
            cross = 0.0
            for s in range(used):
                drafted += drafts[s]
                squares += drafts[s] * drafts[s]
                cross += drafts[s] * context[s]
            new_tokens = drafted + used
            own_span = 0.5 * (squares + 2.0 * drafted + used + new_tokens)
            pairs = cross + decode_kv + own_span
        if mixed:
            dt = _mixed_s(c, k, rows, new_tokens, decode_kv, pairs, p_rows, p_tokens, p_kv, p_pairs)
        else:
            dt = _decode_s(c, k, rows, new_tokens, decode_kv, pairs)
        end = now + dt
        log_dt[iteration] = end - now
        log_batch[iteration] = rows + p_rows
        log_kv[iteration] = held
        if rows:
            verification += per_token * new_tokens + per_pair * pairs
            drafter_flops += _draft_flops(c, rows, k, decode_kv)
            planned_kv = decode_kv
            # Applying it.
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
            filled += used
            emitted_tokens += emitted_total
            decode_kv += emitted_total
            left_total -= emitted_total
            wasted = new_tokens - emitted_total
            if wasted:
                wasted_flops += wasted * _wasted_per_position(c, planned_kv / rows)
            window_rows += k * rows
            decode_rows += rows
            log_itl[2 * iteration] = end - last_end
            log_weight[2 * iteration] = rows - joined
            log_itl[2 * iteration + 1] = end - now
            log_weight[2 * iteration + 1] = joined
            joined = 0  # rows that joined waited only for the first
            last_end = end
            for s in range(used):
                if accepted[s] > remaining[s] * 64.0:  # emitted something, nothing left
                    finished_slot[finishes] = s
                    finished_at[finishes] = n
                    finished_drafted[finishes] = drafted_by_row[s]  # later steps add -1 there
                    finished_time[finishes] = end
                    finishes += 1
                    decode_kv -= context[s]
                    remaining[s] = 0.0
                    context[s] = 0.0
                    level[s] = 0
                    shift[s] = 0.0
                    admit_order[s] = -1
                    decoding -= 1
            while high and remaining[high - 1] == 0.0:
                high -= 1
        else:  # prompt chunks alone: no inter-token gap
            log_itl[2 * iteration] = 0.0
            log_weight[2 * iteration] = 0.0
            log_itl[2 * iteration + 1] = end - now
            log_weight[2 * iteration + 1] = 0.0
        iteration += 1
        if mixed:  # the prompts are through: their rows start decoding
            for j in range(p_rows):
                reserved -= join_reservation[j]
            # Slots come off the end of the free list, which this iteration's finishes joined.
            free = np.empty(p_rows + finishes, dtype=np.int64)
            free[:p_rows] = join_slot[:p_rows]
            free[p_rows:] = finished_slot[:finishes]
            top = free.shape[0]
            for j in range(p_rows):
                emitted_tokens += 1.0  # the prefill pass's token
                top -= 1
                slot = free[top]
                remaining[slot] = join_left[j]
                context[slot] = join_context[j]
                level[slot] = join_level[j]
                shift[slot] = 2.0 * join_level[j]
                drafted_by_row[slot] = 0.0
                admit_order[slot] = join_order[j]
                decode_kv += join_context[j]
                left_total += join_left[j]
                decoding += 1
                joined += 1
                if slot >= high:
                    high = slot + 1
            first_end = end
            mixed = False
            p_rows = 0
        else:
            last_dt = dt
        now = end
        n += 1
        if iteration == most or filled > step_limit:  # the log folds its buffers first
            break
    state[DECODE_KV], state[EMITTED], state[LEFT_TOTAL] = decode_kv, emitted_tokens, left_total
    state[NOW], state[LAST_END], state[LAST_DT] = now, last_end, last_dt
    state[VERIFICATION], state[DRAFTER_FLOPS], state[WASTED] = (
        verification,
        drafter_flops,
        wasted_flops,
    )
    state[WINDOW_ROWS], state[DECODE_ROWS] = window_rows, decode_rows
    state[HELD], state[FIRST_END], state[RESERVED] = held, first_end, reserved
    out[ITERATIONS], out[STEPS], out[FINISHES] = n, filled, finishes
    out[HIGH], out[DECODING], out[DRAWN], out[LOGGED] = high, decoding, drawn, iteration
    out[JOINED] = joined
