"""Acceptance calibrated from production: vLLM's speculative-decoding Prometheus counters.

The scrape is read by ``specsim.serving.prometheus`` (the counters, their sums over label sets
and the rates derived from them); this module turns the sums into a profile's acceptance entry.
"""

from __future__ import annotations

from pathlib import Path

from specsim.errors import SpecsimError
from specsim.serving.prometheus import (
    PREFIX,
    Sample,
    SpecDecodeCounters,
    parse_prometheus,
    read_counters,
)

__all__ = [
    "PREFIX",
    "Sample",
    "SpecDecodeCounters",
    "calibrate_profile",
    "calibrated_entry",
    "parse_prometheus",
    "read_counters",
]


def calibrated_entry(
    counters: SpecDecodeCounters, drafter: str, verifier: str, temperature: float
) -> dict:
    """A profile acceptance entry (``source: calibrated``) from summed counters."""
    rates = counters.conditional_rates()
    if not rates:
        raise SpecsimError(
            "no position was ever accepted",
            key="per_position",
            fix="scrape the server after it served speculative requests",
        )
    return {
        "drafter": drafter,
        "verifier": verifier,
        "temperature": temperature,
        "per_position": rates,
        "mean_acceptance_length": {counters.k: counters.mean_acceptance_length},
        "source": "calibrated",
        "tokens_scored": int(counters.draft_tokens),
    }


def calibrate_profile(
    profile_path: str | Path,
    metrics_path: str | Path,
    drafter: str,
    verifier: str,
    temperature: float,
    out_path: str | Path,
    label_filter: dict[str, str] | None = None,
):
    """The profile at ``profile_path`` with the (drafter, verifier, temperature) acceptance
    entry replaced by one calibrated from ``metrics_path``. Returns (Profile, counters)."""
    import os

    from specsim.profile import load_profile
    from specsim.profiling.writer import build_profile

    loaded = load_profile(profile_path)
    loaded.drafter(drafter)  # a clear error when the profile lacks it
    counters = read_counters(metrics_path, label_filter)
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
    entry = calibrated_entry(counters, drafter, verifier, temperature)
    kept = [
        a
        for a in data["acceptance"]
        if not (
            a["drafter"] == drafter
            and a["verifier"] == verifier
            and abs(a["temperature"] - temperature) <= 0.05
        )
    ]
    # Sequence files stay where they are; re-point them if the profile moves.
    old_dir, new_dir = Path(profile_path).resolve().parent, Path(out_path).resolve().parent
    for a in kept:
        if "sequences" in a and old_dir != new_dir:
            a["sequences"]["path"] = os.path.relpath(old_dir / a["sequences"]["path"], new_dir)
    data["acceptance"] = [*kept, entry]
    note = (
        f" Acceptance of {drafter}/{verifier} at T={temperature:g} calibrated from "
        f"{Path(metrics_path).name}: {counters.drafts:.0f} speculative steps over "
        f"{counters.series} label set(s), k={counters.k}, draft acceptance rate "
        f"{counters.draft_acceptance_rate:.3f}."
    )
    data["provenance"]["notes"] = (data["provenance"].get("notes", "") + note).strip()
    return build_profile(data, str(out_path)), counters
