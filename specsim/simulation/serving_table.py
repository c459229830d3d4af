"""The compiled serving loop's table (``compiled_serving.py``): a replica's state packed for
the kernel, and written back after it.

``_pack`` loads what the kernel reads (the requests in flight as rows of a table, the queue and
the prompts in prefill as rings of rows, the batch's slots, the acceptance levels, arrivals and
clients' lengths drawn ahead); ``_unpack`` writes back what it did: the records in finish
order, the requests still in flight as ``Request`` objects, and the replica's, admission's,
step log's, arrival feed's and clients' counts.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import attrgetter

import numpy as np

from specsim.simulation.compiled_layout import (
    ADMISSIONS,
    ARRIVALS_AT,
    CHECKS_RANGES,
    CLIENTS,
    CLOSED,
    CLOSED_AT,
    CLOSED_EMITTED,
    COUNTS,
    DECODE_STEPS,
    DECODING,
    DELAY,
    FIELDS,
    FILLED,
    FIRST_HI,
    FIRST_LEFT,
    FIRST_LO,
    FREE_N,
    HANDS_OFF,
    HIGH,
    HIT,
    HORIZON,
    ISSUE_LEFT,
    ISSUED,
    JITTERED,
    JOINED,
    JOINS,
    LEVELS_AT,
    LOGGED,
    MORE_ARRIVALS,
    NEXT_RID,
    NOW,
    OPENED,
    OPENED_AT,
    OPENED_EMITTED,
    OWED_PAIRS,
    OWED_ROWS,
    OWED_TOKENS,
    P_HEAD,
    P_LEN,
    PADDED,
    PEND_HEAD,
    PEND_LEN,
    PREFILL_APART,
    PREFIX_HITS,
    PROMPT_PASS,
    Q_HEAD,
    Q_LEN,
    RANGE_BATCH_LO,
    RANGE_NEW_HI,
    RECORD,
    RECORDS,
    REQUEST_FIELDS,
    RESERVED,
    RID,
    ROWS_FREE_N,
    SHARED_HELD,
    STATE,
    STEP_STATE,
    TIME_FIELDS,
    TOKEN_BUDGET,
)
from specsim.simulation.request import Request
from specsim.simulation.serving_kv import fitting_lengths, pack_kv, shared_held, unpack_holders
from specsim.simulation.serving_policy import pack_policy, policy_floats, unpack_policy
from specsim.simulation.steplog import BUFFER_ITERATIONS

AHEAD = 4096  # arrivals or clients' lengths handed to one call, and records it may write
FLEET_ROWS = 64  # a fleet replica's first request table (it doubles as needed)
TRACE = BUFFER_ITERATIONS  # iterations one call may run (the step log folds after as many)


class ServingTable:
    """One replica's buffers for the serving kernel, and the traffic it serves (an open-loop
    ``ArrivalFeed`` or ``ClosedLoopClients``)."""

    def __init__(self, replica, decode, feed=None, clients=None):
        self.feed = feed
        self.clients = clients
        # ``KernelTables``: the cost vector, window terms and acceptance tables.
        self.decode = decode
        self.admission = replica.admission  # its prefix-cache hits (``Admission.hits``)
        self._slots(replica)
        self.records = np.zeros((AHEAD, RECORD))
        # Clients' requests on their way through an API server (``fleet.Frontend``): between
        # calls the loop holds those it sent (``pending``), and hands them to the server
        # before Python steps the replica itself; while the server has any on the way, the
        # loop waits (it would run past their arrival).
        self.frontend = getattr(clients, "fleet", None)
        self.delay = getattr(self.frontend, "request_s", 0.0)
        self.pending: list[Request] = []
        self.rows = 0
        # A client's request takes the client's row; a lone replica's arrivals take up to
        # AHEAD rows; a fleet replica's table grows with what is in flight (``_pack``).
        rows = replica.capacity + AHEAD if feed is not None else FLEET_ROWS
        self._table(clients.source.concurrency if clients is not None else rows)
        self.wait = 0  # iterations to leave to Python before the next call
        # Each iteration's end and the tokens emitted by then; and its time multipliers drawn
        # ahead (decode, prefill) where the replica has jitter.
        self.trace = np.zeros((4, TRACE))

    def _slots(self, replica) -> None:
        """The per-slot arrays and the state, as views into two arrays (``floats``, ``counts``):
        with the request table and its rings, what a call changes is four arrays, which a
        fleet replica copies to replay a call from (``fleet_serving.py``). The replica's batch
        arrays become views too, their values kept."""
        cap = replica.capacity
        self.floats = np.zeros(6 * cap + STATE + policy_floats(replica.policy))
        self.counts = np.zeros(5 * cap + COUNTS, dtype=np.int64)
        floats = self.floats[: 6 * cap].reshape(6, cap)
        counts = self.counts[: 5 * cap].reshape(5, cap)
        for views, names in (
            (floats, ("remaining", "context", "output", "level_shift", "row_drafted")),
            (counts, ("level", "admit_order")),
        ):
            for view, name in zip(views, names, strict=False):  # the rest are the table's
                view[:] = getattr(replica, name)
                setattr(replica, name, view)
        self.join_left = floats[5]
        self.slot_row, self.join_step, self.free = counts[2], counts[3], counts[4]
        self.slot_row[:] = -1
        self.st = self.floats[6 * cap :]
        self.ct = self.counts[5 * cap :]

    def _table(self, rows: int) -> None:
        """The request table and its rings, for ``rows`` requests in flight."""
        self.rows = rows
        self.req = np.zeros((rows, FIELDS))
        self.rings = np.zeros((4, rows), dtype=np.int64)
        self.rows_free, self.queue, self.prefilling, self.pending_ring = self.rings
        self._args = None  # the kernel's arguments name the table's arrays

    # ---- packing -------------------------------------------------------------------------
    def _pack(self, replica, now: float, in_flight: int) -> None:
        """The table, rings and counts loaded from the replica, and the levels, arrivals and
        clients' lengths for the call (``inputs``)."""
        admission, log = replica.admission, replica.log
        ct, st = self.ct, self.st
        ct[:] = 0
        arrivals, more = self._arrivals(replica)
        if self.clients is None and in_flight + arrivals.shape[1] > self.rows:
            self._table(2 * (in_flight + arrivals.shape[1]))
        req = self.req
        req[:, RID] = -1.0
        loaded = 0
        for ring, requests, size in (
            (self.queue, admission.queue, Q_LEN),
            (self.prefilling, admission.prefilling, P_LEN),
        ):
            for j, request in enumerate(requests):
                ring[j] = self._load(request, loaded)
                loaded += 1
            ct[size] = len(requests)
        for j, request in enumerate(self.pending):
            self.pending_ring[j] = self._load(request, loaded)
            loaded += 1
        ct[PEND_LEN] = len(self.pending)
        self.slot_row[:] = -1
        for slot, request in enumerate(replica.slot_request):
            if request is not None:
                self.slot_row[slot] = self._load(request, loaded)
                loaded += 1
                self.join_step[slot] = replica.join_step[slot]
                self.join_left[slot] = replica.join_remaining[slot]
        unused = np.flatnonzero(req[:, RID] < 0)[::-1]  # taken from the end: the lowest first
        self.rows_free[: unused.shape[0]] = unused
        ct[ROWS_FREE_N] = unused.shape[0]
        free = replica.free_slots
        self.free[: len(free)] = free
        ct[FREE_N] = len(free)
        ct[HIGH], ct[DECODING], ct[JOINED] = replica.high, replica.decoding, replica._joined
        ct[DECODE_STEPS], ct[ADMISSIONS] = replica.decode_steps, admission.admissions
        ct[LOGGED], ct[FILLED] = log._iterations, log._filled
        ct[MORE_ARRIVALS] = more
        ct[PREFILL_APART] = not replica.chunked
        ct[JITTERED] = replica.jitter is not None
        ct[PADDED] = replica.padded
        ct[HANDS_OFF], ct[JOINS] = replica.hands_off, replica.joins
        ct[PROMPT_PASS] = replica.draft_prompt_pass
        st[:] = 0.0
        st[: TOKEN_BUDGET + 1] = (
            *step_state(replica, now),
            admission.reserved,
            admission.pending,
            replica.kv_capacity,
            replica._kv_planned,
            replica.stats.flops["prefill"],
            admission.prefill_computed,
            admission.prefix_queried,
            np.inf,  # the clients' horizon, if any
            replica.token_budget,
        )
        st[OWED_ROWS : OWED_PAIRS + 1] = replica.prompt_pass
        self._rules(replica)
        lengths = self._clients(replica) if self.clients is not None else np.zeros((3, 0))
        # At most one level for each request not yet admitted, in the order pop() takes them.
        most = len(admission.queue) + len(self.pending) + arrivals.shape[1] + lengths.shape[1]
        levels = np.array(admission._levels[: -most - 1 : -1], dtype=np.int64)
        self.inputs = levels, arrivals, lengths
        self._args = None

    def _rules(self, replica) -> None:
        """The API server's delay, the block size, the prefix hits so far, a shared prefix's
        holders, the window policy's state, and the profile's measured range as it stands
        (``StepCosts.range_limits``: a warning, once given, is done)."""
        st = self.st
        st[DELAY] = self.delay
        st[PREFIX_HITS] = replica.admission.prefix_hits
        pack_kv(replica.admission, st, self.ct)
        pack_policy(replica.policy, st, self.ct)
        limits = replica.costs.range_limits()
        st[RANGE_BATCH_LO : RANGE_NEW_HI + 1] = limits
        self.ct[CHECKS_RANGES] = limits != (-np.inf, np.inf, np.inf, -np.inf, np.inf)

    def _load(self, request: Request, loaded: int) -> int:
        """The request's row (a client's own, else the next one), filled in."""
        row = request.client if self.clients is not None else loaded
        self.req[row, :HIT] = _request_fields(request)
        self.req[row, HIT] = self.admission.capped_hit(request)
        self.req[row, SHARED_HELD] = shared_held(self.admission, request)
        return row

    def _arrivals(self, replica) -> tuple[np.ndarray, bool]:
        """The feed's next arrivals (times, prompts, outputs), and whether more may follow."""
        if self.feed is None:
            return np.zeros((4, 0)), False
        self.ct[NEXT_RID] = self.feed.next_id
        times, prompts, outputs = self.feed.upcoming(AHEAD)
        lengths = fitting_lengths(replica.admission, prompts, outputs)
        count = lengths.shape[1]
        arrivals = np.empty((4, count))
        arrivals[0] = times[:count]
        arrivals[1:3] = lengths
        arrivals[3] = self._hits(lengths[0])
        return arrivals, bool(times)  # an empty list: the feed has no more

    def _clients(self, replica) -> np.ndarray:
        """The clients' next requests' lengths, and the clients' counts."""
        clients, ct, st = self.clients, self.ct, self.st
        source = clients.source
        ct[CLIENTS] = 1
        ct[NEXT_RID] = clients.counter[0]
        limit = source.limit
        ct[ISSUE_LEFT] = np.iinfo(np.int64).max if limit is None else limit - source.issued
        ct[FIRST_LO], ct[FIRST_HI], ct[FIRST_LEFT] = clients.first_requests()
        st[HORIZON] = np.inf if source.horizon is None else source.horizon
        prompts, outputs = source.upcoming(int(min(ct[ISSUE_LEFT], AHEAD)))
        lengths = fitting_lengths(replica.admission, prompts, outputs)
        return np.vstack([lengths, self._hits(lengths[0])])

    def _hits(self, prompts: np.ndarray) -> np.ndarray:
        """The prefix-cache hits of the requests to be numbered from ``ct[NEXT_RID]`` on, with
        these prompts: drawn here, as the admission would (the kernel admits with them)."""
        rids = np.arange(prompts.shape[0], dtype=np.int64) + self.ct[NEXT_RID]
        return self.admission.hits(rids, prompts)

    # ---- unpacking -----------------------------------------------------------------------
    def _unpack(self, replica) -> None:
        admission, log = replica.admission, replica.log
        ct, st = self.ct, self.st
        in_flight = self._requests()
        admission.queue = deque(in_flight[row] for row in _ring(self.queue, ct[Q_HEAD], ct[Q_LEN]))
        admission.prefilling = [
            in_flight[row] for row in _ring(self.prefilling, ct[P_HEAD], ct[P_LEN])
        ]
        before = len(self.pending)
        self.pending = [
            in_flight[row] for row in _ring(self.pending_ring, ct[PEND_HEAD], ct[PEND_LEN])
        ]
        for slot, row in enumerate(self.slot_row.tolist()):
            replica.slot_request[slot] = None if row < 0 else in_flight[row]
            if row >= 0:
                replica.join_step[slot] = int(self.join_step[slot])
                replica.join_remaining[slot] = int(self.join_left[slot])
        replica.free_slots = self.free[: ct[FREE_N]].tolist()
        replica.high, replica.decoding = int(ct[HIGH]), int(ct[DECODING])
        replica._joined = int(ct[JOINED])
        replica.decode_steps = int(ct[DECODE_STEPS])
        taken = int(ct[ARRIVALS_AT]) if self.feed is not None else int(ct[ISSUED])
        # A request counts at the replica from its arrival (``Replica.enqueue``).
        arrived = taken - (len(self.pending) - before)
        replica.outstanding += arrived
        admission.admissions = int(ct[ADMISSIONS])
        del admission._levels[len(admission._levels) - int(ct[LEVELS_AT]) :]
        values = st.tolist()
        restore_step_state(replica, values)
        (
            admission.reserved,
            admission.pending,
            _,
            replica._kv_planned,
            replica.stats.flops["prefill"],
            admission.prefill_computed,
            prefix_queried,
        ) = values[RESERVED:HORIZON]
        admission.prefix_queried = int(prefix_queried)
        admission.prefix_hits = int(values[PREFIX_HITS])
        unpack_holders(admission, self.req, st)
        unpack_policy(replica.policy, st, ct)
        if ct[PROMPT_PASS]:
            replica.prompt_pass = [int(values[OWED_ROWS]), values[OWED_TOKENS], values[OWED_PAIRS]]
        log.adopt(int(ct[LOGGED]), int(ct[FILLED]))
        if self.feed is not None:
            self.feed.taken(taken)
        if self.clients is not None:
            self._clients_after()
        self._write_records(replica)

    def _clients_after(self) -> None:
        clients, ct, st = self.clients, self.ct, self.st
        clients.counter[0] = int(ct[NEXT_RID])
        clients.source.issued_ahead(int(ct[ISSUED]))
        opened = (float(st[OPENED_AT]), float(st[OPENED_EMITTED])) if ct[OPENED] else None
        closed = (float(st[CLOSED_AT]), float(st[CLOSED_EMITTED])) if ct[CLOSED] else None
        clients.caught_up(int(ct[FIRST_LEFT]), opened, closed)

    def _write_records(self, replica) -> None:
        count = int(self.ct[RECORDS])
        if not count:
            return
        replica.outstanding -= count
        columns = self.records[:count].T
        ints = columns.astype(np.int64)
        rows = zip(
            ints[0].tolist(),
            *(columns[j].tolist() for j in range(1, 5)),
            *(ints[j].tolist() for j in range(5, RECORD)),
            repeat(replica.index),
            repeat(replica.pool_index),
        )
        replica.sink.add_rows(rows)

    def _requests(self) -> dict[int, Request]:
        """The requests in flight after the call, by row, as ``Request`` objects."""
        requests = {}
        rows = np.flatnonzero(self.req[:, RID] >= 0)
        for row, values in zip(rows.tolist(), self.req[rows, :HIT].tolist(), strict=True):
            request = Request.__new__(Request)  # every slot is set here
            for name, value in zip(REQUEST_FIELDS, values, strict=True):
                setattr(request, name, value if name in TIME_FIELDS else int(value))
            requests[row] = request
        return requests


_request_fields = attrgetter(*REQUEST_FIELDS)


def _ring(ring: np.ndarray, head: int, size: int) -> list[int]:
    count = ring.shape[0]
    return [int(ring[(head + j) % count]) for j in range(size)]


# The step state's slots (``compiled_layout.STEP_STATE``), in order: whose attribute each is
# (the replica's, or its step log's sums) and its name; ``now`` is the kernel's clock.
STEP_SLOTS = (
    ("replica", "decode_kv"),
    ("replica", "emitted_tokens"),
    (None, "now"),
    ("replica", "last_decode_end"),
    ("log", "verification_flops"),
    ("log", "drafter_flops"),
    ("log", "wasted_flops"),
    ("log", "window_rows"),
    ("log", "decode_rows"),
)


def step_state(replica, now: float) -> list[float]:
    """The values the kernel's state array begins with, in their order (``STEP_SLOTS``)."""
    owners = {"replica": replica, "log": replica.log}
    return [now if owner is None else getattr(owners[owner], name) for owner, name in STEP_SLOTS]


def restore_step_state(replica, values: list[float]) -> float:
    """Write back what a kernel left of ``step_state``'s values; returns its time (now)."""
    owners = {"replica": replica, "log": replica.log}
    for (owner, name), value in zip(STEP_SLOTS, values[:STEP_STATE], strict=True):
        if owner is not None:
            setattr(owners[owner], name, value)
    return values[NOW]
