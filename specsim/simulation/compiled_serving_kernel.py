"""The compiled serving loop (numba): a lone replica's admission, prefill and decoding.

``serving_loop`` runs a replica alone on its traffic (open-loop arrivals, or closed-loop
clients without think time) iteration after iteration, as ``Replica._fast_process`` with
``Admission`` and ``ClosedLoopClients`` would: it takes the arrivals due, admits waiting
requests FCFS (``Admission.admit``), preempts where the cache cannot hold the next step
(``Admission.make_room``; the cache counted in tokens or in blocks, ``compiled_kv_kernel``),
plans the decode step and the prompt chunks within the token budget
(``Replica._plan_mixed``, ``Admission.chunks``; without chunked prefill, the waiting prompts
whole in an iteration of their own, ``Replica._plan_prefill_only``), prices the iteration
(times the replica's next jitter multiplier, which Python draws ahead), applies it
(``Replica._apply_mixed``: emitted tokens, finishes in slot order, then the prompts that went
through, ``Admission.complete``) and, for each finish, writes the request's record and issues
its client's next request (``ClosedLoopClients.on_finish``), in the same operations and order.
Requests live in a table of rows (a closed-loop client's next request takes its row); the
queue and the prompts in prefill are rings of row numbers. It stops before an iteration where
Python must act (``compiled_serving.py``): the step log folds, the records, the arrivals or the
clients' lengths run short, admission needs an acceptance level not drawn yet, one sequence
outgrows the cache, the iteration would query the profile's latency fit outside its measured
range where that still warns or raises (Python runs it, as the reference does), or nothing is
left to run; and where Python asks it to, after a given number of iterations or after the
iteration in which a request finishes (a fleet's replica, ``fleet_serving.py``). What it did of
that iteration before stopping (admission, preemption) is what Python's would do first.
A split fleet's replicas (``disagg.py``) run it too: a prefill replica's prompts through leave
as hand-off records, and a decode replica's requests join with their KV cache.
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled_admission_kernel import (
    _admit,
    _bank_row,
    _finish,
    _free_slot,
    _make_room,
    _release_pending,
    _take_arrivals,
)
from specsim.simulation.compiled_kernels import _apply, _inner, _jit, _jump
from specsim.simulation.compiled_kv_kernel import _kv_in_use
from specsim.simulation.compiled_layout import (
    ADMISSIONS,
    ARRIVAL,
    ARRIVALS_AT,
    CHARGED,
    CHECKS_RANGES,
    CLIENTS,
    DECODE_KV,
    DECODE_STEPS,
    DECODING,
    DRAWN,
    EMITTED,
    FILLED,
    FIRST,
    GENERATED,
    HELD,
    HIGH,
    ISSUE_LEFT,
    ITERATION_LIMIT,
    ITERATIONS,
    JITTERED,
    JOINED,
    JOINS,
    LENGTHS_AT,
    LOGGED,
    MORE_ARRIVALS,
    NOW,
    OPEN_UNTIL,
    OUTPUT,
    OWED_PAIRS,
    OWED_ROWS,
    OWED_TOKENS,
    P_LEN,
    PADDED,
    PEND_HEAD,
    PEND_LEN,
    PENDING,
    PREFILL_APART,
    PREFILL_FLOPS,
    Q_LEN,
    RECORDS,
    STOP_AT_FINISH,
    TOKEN_BUDGET,
)
from specsim.simulation.compiled_policy_kernel import _observe, _policy_window
from specsim.simulation.compiled_prefill_kernel import (
    _chunks,
    _completing,
    _padded_rows,
    _prompts_apart,
    _through,
    _whole_prompts,
    in_range,
    window_goodput,
)
from specsim.simulation.compiled_step_kernel import (
    T_ATTN,
    T_FLOPS,
    _admitted_s,
    _decode_s,
    _draft_prefill_flops,
    _draft_prefill_s,
    _mixed_s,
    apply_step,
    draw_rows,
    log_iteration,
    row_totals,
    widest_row,
)


@_inner
def _jittered(dt, trace, ct, prefill):
    """``dt`` times the iteration's multiplier where the replica has jitter (``Jitter.factor``:
    an iteration with no decoding row takes the prefill kind)."""
    if ct[JITTERED]:
        return dt * trace[3 if prefill else 2, ct[ITERATIONS]]
    return dt


@_inner
def _advance(trace, st, ct, end):
    """The iteration over at ``end``: the clock, and the trace's entry."""
    st[NOW] = end
    trace[0, ct[ITERATIONS]] = end
    trace[1, ct[ITERATIONS]] = st[EMITTED]
    ct[ITERATIONS] += 1


@_inner
def _owed_prompt_pass(c, st):
    """``DecodeReplica._plan_mixed``: the seconds of the draft model's prompt passes the rows
    that joined owe (their FLOPs counted), charged in this iteration."""
    rows, tokens, pairs = st[OWED_ROWS], st[OWED_TOKENS], st[OWED_PAIRS]
    st[PREFILL_FLOPS] += _draft_prefill_flops(c, tokens, pairs)
    st[OWED_ROWS] = st[OWED_TOKENS] = st[OWED_PAIRS] = 0.0
    return _draft_prefill_s(c, rows, tokens, 0.0, pairs)


@_inner
def _admitted(c, ct):
    """``Replica.process``: the engine's own work on the requests admitted since an iteration
    last paid for them (``formula.admitted_s``), charged in this one."""
    seconds = _admitted_s(c, ct[ADMISSIONS] - ct[CHARGED])
    ct[CHARGED] = ct[ADMISSIONS]
    return seconds


@_inner
def _first_tokens(req, slot_row, used, end):
    """``DecodeReplica._apply_mixed``: the rows that joined with their KV cache (no first token
    yet) stream it at the end of their first decode iteration."""
    for s in range(used):
        row = slot_row[s]
        if row >= 0 and req[row, FIRST] < 0:
            req[row, FIRST] = end


@_jit
def serving_loop(
    adaptive,
    base_words,
    offset,
    blocks,
    tables,
    table_at,
    proposal_rate,
    by_rows,
    goodput,
    lookahead,
    batch,
    slot_row,
    join_step,
    join_left,
    free,
    req,
    rows_free,
    queue,
    prefilling,
    pending,
    levels,
    arrivals,
    lengths,
    records,
    c,
    st,
    ct,
    log,
    log_batch,
    log_accepted,
    log_drafted,
    step_limit,
    trace,
):
    """Iterations from ``st[NOW]`` until Python must act (see the module's docstring).

    ``adaptive``: the goodput policy's window (``window_goodput``), else k by batch size
    (``by_rows``; one entry for a fixed k), or 0 once TensorRT-LLM's off-switch has tripped,
    or SGLang's adaptive steps (``compiled_policy_kernel``: their state in ``st`` and ``ct``,
    updated after each decode iteration).

    ``batch``: the replica's (remaining, context, output, level, level shift, drafted,
    admit order) arrays; ``slot_row``, ``join_step``, ``join_left``: each slot's request row
    (-1 empty), the decode steps when it joined and the tokens it had left; ``free``: the free
    slots, a stack of ``ct[FREE_N]``; ``req``: the requests in flight (``rows_free``: the free
    rows, a stack of ``ct[ROWS_FREE_N]``); ``levels``: acceptance levels in the order
    admissions take them; ``arrivals``: the open loop's next arrivals (times, prompts,
    outputs, prefix-cache hits); ``lengths``: the clients' next requests' prompt and output
    lengths and hits (with ``ct[CLIENTS]``); ``pending``: the ring of clients' requests not
    yet arrived (``ct[PEND_HEAD]``, ``ct[PEND_LEN]``); ``log``: the step log's float buffers
    (durations, KV, gaps, weights); ``trace``: each iteration's end and the tokens emitted by
    then (a fleet's router and clients read a call under way from it, ``fleet_serving.py``).
    The acceptance draws start ``offset`` doubles after the PCG64 state ``base_words``
    (``ct[DRAWN]`` gets how many the iterations took)."""
    remaining, context, _, _, shift, drafted_by_row, _ = batch
    log_dt, log_kv, log_itl, log_weight = log
    log_all = (log_dt, log_batch, log_kv, log_itl, log_weight, log_accepted, log_drafted)
    capacity = remaining.shape[0]
    count = req.shape[0]
    words = base_words.copy()
    if offset > 0:
        mult_high, mult_low, plus_high, plus_low = _jump(words[2], words[3], np.uint64(offset))
        _apply(words, mult_high, mult_low, plus_high, plus_low)
    jump = np.zeros(5, dtype=np.uint64)
    jump[4] = capacity + 1
    drafts = np.empty(capacity)
    accepted = np.empty(capacity)
    chunk = np.empty(count)
    done = np.empty(count, dtype=np.int64)
    most = log_dt.shape[0]
    places = (slot_row, join_step, join_left, free, records, queue, pending, rows_free)
    per_token, per_pair = c[T_FLOPS], c[T_ATTN]
    while True:
        if ct[ITERATIONS] >= ct[ITERATION_LIMIT] or (ct[STOP_AT_FINISH] and ct[RECORDS]):
            break
        if ct[LOGGED] == most or ct[FILLED] > step_limit:  # the log folds its buffers first
            break
        if records.shape[0] - ct[RECORDS] < capacity:
            break
        if ct[CLIENTS]:
            lengths_left = lengths.shape[1] - ct[LENGTHS_AT]
            if lengths_left < capacity and lengths_left < ct[ISSUE_LEFT]:
                break
            _release_pending(req, queue, pending, st, ct)
        elif not _take_arrivals(req, queue, rows_free, arrivals, st, ct):
            break
        elif ct[ARRIVALS_AT] == arrivals.shape[1] and ct[MORE_ARRIVALS]:
            break  # the next arrival is not known here
        if not (ct[Q_LEN] or ct[DECODING] or ct[P_LEN]):
            if ct[PEND_LEN]:
                st[NOW] = req[pending[ct[PEND_HEAD]], ARRIVAL]  # idle until a client's arrives
                continue
            if ct[CLIENTS] or ct[ARRIVALS_AT] == arrivals.shape[1]:
                break
            st[NOW] = arrivals[0, ct[ARRIVALS_AT]]  # idle until the next arrival
            continue
        if not _admit(req, prefilling, levels, batch, places, st, ct, lookahead):
            break
        # Admission stopped short of the queue's tail only where a request still waits (FCFS),
        # the batch is full or the prompt budget spent: else one queued last would have joined.
        # Without chunked prefill the budget stops no admission (nor a join on a decode
        # replica), and prompts waiting run whole in an iteration of their own, with no room
        # made first (``_prompts_apart``).
        apart = ct[PREFILL_APART] and ct[P_LEN]
        spent = st[PENDING] >= st[TOKEN_BUDGET] and not (ct[PREFILL_APART] or ct[JOINS])
        if not (ct[Q_LEN] or ct[DECODING] + ct[P_LEN] >= capacity or spent):
            ct[OPEN_UNTIL] = ct[ITERATIONS] + 1
        if not apart and not _make_room(
            req, queue, prefilling, batch, slot_row, join_step, join_left, free, st, ct, lookahead
        ):
            break
        rows = ct[DECODING]
        decode_kv = st[DECODE_KV]
        held = _kv_in_use(batch, st, ct, lookahead)
        if not (rows or ct[P_LEN]):
            break
        now = st[NOW]
        used = ct[HIGH]
        i = ct[LOGGED]
        if apart:
            whole = _whole_prompts(req, prefilling, st[TOKEN_BUDGET], chunk, ct)
            p_rows = whole[0]
            if ct[CHECKS_RANGES] and not in_range(
                req, prefilling, 0, 0, p_rows, chunk, context, used, st, ct
            ):
                break  # Python runs the iteration, and warns or raises
            dt = _prompts_apart(whole, c, st, ct) + _admitted(c, ct)
            dt = _jittered(dt, trace, ct, True)
            end = now + dt
            # The reference logs the duration itself (not end - now): the same with now 0.0.
            log_iteration(
                log_dt, log_batch, log_kv, log_itl, log_weight, i, 0.0, dt, p_rows, held, 0.0, 0, 0
            )
            ct[LOGGED] = i + 1
            st[HELD] = held
            st[EMITTED] += _completing(req, prefilling, p_rows, chunk, ct)
            _through(
                req, prefilling, p_rows, chunk, done, batch, places, lengths, st, ct, lookahead, end
            )
            _advance(trace, st, ct, end)
            continue
        if adaptive:  # one flag, not a function argument: numba's on-disk cache keys on types
            k = window_goodput(
                by_rows, goodput, c, rows, decode_kv, remaining, context, used, req, prefilling,
                chunk, st, ct,
            )  # fmt: skip
        else:
            k = _policy_window(by_rows, rows, st, ct)
        new_tokens = pairs = charged_pairs = 0.0
        charged_kv = decode_kv  # what the pass is charged for (padded attention: more)
        drawn = ct[DRAWN]
        if rows:
            ct[DRAWN] += draw_rows(
                words, jump, k, used, capacity, blocks, tables, table_at, proposal_rate,
                remaining, shift, drafts, accepted,
            )  # fmt: skip
            new_tokens, pairs, own_span = row_totals(c, drafts, context, used, decode_kv)
            charged_pairs = pairs
            if ct[PADDED]:
                charged_kv, charged_pairs = _padded_rows(context, used, rows, new_tokens, own_span)
        p_rows, p_tokens, p_kv, p_pairs = 0, 0.0, 0.0, 0.0
        if ct[P_LEN]:
            p_rows, p_tokens, p_kv, p_pairs = _chunks(
                req, prefilling, st[TOKEN_BUDGET] - new_tokens, chunk, st, ct
            )
        if ct[CHECKS_RANGES] and not in_range(
            req, prefilling, rows, widest_row(c, k), p_rows, chunk, context, used, st, ct
        ):
            ct[DRAWN] = drawn  # Python runs the iteration, draws and all, and warns or raises
            break
        if p_rows:
            target = per_token * p_tokens + per_pair * p_pairs
            st[PREFILL_FLOPS] += target + _draft_prefill_flops(c, p_tokens, p_pairs)
        if rows and not p_rows:
            dt = _decode_s(c, k, rows, new_tokens, charged_kv, charged_pairs)
        else:
            dt = _mixed_s(
                c, k, rows, new_tokens, charged_kv, charged_pairs, p_rows, p_tokens, p_kv, p_pairs
            )
        if st[OWED_ROWS]:
            dt += _owed_prompt_pass(c, st)
        dt += _admitted(c, ct)
        dt = _jittered(dt, trace, ct, rows == 0)
        end = now + dt
        # First tokens count before any finish, which may end the steady window.
        st[EMITTED] += _completing(req, prefilling, p_rows, chunk, ct)
        if rows:
            _observe(drafts, accepted, used, st, ct, end)
            apply_step(
                st, c, k, rows, used, new_tokens, pairs, accepted, drafts, remaining, context,
                drafted_by_row, log_all, ct[FILLED], i, end, rows + p_rows, held, ct[JOINED],
            )  # fmt: skip
            ct[FILLED] += used
            ct[DECODE_STEPS] += 1
            if ct[JOINS] and ct[JOINED]:
                _first_tokens(req, slot_row, used, end)
            ct[JOINED] = 0
            for s in range(used):
                if accepted[s] > remaining[s] * 64.0:  # emitted something, nothing left
                    client = slot_row[s]
                    _bank_row(req, client, s, batch, join_step, join_left, ct)
                    req[client, GENERATED] = req[client, OUTPUT]
                    _free_slot(s, batch, slot_row, free, st, ct)
                    _finish(req, client, end, records, queue, pending, rows_free, lengths, st, ct)
        else:  # prompt chunks alone: no inter-token gap
            log_iteration(
                log_dt, log_batch, log_kv, log_itl, log_weight, i, now, end, p_rows, held, 0.0, 0, 0
            )
        ct[LOGGED] = i + 1
        st[HELD] = held
        if p_rows:
            _through(
                req, prefilling, p_rows, chunk, done, batch, places, lengths, st, ct, lookahead, end
            )
        _advance(trace, st, ct, end)
