"""Acceptance calibrated from production: vLLM's speculative-decoding Prometheus counters, or
the engines' per-request responses (``specsim.calibration.requests``).

The scrape is read by ``specsim.serving.prometheus`` (the counters, their sums over label sets
and the rates derived from them); this module turns the sums into a profile's acceptance entry.
"""

from __future__ import annotations

from pathlib import Path

from specsim.calibration.requests import requests_counters, requests_entry
from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.serving.prometheus import (
    PREFIX,
    Sample,
    SpecDecodeCounters,
    parse_prometheus,
    read_counters,
)
from specsim.serving.request_metrics import looks_like_json, read_request_acceptance

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
    if looks_like_json(read_text(metrics_path, "metrics dump")):
        if label_filter:
            raise SpecsimError(
                "--label picks Prometheus label sets; per-request responses have none",
                file=str(metrics_path),
                key="--label",
                fix="drop --label, or give a /metrics scrape",
            )
        requests = read_request_acceptance(metrics_path)
        counters = requests_counters(requests)
        entry = requests_entry(requests, drafter, verifier, temperature)
    else:
        counters = read_counters(metrics_path, label_filter)
        entry = calibrated_entry(counters, drafter, verifier, temperature)
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
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
        f"{counters.series} {counters.series_of}, k={counters.k}, draft acceptance rate "
        f"{counters.draft_acceptance_rate:.3f}."
    )
    data["provenance"]["notes"] = (data["provenance"].get("notes", "") + note).strip()
    return build_profile(data, str(out_path)), counters
