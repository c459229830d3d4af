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

import numpy as np

CONTEXT = 128
REPEATS = 21


@dataclass(frozen=True)
class SpeedCheck:
    measured_s: float
    predicted_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


def speed_check(
    target_spec: str, latency_model, device: str = "cpu", clock: str = "wall"
) -> SpeedCheck:
    """Median of ``REPEATS`` reference decode passes against the profile's prediction, timed
    with the engine's clock (``wall`` or the process's ``cpu`` time)."""
    import torch

    from specsim.models import load_model

    now = time.process_time if clock == "cpu" else time.perf_counter
    model = load_model(target_spec, device)
    context = min(CONTEXT, model.config.max_position - 1)
    cache = model.new_cache(1, context + 1)
    prompt = torch.ones((1, context), dtype=torch.long, device=model.device)
    one = torch.ones((1, 1), dtype=torch.long, device=model.device)
    times = []
    with torch.inference_mode():
        model(prompt, cache)
        for i in range(REPEATS + 2):
            cache.rollback([context])
            _sync(model.device)
            began = now()
            model(one, cache)
            _sync(model.device)
            if i >= 2:  # two warm-up passes
                times.append(now() - began)
    predicted = latency_model.seconds_from_totals(1, 1, context, context + 1)
    return SpeedCheck(float(np.median(times)), float(predicted))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
