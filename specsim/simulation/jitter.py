"""Iteration-time spread: seeded multipliers drawn from a profile's measured distribution.

The latency fits and the overhead predict an iteration's typical time. A real serving loop
varies around it (the operating system, caches, allocator, other tenants), and latency tails
follow that spread: a TTFT p90 is one prefill iteration's p90, not its median. ``Jitter`` draws
independent multipliers by inverse transform of uniforms from the replica's own stream, in
chunks (one numpy call per 4096 iterations), linearly between the profile's quantiles.

An iteration that only prefills is long and compute-bound, and varies less, relative to its
median, than a decode iteration (docs/notes/2026-11-29-engine-overhead-fit.md): it takes the
profile's ``prefill_jitter`` where there is one. Both kinds map the same uniform, so a profile
without it draws exactly what it drew before.
"""

from __future__ import annotations

import numpy as np

from specsim.profile.schema import IterationJitter

_CHUNK = 4096


class Jitter:
    """Multipliers for iteration times: ``factor()`` is the next one; ``factor(prefill=True)``
    the next for an iteration that only prefills (``prefill``'s spread; without it, ``spec``'s)."""

    def __init__(
        self,
        spec: IterationJitter,
        rng: np.random.Generator,
        prefill: IterationJitter | None = None,
    ):
        # Decode's spread, and prefill's when the profile has one of its own.
        self.kinds = [np.asarray(s.quantiles, dtype=float) for s in (spec, prefill) if s]
        self.rng = rng
        self._next: list[list[float]] = [[] for _ in self.kinds]  # the same uniforms mapped

    def factor(self, prefill: bool = False) -> float:
        if not self._next[0]:
            uniforms = self.rng.random(_CHUNK)
            self._next = [
                np.interp(uniforms, np.linspace(0.0, 1.0, len(q)), q)[::-1].tolist()
                for q in self.kinds
            ]
        draws = [kind.pop() for kind in self._next]  # one uniform used, whichever is asked
        return draws[-1] if prefill else draws[0]
