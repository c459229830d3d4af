"""Scenario files for the planner tests (a helper module: it holds no tests of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PROFILE = "profiles/llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


def write_scenario(
    folder: Path,
    repo: Path,
    *,
    rate: float = 4.0,
    requests: int = 600,
    kind: str = "poisson",
    slo: dict[str, float] | None = None,
    drafter: str | None = "llama3.2-1b",
    verifier: str = "rejection",
    profile: Path | None = None,
) -> Path:
    """A small chat scenario on the shipped H100 roofline profile.

    600 short requests by default: long enough for an overload to build up, short enough to
    simulate in well under a second.
    """
    workload: dict[str, Any] = {
        "kind": kind,
        "requests": requests,
        "prompt": {"dist": "lognormal", "median": 300, "sigma": 0.5, "high": 1500},
        "output": {"dist": "lognormal", "median": 80, "sigma": 0.4, "high": 300},
    }
    if kind == "closed_loop":
        workload["concurrency"] = 8
    else:
        workload["rate"] = rate
    data: dict[str, Any] = {
        "name": "plan-test",
        "seed": 11,
        "profile": str(profile or repo / PROFILE),
        "workload": workload,
        "engine": {"max_batch": 96},
        "speculation": {"drafter": drafter, "k": 3, "verifier": verifier},
    }
    if slo is not None:
        data["slo"] = slo
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
