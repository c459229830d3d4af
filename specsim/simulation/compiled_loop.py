"""The compiled replica loop's Python side: when a replica runs it, and applying what it did.

(A replica alone with chunked prefill and no prefix cache runs the serving loop instead,
``compiled_serving.py``, queue and all; this loop serves the others.)
A replica alone on an open-loop source with no request queued runs, until the next arrival, an
iteration with the prompts just admitted (when they fit whole in it) and then decode iterations
only: ``compiled_loop_kernel.decode_loop`` runs them one after the other, as
``Replica._plan_mixed`` and ``_apply_mixed`` would, and the replica waits once for the last
one's end. Its finishes change nothing but the batch there (no client, router or queued request
waits on them), so their records, and the prompts' completion (``Admission.complete``), are
written after the loop, in the order the iterations made them. The window policy is compiled
too (a fixed k, k by batch size, or the goodput policy's argmax; the goodput policy's choice
with prompt chunks is not, so that iteration takes the Python path). Anything else (a queue,
prompts that do not fit whole, another policy, jitter, padded attention, reported range
queries, preemption) takes the other paths, and the loop stops before the iteration that would
need it.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.compiled import kernel_module
from specsim.simulation.compiled_layout import STEP_STATE
from specsim.simulation.policy import BatchTableWindow, FixedWindow, GoodputWindow

STATE = STEP_STATE + 3  # the values ``run`` hands the kernel in ``state`` (it adds two: the
# KV held, the first iteration's end)
_kernel: ModuleType | None = None


def kernel() -> ModuleType:
    """The kernel's module (numba imported on the first call)."""
    global _kernel
    if _kernel is None:
        _kernel = kernel_module("compiled_loop_kernel")
    return _kernel


def step_kernel() -> ModuleType:
    """The compiled loops' shared parts (the cost model, the window policy, a decode step)."""
    return kernel_module("compiled_step_kernel")


def step_state(replica, now: float) -> list[float]:
    """The values both compiled loops' state arrays begin with, in their order
    (``compiled_layout.STEP_STATE``): the replica's, and its step log's sums."""
    log = replica.log
    return [
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
    ]


def restore_step_state(replica, values: list[float]) -> float:
    """Write back what a kernel left of ``step_state``'s values; returns its time (now)."""
    log = replica.log
    (
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
    ) = values[:STEP_STATE]
    return now


def window_terms(policy) -> tuple[np.ndarray, np.ndarray] | None:
    """The window policy as the kernel reads it (``compiled_loop_kernel._window``): k by batch
    size, or (none) the goodput policy's per-window terms; None for another policy."""
    kind = type(policy)
    if kind is FixedWindow:
        return np.array([policy.k], dtype=np.int64), np.zeros((5, 1))
    if kind is BatchTableWindow:
        return np.array(policy._by_size, dtype=np.int64), np.zeros((5, 1))
    if kind is GoodputWindow:
        terms = [policy._row_tokens, policy._row_new, policy._row_pairs, policy._bonus_pairs]
        goodput = np.zeros((5, policy.k_max + 1))
        goodput[:4] = terms
        goodput[4, 0] = policy._proposal
        return np.zeros(0, dtype=np.int64), goodput
    return None


class DecodeLoop:
    """One replica's buffers and constants for the kernel."""

    def __init__(self, replica, costs: np.ndarray, window: tuple[np.ndarray, np.ndarray]):
        self.costs = costs
        self.by_rows, self.goodput = window
        cap = replica.capacity
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
        self.state = np.zeros(STATE + 2)  # and the last iteration's KV held, the first's end
        self.counts = np.zeros(8, dtype=np.int64)
        self.totals = None  # the first iteration's prompt chunks' PassTotals
        self.prefill = np.zeros(4)  # the first iteration's prompt chunks: rows, tokens, kv, pairs
        self.join_slot = np.empty(cap, dtype=np.int64)
        self.join_level = np.empty(cap, dtype=np.int64)
        self.join_order = np.empty(cap, dtype=np.int64)
        self.join_context, self.join_left, self.join_reservation = (np.empty(cap) for _ in "abc")
        self.logged = np.zeros(2, dtype=np.int64)  # the step log's fill levels
        # A call's rows, those at its start and those its first iteration adds, fit the batch:
        # at most ``cap`` finish in one.
        self.finished_slot = np.empty(cap, dtype=np.int64)
        self.finished_at = np.empty(cap, dtype=np.int64)
        self.finished_drafted = np.empty(cap)
        self.finished_time = np.empty(cap)

    @staticmethod
    def build(replica, ranges: bool = False) -> DecodeLoop | None:
        """The loop for ``replica``, or None where it cannot run there (``ranges``: the caller
        checks the profile's measured range itself, as the serving loop does)."""
        if not (
            replica.fast
            and replica.jitter is None
            and not replica.padded
            and (ranges or not replica.costs.checks_ranges)
            and isinstance(replica.acceptance, RateAcceptance)
            and not replica.acceptance.needs_position
            and getattr(replica.admission, "shared", None) is None  # counts a shared prefix once
        ):
            return None
        costs, window = replica.cost_terms, replica.window_terms  # made with the replica
        if costs is None or window is None:
            return None
        return DecodeLoop(replica, costs, window)

    def run(self, replica, start: float, bound: float) -> float | None:
        """Run the iterations from ``start`` until the first that would start at or after
        ``bound``, applying them to ``replica``; returns when the last one ends (None: none
        ran)."""
        admission, log = replica.admission, replica.log
        chunks = self._whole_prompts(replica) if admission.prefilling else None
        if admission.prefilling and chunks is None:
            return None
        if chunks is None:
            self.prefill[0] = 0.0  # no prompt chunks
        rows = replica.decoding
        stream = replica._draws
        base_words, offset = stream.base()
        state = self.state
        state[:STATE] = (
            *step_state(replica, start),
            bound,
            admission.reserved,
            replica.kv_capacity,
        )
        logged = self.logged
        logged[0], logged[1] = log._iterations, log._filled
        joined = replica._joined
        kernel().decode_loop(
            base_words,
            offset,
            self.blocks,
            replica.capacity,
            self.tables,
            self.table_at,
            replica.acceptance.proposal_rate,
            self.by_rows,
            self.goodput,
            admission.lookahead,
            replica.remaining,
            replica.context,
            replica.level_shift,
            replica.row_drafted,
            replica.level,
            replica.admit_order,
            replica.high,
            rows,
            joined,
            self.costs,
            state,
            log._dt,
            log._batch,
            log._kv,
            log._itl,
            log._itl_weight,
            log._accepted,
            log._drafted,
            logged,
            log._step_limit,
            self.finished_slot,
            self.finished_at,
            self.finished_drafted,
            self.finished_time,
            self.prefill,
            self.join_slot,
            self.join_context,
            self.join_left,
            self.join_level,
            self.join_order,
            self.join_reservation,
            self.counts,
        )
        n, filled, finishes, high, decoding, drawn, iterations, joined = self.counts.tolist()
        stream.skip(drawn)
        if not n:
            return None
        log.adopt(iterations, filled)
        replica._joined = joined
        values = state.tolist()
        end = restore_step_state(replica, values)
        replica._kv_planned, first_end = values[STATE:]
        # A first iteration of prompt chunks alone is no decode step.
        skipped = 1 if chunks is not None and not rows else 0
        steps_before = replica.decode_steps
        replica.decode_steps += n - skipped
        replica.decoding, replica.high = decoding, high
        finished = zip(
            self.finished_slot[:finishes].tolist(),
            self.finished_at[:finishes].tolist(),
            self.finished_drafted[:finishes].tolist(),
            self.finished_time[:finishes].tolist(),
            strict=True,
        )
        joining = chunks is not None
        for slot, at, drafted, finished_at in finished:
            if joining and at:  # the prompts went through at the first iteration's end
                self._join(replica, chunks, first_end, steps_before + 1 - skipped)
                joining = False
            replica.release(slot, drafted, steps_before + at + 1 - skipped, finished_at)
        if joining:
            self._join(replica, chunks, first_end, steps_before + 1 - skipped)
        return end

    def _whole_prompts(self, replica):
        """The prompt chunks of the next iteration, when they are the prompts in prefill whole
        whatever the decoding rows draft, with the rows they will take loaded for the kernel
        (None where the loop does not take this iteration: the goodput policy, which weighs
        the chunks against each window; prompts that do not fit whole; a prompt whose first
        token is its last; or a cache that must preempt first)."""
        if not self.by_rows.shape[0]:
            return None
        admission = replica.admission
        rows = replica.decoding
        k = int(self.by_rows[min(rows, self.by_rows.shape[0] - 1)])
        room = replica.token_budget - rows * (k + 1.0)  # the decoding rows verify at most this
        prompts = admission.prefilling
        if sum(r.prefill_target - r.prefilled for r in prompts) > room:
            return None
        if any(r.generated + 1 >= r.output for r in prompts):
            return None
        if admission.kv_in_use(rows, replica.decode_kv) > replica.kv_capacity:
            return None
        chunks, totals = admission.chunks(room)
        self.prefill[:] = (totals.rows, totals.tokens, totals.kv, totals.pairs)
        self.totals = totals
        free = replica.free_slots
        self.join_slot[: len(prompts)] = free[len(free) - len(prompts) :]  # the free list's end
        for j, request in enumerate(prompts):
            self.join_context[j] = request.prefill_target
            self.join_left[j] = request.output - request.generated - 1
            self.join_level[j] = request.level
            self.join_order[j] = request.admit_order
            self.join_reservation[j] = admission.reservation(request)
        return chunks

    def _join(self, replica, chunks, now: float, join_step: int) -> None:
        """The first iteration's prompts went through at ``now``: the Python side of what the
        kernel did (``Admission.complete``, and ``Replica._start_decoding`` but the arrays)."""
        costs, totals = replica.costs, self.totals
        replica.stats.flops["prefill"] += costs.target_flops(
            totals.tokens, totals.pairs
        ) + costs.draft_prefill_flops(totals.tokens, totals.pairs)
        for request in replica.admission.complete(chunks, now):
            replica.adopt(request, join_step)
