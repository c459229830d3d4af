"""The serving table's window-policy state (``serving_table.py``, for
``compiled_policy_kernel``): an observing policy's state packed into the kernel's, and written
back after a call, so that the policy object holds what the kernel left and Python can go on
stepping it."""

from __future__ import annotations

from collections import deque

import numpy as np

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
    TIER_BATCHES,
    TIER_EMA,
    TIER_SLOTS,
    TIER_STEPS,
)
from specsim.simulation.engine_policies import AcceptanceGate, AdaptiveStepsWindow

# The most samples an off-switch's ring may hold on the kernel (a longer window runs in Python).
MOST_GATE_WINDOW = 1 << 16


def policy_floats(policy) -> int:
    """The floats the policy's state takes after ``st``'s slots."""
    if isinstance(policy, AcceptanceGate):
        return policy.window
    if isinstance(policy, AdaptiveStepsWindow):
        return len(policy.slots) * _stride(policy) + 3 * REPORTED_CHANGES
    return 0


def _stride(policy: AdaptiveStepsWindow) -> int:
    return TIER_SLOTS + max(len(slot.candidates) for slot in policy.slots)


def pack_policy(policy, st: np.ndarray, ct: np.ndarray) -> None:
    """The policy's state into the kernel's (nothing for a policy without)."""
    if isinstance(policy, AcceptanceGate):
        samples = list(policy._samples)
        ct[GATE_WINDOW], ct[GATE_HEAD], ct[GATE_LEN] = policy.window, 0, len(samples)
        ct[GATE_RECORDED] = policy.recorded
        ct[GATE_TRIPPED] = policy.tripped_at or 0
        st[GATE_THRESHOLD], st[GATE_SUM] = policy.threshold, policy._sum
        st[GATE_OFF_AT] = np.nan if policy.off_at_s is None else policy.off_at_s
        st[POLICY_AT : POLICY_AT + len(samples)] = samples
    elif isinstance(policy, AdaptiveStepsWindow):
        stride = _stride(policy)
        ct[STEPS_TIERS], ct[STEPS_STRIDE] = len(policy.slots), stride
        current = policy._current
        ct[STEPS_CURRENT] = -1 if current is None else policy.slots.index(current)
        ct[STEPS_CHANGED] = policy.changed
        for t, (start, slot) in enumerate(zip(policy.starts, policy.slots, strict=True)):
            at = POLICY_AT + t * stride
            values = [start, slot.steps, slot.ema, slot.batches, slot.alpha, slot.interval]
            values += [slot.warmup, slot.up, slot.down, len(slot.candidates), *slot.candidates]
            st[at : at + len(values)] = values
        changes = POLICY_AT + len(policy.slots) * stride
        st[changes : changes + 3 * len(policy.changes)] = np.ravel(policy.changes)


def unpack_policy(policy, st: np.ndarray, ct: np.ndarray) -> None:
    """The policy's state as a call left it."""
    if isinstance(policy, AcceptanceGate):
        window, head = int(ct[GATE_WINDOW]), int(ct[GATE_HEAD])
        ring = st[POLICY_AT : POLICY_AT + window].tolist()
        policy._samples = deque(ring[(head + j) % window] for j in range(int(ct[GATE_LEN])))
        policy._sum = float(st[GATE_SUM])
        policy.recorded = int(ct[GATE_RECORDED])
        policy.tripped_at = int(ct[GATE_TRIPPED]) or None
        policy.off_at_s = None if policy.tripped_at is None else float(st[GATE_OFF_AT])
    elif isinstance(policy, AdaptiveStepsWindow):
        stride = int(ct[STEPS_STRIDE])
        for t, slot in enumerate(policy.slots):
            at = POLICY_AT + t * stride
            slot.steps, slot.batches = int(st[at + TIER_STEPS]), int(st[at + TIER_BATCHES])
            slot.ema = float(st[at + TIER_EMA])
        current = int(ct[STEPS_CURRENT])
        policy._current = None if current < 0 else policy.slots[current]
        policy.changed = int(ct[STEPS_CHANGED])
        changes = POLICY_AT + len(policy.slots) * stride
        kept = min(policy.changed, REPORTED_CHANGES)
        values = st[changes : changes + 3 * kept].reshape(-1, 3).tolist()
        policy.changes = [(when, int(start), int(steps)) for when, start, steps in values]
