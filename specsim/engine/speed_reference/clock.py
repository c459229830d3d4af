"""The reference clock: the engine's CPU time, each stretch rescaled to the reference speed."""

from __future__ import annotations

import time

from specsim.engine.clock import ProcessClock


class ReferenceClock(ProcessClock):
    """CPU time at the reference speed: each stretch counts times the normaliser's factor
    (``SpeedNormaliser``) for what ran in it: a pass of a model feeding some tokens takes that
    model's factor for that width, and the engine's own work between passes the host pass's
    factor. Per pass, not per iteration: in a speculative step the drafter's narrow passes and
    the target's wide verification do not slow alike. The speed probes the normaliser runs
    every quarter second stay off the clock."""

    def __init__(self, normaliser):
        super().__init__()
        self.normaliser = normaliser

    def _factor(self, model, tokens: float) -> float:
        return self.normaliser.current(tokens, model)

    def now(self) -> float:
        reading = super().now()
        self.normaliser.refresh()  # may probe: restart the stretch after it
        self._last = time.process_time()
        return reading

    def report(self) -> dict:
        """The machine's speed over the run's probes (``SpeedNormaliser.drift``)."""
        return self.normaliser.drift()
