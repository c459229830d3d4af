"""The engine's clocks: wall-clock time, or this process's CPU time on a shared machine.

``wall`` is what a user of a server sees. On a machine shared with other busy processes, wall
time also counts the time the operating system gave to them, at random; ``cpu`` counts only the
engine's own work (``time.process_time``, one torch thread), and an idle wait for the next
arrival advances the clock by the wait instead of sleeping. With the profiler's ``--clock cpu``
the two sides then measure the same thing. A clock that needs more than its name (the shared
CPU's ``reference`` clock, ``specsim.engine.speed_reference``) is given as a setting that
``start_clock`` starts on the run's models.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from specsim.errors import SpecsimError

CLOCKS = ("wall", "cpu", "reference")


ROLES = ("target", "drafter", "host")  # what a stretch of the engine's time ran


class WallClock:
    """Elapsed time. It keeps no split: a GPU's passes return before their work is done."""

    split = None

    def report(self) -> dict | None:
        """What the clock has to say about the run for its summary (nothing)."""
        return None

    def now(self) -> float:
        return time.perf_counter()

    def mark(self, model, tokens: float = 1.0, role: str = "host") -> None:
        """What runs from now on (the CPU clocks' concern)."""

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class ProcessClock:
    """CPU time of this process, plus the idle waits it skipped. The engine marks where each
    model pass starts and ends (``mark``; ``MeteredModel`` does it), and the clock keeps the
    time split by what ran (``split``: the target's passes, the drafter's, and the engine's own
    work between them), so a validation can say which part of an iteration the profile
    mispredicts."""

    def __init__(self):
        self.skipped = 0.0
        self.elapsed = 0.0
        self.split = dict.fromkeys(ROLES, 0.0)
        self._last: float | None = None
        self._running: tuple[object, float, str] = (None, 1.0, "host")  # model, tokens, role

    def _factor(self, model, tokens: float) -> float:
        return 1.0

    def _close_stretch(self) -> None:
        raw = time.process_time()
        if self._last is not None:
            model, tokens, role = self._running
            seconds = (raw - self._last) * self._factor(model, tokens)
            self.elapsed += seconds
            self.split[role] += seconds
        self._last = raw

    def mark(self, model, tokens: float = 1.0, role: str = "host") -> None:
        self._close_stretch()
        self._running = (model, tokens, role) if model is not None else (None, 1.0, "host")

    def now(self) -> float:
        self._close_stretch()
        self._running = (None, 1.0, "host")
        return self.elapsed + self.skipped

    def sleep(self, seconds: float) -> None:
        self.skipped += max(0.0, seconds)

    def report(self) -> dict | None:
        return None


class MeteredModel:
    """``model`` in ``role`` (target or drafter), telling ``mark`` when each of its passes
    starts (with the tokens it feeds) and ends; everything else passes through to the model."""

    def __init__(self, model, role: str, mark):
        self.model = model
        self.role = role
        self._mark = mark

    def __call__(self, ids, *args, **kwargs):
        self._mark(self.model, float(ids.numel()), self.role)
        try:
            return self.model(ids, *args, **kwargs)
        finally:
            self._mark(None)

    def __getattr__(self, name):
        return getattr(self.model, name)


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


class ClockSetting(Protocol):
    """A clock given by more than its name: ``start`` builds it on the run's models."""

    name: str

    def start(self, target: Any, drafters: Mapping[str, Any]) -> ProcessClock: ...


def clock_name(clock: str | ClockSetting) -> str:
    return clock if isinstance(clock, str) else clock.name


def start_clock(
    clock: str | ClockSetting = "wall",
    device: str = "cpu",
    target: Any = None,
    drafters: Mapping[str, Any] | None = None,
):
    """The engine's clock: ``wall``, ``cpu``, or a setting started on ``target`` and the
    ``drafters`` by name (the reference clock's; a bare ``"reference"`` names it without the
    references it needs). Checked before anything is timed."""
    check_clock(clock_name(clock), device)
    if clock == "wall":
        return WallClock()
    if clock == "cpu":
        return ProcessClock()
    if isinstance(clock, str):
        raise ValueError(
            "the reference clock needs its setting: specsim.engine.speed_reference.ReferenceClock"
            "Setting"
        )
    return clock.start(target, drafters or {})


def sync(device) -> None:
    """Wait for a CUDA device's queued work before a clock is read (CPU passes return done)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
