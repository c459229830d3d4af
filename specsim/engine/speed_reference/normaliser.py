"""How fast the machine is right now, from reference passes: timing on a shared machine.

Other tenants of a shared machine slow even this process's CPU time, and not every pass or
model alike. ``SpeedNormaliser`` times short bursts of fixed passes every ``interval_s`` (the
target's decode after ``REFERENCE_CONTEXT`` tokens and its prefill of ``PREFILL_TOKENS``, each
tracked drafter's own, and ``HostPass`` for the engine's own work between passes) and rescales
the CPU time measured since to the speed at which the references were taken. A pass's factor
moves from its model's decode probe (1 token) to its prefill probe (``PREFILL_TOKENS`` and
wider), geometric in log(tokens), because wide passes slow differently from decodes. Without
given references it calibrates to the machine's quiet speed (``calibrate``: the fastest of
``CALIBRATION_ROUNDS`` back-to-back bursts), so that the factors stay near 1 and only slow
phases are scaled. The measurements behind each choice: docs/notes/2026-11-29-reference-clock.md.
"""

from __future__ import annotations

import time

import numpy as np

from specsim.engine.speed_reference.probes import HostPass, ReferencePass

CALIBRATION_ROUNDS = 10  # bursts of each probe for its reference, in rounds over all probes
INTERVAL_S = 0.25  # the machine's speed moves on a scale of seconds


class ModelSpeed:
    """One model's two probes (decode and prefill), their times at the reference speed (None
    until ``SpeedNormaliser.calibrate``), every probe taken, and the factors from the latest."""

    def __init__(
        self,
        decode: ReferencePass,
        reference_s: float | None = None,
        prefill: ReferencePass | None = None,
        reference_prefill_s: float | None = None,
        name: str = "target",
    ):
        self.name = name
        self.decode = decode
        self.prefill = prefill or ReferencePass(decode.model, decode.now, "prefill")
        self.reference_s = reference_s
        self.reference_prefill_s = reference_prefill_s
        self.probes_s: list[float] = []
        self.prefill_probes_s: list[float] = []
        self._decode_factor = self._prefill_factor = 1.0

    def probe(self) -> None:
        decode, prefill = self.decode.median_s(), self.prefill.median_s()
        self.probes_s.append(decode)
        self.prefill_probes_s.append(prefill)
        self._decode_factor = self.reference_s / decode
        self._prefill_factor = self.reference_prefill_s / prefill

    def factor(self, tokens: float) -> float:
        weight = min(max(np.log(max(tokens, 1.0)) / np.log(self.prefill.tokens), 0.0), 1.0)
        return float(self._decode_factor ** (1.0 - weight) * self._prefill_factor**weight)

    def references(self) -> dict[str, float]:
        return {"decode_s": self.reference_s, "prefill_s": self.reference_prefill_s}

    def unreferenced(self) -> list[tuple[str, object]]:
        return [
            (name, probe)
            for name, probe in (("reference_s", self.decode), ("reference_prefill_s", self.prefill))
            if getattr(self, name) is None
        ]

    def drift(self) -> dict[str, float]:
        return {
            **slowdowns(self.probes_s, self.reference_s),
            **slowdowns(self.prefill_probes_s, self.reference_prefill_s, "prefill_"),
        }


class HostSpeed:
    """The engine's own work's probe (``HostPass``), its time at the reference speed (None until
    ``SpeedNormaliser.calibrate``), every probe taken, and the factor from the latest."""

    def __init__(self, probe: HostPass, reference_s: float | None = None):
        self.pass_ = probe
        self.reference_s = reference_s
        self.probes_s: list[float] = []
        self._factor = 1.0

    def probe(self) -> None:
        seconds = self.pass_.median_s()
        self.probes_s.append(seconds)
        self._factor = self.reference_s / seconds

    def factor(self, tokens: float) -> float:
        return self._factor

    def unreferenced(self) -> list[tuple[str, object]]:
        return [("reference_s", self.pass_)] if self.reference_s is None else []


def slowdowns(probes: list[float], reference: float, prefix: str = "") -> dict[str, float]:
    """Median, 10th and 90th percentile of the probes over their reference (1 = as fast)."""
    ratios = np.asarray(probes or [reference]) / reference
    return {
        f"{prefix}slowdown_median": float(np.median(ratios)),
        f"{prefix}slowdown_p10": float(np.percentile(ratios, 10)),
        f"{prefix}slowdown_p90": float(np.percentile(ratios, 90)),
    }


class SpeedNormaliser:
    """The factor that turns CPU seconds measured now into seconds at the reference speed.

    ``reference_s`` and ``reference_prefill_s`` are the target's decode and prefill passes'
    times at the reference speed (a profile's ``provenance``), ``reference_host_s`` the host
    pass's; without one, that pass's quiet speed (``calibrate``). ``track`` adds a drafter
    with probes of its own: other tenants do not slow a drafter small enough for the caches as
    they slow the target, so a drafter's passes take its own probes' factor; the engine's own
    work between passes takes the host pass's. ``factor(tokens, model)`` re-probes everything
    once ``interval_s`` of process time has passed since the last probe (``refresh``) and keeps
    every probe (the drift over the run, for reports); ``current(tokens, model)`` is the factor
    from the latest probes, without probing; ``model`` None is the engine's own work.
    """

    def __init__(
        self,
        reference: ReferencePass,
        reference_s: float | None = None,
        interval_s: float = INTERVAL_S,
        prefill: ReferencePass | None = None,
        reference_prefill_s: float | None = None,
        host: HostPass | None = None,
        reference_host_s: float | None = None,
    ):
        self.target = ModelSpeed(reference, reference_s, prefill, reference_prefill_s)
        self.host = HostSpeed(host or HostPass(reference.now), reference_host_s)
        self.interval_s = interval_s
        self.tracked: dict[int, ModelSpeed] = {}  # by id(model): models need not be hashable
        self._next = -float("inf")

    def track(
        self,
        model,
        name: str,
        reference_s: float | None = None,
        reference_prefill_s: float | None = None,
    ) -> ModelSpeed:
        """Probe ``model`` (called ``name`` in reports) too, at the references given (without
        them, its quiet speed, calibrated with the others')."""
        if model is self.target.decode.model:
            return self.target
        decode = ReferencePass(model, self.target.decode.now)
        speed = ModelSpeed(decode, reference_s, None, reference_prefill_s, name)
        self.tracked[id(model)] = speed
        return speed

    def speed_of(self, model=None) -> ModelSpeed | HostSpeed:
        if model is None:
            return self.host
        if model is self.target.decode.model:
            return self.target
        try:
            return self.tracked[id(model)]
        except KeyError:
            raise ValueError("the normaliser does not track this model: track() it") from None

    def calibrate(self) -> None:
        """Every missing reference: the fastest of ``CALIBRATION_ROUNDS`` bursts of its probe,
        in rounds over all such probes, back to back."""
        missing = [
            (speed, name, probe)
            for speed in (self.target, self.host, *self.tracked.values())
            for name, probe in speed.unreferenced()
        ]
        fastest = [float("inf")] * len(missing)
        for _ in range(CALIBRATION_ROUNDS if missing else 0):
            for i, (_, _, probe) in enumerate(missing):
                fastest[i] = min(fastest[i], probe.median_s())
        for (speed, name, _), seconds in zip(missing, fastest, strict=True):
            setattr(speed, name, seconds)

    def refresh(self) -> None:
        if time.process_time() < self._next:
            return
        self.calibrate()  # references first (a no-op once every probe has one)
        for speed in (self.target, self.host, *self.tracked.values()):
            speed.probe()
        self._next = time.process_time() + self.interval_s

    def current(self, tokens: float = 1.0, model=None) -> float:
        """The factor for a pass of ``model`` feeding ``tokens`` tokens, from the latest probes:
        the decode probe's for 1 token, the prefill probe's from its width up, and geometric
        in log(tokens) between; for the engine's own work (``model`` None), the host probe's."""
        return self.speed_of(model).factor(tokens)

    def factor(self, tokens: float = 1.0, model=None) -> float:
        self.refresh()
        return self.current(tokens, model)

    @property
    def reference_s(self) -> float:
        return self.target.reference_s

    @property
    def reference_prefill_s(self) -> float:
        return self.target.reference_prefill_s

    def drift(self) -> dict:
        """The machine's speed over the probes, relative to the reference (1 = as fast; 2 = a
        pass took twice as long): median, 10th and 90th percentile, of the target's decode probe
        and (``prefill_``) of its prefill probe, and (``host_``) of the host probe; under
        ``models``, each tracked model's by name, with its references."""
        out: dict = {
            "reference_pass_s": self.reference_s,
            "reference_prefill_s": self.reference_prefill_s,
            "reference_host_s": self.host.reference_s,
            "probes": len(self.target.probes_s),
            **self.target.drift(),
            **slowdowns(self.host.probes_s, self.host.reference_s, "host_"),
        }
        if self.tracked:
            out["models"] = {
                speed.name: {**speed.references(), **speed.drift()}
                for speed in self.tracked.values()
            }
        return out
