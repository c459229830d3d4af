"""The serving kernel's window policies that observe each decode iteration (numba):
``engine_policies.py``'s, in the same float operations and order, on state the kernel carries
(``compiled_layout``: ``GATE_*`` slots, and the policy's floats from ``POLICY_AT`` in ``st``).

- TensorRT-LLM's acceptance off-switch (``AcceptanceGate``, ``ct[GATE_WINDOW]`` > 0): a ring
  of the last samples and their running sum; once tripped, k is 0 for good.
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
)


@_inner
def _policy_window(by_rows, rows, st, ct):
    """The k of a fixed or by-batch policy (``by_rows``), 0 where the off-switch has tripped
    (``AcceptanceGate.choose``)."""
    if ct[GATE_TRIPPED]:
        return 0
    return by_rows[min(rows, by_rows.shape[0] - 1)]


@_inner
def _observe(drafts, accepted, used, st, ct, end):
    """The policy's ``observe`` after a decode iteration ending at ``end``: ``drafts`` and
    ``accepted`` (before they become the tokens emitted) of the first ``used`` slots (-1 in
    empty ones)."""
    if ct[GATE_WINDOW] and not ct[GATE_TRIPPED]:
        drafted = 0.0
        taken = 0.0
        for s in range(used):
            if drafts[s] > 0.0:  # whole numbers: exact in any order, as numpy's sum
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
