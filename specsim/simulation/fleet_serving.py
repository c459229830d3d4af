"""The compiled serving loop for a replica in a fleet: requests reach it from a router.

A lone replica's serving loop (``compiled_serving.ServingLoop``) takes its traffic itself. A
replica behind a router (or a client cap, or closed-loop clients with think time) cannot: what
reaches it, and when, depends on the other replicas, and a router reads the replica's
``outstanding`` at every arrival. So a call here takes no traffic of its own and stops after
the iteration in which a request first finishes (or at idle, or where a lone call stops). Its
results are applied when its last iteration ends in SimPy time: until then the replica is in
the call's starting state, and ``outstanding`` is right for any router, since it changes only
at a finish. The records then go through ``Replica._finish`` one by one, so that clients and
routers react to each as the per-iteration path has them react.

A request routed to the replica while a call is under way (``takes``, at time t) is set aside,
and cuts the call where an iteration the call ran starts at or after t (it would have seen the
request): the call is run again from the same starting state and draw position, limited to
the iterations that start before t (``_replay``; the draws are deterministic, so those are the
same iterations), the replica waits for the last of them to end, applies them, and queues what
arrived meanwhile behind the kernel's queue. Where admission stopped short of the queue's tail
at every iteration from t on (a request waits ahead, the batch is full or the prompt budget
spent: admission is FCFS), the request could not have changed them, and waits without a cut.

Between calls the kernel's arrays keep the replica's state (``holding``): a routed request
goes straight into the kernel's queue, and the replica's Python state is written back
(``release``) only where Python must step it (a call that runs no iteration), the table is
full, or the run ends. A call then costs a copy of the arrays (to replay from) and the kernel.
"""

from __future__ import annotations

import numpy as np
from simpy import Interrupt

from specsim.simulation.compiled_layout import (
    DECODING,
    DRAWN,
    EMITTED,
    FILLED,
    HANDED_OFF,
    HIT,
    ITERATIONS,
    LOGGED,
    NOW,
    OPEN_UNTIL,
    P_LEN,
    Q_HEAD,
    Q_LEN,
    RECORDS,
    REQUEST_FIELDS,
    RID,
    ROWS_FREE_N,
    TIME_FIELDS,
)
from specsim.simulation.compiled_serving import MOST_IN_FLIGHT, RETRY_AFTER, ServingLoop
from specsim.simulation.request import Request
from specsim.simulation.serving_table import TRACE


class FleetServing(ServingLoop):
    """A fleet replica's serving loop: one call per run of iterations up to a finish, undone
    back to an arrival routed to it meanwhile."""

    def __init__(self, replica, decode, feed=None, clients=None):
        super().__init__(replica, decode, feed, clients)
        self.replica = replica
        self.packed: dict[int, Request] = {}  # the requests the kernel holds, by id
        self.by_row: dict[int, Request] = {}  # and by their row in the table
        self.late: list[Request] = []  # routed here while a call is under way
        self.holding = False  # the kernel's arrays hold the replica's state
        self.busy = False  # a call's results wait for its end
        self.cutting = False  # a cut is on its way to the process
        self.start = 0.0  # when the call under way began
        self.ran = 0  # iterations the call under way ran
        self.saved: list[np.ndarray] = []  # what a call changes, as it began
        self.saved_emitted = 0.0  # the tokens emitted when it began

    # ---- the replica's view ----------------------------------------------------------------
    def has_work(self) -> bool:
        ct = self.ct
        return bool(ct[Q_LEN] or ct[DECODING] or ct[P_LEN])

    def emitted_at(self, now: float) -> float:
        """Output tokens the replica emitted by ``now``, its state held here."""
        if not self.busy:
            return float(self.st[EMITTED])
        done = int(self.trace[0, : self.ran].searchsorted(now, side="right"))
        return float(self.trace[1, done - 1] if done else self.saved_emitted)

    def takes(self, request: Request) -> bool:
        """A request routed to the replica, taken while the kernel holds its state (set aside
        while a call is under way, cutting it where an iteration it ran starts after now)."""
        if self.busy:
            self.late.append(request)
            process = self.replica._process
            if not self.cutting and self._cut_by(process.env.now):
                self.cutting = True
                process.interrupt()
            return True
        return self.holding and self._queue(request)

    def _cut_by(self, now: float) -> bool:
        """Whether a request routed here at ``now`` changes the call under way: an iteration
        it ran starts at or after ``now`` and its admission could reach the queue's tail (where
        every such admission stopped short, the request waits behind)."""
        if now >= self._iteration_start(self.ran - 1):
            return False
        return self._started_before(now) < self.ct[OPEN_UNTIL]

    # ---- a call ------------------------------------------------------------------------------
    def serve(self, replica, env):
        """SimPy: one call, cut where a request arrives meanwhile, applied at its end."""
        start = env.now
        if not (self.holding or self._hold(replica, start)):
            return False
        self._begin(start)
        self._kernel(replica, TRACE)
        self.ran = int(self.ct[ITERATIONS])
        if not self.ran:  # Python steps the replica for a while
            self.release(replica)
            self.wait = RETRY_AFTER
            return False
        self.busy, self.start = True, start
        while True:
            try:
                yield env.timeout_at(float(self.trace[0, self.ran - 1]))
                break
            except Interrupt:  # a request was routed here: see ``takes``
                self.cutting = False
                self._replay(replica, self._started_before(env.now))
                if not self.ran or self.trace[0, self.ran - 1] <= env.now:
                    break
        self.busy = False
        self._settle(replica)
        return True

    def _hold(self, replica, now: float) -> bool:
        """The replica's state into the kernel's arrays (False: Python steps it meanwhile)."""
        if self.wait:
            self.wait -= 1
            return False
        admission = replica.admission
        in_flight = len(admission.queue) + len(admission.prefilling) + replica.decoding
        if in_flight > MOST_IN_FLIGHT:
            return False
        if 2 * in_flight > self.rows:  # room for what the router sends while it holds
            self._table(2 * in_flight)
        self.packed, self.by_row = {}, {}
        self._pack(replica, now, in_flight)
        levels = np.array(admission._levels[::-1], dtype=np.int64)  # for the whole hold
        self.inputs = (levels, *self.inputs[1:])
        self._args = None
        self.saved = [array.copy() for array in self._arrays()]  # the table is this size now
        self.holding = True
        return True

    def _arrays(self) -> tuple:
        """Every array a call changes (the replica's batch among them: ``ServingTable._slots``)."""
        return self.floats, self.counts, self.req, self.rings

    def _begin(self, start: float) -> None:
        self.st[NOW] = start
        self.ct[RECORDS] = self.ct[ITERATIONS] = self.ct[DRAWN] = self.ct[OPEN_UNTIL] = 0
        for saved, array in zip(self.saved, self._arrays(), strict=True):
            saved[...] = array  # (quicker than np.copyto on these small arrays)
        self.saved_emitted = float(self.st[EMITTED])

    def _iteration_start(self, i: int) -> float:
        return self.start if i == 0 else float(self.trace[0, i - 1])

    def _started_before(self, now: float) -> int:
        """How many of the call's iterations started before ``now`` (the per-iteration path's
        later ones would have seen a request that arrived at ``now``)."""
        return int(self.trace[0, : self.ran - 1].searchsorted(now, side="left")) + (
            self.start < now
        )

    def _replay(self, replica, iterations: int) -> None:
        """The call again from its starting state, for its first ``iterations`` only."""
        for saved, array in zip(self.saved, self._arrays(), strict=True):
            array[...] = saved
        self.ran = iterations
        if iterations:
            self._kernel(replica, iterations)

    def _settle(self, replica) -> None:
        """A call's end: its draws taken, the step log folded where full, the requests routed
        here meanwhile queued, then each finish."""
        ct, log = self.ct, replica.log
        replica._draws.skip(int(ct[DRAWN]))
        ct[DRAWN] = 0
        if replica.jitter is not None:  # one multiplier for each iteration the call kept
            replica.jitter.skip(int(ct[ITERATIONS]))
        ct[LOGGED], ct[FILLED] = log.adopt(int(ct[LOGGED]), int(ct[FILLED]))
        late, self.late = self.late, []
        for request in late:
            if not (self.holding and self._queue(request)):
                replica.admission.queue.append(request)
        self._write_records(replica)

    def _queue(self, request: Request) -> bool:
        """The request into the kernel's queue (False: the table is full, and the replica's
        state is back in Python)."""
        ct = self.ct
        if not ct[ROWS_FREE_N]:
            self.release(self.replica)
            return False
        ct[ROWS_FREE_N] -= 1
        row = int(self.rows_free[ct[ROWS_FREE_N]])
        self._load(request, row)
        self.queue[(ct[Q_HEAD] + ct[Q_LEN]) % self.rows] = row
        ct[Q_LEN] += 1
        return True

    # ---- writing back ------------------------------------------------------------------------
    def release(self, replica) -> None:
        """The replica's state back from the kernel's arrays (nothing to do when not held)."""
        if self.holding:
            self.holding = False
            # A call's records go at its end, after what was routed here meanwhile is queued
            # (``_settle``, where a full table releases the state): not with the state.
            ct = self.ct
            records, ct[RECORDS] = int(ct[RECORDS]), 0
            self._unpack(replica)
            ct[RECORDS] = records

    def _load(self, request: Request, loaded: int) -> int:
        row = super()._load(request, loaded)
        self.packed[request.rid] = request
        self.by_row[row] = request
        return row

    def _requests(self) -> dict[int, Request]:
        """The requests in flight, by row: the held ones, their fields written back."""
        req = self.req
        for row in np.flatnonzero(req[:, RID] >= 0).tolist():
            request = self.by_row[row]
            for name, value in zip(REQUEST_FIELDS, req[row, :HIT].tolist(), strict=True):
                setattr(request, name, value if name in TIME_FIELDS else int(value))
        return self.by_row

    def _write_records(self, replica) -> None:
        """Each finished request's record and its client's and router's turn, or a prefill
        replica's hand-off, in the order the iterations made them (``Replica._finish``,
        ``PrefillReplica.hand_off``)."""
        for values in self.records[: int(self.ct[RECORDS])].tolist():
            request = self.packed.pop(int(values[0]))
            request.scheduled, request.first_token = values[2], values[3]
            request.steps, request.drafted, request.accepted = (int(v) for v in values[7:10])
            request.preemptions = int(values[10])
            if values[3] == HANDED_OFF:  # its prompt through and its first token sampled
                request.prefilled = request.prefill_target
                request.generated += 1
                replica.hand_off(request, values[4])
                continue
            request.generated = request.output
            replica._finish(request, values[4])
        self.ct[RECORDS] = 0
