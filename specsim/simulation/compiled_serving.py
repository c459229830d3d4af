"""The compiled serving loop, Python's side: where it runs, and its calls.

A replica alone on its traffic (open-loop arrivals, or closed-loop clients without think time),
under any window policy, runs ``compiled_serving_kernel.serving_loop``: admission, prefill
(chunked into decode iterations, or prompts whole in iterations of their own), preemption,
decoding, finishes and the clients' next requests in one call, from one stop to the next
(busy or saturated, where the queue rarely empties, as at low load), with iteration jitter
(each call takes the multipliers of the iterations it applies) and padded attention or not.
Its state goes in and out through the table (``serving_table.py``); a replica behind a router
runs the same kernel through ``fleet_serving.py``. It runs where the replica's fast path has a
rate model of acceptance and a compiled window policy (``kernel_tables``; TensorRT-LLM's
off-switch among them, ``compiled_policy_kernel``), and a prefix cache,
if any, hits by request alone (a trace's column, a fraction of each prompt or a shared system
prompt, drawn ahead by the table: not a session's memory), the KV cache counted in tokens or
blocks; elsewhere, and whenever the
kernel stops for Python (levels to draw, one sequence outgrowing the cache, an iteration
outside the profile's measured range that still warns or raises), the other paths run.
"""

from __future__ import annotations

import numpy as np

from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.compiled import kernel_module
from specsim.simulation.compiled_layout import (
    CHARGED,
    DRAWN,
    ITERATION_LIMIT,
    ITERATIONS,
    NOW,
    STOP_AT_FINISH,
)
from specsim.simulation.serving_table import TRACE, ServingTable

RETRY_AFTER = 16  # iterations Python runs after a call that ran none, before the next call
# Most requests in flight that a call packs: each call packs them all, so past this (an
# overloaded open loop's growing queue) packing would cost more than the kernel saves.
MOST_IN_FLIGHT = 2048


class ServingLoop(ServingTable):
    """The serving kernel's calls for one replica."""

    @classmethod
    def build(cls, replica, feed=None, clients=None) -> ServingLoop | None:
        """The loop for ``replica`` alone on ``feed`` or ``clients`` (``fleet_serving``'s
        subclass: for requests routed to it), or None where it cannot run."""
        decode = kernel_tables(replica)
        if (
            decode is None
            or not replica.admission.prefix.by_request
            or (clients is not None and clients.source.think_mean > 0)
        ):
            return None
        return cls(replica, decode, feed, clients)

    def serve(self, replica, env):
        """SimPy: run iterations from now until the kernel stops, and wait for the last one's
        end; returns False where it ran none and waited for nothing (whatever admission it did
        is written back) and the replica's Python path takes the next iteration."""
        end = self.run(replica, env.now)
        if end is None:
            return False
        yield env.timeout_at(end)
        return True

    def takes(self, request) -> bool:
        """A request routed to the replica: a lone replica's loop leaves it to Python (it is
        never under way then, and writes the replica's state back after every call)."""
        return False

    def release(self, replica) -> None:
        """The replica's state is Python's between a lone loop's calls: nothing to write."""

    def run(self, replica, now: float) -> float | None:
        """Run iterations from ``now`` until the kernel stops and apply them; returns where it
        stopped (None: it ran none and waited for nothing)."""
        if getattr(self.frontend, "in_flight", 0):  # until they arrive, Python steps it
            self._hand_off()
            return None
        if not self._call(replica, now, TRACE):
            return None
        replica._draws.skip(int(self.ct[DRAWN]))
        if replica.jitter is not None:  # one multiplier an iteration
            replica.jitter.skip(int(self.ct[ITERATIONS]))
        self._unpack(replica)
        end = float(self.st[NOW])
        if not self.ct[ITERATIONS] and end == now:
            self.wait = RETRY_AFTER
            self._hand_off()
            return None
        admission = replica.admission
        if not (admission.queue or replica.decoding or admission.prefilling):
            self._hand_off()  # the replica waits for them to arrive
        return end

    def _pack(self, replica, now: float, in_flight: int) -> None:
        super()._pack(replica, now, in_flight)
        self.ct[CHARGED] = replica.charged_admissions

    def _unpack(self, replica) -> None:
        # A call that stopped after admitting leaves their cost to Python's next iteration.
        super()._unpack(replica)
        replica.charged_admissions = int(self.ct[CHARGED])

    def _call(self, replica, now: float, limit: int) -> bool:
        """The kernel run from the replica's state at ``now`` for at most ``limit`` iterations,
        nothing applied (False: not called, Python steps the replica meanwhile)."""
        if self.wait:
            self.wait -= 1
            self._hand_off()
            return False
        admission = replica.admission
        in_flight = len(admission.queue) + len(admission.prefilling) + replica.decoding
        if in_flight > MOST_IN_FLIGHT:  # the Python path steps it meanwhile
            self._hand_off()
            return False
        self._pack(replica, now, in_flight)
        self._kernel(replica, limit)
        return True

    def _kernel(self, replica, limit: int) -> None:
        """The kernel on the packed state, for at most ``limit`` iterations."""
        self.ct[ITERATION_LIMIT] = limit
        self.ct[STOP_AT_FINISH] = self.feed is None and self.clients is None
        if replica.jitter is not None:  # as many as the call may run iterations (TRACE at most)
            self.trace[2, :limit], self.trace[3, :limit] = replica.jitter.ahead(limit)
        if self._args is None:  # the same arrays from call to call while the table stands
            self._args = self._arguments(replica)
        base_words, offset = replica._draws.base()
        _serving_kernel().serving_loop(self._adaptive, base_words, offset, *self._args)

    def _arguments(self, replica) -> tuple:
        """The kernel's arguments after the draws' position."""
        decode, log, admission = self.decode, replica.log, replica.admission
        levels, arrivals, lengths = self.inputs
        self._adaptive = decode.by_rows.shape[0] == 0
        return (
            decode.blocks,
            decode.tables,
            decode.table_at,
            replica.acceptance.proposal_rate,
            decode.by_rows,
            decode.goodput,
            admission.lookahead,
            (
                replica.remaining,
                replica.context,
                replica.output,
                replica.level,
                replica.level_shift,
                replica.row_drafted,
                replica.admit_order,
            ),
            self.slot_row,
            self.join_step,
            self.join_left,
            self.free,
            self.req,
            self.rows_free,
            self.queue,
            self.prefilling,
            self.pending_ring,
            levels,
            arrivals,
            lengths,
            self.records,
            decode.costs,
            self.st,
            self.ct,
            (log._dt, log._kv, log._itl, log._itl_weight),
            log._batch,
            log._accepted,
            log._drafted,
            log._step_limit,
            self.trace,
        )

    def _hand_off(self) -> None:
        """The clients' requests still on their way go to the API server, to arrive at their
        times exactly, for the Python path to take."""
        for request in self.pending:
            self.frontend.arrive_at(request, request.arrival)
        self.pending = []


class KernelTables:
    """One replica's constants for the kernel: its cost vector, window policy and acceptance
    tables."""

    def __init__(self, replica, costs: np.ndarray, window: tuple[np.ndarray, np.ndarray]):
        self.costs = costs
        self.by_rows, self.goodput = window
        acceptance = replica.acceptance
        self.blocks = 2 if acceptance.proposal_rate < 1.0 else 1
        # Every window's flat acceptance tables end to end: thresholds above, counts below.
        windows = range(replica.k_max + 1)
        self.tables = np.array(
            [
                np.concatenate([acceptance.flat_thresholds[k] for k in windows]),
                np.concatenate([acceptance.flat_counts[k] for k in windows]),
            ]
        )
        sizes = [acceptance.flat_thresholds[k].shape[0] for k in windows]
        self.table_at = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def kernel_tables(replica) -> KernelTables | None:
    """The acceptance tables, cost vector and window terms the kernel reads, where it can run
    the replica's decode steps (None elsewhere)."""
    if not (replica.fast and isinstance(replica.acceptance, RateAcceptance)):
        return None
    costs, window = replica.cost_terms, replica.window_terms  # made with the replica
    if costs is None or window is None:
        return None
    return KernelTables(replica, costs, window)


_module = []


def _serving_kernel():
    if not _module:
        _module.append(kernel_module("compiled_serving_kernel"))
    return _module[0]
