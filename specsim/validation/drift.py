"""Is the machine as fast now as when the profile was measured? A reference pass, timed.

On a shared machine the same pass can take twice as long an hour later. Before and after the
engine run, ``speed_check`` times one reference pass of the target (batch 1, one new token after
a 128-token context: a decode pass) and compares the median with what the profile's latency fit
predicts for it. A ratio far from 1 means the engine ran on a machine slower (> 1) or faster
(< 1) than the one profiled: the comparison then measures that drift as much as the simulator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specsim.engine.speed_reference import REFERENCE_CONTEXT

CONTEXT = REFERENCE_CONTEXT  # the reference pass's context, named in reports

REPEATS = 21


@dataclass(frozen=True)
class SpeedCheck:
    measured_s: float
    predicted_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


def speed_check(
    target_spec: str,
    latency_model,
    device: str = "cpu",
    clock: str = "wall",
    dtype: str = "float32",
) -> SpeedCheck:
    """Median of ``REPEATS`` reference decode passes against the profile's prediction, timed
    with the engine's clock (``wall``, or the process's CPU time for ``cpu`` and ``reference``:
    raw, so that it shows the drift the reference clock takes out)."""
    from specsim.engine.speed_reference import ReferencePass

    now = time.perf_counter if clock == "wall" else time.process_time
    reference = ReferencePass.load(target_spec, device, dtype, now)
    measured = reference.median_s(REPEATS)
    context = reference.context
    predicted = latency_model.seconds_from_totals(1, 1, context, context + 1)
    return SpeedCheck(measured, float(predicted))
