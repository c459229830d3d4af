"""Iteration-time spread: seeded multipliers drawn from a profile's measured distribution.

The latency fits and the overhead predict an iteration's median time. A real serving loop
varies around it (the operating system, caches, allocator, other tenants), and latency tails
follow that spread: a TTFT p90 is one prefill iteration's p90, not its median. ``Jitter`` draws
independent multipliers by inverse transform of uniforms from the replica's own stream, in
chunks (one numpy call per 4096 iterations), linearly between the profile's quantiles.
"""

from __future__ import annotations

import numpy as np

from specsim.profile.schema import IterationJitter

_CHUNK = 4096


class Jitter:
    """Multipliers for iteration times: ``factor()`` is the next one."""

    def __init__(self, spec: IterationJitter, rng: np.random.Generator):
        self.quantiles = np.asarray(spec.quantiles, dtype=float)
        self.probs = np.linspace(0.0, 1.0, len(self.quantiles))
        self.rng = rng
        self._next: list[float] = []

    def factor(self) -> float:
        if not self._next:
            draws = np.interp(self.rng.random(_CHUNK), self.probs, self.quantiles)
            self._next = draws[::-1].tolist()
        return self._next.pop()
