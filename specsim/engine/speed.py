"""How fast the machine is right now, from a reference pass: timing on a shared machine.

On a shared machine the same forward pass can take 1.9 ms now and 3.1 ms a few seconds later,
even counted in this process's CPU time (other tenants compete for caches and memory
bandwidth). A profile measured in one such phase and an engine run in another then differ by the
machine, not by the model. ``SpeedNormaliser`` measures that drift as it happens: every
``interval_s`` it times a short burst of one fixed pass (the target's decode at batch 1 after a
128-token context) and rescales the CPU time measured since by ``reference_s / burst median``,
so that times read as if the machine ran at its speed when ``reference_s`` was taken. The
profiler records its ``reference_s`` in the profile (``provenance.reference_pass_s``); the
engine's ``reference`` clock normalises to the same number, so both sides are in one unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

REFERENCE_CONTEXT = 128
BURST = 5  # passes per probe: the median of a few is steady, the probe stays ~10 ms
CALIBRATION = 31  # passes for the reference itself
INTERVAL_S = 0.25  # the machine's speed moves on a scale of seconds


class ReferencePass:
    """One decode pass of ``model`` at batch 1 after ``REFERENCE_CONTEXT`` cached tokens."""

    def __init__(self, model, now: Callable[[], float] = time.process_time):
        self.model = model
        self.now = now
        self.context = min(REFERENCE_CONTEXT, model.config.max_position - 1)
        self._cache = None
        self._one = None

    def _ready(self) -> None:
        if self._cache is not None:
            return
        model = self.model
        self._cache = model.new_cache(1, self.context + 1)
        self._one = torch.ones((1, 1), dtype=torch.long, device=model.device)
        with torch.inference_mode():
            model(torch.ones((1, self.context), dtype=torch.long, device=model.device), self._cache)
            for _ in range(2):  # warm-up: first calls pay for allocation
                self._pass()

    def _pass(self) -> float:
        self._cache.rollback([self.context])
        sync(self.model.device)
        began = self.now()
        self.model(self._one, self._cache)
        sync(self.model.device)
        return self.now() - began

    def median_s(self, passes: int = BURST) -> float:
        """Median seconds of ``passes`` reference passes, back to back."""
        self._ready()
        with torch.inference_mode():
            return float(np.median([self._pass() for _ in range(passes)]))


class SpeedNormaliser:
    """The factor that turns CPU seconds measured now into seconds at the reference speed.

    ``reference_s`` is the reference pass's time at the reference speed (a profile's
    ``provenance.reference_pass_s``); without one, the speed at construction is the reference.
    ``factor()`` re-probes once ``interval_s`` of process time has passed since the last probe
    and keeps every probe in ``probes_s`` (the drift over the run, for reports).
    """

    def __init__(
        self,
        reference: ReferencePass,
        reference_s: float | None = None,
        interval_s: float = INTERVAL_S,
    ):
        self.reference = reference
        self.interval_s = interval_s
        self.reference_s = reference_s or reference.median_s(CALIBRATION)
        self.probes_s: list[float] = []
        self._factor = 1.0
        self._next = -float("inf")

    def factor(self) -> float:
        now = time.process_time()
        if now >= self._next:
            seconds = self.reference.median_s()
            self.probes_s.append(seconds)
            self._factor = self.reference_s / seconds
            self._next = time.process_time() + self.interval_s
        return self._factor

    def drift(self) -> dict[str, float]:
        """The machine's speed over the probes, relative to the reference (1 = as fast; 2 = a
        pass took twice as long): median, 10th and 90th percentile."""
        ratios = np.asarray(self.probes_s or [self.reference_s]) / self.reference_s
        return {
            "reference_pass_s": self.reference_s,
            "probes": len(self.probes_s),
            "slowdown_median": float(np.median(ratios)),
            "slowdown_p10": float(np.percentile(ratios, 10)),
            "slowdown_p90": float(np.percentile(ratios, 90)),
        }


def sync(device: torch.device) -> None:
    """Wait for a CUDA device's queued work (CPU passes return when done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
