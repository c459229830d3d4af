"""The serving kernel's window policies that observe each decode iteration (numba):
``engine_policies.py``'s, in the same float operations and order, on state the kernel carries
(``compiled_layout``: the ``GATE_*`` and ``STEPS_*`` slots, and the policy's floats from
``POLICY_AT`` in ``st``).

- TensorRT-LLM's acceptance off-switch (``AcceptanceGate``, ``ct[GATE_WINDOW]`` > 0): a ring
  of the last samples and their running sum; once tripped, k is 0 for good.
- SGLang's adaptive steps (``AdaptiveStepsWindow``, ``ct[STEPS_TIERS]`` > 0): each tier's slot
  (``StepSlot``): its steps, EMA and batch count, and its settings and candidates.
"""

from __future__ import annotations

from specsim.simulation.compiled_kernels import _inner
from specsim.simulation.compiled_layout import (
    GATE_HEAD,
    GATE_LEN,
    GATE_OFF_AT,
    GATE_RECORDED,
    GATE_SUM,
    GATE_THRESHOLD,
    GATE_TRIPPED,
    GATE_WINDOW,
    POLICY_AT,
    REPORTED_CHANGES,
    STEPS_CHANGED,
    STEPS_CURRENT,
    STEPS_STRIDE,
    STEPS_TIERS,
    TIER_ALPHA,
    TIER_BATCHES,
    TIER_CANDIDATES,
    TIER_DOWN,
    TIER_EMA,
    TIER_INTERVAL,
    TIER_MIN_BATCH,
    TIER_SLOTS,
    TIER_STEPS,
    TIER_UP,
    TIER_WARMUP,
)


@_inner
def _policy_window(by_rows, rows, st, ct):
    """The k of a fixed or by-batch policy (``by_rows``), 0 where the off-switch has tripped
    (``AcceptanceGate.choose``); or the steps of the tier of a batch of ``rows``, which
    observes this iteration (``AdaptiveStepsWindow.choose``)."""
    if ct[STEPS_TIERS]:
        ct[STEPS_CURRENT] = _tier(rows, st, ct)
        return int(st[POLICY_AT + ct[STEPS_CURRENT] * ct[STEPS_STRIDE] + TIER_STEPS])
    if ct[GATE_TRIPPED]:
        return 0
    return by_rows[min(rows, by_rows.shape[0] - 1)]


@_inner
def _tier(rows, st, ct):
    """``AdaptiveStepsWindow.slot``: the last tier whose min_batch is at most ``rows`` (the
    first below them all)."""
    tier = 0
    for t in range(1, ct[STEPS_TIERS]):
        if st[POLICY_AT + t * ct[STEPS_STRIDE] + TIER_MIN_BATCH] <= rows:
            tier = t
    return tier


@_inner
def _observe(drafts, accepted, used, st, ct, end):
    """The policy's ``observe`` after a decode iteration ending at ``end``: ``drafts`` and
    ``accepted`` (before they become the tokens emitted) of the first ``used`` slots (-1 in
    empty ones). Sums of whole numbers: exact in any order, as numpy's."""
    if ct[STEPS_TIERS]:
        rows = 0
        total = 0.0
        for s in range(used):
            if drafts[s] >= 0.0:
                rows += 1
                total += accepted[s]
        tier = ct[STEPS_CURRENT] if ct[STEPS_CURRENT] >= 0 else _tier(rows, st, ct)
        at = POLICY_AT + tier * ct[STEPS_STRIDE]
        before = st[at + TIER_STEPS]
        _update(at, total, rows, st)
        if st[at + TIER_STEPS] != before:
            _changed(end, st[at + TIER_MIN_BATCH], st[at + TIER_STEPS], st, ct)
    elif ct[GATE_WINDOW] and not ct[GATE_TRIPPED]:
        drafted = 0.0
        taken = 0.0
        for s in range(used):
            if drafts[s] > 0.0:
                drafted += drafts[s]
                taken += accepted[s]
        if drafted > 0.0:  # no request drafted: no sample
            _record(taken / drafted, st, ct)
            if ct[GATE_TRIPPED]:
                st[GATE_OFF_AT] = end


@_inner
def _record(rate, st, ct):
    """``AcceptanceGate.record``: the ring takes the sample (the oldest leaves once it holds
    the window), and the mean of the last window is compared with the threshold."""
    window = ct[GATE_WINDOW]
    st[GATE_SUM] += rate
    if ct[GATE_LEN] < window:
        st[POLICY_AT + (ct[GATE_HEAD] + ct[GATE_LEN]) % window] = rate
        ct[GATE_LEN] += 1
    else:
        oldest = POLICY_AT + ct[GATE_HEAD]
        st[GATE_SUM] -= st[oldest]
        st[oldest] = rate
        ct[GATE_HEAD] = (ct[GATE_HEAD] + 1) % window
    ct[GATE_RECORDED] += 1
    if ct[GATE_RECORDED] >= window and st[GATE_SUM] / ct[GATE_LEN] < st[GATE_THRESHOLD]:
        ct[GATE_TRIPPED] = ct[GATE_RECORDED]


@_inner
def _update(at, total, rows, st):
    """``StepSlot.update`` of the tier at ``at``: ``total`` accepted drafts over ``rows``."""
    if st[at + TIER_STEPS] > 0:
        mean = total / rows
        alpha = st[at + TIER_ALPHA]
        st[at + TIER_EMA] = (1.0 - alpha) * st[at + TIER_EMA] + alpha * mean
    st[at + TIER_BATCHES] += 1.0
    batches, warmup = st[at + TIER_BATCHES], st[at + TIER_WARMUP]
    if batches <= warmup or (batches - warmup) % st[at + TIER_INTERVAL]:
        return
    st[at + TIER_STEPS] = _recompute(at, st)


@_inner
def _recompute(at, st):
    """``StepSlot._recompute``: the tier's next steps among its candidates."""
    first = at + TIER_SLOTS
    count = int(st[at + TIER_CANDIDATES])
    steps, ema = st[at + TIER_STEPS], st[at + TIER_EMA]
    index = 0
    while st[first + index] != steps:
        index += 1
    if steps == 0:  # probe the next candidate up; with no history start it neutral
        index = min(index + 1, count - 1)
        if st[first + index] > 0 and ema < 0:
            st[at + TIER_EMA] = st[first + index] - 1.0
        return st[first + index]
    start = index
    while index > 0:
        lower = st[first + index - 1]
        drop = (0.5 if lower == 0 else lower - 0.5) + st[at + TIER_DOWN]
        if ema > drop:
            break
        index -= 1
    if index == start:
        while index < count - 1 and ema > st[first + index] - 0.5 + st[at + TIER_UP]:
            index += 1
    return st[first + index]


@_inner
def _changed(end, min_batch, steps, st, ct):
    """A tier's steps changed at ``end``: counted, and kept among the first ``REPORTED_CHANGES``."""
    if ct[STEPS_CHANGED] < REPORTED_CHANGES:
        at = POLICY_AT + ct[STEPS_TIERS] * ct[STEPS_STRIDE] + 3 * ct[STEPS_CHANGED]
        st[at], st[at + 1], st[at + 2] = end, min_batch, steps
    ct[STEPS_CHANGED] += 1
