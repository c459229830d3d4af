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

CLOCKS = ("wall", "cpu")


class WallClock:
    def now(self) -> float:
        return time.perf_counter()

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


def make_clock(name: str, device: str = "cpu"):
    if name == "wall":
        return WallClock()
    if name != "cpu":
        raise SpecsimError(f"unknown clock {name!r}", file="--clock", fix="wall or cpu")
    import torch

    if device != "cpu":
        raise SpecsimError(
            "--clock cpu applies to CPU runs", file="--clock", fix="use --clock wall on a GPU"
        )
    if torch.get_num_threads() != 1:
        raise SpecsimError(
            f"--clock cpu needs one torch thread (have {torch.get_num_threads()})",
            file="--clock",
            fix="set OMP_NUM_THREADS=1, or use --clock wall",
        )
    return ProcessClock()
