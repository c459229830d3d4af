"""``specsim validate --bench DIR``: the simulator's prediction against a serving engine's own
benchmark runs.

1. The result files: ``DIR/engine/bench/`` (what ``bash DIR/engine/bench.sh vllm`` or
   ``sglang`` writes, ``plan ... --emit`` having written the script) when it exists, otherwise
   every file under ``DIR``; each is read by its content (``read_bench_files``: vLLM, SGLang or
   the normalised CSV, one deployment).
2. Each run's workload is rebuilt as ``profile from-bench`` rebuilds it
   (``calibration.workload.replay``: its own send times and lengths when saved) and simulated
   with the scenario's engine, speculation and fleet on the profile (default: the scenario's),
   the seeded run and ``replications - 1`` more with other acceptance and jitter draws.
3. Each figure the file holds is compared as the benchmark client measured it
   (``calibration.simulate.run_metrics``), and the mean acceptance length with the run's
   counters, under the built-in engine's validation thresholds, bands and verdict
   (``compare``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.calibration.caps import resolve_caps
from specsim.calibration.simulate import metric_parts, run_metrics, unfitted_reason
from specsim.calibration.workload import EngineDefaults, replay
from specsim.errors import SpecsimError
from specsim.fileio import dump_json
from specsim.profile import LoadedProfile, load_profile
from specsim.scenario import Scenario
from specsim.serving.bench_commands import FOLDER, SCRIPT, label
from specsim.serving.detect import not_results, read_bench_files
from specsim.serving.prefix_share import parse_share, state_shares
from specsim.serving.runs import METRIC_NAMES, THROUGHPUT_KEYS, BenchRun
from specsim.serving.scrapes import attach_scrapes, parse_pair
from specsim.validation.compare import Comparison, compare_figures, tail_thresholds

ACCEPTANCE = "mean_acceptance_length"
BENCH_FOLDER = Path("engine") / FOLDER
STATISTICS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class RunValidation:
    run: BenchRun
    name: str  # its folder under runs/: NN-LABEL
    workload: dict[str, Any]  # how it was replayed (calibration.workload.Replay.describe)
    comparison: Comparison
    not_compared: dict[str, str]  # figure -> why it is not compared
    records: dict[str, np.ndarray]  # the simulator's seeded run


def result_files(folder: str | Path) -> list[Path]:
    """The result files of ``--bench DIR`` (module docstring), in name order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecsimError(
            "not a folder",
            file=str(folder),
            key="--bench",
            fix="give the --out folder of plan ... --emit (after running its engine/bench.sh), "
            "or a folder of benchmark result files",
        )
    root = folder / BENCH_FOLDER
    if not root.is_dir():
        if (folder / "engine" / SCRIPT).is_file():
            raise SpecsimError(
                f"no results: {BENCH_FOLDER} is missing",
                file=str(folder),
                key="--bench",
                fix=f"run bash {folder / 'engine' / SCRIPT} vllm (or sglang) against the server",
            )
        root = folder
    files = sorted(
        path
        for path in root.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    )
    if not files:
        raise SpecsimError(
            "holds no benchmark result files",
            file=str(root),
            key="--bench",
            fix="run the benchmark (bench.sh), or give the folder its results are in",
        )
    return files


def split_results(files: list[Path]) -> tuple[list[Path], dict[str, str]]:
    """The result files among ``files`` and, by path, why each other one is skipped (a
    ``server.log`` or a README beside the results); none left is bad input."""
    kept, skipped = [], {}
    for path in files:
        reason = not_results(path)
        if reason is None:
            kept.append(path)
        else:
            skipped[str(path)] = reason
    if not kept:
        named = "; ".join(f"{path}: {why}" for path, why in skipped.items())
        raise SpecsimError(
            f"holds no benchmark result files (skipped {named})",
            file=str(files[0].parent),
            key="--bench",
            fix="run the benchmark (bench.sh), or give the folder its results are in",
        )
    return kept, skipped


def check_prefix(runs: list[BenchRun], scenario: Scenario) -> None:
    """A scenario prefix read from trace columns cannot describe runs whose replayed traces
    have none; a run without its own hit share would take it."""
    prefix = scenario.workload.prefix
    if prefix is None or prefix.source not in ("column", "session"):
        return
    for run in runs:
        if run.prefix_hit_share is None:
            raise SpecsimError(
                f"the scenario's prefix source {prefix.source!r} reads trace columns, and the "
                "replayed benchmark runs carry none",
                file=str(scenario.source or "scenario"),
                key="workload.prefix.source",
                fix="state the runs' hit share (--prefix-hit RESULT=FRACTION, or a /metrics "
                "scrape with --metrics), or use source 'fraction' or 'system_prompt'",
            )


def check_speculation(run: BenchRun, scenario: Scenario) -> None:
    """The run must have speculated as the scenario does, with counters to compare."""
    spec = scenario.speculation
    where = str(scenario.source) if scenario.source else "scenario"
    counters = run.speculation
    if spec.enabled and (counters is None or measured_acceptance(run) is None):
        raise SpecsimError(
            "a run without speculative decoding counters, and the scenario speculates",
            file=run.where,
            key="spec_decode_acceptance_length",
            fix="benchmark the speculative server (vllm bench serve 0.33 writes spec_decode_*, "
            "SGLang accept_length), or validate against a scenario without speculation",
        )
    if not spec.enabled and counters is not None:
        raise SpecsimError(
            "a speculative run, and the scenario does not speculate",
            file=run.where,
            key="speculation",
            fix=f"give {where} the deployed drafter and k (--set speculation.drafter=NAME "
            "--set speculation.k=K)",
        )
    if spec.enabled and spec.policy == "fixed" and counters.k is not None and counters.k != spec.k:
        raise SpecsimError(
            f"the run drafted {counters.k} tokens per step; the scenario's k is {spec.k}",
            file=run.where,
            key="speculation.k",
            fix=f"--set speculation.k={counters.k}, or give the results of the planned k",
        )


def measured_acceptance(run: BenchRun) -> float | None:
    """The mean acceptance length the run counted (1 + accepted / drafts), if it says."""
    counters = run.speculation
    if counters is None:
        return None
    if counters.acceptance_length is not None:
        return counters.acceptance_length
    if counters.acceptance_rate is not None and counters.k is not None:
        return 1 + counters.k * counters.acceptance_rate
    return None


def _order(key: str) -> tuple[int, int, str]:
    name, statistic = metric_parts(key)
    names = (*METRIC_NAMES, *THROUGHPUT_KEYS, ACCEPTANCE)
    rank = STATISTICS.index(statistic) if statistic in STATISTICS else len(STATISTICS)
    return names.index(name) if name in names else len(names), rank, statistic


def figures(run: BenchRun, spread_known: bool) -> tuple[list[str], dict[str, str]]:
    """The run's figures the simulation gives, in report order, and why the others are not."""
    compared, skipped = [], {}
    for key, value in run.metrics.items():
        reason = unfitted_reason(key, value, spread_known)
        if reason is None:
            compared.append(key)
        else:
            skipped[key] = reason
    return sorted(compared, key=_order), skipped


def run_scenario(scenario: Scenario, workload, seed: int, engine: dict, profile: str) -> Scenario:
    """The scenario's setting serving the replayed workload: with the run's prefix-cache hit
    share where it has one, otherwise with the scenario's own ``workload.prefix``."""
    own = scenario.workload.prefix
    if workload.prefix is None and own is not None:
        workload = workload.model_copy(update={"prefix": own})
    return scenario.model_copy(
        update={
            "workload": workload,
            "seed": seed,
            "engine": scenario.engine.model_copy(update=engine),
            "profile": profile,
        }
    )


def validate_run(
    run: BenchRun,
    scenario: Scenario,
    loaded: LoadedProfile,
    replications: int,
    folder: Path,
    caps: EngineDefaults,
) -> tuple[dict[str, Any], Comparison, dict[str, str], dict[str, np.ndarray]]:
    """One run against the simulator: how it was replayed, the comparison, the figures left
    out (and why) and the seeded simulation's records. Writes the replayed trace
    (``workload.csv``) and the seeded run (``requests.csv``, ``summary.json``) into ``folder``."""
    from specsim.simulation import run_simulation
    from specsim.simulation.records import read_records

    folder.mkdir(parents=True)
    replayed = replay(run, folder / "workload.csv", None, caps)
    profile_path = str(Path(loaded.path).resolve())
    simulated = run_scenario(
        scenario,
        replayed.scenario(profile_path).workload,
        replayed.seed,
        replayed.engine,
        profile_path,
    )
    keys, skipped = figures(run, replayed.spread_known)
    measured = {key: run.metrics[key] for key in keys}
    acceptance = measured_acceptance(run)
    if acceptance is not None:
        keys.append(ACCEPTANCE)
        measured[ACCEPTANCE] = acceptance
    draws, records = [], None
    with tempfile.TemporaryDirectory(prefix="specsim-bench-") as tmp:
        for replication in range(max(replications, 1)):
            path = folder / "requests.csv" if replication == 0 else Path(tmp) / "requests.csv"
            result = run_simulation(
                simulated, records_path=path, replication=replication, profile=loaded
            )
            these = read_records(path)
            duration = replayed.duration(result.summary["duration_s"])
            draw = run_metrics(these, duration, keys, run.itl_per_token)
            if acceptance is not None:
                draw[ACCEPTANCE] = float(result.summary[ACCEPTANCE])
            draws.append(draw)
            if replication == 0:
                records = these
                (folder / "summary.json").write_text(dump_json(result.summary), "utf-8")
    comparison = compare_figures(keys, draws, measured, tail_thresholds(keys))
    described = replayed.describe()
    prefix = simulated.workload.prefix
    described["prefix"] = None if prefix is None else prefix.model_dump(exclude_none=True)
    return described, comparison, skipped, records


def scenario_caps(scenario: Scenario) -> dict[str, tuple[int, str]]:
    """The caps the scenario sets itself (its file or --set): those replace the engine's."""
    where = str(scenario.source) if scenario.source else "the scenario"
    given = scenario.engine.model_fields_set & {"max_batch", "max_batched_tokens"}
    return {cap: (getattr(scenario.engine, cap), f"{where} (engine.{cap})") for cap in given}


def run_names(runs: list[BenchRun]) -> list[str]:
    """Each run's folder under runs/: its number and its label (or its file's stem)."""
    return [f"{i + 1:02d}-{label(r.label or Path(r.source).stem)}" for i, r in enumerate(runs)]


def validate_bench(
    scenario: Scenario,
    bench: str | Path,
    profile: str | None,
    replications: int,
    staging: Path | None = None,
    metrics: tuple[str, ...] = (),
    server_args: str | None = None,
    prefix_hits: tuple[str, ...] = (),
) -> tuple[str, list[RunValidation], dict[str, str], EngineDefaults]:
    """The profile used, every run under ``bench`` against the simulator, and the files
    skipped as no results (``split_results``) and the engine caps the runs were replayed with
    (``scenario_caps``). Bad input is
    refused before anything is simulated; the runs' files go into ``staging/runs/NAME/``
    (a temporary folder when None). ``metrics`` (RESULT=SCRAPE) gives a scrape's acceptance to
    a result file that counts none (``specsim.serving.scrapes``)."""
    pairs = [parse_pair(text) for text in metrics]
    shares = [parse_share(text) for text in prefix_hits]
    files, skipped = split_results(result_files(bench))
    runs = state_shares(attach_scrapes(read_bench_files(files), pairs), shares)
    for run in runs:
        check_speculation(run, scenario)
    check_prefix(runs, scenario)
    path = str(scenario.resolve(scenario.profile)) if profile is None else profile
    loaded = load_profile(path)
    caps = resolve_caps(runs, scenario_caps(scenario), server_args, loaded.profile)
    with tempfile.TemporaryDirectory(prefix="specsim-validate-") as tmp:
        # Absolute: the replayed traces are read through a scenario whose relative paths
        # resolve against its own file's folder, not the working one.
        root = (Path(tmp) if staging is None else staging).resolve()
        validated = []
        for run, name in zip(runs, run_names(runs), strict=True):
            parts = validate_run(run, scenario, loaded, replications, root / "runs" / name, caps)
            validated.append(RunValidation(run, name, *parts))
    return path, validated, skipped, caps
