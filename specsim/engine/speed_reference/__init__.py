"""Timing on a shared CPU: CPU time rescaled to the machine's speed at a reference moment.

On a dedicated machine none of this is needed: time with the ``wall`` clock (a GPU) or the
``cpu`` clock. On a CPU shared with other busy processes even this process's own CPU time
drifts, so ``--clock reference`` times short reference passes of every model and of the
engine's own work every quarter second and rescales each pass by how far its probes ran from
their references (``normaliser``; why: docs/notes/2026-11-29-reference-clock.md). The profiler
stores the references in the profile's ``provenance.speed_reference`` block, and the engine,
under ``specsim validate --clock reference``, rescales to the same numbers, so both sides count
in one unit.

- ``ReferenceTiming(target, drafters, stored)``: one run's probes. ``factor(tokens, model)``
  rescales a pass the profiler timed, ``clock()`` is the engine's clock, ``drift()`` the
  machine's speed over the run, ``block(overhead_pass_scale)`` the profile's block.
- ``clock_setting(name, stored)``: a ``--clock`` name as ``run_engine(clock=...)`` takes it
  (``ReferenceClockSetting`` for ``reference``).
- ``describe(drift, steady)`` and ``steady(drift)``: the validation report's lines on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from specsim.engine.speed_reference.clock import ReferenceClock
from specsim.engine.speed_reference.normaliser import SpeedNormaliser
from specsim.engine.speed_reference.probes import REFERENCE_CONTEXT, ReferencePass
from specsim.profile.provenance import SpeedReference

__all__ = [
    "REFERENCE_CONTEXT",
    "ReferenceClockSetting",
    "ReferencePass",
    "ReferenceTiming",
    "clock_setting",
    "describe",
    "steady",
]


class ReferenceTiming:
    """The reference clock's probes for one run: of ``target``, of each of ``drafters`` (by
    name) and of the engine's own work, at the references ``stored`` (a profile's
    ``provenance.speed_reference``; without one, each probe's quiet speed, calibrated at the
    first probe). Nothing is timed before the first ``factor`` or clock reading."""

    def __init__(
        self,
        target: Any,
        drafters: Mapping[str, Any] | None = None,
        stored: SpeedReference | None = None,
    ):
        stored = stored or SpeedReference()
        self.normaliser = SpeedNormaliser(
            ReferencePass(target),
            stored.decode_s,
            reference_prefill_s=stored.prefill_s,
            reference_host_s=stored.host_s,
        )
        own = stored.drafters or {}
        for name, model in (drafters or {}).items():
            passes = own.get(name)
            self.normaliser.track(
                model,
                name,
                passes.decode_s if passes is not None else None,
                passes.prefill_s if passes is not None else None,
            )

    def factor(self, tokens: float = 1.0, model: Any = None) -> float:
        """The factor for a pass of ``model`` (None: the engine's own work) feeding ``tokens``,
        probing first when a probe is due; call it before the pass, never inside."""
        return self.normaliser.factor(tokens, model)

    def clock(self) -> ReferenceClock:
        return ReferenceClock(self.normaliser)

    def drift(self) -> dict:
        return self.normaliser.drift()

    def slowdown(self) -> float:
        """The target's median decode probe over its reference (1 = as fast), to 4 digits."""
        return round(self.normaliser.drift()["slowdown_median"], 4)

    def block(self, overhead_pass_scale: float | None) -> dict:
        """The profile's ``provenance.speed_reference``: every reference, the slowdown, and the
        overhead waves' pass speed against the latency fits."""
        normaliser = self.normaliser
        return {
            "decode_s": normaliser.reference_s,
            "prefill_s": normaliser.reference_prefill_s,
            "host_s": normaliser.host.reference_s,
            "drafters": (
                {s.name: s.references() for s in normaliser.tracked.values()}
                if normaliser.tracked
                else None
            ),
            "slowdown": self.slowdown(),
            "overhead_pass_scale": overhead_pass_scale,
        }


@dataclass(frozen=True)
class ReferenceClockSetting:
    """The reference clock for an engine run, rescaling to ``stored`` (a profile's
    ``provenance.speed_reference``; None: the quiet speed at the start)."""

    stored: SpeedReference | None = None
    name: ClassVar[str] = "reference"

    def start(self, target: Any, drafters: Mapping[str, Any]) -> ReferenceClock:
        return ReferenceTiming(target, drafters, self.stored).clock()


def clock_setting(name: str, stored: SpeedReference | None = None):
    """``--clock NAME`` as ``run_engine(clock=...)`` takes it: the reference clock rescaling to
    ``stored``; ``wall`` and ``cpu`` as they are."""
    return ReferenceClockSetting(stored) if name == "reference" else name


def steady(drift: dict, tolerance: float = 0.1) -> bool:
    """Whether every probe (the target's, the host pass and each drafter's) ran within
    ``tolerance`` of the reference speed for most of the run (their median slowdowns)."""
    keys = ("slowdown_median", "prefill_slowdown_median", "host_slowdown_median")
    return all(
        abs(probes[key] - 1.0) <= tolerance
        for probes in (drift, *drift.get("models", {}).values())
        for key in keys
        if key in probes
    )


def describe(ref: dict, is_steady: bool = True) -> str:
    """The validation report's lines on the machine's speed under the reference clock."""
    text = (
        f"\nreference clock: {ref['probes']} probes during the run found the machine "
        f"x{ref['slowdown_median']:.2f} as slow as at the reference for a decode "
        f"({ref['reference_pass_s'] * 1e3:.2f} ms; p10..p90 x{ref['slowdown_p10']:.2f}.."
        f"x{ref['slowdown_p90']:.2f}) and x{ref['prefill_slowdown_median']:.2f} for a "
        f"prefill ({ref['reference_prefill_s'] * 1e3:.2f} ms; p10..p90 "
        f"x{ref['prefill_slowdown_p10']:.2f}..x{ref['prefill_slowdown_p90']:.2f}), and "
        f"x{ref['host_slowdown_median']:.2f} for the engine's own work "
        f"({ref['reference_host_s'] * 1e3:.2f} ms; p10..p90 x{ref['host_slowdown_p10']:.2f}.."
        f"x{ref['host_slowdown_p90']:.2f}); the engine's times are rescaled to the references."
    )
    for name, own in ref.get("models", {}).items():
        text += (
            f"\n  drafter {name}, its own probes: x{own['slowdown_median']:.2f} for a "
            f"decode ({own['decode_s'] * 1e3:.2f} ms), x{own['prefill_slowdown_median']:.2f} "
            f"for a prefill ({own['prefill_s'] * 1e3:.2f} ms); its passes are rescaled by "
            "them."
        )
    if not is_steady:
        text += (
            "\nwarning: the machine ran more than 10 % away from the reference speed for "
            "most of the run; the rescaling then rests on how the reference passes' slowdown "
            "carries over to the engine's passes, which on a shared 2-core machine held to "
            "5-10 %: errors of that size may be the machine's, rerun when it is quieter."
        )
    return text
