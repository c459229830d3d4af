"""Timing real forward passes with a real KV cache: the measured half of a latency profile.

Each grid point is (batch, context, new tokens per sequence): 1 new token is a decode pass,
k + 1 a verification pass, a prompt length with no context a prefill. The cache is allocated at
its full size and its row lengths are set to the context, so attention really reads ``context``
cached keys per row (their values do not change the time). Every point gets warm-up passes, then
timed repeats; the sample is their median with the interquartile range as spread.

On CPU a pass is timed with ``time.perf_counter_ns`` (CPU torch ops are synchronous: they return
when the work is done), or with the process's CPU time (``clock="cpu"``) on a shared machine. On
CUDA it is timed with CUDA events recorded around the pass and a device synchronisation before
reading them, which excludes host-side queueing jitter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from specsim.bounds import MAX_BATCH, MAX_TOKENS
from specsim.engine.clock import check_clock
from specsim.errors import SpecsimError
from specsim.profile.latency import LatencySample

DEFAULT_CPU_GRID = {
    "batch": (1, 2, 4, 8),
    "context": (16, 128, 384),
    "new": (1, 3, 5, 9),
    "prefill": (32, 128),
}
DEFAULT_CUDA_GRID = {
    "batch": (1, 4, 16, 64),
    "context": (128, 1024, 4096),
    "new": (1, 3, 5, 9),
    "prefill": (256, 1024),
}
GRID_AXES = ("batch", "context", "new", "prefill")


@dataclass(frozen=True, order=True)
class GridPoint:
    batch: int
    context: int
    new_tokens: int

    @property
    def phase(self) -> str:
        if self.new_tokens == 1:
            return "decode"
        return "prefill" if self.context == 0 else "verify"


def grid_points(axes: dict[str, Sequence[int]]) -> list[GridPoint]:
    """Decode/verify points (batch x context x new) plus prefill points (batch x prompt)."""
    points = {
        GridPoint(b, c, n) for b in axes["batch"] for c in axes["context"] for n in axes["new"]
    }
    points |= {GridPoint(b, 0, p) for b in axes["batch"] for p in axes.get("prefill", ())}
    return sorted(points)


def parse_grid(
    texts: Iterable[str], device: str, max_position: int | None = None
) -> dict[str, tuple[int, ...]]:
    """``["batch=1,2,4", "new=1,5"]`` over the device's default grid. With the models'
    ``max_position``, the default context and prefill values are fitted to it (see
    ``fit_to_positions``) and a given value past it is an error."""
    axes = dict(DEFAULT_CUDA_GRID if device.startswith("cuda") else DEFAULT_CPU_GRID)
    given = set()
    for text in texts:
        axis, _, values = text.partition("=")
        axis = axis.strip()
        if axis not in GRID_AXES:
            raise SpecsimError(
                f"unknown grid axis {axis!r}",
                file="--grid",
                key=axis,
                fix=f"use one of {', '.join(GRID_AXES)}: --grid batch=1,2,4",
            )
        try:
            parsed = tuple(sorted({int(v) for v in values.split(",") if v.strip()}))
        except ValueError:
            raise SpecsimError(
                f"grid values {values!r} are not integers",
                file="--grid",
                key=axis,
                fix="write comma-separated integers, e.g. --grid batch=1,2,4",
            ) from None
        low = 0 if axis == "context" else 1
        high = MAX_BATCH if axis == "batch" else MAX_TOKENS
        if any(not low <= v <= high for v in parsed):
            raise SpecsimError(
                f"grid values must be from {low} to {high:,}",
                file="--grid",
                key=axis,
                fix="use values in that range",
            )
        axes[axis] = parsed
        given.add(axis)
    for axis in ("batch", "context", "new"):
        if not axes[axis]:
            raise SpecsimError(
                f"grid axis {axis!r} has no values, so the grid has no points",
                file="--grid",
                key=axis,
                fix=f"give at least one value: --grid {axis}=...",
            )
    if max_position is not None:
        axes = fit_to_positions(axes, max_position, given)
    return axes


def fit_to_positions(
    axes: dict[str, tuple[int, ...]], max_position: int, given: set[str]
) -> dict[str, tuple[int, ...]]:
    """Keep every pass within ``max_position`` (context + new tokens, or the prompt length).

    Default values that do not fit give way to the largest that does (the grid still reaches
    the models' longest context); a value the user gave that does not fit is an error."""
    longest_new = max(axes["new"])
    limits = {"context": max_position - longest_new, "prefill": max_position}
    if limits["context"] < 0:
        raise SpecsimError(
            f"{longest_new} new tokens per pass exceed the models' {max_position} positions",
            file="--grid",
            key="new",
            fix=f"use new values of at most {max_position}",
        )
    out = dict(axes)
    for axis, limit in limits.items():
        values = axes.get(axis, ())
        too_long = [v for v in values if v > limit]
        if not too_long:
            continue
        if axis in given:
            raise SpecsimError(
                f"grid {axis} {too_long[0]} does not fit the models' {max_position} positions"
                + (f" with {longest_new} new tokens" if axis == "context" else ""),
                file="--grid",
                key=axis,
                fix=f"use {axis} values of at most {limit}",
            )
        out[axis] = tuple(sorted({v for v in values if v <= limit} | {limit}))
    return out


class PassTimer:
    """Times one kind of pass: warm-ups, then ``repeats`` timed runs (median and IQR).

    ``clock`` (CPU only): ``wall`` times elapsed time; ``cpu`` times the process's CPU time,
    which leaves out the time the operating system gave to other processes, so it measures what
    a dedicated core would take even on a shared machine. It is only meaningful with one torch
    thread (several threads add their CPU times up), which the timer checks. ``reference`` is
    CPU time rescaled by ``normalise(tokens, model)`` (a ``ReferenceTiming.factor``, called
    before each timed pass with the tokens it feeds and the model that runs it) to the
    machine's speed at a reference moment: other tenants also slow this process's own CPU time
    (see ``specsim.engine.speed_reference``).
    """

    def __init__(
        self,
        device: str,
        warmup: int = 2,
        repeats: int = 5,
        clock: str = "wall",
        normalise: Callable[..., float] | None = None,
        prime_s: float = 0.03,
    ):
        if repeats < 1 or warmup < 0:
            raise SpecsimError(
                "repeats must be >= 1 and warm-ups >= 0", key="--repeats", fix="use 1 or more"
            )
        if clock != "wall" and device.startswith("cuda"):
            raise SpecsimError(
                f"--clock {clock} times CPU passes; CUDA passes are timed with CUDA events",
                file="--clock",
                fix=f"drop --clock {clock} for --device cuda",
            )
        check_clock(clock)  # the engine's clocks' rules: a known name, one torch thread
        if (clock == "reference") != (normalise is not None):
            raise ValueError("the reference clock, and only it, needs a normalise function")
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.clock = clock
        self.normalise = normalise
        self.prime_s = prime_s  # seconds of untimed passes of a grid point before its timed one

    def time_once(self, run: Callable[[], object], tokens: int = 1, model=None) -> float:
        """Seconds of one ``run``; ``tokens``: how many tokens its pass feeds, ``model``: whose
        pass it is (None: the target; the reference clock's factor depends on both)."""
        import torch

        if self.device.startswith("cuda"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1e3
        # Read before the pass: a speed probe, when one is due, stays out of the timing.
        factor = self.normalise(tokens, model) if self.normalise is not None else 1.0
        now = time.perf_counter_ns if self.clock == "wall" else time.process_time_ns
        begin = now()
        run()
        return (now() - begin) / 1e9 * factor

    def measure(
        self, run: Callable[[], object], reset: Callable[[], object], tokens: int = 1, model=None
    ) -> np.ndarray:
        """Seconds of ``repeats`` runs of ``run``, each after ``reset`` (not timed)."""
        for _ in range(self.warmup):
            reset()
            run()
        times = np.empty(self.repeats)
        for i in range(self.repeats):
            reset()
            times[i] = self.time_once(run, tokens, model)
        return times


@dataclass
class TimingRun:
    samples: list[LatencySample]
    planned: int
    stopped_early: bool
    seconds: float


def _check_fits(model, points: Sequence[GridPoint]) -> None:
    limit = model.config.max_position
    for point in points:
        if point.context + point.new_tokens > limit:
            raise SpecsimError(
                f"grid point context {point.context} + new {point.new_tokens} exceeds the "
                f"model's max_position {limit}",
                file="--grid",
                key="context",
                fix=f"keep context + new tokens <= {limit}",
            )


def time_grid(
    model,
    points: Sequence[GridPoint],
    timer: PassTimer,
    *,
    seed: int = 0,
    deadline: float = math.inf,
    progress=None,
) -> TimingRun:
    """Measure ``points`` of ``model`` (a ``specsim.models`` model) until done or until
    ``time.monotonic()`` passes ``deadline``.

    Repeats run in rounds: every point once per round (warm-up rounds first, untimed), each timed
    pass right after ``timer.prime_s`` of the same pass untimed (one pass at least), so it runs
    warm, as a serving loop's alike steps do (after an unlike pass a CPU runs the next few
    slower: docs/notes/2026-11-29-timing-grid-priming.md). A burst of load from other processes
    then costs many points one slow repeat each, which the median drops, instead of spoiling
    every repeat of one point or of one region of the grid. Within a round points go by batch
    size, smallest first, with one cache per batch size at a time (sized for its longest point;
    the model attends only up to each row's length, so the longer allocation costs nothing). A
    time budget thus cuts the expensive end of the grid first, and the valid range records what
    was measured.
    """
    return time_grids(
        {"model": model}, points, timer, seed=seed, deadline=deadline, progress=progress
    )["model"]


def time_grids(
    models: dict,
    points: Sequence[GridPoint],
    timer: PassTimer,
    *,
    seed: int = 0,
    deadline: float = math.inf,
    progress=None,
) -> dict[str, TimingRun]:
    """``time_grid`` for several models at once, their rounds interleaved (a round of the
    first, then of the next, ...): each model's repeats then span the whole measurement, and on
    a machine whose speed drifts no model's fit comes from one phase of it alone (a drafter's
    grid takes about a second on a CPU: on its own it would catch just one phase). The
    deadline cuts the last rounds, the last model's (put the target last) largest points
    first."""
    grids = {name: _ModelGrid(model, points, seed) for name, model in models.items()}
    out_of_time = False
    for round_index in range(timer.warmup + timer.repeats):
        timed = round_index >= timer.warmup
        for grid in grids.values():
            if not grid.round(timer, timed, deadline, progress):
                out_of_time = True
                break
        if out_of_time:
            break
    return {
        name: TimingRun(
            samples=grid.samples(),
            planned=len(points),
            stopped_early=out_of_time,
            seconds=grid.seconds,
        )
        for name, grid in grids.items()
    }


class _ModelGrid:
    """One model's grid: its inputs, its cache, and the times measured so far."""

    def __init__(self, model, points: Sequence[GridPoint], seed: int):
        import torch

        _check_fits(model, points)
        self.model = model
        self.ordered = sorted(points)
        generator = torch.Generator().manual_seed(seed)
        vocab = model.config.vocab_size
        tokens = {
            p: torch.randint(0, vocab, (p.batch, p.new_tokens), generator=generator)
            for p in self.ordered
        }
        self.tokens = {p: t.to(model.device) for p, t in tokens.items()}
        batches = {p.batch for p in self.ordered}
        self.longest = {
            b: max(p.context + p.new_tokens for p in self.ordered if p.batch == b) for b in batches
        }
        self.times: dict[GridPoint, list[float]] = {}
        self.seconds = 0.0  # time spent in this model's rounds

    def round(self, timer: PassTimer, timed: bool, deadline: float, progress) -> bool:
        """Every point once (timed or warm-up); False when the deadline cut it short."""
        import torch

        began = time.monotonic()
        cache = None
        try:
            for point in self.ordered:
                if timed and time.monotonic() >= deadline:
                    return False
                fresh = cache is None or cache.batch_size != point.batch
                if fresh:
                    cache = None  # free the previous batch size's cache first
                    cache = self.model.new_cache(point.batch, self.longest[point.batch])

                def run(point=point, cache=cache):
                    with torch.inference_mode():
                        self.model(self.tokens[point], cache)

                # Each timed pass follows the same pass untimed for ``timer.prime_s``, as a
                # serving loop's steps follow steps alike: a pass right after an unlike one runs
                # slow (docs/notes/2026-11-29-timing-grid-priming.md), and a fresh cache's
                # first touch (page faults) stays out.
                fed = point.batch * point.new_tokens
                if timed and timer.normalise is not None:
                    # A speed probe now due runs here, before the priming, so that the timed
                    # pass follows its primers and not the probe's passes.
                    timer.normalise(fed, self.model)
                priming = time.perf_counter()
                while True:
                    cache.lengths.fill_(point.context)
                    run()
                    if not timed or time.perf_counter() - priming >= timer.prime_s:
                        break
                if not timed:
                    continue
                cache.lengths.fill_(point.context)  # back to the point's context, untimed
                self.times.setdefault(point, []).append(timer.time_once(run, fed, self.model))
                if progress is not None:
                    progress.update(1)
            return True
        finally:
            self.seconds += time.monotonic() - began

    def samples(self) -> list[LatencySample]:
        return [_sample(point, np.asarray(t)) for point, t in sorted(self.times.items())]


def _sample(point: GridPoint, times: np.ndarray) -> LatencySample:
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return LatencySample(
        batch=point.batch,
        context=point.context,
        new_tokens=point.new_tokens,
        seconds=float(median),
        spread_s=float(q3 - q1),
        repeats=len(times),
        phase=point.phase,
    )
