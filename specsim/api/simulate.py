"""``simulate``: one scenario through the simulator, as ``specsim simulate`` runs it.

``specsim simulate`` and ``specsim.simulate`` share ``prepare`` (the scenario with its
overrides, and the speculation-off baseline) and ``simulate_into`` (the run, the baseline's
comparison and the two files), so a Result holds what the command writes.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsim.api.overrides import override_texts
from specsim.api.results import REQUESTS, SUMMARY, Result
from specsim.comparison import compare, regressions_json
from specsim.config import apply_overrides, validate_as
from specsim.fileio import atomic_output_dir, check_output_folder, dump_json, write_text_atomic
from specsim.metrics import round_floats
from specsim.planning.common import answerable_k, switch_overrides
from specsim.profile import load_profile
from specsim.scenario import Scenario, load_scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import read_requests

SPEEDUP_KEYS = ("ttft_s", "tpot_s", "e2e_s")
BASELINE_OVERRIDES = ("speculation.tree=null", "speculation.k=0", "speculation.policy=fixed")


def simulate(
    scenario: str | os.PathLike | Scenario,
    *,
    out: str | os.PathLike | None = None,
    compare_baseline: bool = False,
    **overrides: Any,
) -> Result:
    """Simulate a scenario (a file's path, or a ``Scenario`` from ``load_scenario``).

    Overrides are keyword arguments, a double underscore for each dot of ``--set``:
    ``simulate("scenarios/poisson.yaml", speculation__k=3, workload__rate=8)`` is
    ``specsim simulate scenarios/poisson.yaml --set speculation.k=3 --set workload.rate=8``,
    type-checked by the same schema with the same one-line ``SpecsimError``. A dotted key works
    too: ``**{"speculation.k": 3}``. ``compare_baseline`` adds the speculation-off run's keys,
    as ``--compare-baseline`` does. With ``out`` the two files are written there as well.
    """
    texts = override_texts(overrides)
    main, baseline = prepare(scenario, texts, compare_baseline)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="specsim-") as folder:
            return _result(Path(folder), main, baseline)
    check_output_folder(out, "out")
    with atomic_output_dir(out) as staging:
        return _result(staging, main, baseline)


def _result(folder: Path, scenario: Scenario, baseline: Scenario | None) -> Result:
    summary = simulate_into(folder, scenario, baseline)
    return Result(summary, read_requests(folder / REQUESTS))


def load(scenario: str | os.PathLike | Scenario, overrides: Sequence[str]) -> Scenario:
    """The scenario with ``--set``-style overrides applied and validated by its schema."""
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario.model_copy(deep=True).with_source(scenario.source)
        data = apply_overrides(scenario.model_dump(), list(overrides))
        source = f"{scenario.source or 'scenario'} (with --set overrides)"
        return validate_as(Scenario, data, source).with_source(scenario.source)
    if isinstance(scenario, (str, os.PathLike)):
        return load_scenario(scenario, list(overrides))
    raise TypeError(f"expected a scenario file's path or a Scenario, not {type(scenario).__name__}")


def prepare(
    scenario: str | os.PathLike | Scenario, overrides: Sequence[str], compare_baseline: bool
) -> tuple[Scenario, Scenario | None]:
    """The scenario to run and, with ``compare_baseline``, the same with speculation off in
    every pool."""
    main = load(scenario, overrides)
    warn_beyond_measured_k(main)
    if not compare_baseline:
        return main, None
    # The scenario's engine switches that policy fixed refuses go with its speculation.
    switches = switch_overrides(main.speculation, "fixed")
    baseline = load(scenario, [*overrides, *BASELINE_OVERRIDES, *switches])
    for pool in baseline.fleet.pools:
        pool.speculation.tree = None
        pool.speculation.k = 0
        pool.speculation.policy = "fixed"
    return main, baseline


def simulate_into(folder: Path, scenario: Scenario, baseline: Scenario | None) -> dict[str, Any]:
    """Run the scenario (and the baseline) and write requests.csv and summary.json into
    ``folder``; return the summary."""
    result = run_simulation(scenario, records_path=folder / REQUESTS)
    summary = dict(result.summary)
    if baseline is not None:
        base = run_simulation(baseline).summary
        summary["baseline"] = {k: v for k, v in base.items() if k != "pools"}
        summary["speedup_vs_baseline"] = {
            k: round(v, 4) for k, v in speedups(summary, base).items()
        }
        changes = compare(summary, base)
        summary["compared_vs_baseline"] = [c.metric for c in changes]
        summary["regressions_vs_baseline"] = round_floats(regressions_json(changes))
    write_text_atomic(folder / SUMMARY, dump_json(summary))
    return summary


def speedups(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Baseline over speculative latency (>1 = speculation faster); throughput the other way."""
    out: dict[str, float] = {}
    for key in SPEEDUP_KEYS:
        for stat in ("mean", "p50", "p99"):
            s, b = spec[key][stat], base[key][stat]
            out[f"{key[:-2]}_{stat}"] = b / s if s > 0 else 0.0
    s, b = spec["throughput_tokens_per_s"], base["throughput_tokens_per_s"]
    out["throughput"] = s / b if b > 0 else 0.0
    s, b = spec["cost_usd_per_million_tokens"], base["cost_usd_per_million_tokens"]
    out["cost"] = b / s if s > 0 else 0.0
    return out


def warn_beyond_measured_k(scenario: Scenario) -> None:
    """Warn where a pool's k reaches past the positions the profile measured acceptance for.

    The simulator then repeats the last measured rate (a guess); the planner refuses such k.
    """
    profile = load_profile(scenario.resolve(scenario.profile))
    for pool in scenario.fleet.pools or [None]:
        spec = scenario.pool_speculation(pool)
        if not spec.enabled or spec.tree is not None:  # a tree's lengths come from its table
            continue
        limit = answerable_k(profile, spec)
        if spec.max_k > limit:
            where = f"pool {pool.name}: " if pool is not None else ""
            warnings.warn(
                f"{where}k = {spec.max_k} is beyond the {limit} positions the profile measured "
                f"acceptance for (drafter {spec.drafter!r}); the positions past {limit} repeat "
                "its last rate, a guess: profile more positions, or use acceptance: iid or "
                "sequences",
                stacklevel=4,  # the caller of specsim.simulate
            )
