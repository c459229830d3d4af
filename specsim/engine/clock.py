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


ROLES = ("target", "drafter", "host")  # what a stretch of the engine's time ran


class WallClock:
    """Elapsed time. It keeps no split: a GPU's passes return before their work is done."""

    split = None

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


class ReferenceClock(ProcessClock):
    """CPU time at the reference speed: each stretch counts times the normaliser's factor
    (``specsim.engine.speed.SpeedNormaliser``) for what ran in it: a pass of a model feeding
    some tokens takes that model's factor for that width, and the engine's own work between
    passes the host pass's factor. Per pass, not per iteration: in a speculative step the
    drafter's narrow passes and the target's wide verification do not slow alike. The speed
    probes the normaliser runs every quarter second stay off the clock."""

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
    reference_host_s: float | None = None,
):
    """``wall``, ``cpu``, or ``reference``: rescaled to the speed at which ``reference_model``'s
    reference passes take ``reference_s`` (decode) and ``reference_prefill_s``, and the host
    pass ``reference_host_s`` (see ``specsim.engine.speed``; without them, the quiet speed
    now). Checked before the reference passes are first timed."""
    check_clock(name, device)
    if name != "reference":
        return clock_for(name)
    if reference_model is None:
        raise ValueError("the reference clock needs the model whose pass is the reference")
    from specsim.engine.speed import ReferencePass, SpeedNormaliser

    normaliser = SpeedNormaliser(
        ReferencePass(reference_model),
        reference_s,
        reference_prefill_s=reference_prefill_s,
        reference_host_s=reference_host_s,
    )
    return clock_for(name, normaliser)
