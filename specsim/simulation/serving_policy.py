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
)
from specsim.simulation.engine_policies import AcceptanceGate

# The most samples an off-switch's ring may hold on the kernel (a longer window runs in Python).
MOST_GATE_WINDOW = 1 << 16


def policy_floats(policy) -> int:
    """The floats the policy's state takes after ``st``'s slots."""
    if isinstance(policy, AcceptanceGate):
        return policy.window
    return 0


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
