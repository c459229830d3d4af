"""What the compiled serving loop reads of a replica (``compiled_serving.py``): where it may run,
its cost vector, its window policy and its acceptance tables, and the float state it begins
with (``compiled_layout.STEP_STATE``).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from specsim.simulation.compiled import kernel_module
from specsim.simulation.compiled_layout import STEP_STATE
from specsim.simulation.policy import BatchTableWindow, FixedWindow, GoodputWindow


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
        now,
        replica.last_decode_end,
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
        now,
        replica.last_decode_end,
        log.verification_flops,
        log.drafter_flops,
        log.wasted_flops,
        log.window_rows,
        log.decode_rows,
    ) = values[:STEP_STATE]
    return now


def window_terms(policy) -> tuple[np.ndarray, np.ndarray] | None:
    """The window policy as the kernel reads it (``compiled_step_kernel._window``): k by batch
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
