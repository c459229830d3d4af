"""Closed-form estimates of a scenario under load, for screening sweeps before simulating them.

``specsim.analytic`` gives speculation's speed-up at batch 1; this package extends it to load:
Little's law on the iteration-cost model (``load``), with the simulator's acceptance chains
(``acceptance``), the engine's step costs (``passes``), the scenario's own traffic
(``traffic``) and per-request latencies and SLO share (``latency``), assembled per scenario in
``point``. Nothing is simulated. Planning ranks configurations by it and simulates only those
that can win (``specsim.planning.sweep.screen``).
"""

from __future__ import annotations

import os

from specsim.estimate.point import PointEstimate, estimate

_PARSED: dict[tuple[str, int, int], dict] = {}
_PARSED_SIZE = 16


def load_point(scenario_path: str, overrides: list[str]):
    """``load_scenario`` with the file's YAML parsed once per sweep: a screen estimates
    thousands of points of one file, and parsing it costs more than estimating one."""
    from specsim.config import apply_overrides, validate_as
    from specsim.fileio import read_yaml
    from specsim.scenario import Scenario

    stat = os.stat(scenario_path)
    key = (str(scenario_path), stat.st_mtime_ns, stat.st_size)
    data = _PARSED.get(key)
    if data is None:
        if len(_PARSED) >= _PARSED_SIZE:
            _PARSED.pop(next(iter(_PARSED)))
        data = _PARSED[key] = read_yaml(scenario_path, "scenario")
    source = str(scenario_path) + (" (with --set overrides)" if overrides else "")
    scenario = validate_as(Scenario, apply_overrides(data, list(overrides)), source)
    return scenario.with_source(scenario_path)


def estimate_point(scenario_path: str, overrides: list[str]) -> PointEstimate:
    """The estimate of one sweep point (the scenario file with its overrides)."""
    from specsim.simulation.run import cached_profile, tensor_parallel_profile

    scenario = load_point(scenario_path, overrides)
    profile = cached_profile(scenario.resolve(scenario.profile))
    return estimate(scenario, tensor_parallel_profile(scenario, profile))


__all__ = ["PointEstimate", "estimate", "estimate_point"]
