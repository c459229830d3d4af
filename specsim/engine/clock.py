"""The engine's clocks: wall-clock time, or this process's CPU time on a shared machine.

``wall`` is what a user of a server sees. On a machine shared with other busy processes, wall
time also counts the time the operating system gave to them, at random; ``cpu`` counts only the
engine's own work (``time.process_time``, one torch thread), and an idle wait for the next
arrival advances the clock by the wait instead of sleeping. With the profiler's ``--clock cpu``
the two sides then measure the same thing.
"""

from __future__ import annotations

import time

from specsim.errors import SpecsimError

CLOCKS = ("wall", "cpu", "reference")


class WallClock:
    def now(self) -> float:
        return time.perf_counter()

    def weigh(self, tokens: float) -> None:
        """What the stretch up to the next reading ran (the reference clock's concern)."""

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class ProcessClock:
    """CPU time of this process, plus the idle waits it skipped."""

    def __init__(self):
        self.skipped = 0.0

    def now(self) -> float:
        return time.process_time() + self.skipped

    def sleep(self, seconds: float) -> None:
        self.skipped += max(0.0, seconds)

    def weigh(self, tokens: float) -> None:
        """What the stretch up to the next reading ran (the reference clock's concern)."""


class ReferenceClock(ProcessClock):
    """CPU time at the reference speed: each stretch of CPU time between two readings counts
    times the normaliser's factor (``specsim.engine.speed.SpeedNormaliser``) for the tokens its
    passes fed (``weigh``: the engine's target pass; 1 when not told), and the speed probes the
    normaliser runs every quarter second stay off the clock."""

    def __init__(self, normaliser):
        super().__init__()
        self.normaliser = normaliser
        self.elapsed = 0.0
        self._last: float | None = None
        self._tokens = 1.0

    def weigh(self, tokens: float) -> None:
        self._tokens = tokens

    def now(self) -> float:
        raw = time.process_time()
        if self._last is not None:
            self.elapsed += (raw - self._last) * self.normaliser.current(self._tokens)
        self._tokens = 1.0
        self.normaliser.refresh()  # may probe: read the clock again after it
        self._last = time.process_time()
        return self.elapsed + self.skipped


def check_clock(name: str, device: str = "cpu") -> None:
    """The CPU clocks need a CPU run on one torch thread (several threads add up)."""
    if name == "wall":
        return
    if name not in CLOCKS:
        raise SpecsimError(f"unknown clock {name!r}", file="--clock", fix="wall, cpu or reference")
    import torch

    if device != "cpu":
        raise SpecsimError(
            f"--clock {name} applies to CPU runs", file="--clock", fix="use --clock wall on a GPU"
        )
    if torch.get_num_threads() != 1:
        raise SpecsimError(
            f"--clock {name} needs one torch thread (have {torch.get_num_threads()})",
            file="--clock",
            fix="set OMP_NUM_THREADS=1, or use --clock wall",
        )


def clock_for(name: str, normaliser=None):
    """The clock called ``name``; ``reference`` needs the ``SpeedNormaliser`` to rescale by."""
    if name == "wall":
        return WallClock()
    if name == "cpu":
        return ProcessClock()
    if normaliser is None:
        raise ValueError("the reference clock needs a speed normaliser")
    return ReferenceClock(normaliser)


def make_clock(
    name: str,
    device: str = "cpu",
    reference_model=None,
    reference_s: float | None = None,
    reference_prefill_s: float | None = None,
):
    """``wall``, ``cpu``, or ``reference``: rescaled to the speed at which ``reference_model``'s
    reference passes take ``reference_s`` (decode) and ``reference_prefill_s`` (see
    ``specsim.engine.speed``; without them, the speed now). Checked before the reference
    passes are first timed."""
    check_clock(name, device)
    if name != "reference":
        return clock_for(name)
    if reference_model is None:
        raise ValueError("the reference clock needs the model whose pass is the reference")
    from specsim.engine.speed import ReferencePass, SpeedNormaliser

    normaliser = SpeedNormaliser(
        ReferencePass(reference_model), reference_s, reference_prefill_s=reference_prefill_s
    )
    return clock_for(name, normaliser)
