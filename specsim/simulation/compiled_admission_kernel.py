"""The serving kernel's admission and request table (numba): requests queued, admitted FCFS,
preempted to make room, started decoding in a slot and finished with their records.

Each kernel stands in for the Python method its docstring names, in the same operations and
order (``compiled_serving_kernel`` runs them, iteration after iteration). Requests live in a
table of rows (a closed-loop client's next request takes its row); the queue and the prompts in
prefill are rings of row numbers.
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.compiled_kernels import _inner
from specsim.simulation.compiled_kv_kernel import (
    _hold,
    _kv_in_use,
    _overlap,
    _release,
    _reservation,
)
from specsim.simulation.compiled_layout import (
    ACCEPTED,
    ADMISSIONS,
    ADMIT,
    ARRIVAL,
    ARRIVALS_AT,
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
    EMITTED,
    FIRST,
    FIRST_HI,
    FIRST_LEFT,
    FIRST_LO,
    FREE_N,
    GENERATED,
    HANDED_OFF,
    HIGH,
    HIT,
    HORIZON,
    ISSUE_LEFT,
    ISSUED,
    JOINED,
    JOINS,
    KV_CAPACITY,
    LENGTHS_AT,
    LEVEL,
    LEVELS_AT,
    NEXT_RID,
    NOW,
    OPENED,
    OPENED_AT,
    OPENED_EMITTED,
    OUTPUT,
    OWED_PAIRS,
    OWED_ROWS,
    OWED_TOKENS,
    P_HEAD,
    P_LEN,
    PEND_HEAD,
    PEND_LEN,
    PENDING,
    PREEMPTIONS,
    PREFILL_APART,
    PREFILLED,
    PREFIX_HITS,
    PREFIX_QUERIED,
    PROMPT,
    PROMPT_PASS,
    Q_HEAD,
    Q_LEN,
    RECORDS,
    RESERVED,
    RID,
    ROWS_FREE_N,
    SCHEDULED,
    SHIFT_AT,
    SHIFT_LEVELS,
    SHIFT_RID,
    STEPS,
    TARGET,
    TOKEN_BUDGET,
)


@_inner
def _admit(req, prefilling, levels, batch, places, st, ct, lookahead):
    """``Admission.admit`` at ``st[NOW]`` (a prefix cache whose hits are by request,
    ``req[c, HIT]``, a shared one among them; on a decode replica, ``DecodeAdmission``'s joins);
    False where the next request to start needs an acceptance level beyond ``levels`` (Python
    draws them). ``places``: as ``serving_loop`` holds them (the queue among them)."""
    count = req.shape[0]
    queue, max_batch = places[5], batch[0].shape[0]
    running = ct[DECODING] + ct[P_LEN]
    if ct[Q_LEN] == 0 or running >= max_batch:
        return True
    used = _kv_in_use(batch, st, ct, lookahead)
    while ct[Q_LEN] and running < max_batch:
        c = queue[ct[Q_HEAD]]
        joins = ct[JOINS] and req[c, PREFILLED] > 0  # preemption sets it back to 0
        if not (joins or ct[PREFILL_APART]) and st[PENDING] >= st[TOKEN_BUDGET]:
            break
        need = _reservation(req, c, ct, lookahead)
        if not joins:  # what the holders of a shared prefix hold already
            need -= _overlap(req, c, st, ct)
        if used + need > st[KV_CAPACITY]:
            break
        first_time = req[c, SCHEDULED] < 0
        if (first_time or joins) and ct[LEVELS_AT] == levels.shape[0]:
            return False
        ct[Q_HEAD] = (ct[Q_HEAD] + 1) % count
        ct[Q_LEN] -= 1
        req[c, ADMIT] = ct[ADMISSIONS]
        ct[ADMISSIONS] += 1
        if first_time:
            req[c, SCHEDULED] = st[NOW]
        if first_time or joins:  # a join takes a level from this pool's levels
            req[c, LEVEL] = levels[ct[LEVELS_AT]] + _shifted(req, c, st, ct)
            ct[LEVELS_AT] += 1
        if joins:
            _join(req, c, batch, places, st, ct)
        else:
            _start_prefill(req, c, prefilling, st, ct, lookahead)
        used += need
        running += 1
    return True


@_inner
def _shifted(req, c, st, ct):
    """How far request ``c``'s drawn level moves on (``RateAcceptance.request_level``): the
    base levels where the workload's acceptance has shifted by its index or arrival, else 0."""
    if req[c, RID] >= st[SHIFT_RID] or req[c, ARRIVAL] >= st[SHIFT_AT]:
        return ct[SHIFT_LEVELS]
    return 0


@_inner
def _start_prefill(req, c, prefilling, st, ct, lookahead):
    """``Admission._start_prefill`` past the level: prefill starts past the hit (every
    admission; a decode replica looks nothing up, ``DecodeAdmission._cached``)."""
    count = req.shape[0]
    req[c, PREFILLED] = req[c, HIT]
    _hold(req, c, st, ct)
    if not ct[JOINS]:
        st[PREFIX_QUERIED] += req[c, TARGET]
        st[PREFIX_HITS] += req[c, HIT]
    prefilling[(ct[P_HEAD] + ct[P_LEN]) % count] = c
    ct[P_LEN] += 1
    st[RESERVED] += _reservation(req, c, ct, lookahead)
    st[PENDING] += req[c, TARGET] - req[c, PREFILLED]


@_inner
def _join(req, c, batch, places, st, ct):
    """``DecodeReplica._join``: the request starts decoding with the KV cache it brought, owing
    its draft model's pass over the prompt where the drafter keeps a cache of its own."""
    slot_row, join_step, join_left, free = places[0], places[1], places[2], places[3]
    _start_decoding(req, c, batch, slot_row, join_step, join_left, free, st, ct)
    if ct[PROMPT_PASS]:
        prompt = req[c, PROMPT]
        st[OWED_ROWS] += 1.0
        st[OWED_TOKENS] += prompt
        st[OWED_PAIRS] += prompt * (prompt + 1) / 2.0


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
def _record(req, c, now, records, ct):
    """The request's record at ``now``: the sink's row up to preemptions."""
    r = ct[RECORDS]
    for j, field in enumerate(
        (RID, ARRIVAL, SCHEDULED, FIRST, -1, PROMPT, OUTPUT, STEPS, DRAFTED, ACCEPTED, PREEMPTIONS)
    ):
        records[r, j] = now if field < 0 else req[c, field]
    ct[RECORDS] = r + 1


@_inner
def _free_row(req, c, rows_free, ct):
    """The request's row free for another."""
    req[c, RID] = -1.0
    rows_free[ct[ROWS_FREE_N]] = c
    ct[ROWS_FREE_N] += 1


@_inner
def _hand_off(req, c, now, records, rows_free, st, ct):
    """``PrefillReplica.hand_off``: the request leaves the prefill replica at ``now`` (its hold
    on a shared prefix released), its record marked by its first token (``HANDED_OFF``: the
    decode replica streams it)."""
    _release(req, c, st)
    req[c, FIRST] = HANDED_OFF
    _record(req, c, now, records, ct)
    _free_row(req, c, rows_free, ct)


@_inner
def _finish(req, c, now, records, queue, pending, rows_free, lengths, st, ct):
    """``Replica._finish``: the record; then, for closed-loop clients (no think time),
    ``ClosedLoopClients.on_finish``: the steady window's marks, and the client's next request
    in the row (or the client refused), queued, or with an API server's delay
    (``st[DELAY]``, ``fleet.Frontend``) pending until it arrives; else the row is free. Its
    hold on a shared prefix goes first (``Admission.finished``)."""
    _release(req, c, st)
    _record(req, c, now, records, ct)
    if not ct[CLIENTS]:
        _free_row(req, c, rows_free, ct)
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
    while _kv_in_use(batch, st, ct, lookahead) > st[KV_CAPACITY]:
        if ct[DECODING] + ct[P_LEN] <= 1:
            return False
        if ct[P_LEN]:
            ct[P_LEN] -= 1
            c = prefilling[(ct[P_HEAD] + ct[P_LEN]) % count]
            st[RESERVED] -= _reservation(req, c, ct, lookahead)
            st[PENDING] -= req[c, TARGET] - req[c, PREFILLED]
        else:  # Replica.evict_youngest
            s = np.argmax(admit_order)
            c = slot_row[s]
            _bank_row(req, c, s, batch, join_step, join_left, ct)
            req[c, GENERATED] = req[c, OUTPUT] - remaining[s]
            _free_slot(s, batch, slot_row, free, st, ct)
            req[c, TARGET] = req[c, PROMPT] + req[c, GENERATED]
        _release(req, c, st)
        req[c, PREFILLED] = 0.0
        req[c, PREEMPTIONS] += 1.0
        ct[Q_HEAD] = (ct[Q_HEAD] - 1) % count
        queue[ct[Q_HEAD]] = c
        ct[Q_LEN] += 1
    return True
