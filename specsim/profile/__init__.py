"""Profiles: the versioned YAML files that describe models, hardware, latency and acceptance."""

from __future__ import annotations

from pathlib import Path

from specsim.config import load_yaml_as
from specsim.errors import SpecsimError
from specsim.profile.acceptance import Acceptance, AcceptanceSequences
from specsim.profile.latency import (
    Latency,
    LatencyFit,
    LatencyModel,
    LatencySample,
    OutOfRangeWarning,
    ValidRange,
)
from specsim.profile.provenance import Provenance
from specsim.profile.schema import Hardware, ModelSpec, Overhead, Profile
from specsim.sampling.kinds import VERIFIER_KINDS

__all__ = [
    "Acceptance",
    "AcceptanceSequences",
    "Hardware",
    "Latency",
    "LatencyFit",
    "LatencyModel",
    "LatencySample",
    "LoadedProfile",
    "ModelSpec",
    "OutOfRangeWarning",
    "Overhead",
    "Profile",
    "Provenance",
    "ValidRange",
    "load_profile",
]


class LoadedProfile:
    """A validated profile plus where it came from, with lookups that fail with clear errors."""

    def __init__(self, profile: Profile, path: str | Path):
        self.profile = profile
        self.path = Path(path)
        self._latency: dict[str, LatencyModel] = {}

    @property
    def name(self) -> str:
        return self.profile.name

    def drafter(self, name: str) -> ModelSpec:
        try:
            return self.profile.drafters[name]
        except KeyError:
            known = ", ".join(sorted(self.profile.drafters)) or "none"
            raise SpecsimError(
                f"profile has no drafter {name!r} (it has: {known})",
                file=str(self.path),
                key="drafters",
                fix="choose one of its drafters or profile this one",
            ) from None

    def latency_model(self, model: str) -> LatencyModel:
        """``model`` is ``"target"`` or a drafter name."""
        if model not in self._latency:
            spec = self.profile.target if model == "target" else self.drafter(model)
            if spec.latency is None:
                raise SpecsimError(
                    f"{model!r} has no latency section",
                    file=str(self.path),
                    key=f"drafters.{model}.latency",
                    fix="add a latency fit or use draft_step_s",
                )
            key = "target" if model == "target" else f"drafters.{model}"
            self._latency[model] = LatencyModel(spec.latency, key, str(self.path))
        return self._latency[model]

    def acceptance(self, drafter: str, verifier: str, temperature: float) -> Acceptance:
        """The acceptance entry for drafter x verifier at the closest profiled temperature.

        A greedy-reference verifier (greedy verification) does not depend on temperature; other
        verifiers need an entry within 0.05 of the requested temperature.
        """
        self.drafter(drafter)
        entries = [
            a for a in self.profile.acceptance if a.drafter == drafter and a.verifier == verifier
        ]
        if not entries:
            have = sorted({a.verifier for a in self.profile.acceptance if a.drafter == drafter})
            raise SpecsimError(
                f"profile has no {verifier!r} acceptance for drafter {drafter!r} "
                f"(it has: {', '.join(have) or 'none'})",
                file=str(self.path),
                key="acceptance",
                fix="choose a profiled verifier or profile this pair with it",
            )
        best = min(entries, key=lambda a: abs(a.temperature - temperature))
        temperature_free = VERIFIER_KINDS[verifier].greedy_reference
        if not temperature_free and abs(best.temperature - temperature) > 0.05:
            temps = ", ".join(f"{a.temperature:g}" for a in entries)
            raise SpecsimError(
                f"no {verifier!r} acceptance for drafter {drafter!r} at temperature "
                f"{temperature:g} (profiled: {temps})",
                file=str(self.path),
                key="acceptance",
                fix="use a profiled temperature or profile this one",
            )
        return best

    def sequences_path(self, entry: Acceptance) -> Path:
        if entry.sequences is None:
            raise SpecsimError(
                f"acceptance for drafter {entry.drafter!r} has no per-request sequences",
                file=str(self.path),
                key="acceptance.sequences",
                fix="profile with sequences or use a rate-based acceptance model",
            )
        return (self.path.parent / entry.sequences.path).resolve()


def load_profile(path: str | Path, overrides: list[str] | None = None) -> LoadedProfile:
    """Load and validate a profile file (one-line ``SpecsimError`` on any problem)."""
    return LoadedProfile(load_yaml_as(Profile, path, overrides, what="profile"), path)
