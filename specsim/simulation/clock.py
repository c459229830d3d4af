"""The simulation's SimPy environment, which can also wake a process at an exact time.

A compiled span of engine iterations ends at ``start + dt_1 + dt_2 + ...`` added in order, the time
the per-iteration path reaches one timeout at a time. ``env.timeout(end - env.now)`` lands on
``env.now + (end - env.now)``, which rounding can leave an ulp away with no delay that hits
``end`` exactly (seen: from 0.0225 to 0.11449999999999998), so ``Clock.timeout_at`` schedules the
event at ``end`` itself, the way ``Environment.schedule`` does at ``now + delay``.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


class Clock(simpy.Environment):
    def timeout_at(self, when: float) -> simpy.Event:
        """An event that fires at simulated time ``when`` (not before now)."""
        if when < self._now:
            raise ValueError(f"cannot wake at {when!r}, before now ({self._now!r})")
        event = simpy.Event(self)
        event._ok = True  # triggered, as a Timeout is when it is made
        event._value = None
        heappush(self._queue, (when, NORMAL, next(self._eid), event))
        return event
