"""The compiled loop for closed-loop clients, Python's side: where it runs, its state in and out.

A replica alone serving closed-loop clients with no think time is saturated more often than
not: the queue rarely empties, and most iterations carry prompt chunks. There the open-loop
loop (``compiled_loop.py``) never runs, so ``compiled_closed_kernel.closed_loop`` runs
admission, chunked prefill, decoding, finishes and the clients' next requests itself. This
module packs what it reads (the requests in flight by client, the queue, the prompts in
prefill, the batch's slots, the levels and lengths drawn ahead) and writes back what it did:
the records (in finish order), the requests still in flight as ``Request`` objects, and the
replica's, admission's, step log's and clients' counts. It runs where a fixed k or k by batch
size picks the window, prefill is chunked, no prefix cache is kept, and the replica's other
conditions for a compiled loop hold (``compiled_loop.DecodeLoop.build``); elsewhere, and
whenever the kernel stops for Python (preemption, levels to draw), the other paths run.
"""

from __future__ import annotations

import importlib
from collections import deque
from itertools import repeat

import numpy as np

from specsim.simulation.compiled_closed_layout import (
    ACCEPTED,
    ADMISSIONS,
    ADMIT,
    ARRIVAL,
    CLOSED,
    CLOSED_AT,
    CLOSED_EMITTED,
    COUNTS,
    DECODE_STEPS,
    DECODING,
    DRAFTED,
    DRAWN,
    FIELDS,
    FILLED,
    FIRST,
    FIRST_HI,
    FIRST_LEFT,
    FIRST_LO,
    FREE_N,
    GENERATED,
    HIGH,
    ISSUE_LEFT,
    ISSUED,
    ITERATIONS,
    JOINED,
    LEVEL,
    LEVELS_AT,
    LOGGED,
    NEXT_RID,
    NOW,
    OPENED,
    OPENED_AT,
    OPENED_EMITTED,
    OUTPUT,
    P_HEAD,
    P_LEN,
    PREEMPTIONS,
    PREFILLED,
    PROMPT,
    Q_HEAD,
    Q_LEN,
    RECORD,
    RECORDS,
    RID,
    SCHEDULED,
    STATE,
    STEPS,
    TARGET,
)
from specsim.simulation.compiled_loop import DecodeLoop, kernel
from specsim.simulation.request import Request
from specsim.simulation.steplog import BUFFER_ITERATIONS
from specsim.workload.prefix import NoPrefix

AHEAD = 4096  # the clients' next lengths handed to one call (and records it may write)
RETRY_AFTER = 16  # iterations Python runs after a call that ran none, before the next call


class ClosedLoop:
    """One replica's buffers for the closed-loop kernel, and the clients it serves."""

    def __init__(self, replica, clients, decode: DecodeLoop):
        self.clients = clients
        self.decode = decode  # the cost vector, window terms and acceptance tables
        count = clients.source.concurrency
        self.req = np.zeros((count, FIELDS))
        self.queue = np.zeros(count, dtype=np.int64)
        self.prefilling = np.zeros(count, dtype=np.int64)
        cap = replica.capacity
        self.slot_client = np.full(cap, -1, dtype=np.int64)
        self.join_step = np.zeros(cap, dtype=np.int64)
        self.join_left = np.zeros(cap)
        self.free = np.zeros(cap, dtype=np.int64)
        self.records = np.zeros((AHEAD, RECORD))
        self.st = np.zeros(STATE)
        self.ct = np.zeros(COUNTS, dtype=np.int64)
        self.wait = 0  # iterations to leave to Python before the next call

    @staticmethod
    def build(replica, clients) -> ClosedLoop | None:
        """The loop for ``replica`` serving ``clients`` alone, or None where it cannot run."""
        decode = DecodeLoop.build(replica)
        if (
            decode is None
            or not decode.by_rows.shape[0]  # the goodput policy weighs chunks per window
            or not replica.chunked
            or type(replica.admission.prefix) is not NoPrefix
            or clients.source.think_mean > 0
        ):
            return None
        return ClosedLoop(replica, clients, decode)

    def run(self, replica, now: float) -> float | None:
        """Run iterations from ``now`` until the kernel stops; returns when the last one ends
        (None: none ran; whatever admission it did is written back all the same)."""
        if self.wait:
            self.wait -= 1
            return None
        levels, lengths = self._pack(replica, now)
        decode, log, stream = self.decode, replica.log, replica._draws
        base_words, offset = stream.base()
        ct = self.ct
        _closed_kernel().closed_loop(
            base_words,
            offset,
            decode.blocks,
            decode.tables,
            decode.table_at,
            replica.acceptance.proposal_rate,
            decode.by_rows,
            decode.goodput,
            replica.admission.lookahead,
            (
                replica.remaining,
                replica.context,
                replica.output,
                replica.level,
                replica.level_shift,
                replica.row_drafted,
                replica.admit_order,
            ),
            self.slot_client,
            self.join_step,
            self.join_left,
            self.free,
            self.req,
            self.queue,
            self.prefilling,
            levels,
            lengths,
            self.records,
            decode.costs,
            self.st,
            ct,
            (log._dt, log._kv, log._itl, log._itl_weight),
            log._batch,
            log._accepted,
            log._drafted,
            log._step_limit,
        )
        stream.skip(int(ct[DRAWN]))
        self._unpack(replica)
        if not ct[ITERATIONS]:
            self.wait = RETRY_AFTER
            return None
        return float(self.st[NOW])

    # ---- packing -------------------------------------------------------------------------
    def _pack(self, replica, now: float) -> tuple[np.ndarray, np.ndarray]:
        admission, log, clients = replica.admission, replica.log, self.clients
        source = clients.source
        req, ct = self.req, self.ct
        req[:, RID] = -1.0
        ct[:] = 0
        for ring, requests, size in (
            (self.queue, admission.queue, Q_LEN),
            (self.prefilling, admission.prefilling, P_LEN),
        ):
            for j, request in enumerate(requests):
                self._load(request)
                ring[j] = request.client
            ct[size] = len(requests)
        self.slot_client[:] = -1
        for slot, request in enumerate(replica.slot_request):
            if request is not None:
                self._load(request)
                self.slot_client[slot] = request.client
                self.join_step[slot] = replica.join_step[slot]
                self.join_left[slot] = replica.join_remaining[slot]
        free = replica.free_slots
        self.free[: len(free)] = free
        ct[FREE_N] = len(free)
        ct[HIGH], ct[DECODING], ct[JOINED] = replica.high, replica.decoding, replica._joined
        ct[DECODE_STEPS], ct[ADMISSIONS] = replica.decode_steps, admission.admissions
        ct[NEXT_RID] = clients.counter[0]
        limit = source.limit
        ct[ISSUE_LEFT] = np.iinfo(np.int64).max if limit is None else limit - source.issued
        ct[FIRST_LO], ct[FIRST_HI], ct[FIRST_LEFT] = clients.first_requests()
        ct[LOGGED], ct[FILLED] = log._iterations, log._filled
        self.st[:] = (
            replica.decode_kv,
            replica.emitted_tokens,
            replica.left_total,
            now,
            replica.last_decode_end,
            replica.last_decode_s,
            log.verification_flops,
            log.drafter_flops,
            log.wasted_flops,
            log.window_rows,
            log.decode_rows,
            admission.reserved,
            admission.pending,
            replica.kv_capacity,
            replica._kv_planned,
            replica.stats.flops["prefill"],
            admission.prefill_computed,
            admission.prefix_queried,
            np.inf if source.horizon is None else source.horizon,
            replica.token_budget,
            0.0,
            0.0,
            0.0,
            0.0,
        )
        levels = np.array(admission._levels[::-1], dtype=np.int64)  # in the order pop() takes
        prompts, outputs = source.upcoming(int(min(ct[ISSUE_LEFT], AHEAD)))
        lengths = np.array([prompts, outputs], dtype=np.float64).reshape(2, -1)
        # Only requests that fit the cache: the per-iteration path refuses the first that does
        # not, when a client issues it.
        too_long = lengths[0] + lengths[1] + admission.lookahead > replica.kv_capacity
        if too_long.any():
            lengths = lengths[:, : int(too_long.argmax())]
        return levels, np.ascontiguousarray(lengths)

    def _load(self, request: Request) -> None:
        self.req[request.client] = (
            request.rid,
            request.arrival,
            request.prompt,
            request.output,
            request.scheduled,
            request.first_token,
            request.generated,
            request.steps,
            request.drafted,
            request.accepted,
            request.preemptions,
            request.level,
            request.prefill_target,
            request.prefilled,
            request.admit_order,
        )

    # ---- unpacking -----------------------------------------------------------------------
    def _unpack(self, replica) -> None:
        admission, log, clients = replica.admission, replica.log, self.clients
        ct, st = self.ct, self.st
        self._write_records(replica)
        in_flight = self._requests()
        clients_ring = self.queue, self.prefilling
        admission.queue = deque(
            in_flight[int(c)] for c in _ring(clients_ring[0], ct[Q_HEAD], ct[Q_LEN])
        )
        admission.prefilling = [
            in_flight[int(c)] for c in _ring(clients_ring[1], ct[P_HEAD], ct[P_LEN])
        ]
        for slot, client in enumerate(self.slot_client.tolist()):
            replica.slot_request[slot] = None if client < 0 else in_flight[client]
            if client >= 0:
                replica.join_step[slot] = int(self.join_step[slot])
                replica.join_remaining[slot] = int(self.join_left[slot])
        replica.free_slots = self.free[: ct[FREE_N]].tolist()
        replica.high, replica.decoding, replica._joined = (
            int(ct[HIGH]),
            int(ct[DECODING]),
            int(ct[JOINED]),
        )
        replica.decode_steps = int(ct[DECODE_STEPS])
        replica.outstanding += int(ct[ISSUED]) - int(ct[RECORDS])
        admission.admissions = int(ct[ADMISSIONS])
        del admission._levels[len(admission._levels) - int(ct[LEVELS_AT]) :]
        (
            replica.decode_kv,
            replica.emitted_tokens,
            replica.left_total,
            _,
            replica.last_decode_end,
            replica.last_decode_s,
            log.verification_flops,
            log.drafter_flops,
            log.wasted_flops,
            log.window_rows,
            log.decode_rows,
            admission.reserved,
            admission.pending,
            _,
            replica._kv_planned,
            replica.stats.flops["prefill"],
            admission.prefill_computed,
            prefix_queried,
            *_,
        ) = st.tolist()
        admission.prefix_queried = int(prefix_queried)
        log._iterations, log._filled = int(ct[LOGGED]), int(ct[FILLED])
        if log._iterations == BUFFER_ITERATIONS:
            log._flush_iterations()
        if log._filled > log._step_limit:
            log._flush_steps()
        clients.counter[0] = int(ct[NEXT_RID])
        clients.source.issued_ahead(int(ct[ISSUED]))
        opened = (st[OPENED_AT], st[OPENED_EMITTED]) if ct[OPENED] else None
        closed = (st[CLOSED_AT], st[CLOSED_EMITTED]) if ct[CLOSED] else None
        clients.caught_up(int(ct[FIRST_LEFT]), opened, closed)

    def _write_records(self, replica) -> None:
        count = int(self.ct[RECORDS])
        if not count:
            return
        columns = self.records[:count].T
        ints = columns.astype(np.int64)
        rows = zip(
            ints[0].tolist(),
            columns[1].tolist(),
            columns[2].tolist(),
            columns[3].tolist(),
            columns[4].tolist(),
            *(ints[j].tolist() for j in range(5, RECORD)),
            repeat(replica.index),
            repeat(replica.pool_index),
        )
        replica.sink.add_rows(rows)

    def _requests(self) -> dict[int, Request]:
        """The requests in flight after the call, by client, as ``Request`` objects."""
        requests = {}
        for client, row in enumerate(self.req.tolist()):
            if row[RID] < 0:
                continue
            request = Request(
                int(row[RID]), row[ARRIVAL], int(row[PROMPT]), int(row[OUTPUT]), client
            )
            request.scheduled, request.first_token = row[SCHEDULED], row[FIRST]
            request.generated, request.steps = int(row[GENERATED]), int(row[STEPS])
            request.drafted, request.accepted = int(row[DRAFTED]), int(row[ACCEPTED])
            request.preemptions, request.level = int(row[PREEMPTIONS]), int(row[LEVEL])
            request.prefill_target, request.prefilled = int(row[TARGET]), int(row[PREFILLED])
            request.admit_order = int(row[ADMIT])
            requests[client] = request
        return requests


def _ring(ring: np.ndarray, head: int, size: int) -> list[int]:
    count = ring.shape[0]
    return [int(ring[(head + j) % count]) for j in range(size)]


def _closed_kernel():
    kernel()  # numba and the shared kernels first
    return importlib.import_module("specsim.simulation.compiled_closed_kernel")
