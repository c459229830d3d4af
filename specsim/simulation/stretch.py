"""Steady decode stretches: engine iterations of an unchanging batch, computed several at once.

Between events that change the batch (an arrival, an admission, a finish, a prompt chunk, a
preemption, another k) a replica's decode iterations differ only in their acceptance draws and
the contexts' growth. With rate-based acceptance a row's raw accepted count depends only on its
level and its slot's uniform, so m iterations' counts come from one (m, slots) block of the
stream (the numbers m single draws would give). Capped at the drafts a row has left, its
emissions follow from one cumulative sum: the cap binds only in the step that finishes the row.
Seconds, FLOPs and the adaptive window come from the compiled cost model the loops use
(``compiled_step_kernel``: the scalar path's operations); end times accumulate by the same
float additions (a cumulative sum adds in order).

A stretch ends with the first iteration that finishes a row (or, on a replica that takes its own
open-loop arrivals with none queued, where a finish changes nothing but the batch, with the last
row's finish: a row that finishes leaves and the others go on), or before the first iteration the
engine would plan differently: one that must preempt (the KV cache), one that starts at or after the
next arrival, one whose query would be reported outside the measured range, one where the
window policy takes another k. Nothing is applied until ``Replica`` commits it; a request that
reaches the replica mid-stretch cuts it back to the iterations already under way (``cut``).
"""

from __future__ import annotations

import math

import numpy as np

from specsim.simulation.compiled import kernel_module, kernels

MAX_ITERATIONS = 2048  # per stretch: bounds the arrays drawn ahead
# A stretch costs a few dozen numpy calls, a few single iterations' worth: where the first finish
# is expected sooner than this (a busy batch), the engine steps one iteration at a time.
MIN_EXPECTED = 6.0


class Stretch:
    """Up to ``n`` decode iterations planned from ``start``, not yet applied to the replica."""

    __slots__ = (
        "accepted",
        "blocked",
        "done",
        "drafted_flops",
        "drafts",
        "ends",
        "held",
        "k",
        "n",
        "per_iteration",
        "rows",
        "start",
        "starts",
        "stream_start",
        "totals",
        "verification_flops",
        "views",
        "wasted_flops",
    )

    def cut(self, n: int) -> None:
        """Keep the first ``n`` iterations."""
        self.n = min(n, self.n)

    def started_before(self, now: float) -> int:
        """How many of the iterations had started before ``now`` (the others would have seen a
        request that arrived at ``now``)."""
        return int(self.starts[: self.n].searchsorted(now, side="left"))


def horizon(
    replica, k: int, remaining: np.ndarray, start: float, bound: float, through: bool
) -> int:
    """How many iterations to draw ahead: enough to reach the first finish (every finish, when
    the stretch runs ``through`` them), or the bound, most of the time; a stretch that reaches
    the horizon just ends there. 0: not worth it."""
    left = float(remaining.max()) if remaining.shape[0] else 0.0
    if left <= 0.0:
        return 0
    least = left if through else float(np.min(remaining, where=remaining > 0, initial=left))
    expected = least / replica.expected_emitted(k)
    if bound < math.inf and replica.last_decode_s > 0.0:
        expected = min(expected, (bound - start) / replica.last_decode_s)
    if expected < MIN_EXPECTED:
        return 0
    return int(min(least, math.ceil(expected * 1.25) + 8, MAX_ITERATIONS))


def plan_stretch(replica, k: int, start: float, bound: float, through: bool = False):
    """The steady stretch from ``start`` with window ``k`` (None if its first iteration is
    not steady); ``bound`` is the next arrival's time (infinite if none is known). With
    ``through``, a row that finishes leaves the batch and the stretch goes on with the others
    (for a replica whose finishes change nothing else: see ``Replica._fast_process``)."""
    views = replica._prefix(replica.high)
    remaining, context, shift, _, _ = views
    used = remaining.shape[0]
    costs = replica.costs
    # The measured range depends on the batch; the adaptive policy's choice changes near a
    # row's end anyway, so a stretch through finishes would be cut there after long planning.
    through = through and not costs.checks_ranges and not replica._batch_policy
    m = horizon(replica, k, remaining, start, bound, through)
    if m == 0:
        return None
    acceptance, stream = replica.acceptance, replica._draws
    capacity = replica.capacity
    proposals = acceptance.proposal_rate < 1.0
    per_iteration = 0 if k == 0 else capacity * (2 if proposals else 1)
    stream_start = stream.position
    if k:  # only the occupied slots' uniforms (compiled_stream.py)
        blocks = 2 if proposals else 1
        draws, width, planned = stream.words_for(m, blocks, capacity), blocks, kernels_drawn
    else:
        draws, width, planned = stream.take(0), 0, kernels_rows
    n, rows, left, drafts, accepted, contexts, done, totals, new, own_span, kv, pairs = planned(
        draws,
        width,
        capacity,
        acceptance.flat_thresholds[k],
        acceptance.flat_counts[k],
        acceptance.proposal_rate,
        k,
        shift,
        remaining,
        context,
        m,
        through,
        replica.decode_kv,
    )
    if not through:
        rows = replica.decoding
    held = kv + rows_of(rows, n) * replica.lookahead + replica.admission.reserved

    # Boundaries that need the per-iteration path: preemption, reported range queries, a
    # window policy that takes another k once a row has left.
    over = held > replica.kv_capacity
    if over[-1] or (through and over.any()):  # held only grows without finishes
        n = int(over.argmax())
    if costs.checks_ranges:
        limit = costs.silent_context_limit(rows, k + 1.0, 1.0)
        loud = contexts[:n].max(axis=1) > limit
        if loud.any():
            n = min(n, int(loud.argmax()))
    if through:
        if n > 1 and not replica.policy.fixed:
            n = first_other_window(replica.policy, rows, kv, k, n)
        if n and rows[n - 1] == rows[0]:  # no row left before the last: one size for all
            rows = int(rows[0])
    if n == 0:
        stream.rewind(stream_start)
        return None

    batch = rows_of(rows, n)
    if replica.padded:
        longest = contexts[:n].max(axis=1)
        charged_kv, charged_pairs = batch * longest, new[:n] * longest + own_span[:n]
    else:
        charged_kv, charged_pairs = kv[:n], pairs[:n]
    seconds = np.empty(n)
    step_kernel().decode_seconds_each(
        replica.cost_terms,
        k,
        per_iteration_of(batch, n),
        new[:n],
        charged_kv,
        charged_pairs,
        seconds,
    )
    if replica.jitter is not None:
        seconds = seconds * replica.jitter.peek(n)
    times = np.empty(n + 1)  # the start, then each iteration's end as the clock adds them
    times[0] = start
    seconds[0] += start
    np.cumsum(seconds, out=times[1:])
    starts, ends = times[:-1], times[1:]
    if bound < math.inf:
        n = min(n, int(starts[:n].searchsorted(bound, side="left")))
    if replica._batch_policy and n > 1:
        if replica.window_terms is None:  # a policy the kernels do not know: its own choice
            n = 1
        else:
            choices = np.empty(n, dtype=np.int64)
            goodput = replica.window_terms[1]
            step_kernel().windows_along(
                goodput, replica.cost_terms, rows, kv[:n], left[:n], contexts[:n], used, choices
            )
            changed = choices != k
            if changed.any():
                n = min(n, int(changed.argmax()))
    if n == 0:
        stream.rewind(stream_start)
        return None

    stretch = Stretch()
    stretch.k, stretch.start, stretch.views = k, start, views
    stretch.n = n
    stretch.rows = rows_of(rows, n)  # per iteration (through finishes), or one for all
    stretch.done = done  # [i, slot]: the row's last step is at or before iteration i
    stretch.starts, stretch.ends = starts, ends
    stretch.accepted, stretch.drafts, stretch.totals, stretch.held = accepted, drafts, totals, held
    per_token, per_pair = costs.target_flops_per_token, costs.target_attn_flops
    stretch.verification_flops = per_token * new + per_pair * pairs
    stretch.drafted_flops = np.empty(len(ends))
    step_kernel().draft_flops_each(
        replica.cost_terms, k, per_iteration_of(batch, len(ends)), kv[: len(ends)],
        stretch.drafted_flops,
    )  # fmt: skip
    planned = rows_of(rows, len(kv))
    stretch.wasted_flops = (new - totals) * costs.wasted_flops_per_position(kv / planned)
    stretch.stream_start, stretch.per_iteration = stream_start, per_iteration
    stretch.blocked = bool(replica.admission.queue) or replica.decoding >= replica.max_batch
    return stretch


def step_kernel():
    """The compiled cost model, window policy and decode step (``compiled_step_kernel``)."""
    return kernel_module("compiled_step_kernel")


def kernels_rows(*args):
    """``compiled_kernels.stretch_rows`` (k = 0: no uniforms), unpacked."""
    return unpacked(kernels().stretch_rows(*args))


def kernels_drawn(*args):
    """``compiled_kernels.stretch_rows_drawn`` (the uniforms drawn in the kernel), unpacked."""
    return unpacked(kernels().stretch_rows_drawn(*args))


def unpacked(result) -> tuple:
    n, per_slot, done, per_step = result
    left, drafts, accepted, contexts = per_slot
    rows, totals, new, own_span, kv, pairs = per_step
    return n, rows, left, drafts, accepted, contexts, done, totals, new, own_span, kv, pairs


def per_iteration_of(rows, n: int) -> np.ndarray:
    """Batch sizes as one float per iteration (``rows`` is one for all, or one per iteration)."""
    if isinstance(rows, np.ndarray):
        return rows[:n].astype(np.float64, copy=False)
    return np.full(n, float(rows))


def rows_of(rows, n: int):
    """The first ``n`` iterations' batch sizes (``rows`` is one for all, or one per iteration)."""
    return rows[:n] if isinstance(rows, np.ndarray) else rows


def first_other_window(policy, rows: np.ndarray, kv: np.ndarray, k: int, n: int) -> int:
    """The first of ``n`` iterations where a policy that looks only at the batch's size and KV
    (``choose``) would take another window than ``k``: checked where a row has left."""
    for i in (np.flatnonzero(rows[1:n] != rows[: n - 1]) + 1).tolist():
        if policy.choose(int(rows[i]), float(kv[i])) != k:
            return i
    return n


def accumulate(totals: list[float], columns: list, n: int) -> list[float]:
    """Each of ``totals`` after ``total += v`` for the first ``n`` values of its column in
    order (a cumulative sum adds in order, where ``sum`` would add pairwise); a column may be
    one value repeated."""
    table = np.empty((n + 1, len(totals)))
    table[0] = totals
    for j, column in enumerate(columns):
        table[1:, j] = column[:n] if np.ndim(column) else column
    return np.cumsum(table, axis=0)[-1].tolist()
