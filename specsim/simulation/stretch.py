"""Steady decode stretches: engine iterations of an unchanging batch, computed several at once.

Between events that change the batch (an arrival, an admission, a finish, a prompt chunk, a
preemption, another k) a replica's decode iterations differ only in their acceptance draws and
the contexts' growth. With rate-based acceptance a row's raw accepted count depends only on its
level and its slot's uniform, so m iterations' counts come from one (m, slots) block of the
stream (the numbers m single draws would give). Capped at the drafts a row has left, its
emissions follow from one cumulative sum: the cap binds only in the step that finishes the row.
Seconds are the cost model on arrays, with the scalar path's operations
(``StepCosts.decode_seconds``); end times accumulate by the same float additions (a cumulative
sum adds in order).

A stretch ends with the first iteration that finishes a row, or before the first one the engine
would plan differently: one that must preempt (the KV cache), one that starts at or after the
next arrival, one whose query would be reported outside the measured range, one where the
window policy takes another k. Nothing is applied until ``Replica`` commits it; a request that
reaches the replica mid-stretch cuts it back to the iterations already under way (``cut``).
"""

from __future__ import annotations

import math

import numpy as np

MAX_ITERATIONS = 2048  # per stretch: bounds the arrays drawn ahead
# A stretch costs a few dozen numpy calls, a few single iterations' worth: where the first finish
# is expected sooner than this (a busy batch), the engine steps one iteration at a time.
MIN_EXPECTED = 6.0


class Stretch:
    """Up to ``n`` decode iterations planned from ``start``, not yet applied to the replica."""

    __slots__ = (
        "accepted",
        "blocked",
        "drafted_flops",
        "drafts",
        "ends",
        "finishes",
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
        """Keep the first ``n`` iterations (the finish, if any, was the last one)."""
        if n < self.n:
            self.finishes = False
            self.n = n

    def started_before(self, now: float) -> int:
        """How many of the iterations had started before ``now`` (the others would have seen a
        request that arrived at ``now``)."""
        return int(self.starts[: self.n].searchsorted(now, side="left"))


def horizon(replica, k: int, remaining: np.ndarray, start: float, bound: float) -> int:
    """How many iterations to draw ahead: enough to reach the first finish (or the bound)
    most of the time; a stretch that reaches the horizon just ends there. 0: not worth it."""
    left = float(remaining.max()) if remaining.shape[0] else 0.0
    if left <= 0.0:
        return 0
    least = float(np.min(remaining, where=remaining > 0, initial=left))
    expected = least / replica.expected_emitted(k)
    if bound < math.inf and replica.last_iteration_s > 0.0:
        expected = min(expected, (bound - start) / replica.last_iteration_s)
    if expected < MIN_EXPECTED:
        return 0
    return int(min(least, math.ceil(expected * 1.25) + 8, MAX_ITERATIONS))


def plan_stretch(replica, k: int, start: float, bound: float) -> Stretch | None:
    """The steady stretch from ``start`` with window ``k`` (None if its first iteration is
    not steady); ``bound`` is the next arrival's time (infinite if none is known)."""
    rows = replica.decoding
    views = replica._prefix(replica.high)
    remaining, context, shift, _, _ = views
    used = remaining.shape[0]
    m = horizon(replica, k, remaining, start, bound)
    if m == 0:
        return None
    acceptance, stream = replica.acceptance, replica._draws
    capacity = replica.capacity
    occupied = remaining > 0.0
    proposals = acceptance.proposal_rate < 1.0
    per_iteration = 0 if k == 0 else capacity * (2 if proposals else 1)
    stream_start = stream.position

    # Raw accepted counts and uncapped emissions, from one block of uniforms.
    proposal_cap = None
    if k == 0:
        raw = None
        uncapped = np.broadcast_to(occupied.astype(np.float64), (m, used))
    else:
        uniforms = stream.take(m * per_iteration).reshape(m, per_iteration)
        index = acceptance.flat_thresholds[k].searchsorted(shift + uniforms[:, :used])
        raw = acceptance.flat_counts[k][index]
        if proposals:
            proposal_cap = (uniforms[:, capacity : capacity + used] < acceptance.proposal_rate) * k
            uncapped = np.minimum(raw, proposal_cap)
        else:
            uncapped = np.minimum(raw, float(k))
        uncapped += 1.0
        uncapped *= occupied
    emitted_by = np.cumsum(uncapped, axis=0)  # tokens each row has emitted after i + 1 steps
    finished = (emitted_by >= np.where(occupied, remaining, np.inf)).any(axis=1)
    finishes = bool(finished[-1])
    n = int(finished.argmax()) + 1 if finishes else m

    # The iterations as the engine would plan them (the same formulas, per iteration).
    before = emitted_by[:n] - uncapped[:n]  # emitted before each step
    drafts = np.minimum(remaining - before, k + 1.0)
    drafts -= 1.0
    if proposal_cap is not None:
        drafts = np.minimum(drafts, proposal_cap[:n])
    accepted = drafts.copy() if raw is None else np.minimum(raw[:n], drafts)
    totals = accepted.sum(axis=1) + used  # tokens emitted by each iteration (empty slots: 0)
    contexts = context + before
    drafted = drafts.sum(axis=1)
    new = drafted + used
    # Whole numbers below 2^53 throughout: exact in any order of summation.
    own_span = 0.5 * (np.einsum("ij,ij->i", drafts, drafts) + 2.0 * drafted + used + new)
    kv = replica.decode_kv + (np.cumsum(totals) - totals)
    pairs = np.einsum("ij,ij->i", drafts, contexts) + kv + own_span
    held = kv + rows * replica.lookahead + replica.admission.reserved

    # Boundaries that need the per-iteration path: preemption and reported range queries.
    if held[n - 1] > replica.kv_capacity:  # held only grows
        n = min(n, int((held > replica.kv_capacity).argmax()))
    costs = replica.costs
    if costs.checks_ranges:
        limit = costs.silent_context_limit(rows, k + 1.0, 1.0)
        loud = contexts[:n].max(axis=1) > limit
        if loud.any():
            n = min(n, int(loud.argmax()))
    if n == 0:
        stream.rewind(stream_start)
        return None

    if replica.padded:
        longest = contexts[:n].max(axis=1)
        seconds = costs.decode_seconds(
            k, rows, new[:n], rows * longest, new[:n] * longest + own_span[:n]
        )
    else:
        seconds = costs.decode_seconds(k, rows, new[:n], kv[:n], pairs[:n])
    if replica.jitter is not None:
        seconds = seconds * replica.jitter.peek(n)
    ends = np.cumsum(np.concatenate(([start], seconds)))
    starts, ends = ends[:-1], ends[1:]
    if bound < math.inf:
        n = min(n, int(starts[:n].searchsorted(bound, side="left")))
    if replica._batch_policy and n > 1:
        choices = replica.policy.choose_along(
            rows, kv[:n], remaining - before[:n], contexts[:n], used
        )
        changed = choices != k
        if changed.any():
            n = min(n, int(changed.argmax()))
    if n == 0:
        stream.rewind(stream_start)
        return None

    stretch = Stretch()
    stretch.k, stretch.rows, stretch.start, stretch.views = k, rows, start, views
    stretch.n = n
    stretch.finishes = finishes and n == int(finished.argmax()) + 1
    stretch.starts, stretch.ends = starts, ends
    stretch.accepted, stretch.drafts, stretch.totals, stretch.held = accepted, drafts, totals, held
    per_token, per_pair = costs.target_flops_per_token, costs.target_attn_flops
    stretch.verification_flops = per_token * new + per_pair * pairs
    stretch.drafted_flops = costs.draft_flops(rows, k, kv)  # an array, or one value for all
    stretch.wasted_flops = (new - totals) * costs.wasted_flops_per_position(kv / rows)
    stretch.stream_start, stretch.per_iteration = stream_start, per_iteration
    stretch.blocked = bool(replica.admission.queue) or rows >= replica.max_batch
    return stretch


def accumulate(totals: list[float], columns: list, n: int) -> list[float]:
    """Each of ``totals`` after ``total += v`` for the first ``n`` values of its column in
    order (a cumulative sum adds in order, where ``sum`` would add pairwise); a column may be
    one value repeated."""
    table = np.empty((n + 1, len(totals)))
    table[0] = totals
    for j, column in enumerate(columns):
        table[1:, j] = column[:n] if np.ndim(column) else column
    return np.cumsum(table, axis=0)[-1].tolist()
