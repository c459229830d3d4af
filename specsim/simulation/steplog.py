"""Per-iteration statistics of one replica, buffered in arrays and folded in batches.

The engine writes a few scalars per iteration and one row of accepted and drafted counts per
decode step (the occupied prefix of its batch); every ``BUFFER_ITERATIONS`` iterations the
buffers are folded into the replica's ``EngineStats`` with a handful of vectorised calls, so
statistics cost almost nothing per step.
"""

from __future__ import annotations

import numpy as np

from specsim.metrics import EngineStats

BUFFER_ITERATIONS = 1024


class StepLog:
    def __init__(self, stats: EngineStats, capacity: int):
        self.stats = stats
        self._dt = np.zeros(BUFFER_ITERATIONS)
        self._batch = np.zeros(BUFFER_ITERATIONS, dtype=np.int64)
        self._kv = np.zeros(BUFFER_ITERATIONS)
        # Two inter-token gap samples per iteration: (gap, rows that waited it), (dt, joiners).
        self._itl = np.zeros(2 * BUFFER_ITERATIONS)
        self._itl_weight = np.zeros(2 * BUFFER_ITERATIONS)
        # Steps log only the occupied prefix of the batch, so rows are packed end to end.
        self._accepted = np.zeros(BUFFER_ITERATIONS * capacity, dtype=np.int8)
        self._drafted = np.zeros(BUFFER_ITERATIONS * capacity, dtype=np.int8)
        self._step_limit = (BUFFER_ITERATIONS - 1) * capacity  # room left for one more step
        self._iterations = 0
        self._filled = 0
        # Hot-path accumulators, folded into ``stats`` by close().
        self.verification_flops = 0.0
        self.drafter_flops = 0.0
        self.wasted_flops = 0.0
        self.window_rows = 0.0
        self.decode_rows = 0.0

    def record_step(self, accepted: np.ndarray, drafted: np.ndarray) -> None:
        """Per-row accepted and drafted counts of one decode step (-1 marks empty slots)."""
        start = self._filled
        end = start + accepted.shape[0]
        self._accepted[start:end] = accepted
        self._drafted[start:end] = drafted
        self._filled = end
        if end > self._step_limit:
            self._flush_steps()

    def record_iteration(
        self, dt: float, batch: int, kv_tokens: float, gap: float, waited: int, joined: int
    ) -> None:
        i = self._iterations
        self._dt[i] = dt
        self._batch[i] = batch
        self._kv[i] = kv_tokens
        self._itl[2 * i] = gap
        self._itl_weight[2 * i] = waited
        self._itl[2 * i + 1] = dt
        self._itl_weight[2 * i + 1] = joined
        self._iterations = i + 1
        if self._iterations == BUFFER_ITERATIONS:
            self._flush_iterations()

    def adopt(self, iterations: int, filled: int) -> tuple[int, int]:
        """The buffers' fill as a compiled loop left it, flushed where full; the fill after."""
        self._iterations, self._filled = iterations, filled
        if iterations == BUFFER_ITERATIONS:
            self._flush_iterations()
        if filled > self._step_limit:
            self._flush_steps()
        return self._iterations, self._filled

    def _flush_iterations(self) -> None:
        n = self._iterations
        if n:
            weight = self._itl_weight[: 2 * n]
            keep = weight > 0
            self.stats.add_iterations(self._dt[:n], self._batch[:n], self._kv[:n])
            self.stats.itl.add(self._itl[: 2 * n][keep], weight[keep])
        self._iterations = 0

    def _flush_steps(self) -> None:
        n = self._filled
        if n:
            self.stats.add_steps(self._accepted[:n], self._drafted[:n])
        self._filled = 0

    def close(self) -> None:
        self._flush_iterations()
        self._flush_steps()
        flops = self.stats.flops
        flops["verification"] += self.verification_flops
        flops["drafter"] += self.drafter_flops
        flops["wasted"] += self.wasted_flops
        self.stats.window_rows += self.window_rows
        self.stats.decode_rows += self.decode_rows
        self.verification_flops = self.drafter_flops = self.wasted_flops = 0.0
        self.window_rows = self.decode_rows = 0.0
