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

import numpy as np

from specsim.simulation.compiled_kernels import _apply, _jit, _jump
from specsim.simulation.compiled_layout import (
    DECODE_KV,
    EMITTED,
    LAST_DT,
    LEFT_TOTAL,
    NOW,
    STEP_STATE,
)
from specsim.simulation.compiled_step_kernel import (
    _decode_s,
    _mixed_s,
    _window,
    apply_step,
    draw_rows,
    log_iteration,
    row_totals,
)

# ``state`` (floats in and out: the decode step's, ``compiled_layout.STEP_STATE``, then these)
# and ``counts`` (ints out) layouts.
BOUND, RESERVED, KV_CAPACITY, HELD, FIRST_END = range(STEP_STATE, STEP_STATE + 5)
STATE = STEP_STATE + 5
ITERATIONS, STEPS, FINISHES, HIGH, DECODING, DRAWN, LOGGED, JOINED = range(8)


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
    bound = state[BOUND]
    reserved, kv_capacity = state[RESERVED], state[KV_CAPACITY]
    log = (log_dt, log_batch, log_kv, log_itl, log_weight, log_accepted, log_drafted)
    jump = np.zeros(5, dtype=np.uint64)  # the jump over a block's unused slots, and for which
    jump[4] = capacity + 1
    drawn = 0
    n = finishes = 0
    held = first_end = 0.0
    p_rows = int(prefill[0])
    p_tokens, p_kv, p_pairs = prefill[1], prefill[2], prefill[3]
    mixed = p_rows > 0  # the first iteration carries the prompts in prefill, whole
    while (decoding > 0 or mixed) and state[NOW] < bound:
        decode_kv = state[DECODE_KV]
        held = decode_kv + decoding * lookahead + reserved
        if held > kv_capacity:  # preemption: the per-iteration path's
            break
        used = high
        rows = decoding
        k = _window(by_rows, goodput, c, rows, decode_kv, remaining, context, used)
        new_tokens = pairs = 0.0
        if rows:
            drawn += draw_rows(
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
            )
            new_tokens, pairs = row_totals(drafts, context, used, decode_kv)
        if mixed:
            dt = _mixed_s(c, k, rows, new_tokens, decode_kv, pairs, p_rows, p_tokens, p_kv, p_pairs)
        else:
            dt = _decode_s(c, k, rows, new_tokens, decode_kv, pairs)
        end = state[NOW] + dt
        if rows:
            apply_step(
                state,
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
                rows + p_rows,
                held,
                joined,
            )
            filled += used
            joined = 0  # rows that joined waited only for the first
            for s in range(used):
                if accepted[s] > remaining[s] * 64.0:  # emitted something, nothing left
                    finished_slot[finishes] = s
                    finished_at[finishes] = n
                    finished_drafted[finishes] = drafted_by_row[s]  # later steps add -1 there
                    finished_time[finishes] = end
                    finishes += 1
                    state[DECODE_KV] -= context[s]
                    remaining[s] = 0.0
                    context[s] = 0.0
                    level[s] = 0
                    shift[s] = 0.0
                    admit_order[s] = -1
                    decoding -= 1
            while high and remaining[high - 1] == 0.0:
                high -= 1
        else:  # prompt chunks alone: no inter-token gap
            log_iteration(
                log_dt,
                log_batch,
                log_kv,
                log_itl,
                log_weight,
                iteration,
                state[NOW],
                end,
                p_rows,
                held,
                0.0,
                0,
                0,
            )
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
                state[EMITTED] += 1.0  # the prefill pass's token
                top -= 1
                slot = free[top]
                remaining[slot] = join_left[j]
                context[slot] = join_context[j]
                level[slot] = join_level[j]
                shift[slot] = 2.0 * join_level[j]
                drafted_by_row[slot] = 0.0
                admit_order[slot] = join_order[j]
                state[DECODE_KV] += join_context[j]
                state[LEFT_TOTAL] += join_left[j]
                decoding += 1
                joined += 1
                if slot >= high:
                    high = slot + 1
            first_end = end
            mixed = False
            p_rows = 0
        else:
            state[LAST_DT] = dt
        state[NOW] = end
        n += 1
        if iteration == most or filled > step_limit:  # the log folds its buffers first
            break
    state[HELD], state[FIRST_END], state[RESERVED] = held, first_end, reserved
    out[ITERATIONS], out[STEPS], out[FINISHES] = n, filled, finishes
    out[HIGH], out[DECODING], out[DRAWN], out[LOGGED] = high, decoding, drawn, iteration
    out[JOINED] = joined
