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
    the next for an iteration that only prefills (``prefill``'s spread; without it, ``spec``'s).
    ``ahead(n)`` shows the next ``n`` multipliers of both kinds without using them, ``skip(n)``
    uses them (a call of the serving kernel takes its multipliers at once)."""

    def __init__(
        self,
        spec: IterationJitter,
        rng: np.random.Generator,
        prefill: IterationJitter | None = None,
    ):
        # Decode's spread, and prefill's when the profile has one of its own.
        self.kinds = [np.asarray(s.quantiles, dtype=float) for s in (spec, prefill) if s]
        self.rng = rng
        self._mapped = [np.empty(0) for _ in self.kinds]  # the same uniforms mapped, per kind
        self._next = 0  # index of the next multiplier

    def factor(self, prefill: bool = False) -> float:
        if self._next == self._mapped[0].shape[0]:
            self._draw(1)
        i = self._next
        self._next = i + 1  # one uniform used, whichever kind is asked
        return float(self._mapped[-1 if prefill else 0][i])

    def ahead(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` multipliers of each kind, decode and prefill (not used until
        ``skip``: an iteration uses one of either kind)."""
        if self._next + n > self._mapped[0].shape[0]:
            self._draw(n)
        mapped = self._mapped
        return mapped[0][self._next : self._next + n], mapped[-1][self._next : self._next + n]

    def skip(self, n: int) -> None:
        self._next += n

    def _draw(self, n: int) -> None:
        """Drop the used multipliers and draw chunks until ``n`` are ahead."""
        left = [mapped[self._next :] for mapped in self._mapped]
        self._next = 0
        while left[0].shape[0] < n:
            uniforms = self.rng.random(_CHUNK)
            left = [
                np.concatenate([old, np.interp(uniforms, np.linspace(0.0, 1.0, len(q)), q)])
                for old, q in zip(left, self.kinds, strict=True)
            ]
        self._mapped = left
