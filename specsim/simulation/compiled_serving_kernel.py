"""The compiled serving loop (numba): a lone replica's admission, prefill and decoding.

``serving_loop`` runs a replica alone on its traffic (open-loop arrivals, or closed-loop
clients without think time) iteration after iteration, as ``Replica._fast_process`` with
``Admission`` and ``ClosedLoopClients`` would: it takes the arrivals due, admits waiting
requests FCFS (``Admission.admit``), preempts where the cache cannot hold the next step
(``Admission.make_room``), plans the decode step and the prompt chunks within the token budget
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
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled_kernels import _apply, _inner, _jit, _jump
from specsim.simulation.compiled_layout import (
    ACCEPTED,
    ADMISSIONS,
    ADMIT,
    ARRIVAL,
    ARRIVALS_AT,
    CHECKS_RANGES,
    CLIENT,
    CLIENTS,
    CLOSED,
    CLOSED_AT,
    CLOSED_EMITTED,
    DECODE_KV,
    DECODE_STEPS,
    DECODING,
    DELAY,
    DRAFTED,
    DRAWN,
    EMITTED,
    FILLED,
    FINISH_EMITTED,
    FIRST,
    FIRST_HI,
    FIRST_LEFT,
    FIRST_LO,
    FREE_N,
    GENERATED,
    HELD,
    HIGH,
    HIT,
    HORIZON,
    ISSUE_LEFT,
    ISSUED,
    ITERATION_LIMIT,
    ITERATIONS,
    JITTERED,
    JOINED,
    KV_CAPACITY,
    LENGTHS_AT,
    LEVEL,
    LEVELS_AT,
    LOGGED,
    MORE_ARRIVALS,
    NEXT_RID,
    NOW,
    OPEN_UNTIL,
    OPENED,
    OPENED_AT,
    OPENED_EMITTED,
    OUTPUT,
    P_HEAD,
    P_LEN,
    PADDED,
    PEND_HEAD,
    PEND_LEN,
    PENDING,
    PREEMPTIONS,
    PREFILL_APART,
    PREFILL_COMPUTED,
    PREFILL_FLOPS,
    PREFILLED,
    PREFIX_HITS,
    PREFIX_QUERIED,
    PROMPT,
    Q_HEAD,
    Q_LEN,
    RANGE_BATCH_HI,
    RANGE_BATCH_LO,
    RANGE_CONTEXT,
    RANGE_NEW_HI,
    RANGE_NEW_LO,
    RECORDS,
    RESERVED,
    RID,
    ROWS_FREE_N,
    SCHEDULED,
    STEPS,
    STOP_AT_FINISH,
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
    apply_step,
    best_window,
    draw_rows,
    goodput_windows,
    log_iteration,
    row_totals,
)


@_inner
def _admit(req, queue, prefilling, levels, st, ct, lookahead, max_batch):
    """``Admission.admit`` at ``st[NOW]`` (a prefix cache whose hits are by request,
    ``req[c, HIT]``, and no block size); False where the next request to start needs an
    acceptance level beyond ``levels`` (Python draws them)."""
    count = req.shape[0]
    running = ct[DECODING] + ct[P_LEN]
    if ct[Q_LEN] == 0 or running >= max_batch:
        return True
    used = st[DECODE_KV] + ct[DECODING] * lookahead + st[RESERVED]
    while ct[Q_LEN] and running < max_batch:
        c = queue[ct[Q_HEAD]]
        if not ct[PREFILL_APART] and st[PENDING] >= st[TOKEN_BUDGET]:
            break
        need = req[c, TARGET] + lookahead
        if used + need > st[KV_CAPACITY]:
            break
        first_time = req[c, SCHEDULED] < 0
        if first_time and ct[LEVELS_AT] == levels.shape[0]:
            return False
        ct[Q_HEAD] = (ct[Q_HEAD] + 1) % count
        ct[Q_LEN] -= 1
        req[c, ADMIT] = ct[ADMISSIONS]
        ct[ADMISSIONS] += 1
        if first_time:
            req[c, SCHEDULED] = st[NOW]
            req[c, LEVEL] = levels[ct[LEVELS_AT]]
            ct[LEVELS_AT] += 1
        req[c, PREFILLED] = req[c, HIT]  # prefill starts past the hit (every admission)
        st[PREFIX_QUERIED] += req[c, TARGET]
        st[PREFIX_HITS] += req[c, HIT]
        prefilling[(ct[P_HEAD] + ct[P_LEN]) % count] = c
        ct[P_LEN] += 1
        st[RESERVED] += req[c, TARGET] + lookahead
        st[PENDING] += req[c, TARGET] - req[c, PREFILLED]
        used += need
        running += 1
    return True


@_inner
def _new_request(req, row, rid, arrival, prompt, output, client, hit):
    """``Request(rid, arrival, prompt, output, client)`` in ``req[row]``, with its prefix-cache
    hit (drawn ahead by Python)."""
    req[row, :] = 0.0
    req[row, RID], req[row, ARRIVAL], req[row, CLIENT] = rid, arrival, client
    req[row, PROMPT] = req[row, TARGET] = prompt
    req[row, HIT] = hit
    req[row, OUTPUT] = output
    req[row, SCHEDULED] = req[row, FIRST] = req[row, LEVEL] = req[row, ADMIT] = -1.0


@_inner
def _enqueue(queue, row, ct):
    queue[(ct[Q_HEAD] + ct[Q_LEN]) % queue.shape[0]] = row
    ct[Q_LEN] += 1


@_inner
def _take_arrivals(req, queue, rows_free, arrivals, st, ct):
    """``Replica._take_arrivals``: the arrivals due by ``st[NOW]`` queued, each in a free row
    (False where none is left)."""
    while ct[ARRIVALS_AT] < arrivals.shape[1] and arrivals[0, ct[ARRIVALS_AT]] <= st[NOW]:
        if ct[ROWS_FREE_N] == 0:
            return False
        at = ct[ARRIVALS_AT]
        ct[ARRIVALS_AT] = at + 1
        ct[ROWS_FREE_N] -= 1
        row = rows_free[ct[ROWS_FREE_N]]
        times, prompts, outputs, hits = arrivals[0], arrivals[1], arrivals[2], arrivals[3]
        _new_request(req, row, ct[NEXT_RID], times[at], prompts[at], outputs[at], -1, hits[at])
        ct[NEXT_RID] += 1
        _enqueue(queue, row, ct)
    return True


@_inner
def _release_pending(req, queue, pending, st, ct):
    """The clients' requests that have arrived by ``st[NOW]`` queued, in the order sent (one
    delay for all: the order they arrive)."""
    while ct[PEND_LEN] and req[pending[ct[PEND_HEAD]], ARRIVAL] <= st[NOW]:
        _enqueue(queue, pending[ct[PEND_HEAD]], ct)
        ct[PEND_HEAD] = (ct[PEND_HEAD] + 1) % pending.shape[0]
        ct[PEND_LEN] -= 1


@_inner
def _finish(req, c, now, records, queue, pending, rows_free, lengths, st, ct):
    """``Replica._finish``: the record; then, for closed-loop clients (no think time),
    ``ClosedLoopClients.on_finish``: the steady window's marks, and the client's next request
    in the row (or the client refused), queued, or with an API server's delay
    (``st[DELAY]``, ``fleet.Frontend``) pending until it arrives; else the row is free."""
    r = ct[RECORDS]
    for j, field in enumerate(
        (RID, ARRIVAL, SCHEDULED, FIRST, -1, PROMPT, OUTPUT, STEPS, DRAFTED, ACCEPTED, PREEMPTIONS)
    ):
        records[r, j] = now if field < 0 else req[c, field]
    records[r, FINISH_EMITTED] = st[EMITTED]
    ct[RECORDS] = r + 1
    if not ct[CLIENTS]:
        req[c, RID] = -1.0  # the row is free
        rows_free[ct[ROWS_FREE_N]] = c
        ct[ROWS_FREE_N] += 1
        return
    rid = req[c, RID]
    if ct[FIRST_LO] <= rid < ct[FIRST_HI]:
        ct[FIRST_LEFT] -= 1
        if ct[FIRST_LEFT] == 0:
            ct[OPENED] = 1
            st[OPENED_AT], st[OPENED_EMITTED] = now, st[EMITTED]
    if ct[ISSUE_LEFT] > 0 and now < st[HORIZON]:
        at = ct[LENGTHS_AT]
        ct[LENGTHS_AT] = at + 1
        ct[ISSUE_LEFT] -= 1
        ct[ISSUED] += 1
        arrival = now + st[DELAY] if st[DELAY] > 0.0 else now
        prompt, output, hit = lengths[0, at], lengths[1, at], lengths[2, at]
        _new_request(req, c, ct[NEXT_RID], arrival, prompt, output, req[c, CLIENT], hit)
        ct[NEXT_RID] += 1
        if st[DELAY] > 0.0:
            pending[(ct[PEND_HEAD] + ct[PEND_LEN]) % pending.shape[0]] = c
            ct[PEND_LEN] += 1
        else:
            _enqueue(queue, c, ct)
        return
    req[c, RID] = -1.0  # the client is done
    if ct[CLOSED] == 0:
        ct[CLOSED] = 1
        st[CLOSED_AT], st[CLOSED_EMITTED] = now, st[EMITTED]


@_inner
def _start_decoding(req, c, batch, slot_row, join_step, join_left, free, st, ct):
    """``Replica._start_decoding``: the request takes the free list's last slot."""
    remaining, context, output, level, shift, drafted_by_row, admit_order = batch
    ct[FREE_N] -= 1
    slot = free[ct[FREE_N]]
    if slot >= ct[HIGH]:
        ct[HIGH] = slot + 1
    left = req[c, OUTPUT] - req[c, GENERATED]
    slot_row[slot] = c
    context[slot] = req[c, TARGET]
    st[DECODE_KV] += req[c, TARGET]
    remaining[slot] = left
    output[slot] = req[c, OUTPUT]
    level[slot] = np.int64(req[c, LEVEL])
    shift[slot] = 2.0 * level[slot]
    drafted_by_row[slot] = 0.0
    admit_order[slot] = np.int64(req[c, ADMIT])
    join_step[slot] = ct[DECODE_STEPS]
    join_left[slot] = left
    ct[DECODING] += 1
    ct[JOINED] += 1


@_inner
def _free_slot(s, batch, slot_row, free, st, ct):
    """``Replica._free_slot``: the slot's arrays cleared and the slot on the free list."""
    remaining, context, _, level, shift, _, admit_order = batch
    st[DECODE_KV] -= context[s]
    remaining[s] = 0.0
    context[s] = 0.0
    level[s] = 0
    shift[s] = 0.0
    admit_order[s] = -1
    slot_row[s] = -1
    free[ct[FREE_N]] = s
    ct[FREE_N] += 1
    ct[DECODING] -= 1
    high = ct[HIGH]
    while high and slot_row[high - 1] < 0:
        high -= 1
    ct[HIGH] = high


@_inner
def _bank_row(req, client, s, batch, join_step, join_left, ct):
    """``Replica._bank_row``: the row's steps, drafts and accepted drafts onto its request."""
    remaining, drafted_by_row = batch[0], batch[5]
    steps = ct[DECODE_STEPS] - join_step[s]
    req[client, STEPS] += steps
    req[client, DRAFTED] += drafted_by_row[s]
    req[client, ACCEPTED] += join_left[s] - remaining[s] - steps


@_inner
def _make_room(
    req, queue, prefilling, batch, slot_row, join_step, join_left, free, st, ct, lookahead
):
    """``Admission.make_room``: preempt the youngest sequences (prompts in prefill first) until
    the cache holds the batch's next step; False where one sequence alone outgrows it (Python
    raises the error)."""
    count = req.shape[0]
    remaining, admit_order = batch[0], batch[6]
    while st[DECODE_KV] + ct[DECODING] * lookahead + st[RESERVED] > st[KV_CAPACITY]:
        if ct[DECODING] + ct[P_LEN] <= 1:
            return False
        if ct[P_LEN]:
            ct[P_LEN] -= 1
            c = prefilling[(ct[P_HEAD] + ct[P_LEN]) % count]
            st[RESERVED] -= req[c, TARGET] + lookahead
            st[PENDING] -= req[c, TARGET] - req[c, PREFILLED]
        else:  # Replica.evict_youngest
            s = np.argmax(admit_order)
            c = slot_row[s]
            _bank_row(req, c, s, batch, join_step, join_left, ct)
            req[c, GENERATED] = req[c, OUTPUT] - remaining[s]
            _free_slot(s, batch, slot_row, free, st, ct)
            req[c, TARGET] = req[c, PROMPT] + req[c, GENERATED]
        req[c, PREFILLED] = 0.0
        req[c, PREEMPTIONS] += 1.0
        ct[Q_HEAD] = (ct[Q_HEAD] - 1) % count
        queue[ct[Q_HEAD]] = c
        ct[Q_LEN] += 1
    return True


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
def in_range(req, prefilling, rows, k, p_rows, chunk, context, used, st, ct):
    """Whether ``Replica._check_ranges`` would pass the iteration silently: its batch, its
    largest cached context (a decoding row's, or a chunk's prompt tokens before it) and its
    rows' new tokens (1 to k + 1 for the decoding rows, each chunk's size) within the limits
    ``StepCosts.range_limits`` gave (``st[RANGE_*]``)."""
    count = req.shape[0]
    top = 0.0
    low, high = np.inf, -np.inf
    if rows:
        for s in range(used):
            top = max(top, context[s])
        low, high = 1.0, k + 1.0
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
def _padded_rows(drafts, context, used, rows, new_tokens):
    """``Replica._plan_mixed``'s charge for decoding rows with padded attention: every row's
    attention (and cache read) runs to the longest context; the KV tokens and pairs."""
    longest = drafted = squares = 0.0
    for s in range(used):
        longest = max(longest, context[s])
        drafted += drafts[s]
        squares += drafts[s] * drafts[s]
    own_span = 0.5 * (squares + 2.0 * drafted + used + new_tokens)
    return rows * longest, new_tokens * longest + own_span


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
        st[RESERVED] -= req[c, TARGET] + lookahead
        if req[c, FIRST] < 0:
            req[c, FIRST] = now
        req[c, GENERATED] += 1.0
    return through


@_inner
def _through(req, prefilling, p_rows, chunk, done, batch, places, lengths, st, ct, lookahead, end):
    """The prompts' chunks run by ``end`` (``Replica._finish_prefills``): those now through
    finish (their first token their last) or start decoding."""
    slot_row, join_step, join_left, free, records, queue, pending, rows_free = places
    through = _complete(req, prefilling, p_rows, chunk, done, st, ct, lookahead, end)
    for j in range(through):
        client = done[j]
        if req[client, GENERATED] >= req[client, OUTPUT]:
            _finish(req, client, end, records, queue, pending, rows_free, lengths, st, ct)
        else:
            _start_decoding(req, client, batch, slot_row, join_step, join_left, free, st, ct)


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
    (``by_rows``; one entry for a fixed k).

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
        if not _admit(req, queue, prefilling, levels, st, ct, lookahead, capacity):
            break
        # Admission stopped short of the queue's tail only where a request still waits (FCFS),
        # the batch is full or the prompt budget spent: else one queued last would have joined.
        # Without chunked prefill the budget stops no admission, and prompts waiting run whole
        # in an iteration of their own, with no room made first (``_prompts_apart``).
        apart = ct[PREFILL_APART] and ct[P_LEN]
        spent = st[PENDING] >= st[TOKEN_BUDGET] and not ct[PREFILL_APART]
        if not (ct[Q_LEN] or ct[DECODING] + ct[P_LEN] >= capacity or spent):
            ct[OPEN_UNTIL] = ct[ITERATIONS] + 1
        if not apart and not _make_room(
            req,
            queue,
            prefilling,
            batch,
            slot_row,
            join_step,
            join_left,
            free,
            st,
            ct,
            lookahead,
        ):
            break
        rows = ct[DECODING]
        decode_kv = st[DECODE_KV]
        held = decode_kv + rows * lookahead + st[RESERVED]
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
            dt = _prompts_apart(whole, c, st, ct)
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
                by_rows,
                goodput,
                c,
                rows,
                decode_kv,
                remaining,
                context,
                used,
                req,
                prefilling,
                chunk,
                st,
                ct,
            )
        else:
            k = by_rows[min(rows, by_rows.shape[0] - 1)]
        new_tokens = pairs = charged_pairs = 0.0
        charged_kv = decode_kv  # what the pass is charged for (padded attention: more)
        drawn = ct[DRAWN]
        if rows:
            ct[DRAWN] += draw_rows(
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
            charged_pairs = pairs
            if ct[PADDED]:
                charged_kv, charged_pairs = _padded_rows(drafts, context, used, rows, new_tokens)
        p_rows, p_tokens, p_kv, p_pairs = 0, 0.0, 0.0, 0.0
        if ct[P_LEN]:
            p_rows, p_tokens, p_kv, p_pairs = _chunks(
                req, prefilling, st[TOKEN_BUDGET] - new_tokens, chunk, st, ct
            )
        if ct[CHECKS_RANGES] and not in_range(
            req, prefilling, rows, k, p_rows, chunk, context, used, st, ct
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
        dt = _jittered(dt, trace, ct, rows == 0)
        end = now + dt
        # First tokens count before any finish, which may end the steady window.
        st[EMITTED] += _completing(req, prefilling, p_rows, chunk, ct)
        if rows:
            apply_step(
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
                log_all,
                ct[FILLED],
                i,
                end,
                rows + p_rows,
                held,
                ct[JOINED],
            )
            ct[FILLED] += used
            ct[DECODE_STEPS] += 1
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
                log_dt,
                log_batch,
                log_kv,
                log_itl,
                log_weight,
                i,
                now,
                end,
                p_rows,
                held,
                0.0,
                0,
                0,
            )
        ct[LOGGED] = i + 1
        st[HELD] = held
        if p_rows:
            _through(
                req, prefilling, p_rows, chunk, done, batch, places, lengths, st, ct, lookahead, end
            )
        _advance(trace, st, ct, end)
