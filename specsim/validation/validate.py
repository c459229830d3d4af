"""``specsim validate``: the simulator's prediction against the real engine, on one scenario.

1. Profile: take ``--profile`` or measure the scenario's target and drafter on this machine
   (``specsim.profiling.measure``), written to ``OUT/profile.yaml``.
2. Run the real engine (``specsim.engine``) on the scenario's workload, in wall-clock time.
3. Simulate the same scenario (same seed, so the same arrivals and lengths) with that profile.
4. Compare the two summaries (``compare``), explain the gap per iteration (``residuals``) and
   check the machine's speed against the profile before and after the run (``drift``), plot,
   and write everything atomically:
   ``OUT/engine/`` and ``OUT/simulation/`` (requests.csv + summary.json each),
   ``OUT/comparison.json``, ``OUT/comparison.md``, ``OUT/validation.png`` and its numbers,
   ``OUT/validation.csv``.
"""

from __future__ import annotations

import io
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, dump_json
from specsim.scenario import Scenario
from specsim.validation.compare import (
    Comparison,
    compare_prediction,
    comparison_table,
    explain_failures,
)
from specsim.validation.fit_check import fit_check, fit_warnings

ACCEPTANCE_PROMPTS = 64


@dataclass
class ValidationResult:
    comparison: Comparison
    engine_summary: dict[str, Any]
    simulation_summary: dict[str, Any]
    profile_path: str
    report: str
    residuals: list[dict[str, Any]]
    speed: dict[str, Any]
    profile_fit: dict[str, Any]


@dataclass
class ValidateOptions:
    profile: str | None = None
    target: str = "specsim-target"
    drafters: dict[str, str] | None = None
    prompts: str | None = None
    device: str = "cpu"
    # One parameter type for the profiling and the engine: the profiler's default on a GPU
    # (bfloat16) would otherwise time other passes than the engine runs.
    dtype: str = "float32"
    profile_budget_s: float | None = None
    profile_repeats: int | None = None
    clock: str = "wall"
    replications: int = 20  # simulator runs of the same requests for each metric's band
    progress: bool = True  # progress bars on stderr (shown only when it is a terminal)


def _length_range(dist) -> tuple[int, int]:
    if dist is None:
        return 16, 256
    if dist.dist == "fixed":
        return dist.value, dist.value
    if dist.dist == "uniform":
        return dist.low, dist.high
    if dist.dist == "lognormal":
        return dist.low, dist.high or int(3 * dist.median)
    return 16, 256  # empirical lengths: the default span


def scenario_grid(scenario: Scenario, max_position: int) -> list[str]:
    """A timing grid over the region the scenario's engine runs in: batch sizes up to
    ``max_batch``, contexts from the shortest prompt to the longest prompt plus output, new
    tokens 1 .. k+1 (decode and verification; a tree verifies its nodes + 1), prefill at the
    prompt lengths."""
    spec = scenario.speculation
    shape = spec.tree_shape if spec.enabled else None
    k = spec.max_k if shape is None else shape.num_nodes
    max_batch = scenario.engine.max_batch
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b < max_batch} | {max_batch})
    p_lo, p_hi = _length_range(scenario.workload.prompt)
    _, o_hi = _length_range(scenario.workload.output)
    top = min(p_hi + o_hi, max_position - k - 1)
    contexts = sorted({min(p_lo, top), min((p_lo + top) // 2, top), top})
    news = sorted({1, 2, k // 2 + 1, k + 1})
    prefill = sorted({min(p_lo, max_position), min(p_hi, max_position)})
    return [
        "batch=" + ",".join(map(str, batches)),
        "context=" + ",".join(map(str, contexts)),
        "new=" + ",".join(map(str, news)),
        "prefill=" + ",".join(map(str, prefill)),
    ]


def progress_file(opts: ValidateOptions):
    """Where the progress bars go: stderr, or nowhere (tqdm draws only on a terminal)."""
    return sys.stderr if opts.progress else io.StringIO()


def progress_bar(opts: ValidateOptions, total: int | None, desc: str, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=progress_file(opts), disable=None)


def measure_for(scenario: Scenario, opts: ValidateOptions, drafter_spec: str | None, name: str):
    """Measure the scenario's target and drafter on this machine; returns the report."""
    from specsim.drafters import parse_ngram
    from specsim.models import load_config
    from specsim.profiling.measure import MeasureOptions, measure_profile
    from specsim.profiling.specs import DrafterArg

    spec = scenario.speculation
    max_position = load_config(opts.target).max_position
    drafters = []
    if spec.drafter is not None:
        drafters.append(DrafterArg(spec.drafter, drafter_spec, parse_ngram(drafter_spec)))
    options = MeasureOptions(
        target=opts.target,
        drafters=drafters,
        name=name,
        device=opts.device,
        dtype=opts.dtype,
        prompts=opts.prompts,
        temperatures=[spec.temperature] if spec.temperature > 0 else [1.0],
        grid=scenario_grid(scenario, max_position),
        time_budget=opts.profile_budget_s,
        # Acceptance measured on the whole prompt set over as many tokens as the scenario
        # generates: the default CPU sample (24 prompts x 48 tokens) moves the mean acceptance
        # length by several per cent from one seed to the next, more than the 3 % target.
        max_prompts=ACCEPTANCE_PROMPTS,
        max_new_tokens=min(_length_range(scenario.workload.output)[1], max_position // 2),
        repeats=opts.profile_repeats,
        clock=opts.clock,
        seed=scenario.seed,
        command="specsim validate (profiling step)",
        # A tree's accepted lengths measured for its shape and drafting (not derived).
        trees=[spec.tree_shape] if spec.enabled and spec.tree is not None else [],
        tree_drafts=[spec.tree_drafts] if spec.enabled and spec.tree is not None else [],
    )
    return measure_profile(options, progress_file(opts))


def validate(scenario: Scenario, opts: ValidateOptions, out: str | Path) -> ValidationResult:
    from specsim.engine.run import (
        DEFAULT_DRAFTERS,
        check_supported,
        drafters_for_profile,
        resolve_drafter,
        write_run,
    )
    from specsim.profile import load_profile
    from specsim.profiling.measure_inputs import check_device
    from specsim.simulation.records import read_records
    from specsim.validation.residuals import iteration_residuals, residual_table, split_table

    check_supported(scenario)
    check_device(opts.device)
    where = str(scenario.source) if scenario.source else None
    drafters = opts.drafters or DEFAULT_DRAFTERS
    given = None
    if opts.profile is not None:
        if not Path(opts.profile).is_file():
            raise SpecsimError("profile not found", file=str(opts.profile), fix="check the path")
        given = load_profile(opts.profile)
        # A profile's MTP drafter (method: mtp) is run as the target's own module.
        drafters = drafters_for_profile(opts.drafters, given.profile)
    drafter_spec = resolve_drafter(scenario.speculation.drafter, drafters, where)
    with atomic_output_dir(out) as staging:
        profile_path, final_profile = _profile_file(scenario, opts, drafter_spec, staging, out)
        profile = given or load_profile(profile_path)
        spec = scenario.speculation
        fit = fit_check(profile, spec.drafter if spec.enabled else None)
        for line in fit_warnings(fit):
            warnings.warn(line.removeprefix("warning: "), stacklevel=2)
        run, speed = _run_engine_timed(scenario, opts, drafters, profile)
        write_run(run, staging / "engine")
        sim_records = staging / "simulation" / "requests.csv"
        result, replicas = _simulate_the_engine(scenario, profile_path, sim_records, opts)
        comparison = compare_prediction(result.summary, run.summary, replicas)
        residuals = iteration_residuals(
            run.log,
            profile,
            scenario.speculation.drafter if scenario.speculation.enabled else None,
            jitter=scenario.engine.jitter,
            tree=scenario.speculation.tree_shape if scenario.speculation.enabled else None,
        )
        text = "\n\n".join(
            [
                "\n".join([_report(scenario, comparison, final_profile), *fit_warnings(fit)]),
                residual_table(residuals),
                *filter(None, [split_table(residuals)]),
                _speed(speed),
            ]
        )
        validation = ValidationResult(
            comparison, run.summary, result.summary, final_profile, text, residuals, speed, fit
        )
        _write_outputs(staging, scenario.name, validation, read_records(sim_records), run.records)
    return validation


def _write_outputs(staging: Path, name: str, validation: ValidationResult, simulated, measured):
    """The figure, ``comparison.json`` and ``comparison.md`` of a validation."""
    from specsim.validation.plot import plot_validation

    plot_validation(
        validation.comparison,
        simulated,
        measured,
        f"{name}: simulator (profile {Path(validation.profile_path).name}) vs real engine",
        staging / "validation.png",
    )
    payload = {
        "scenario": name,
        "profile": validation.profile_path,
        **validation.comparison.to_dict(),
        "profile_fit": validation.profile_fit,
        "iteration_residuals": validation.residuals,
        "machine_speed": validation.speed,
    }
    (staging / "comparison.json").write_text(dump_json(payload), encoding="utf-8")
    (staging / "comparison.md").write_text(
        f"# {name}\n\n```\n{validation.report}\n```\n", encoding="utf-8"
    )


def _profile_file(scenario: Scenario, opts, drafter_spec, staging: Path, out) -> tuple[Path, str]:
    """The profile to simulate with (where it is now, and where it will be): the one given, or
    one measured on this device into the output folder."""
    if opts.profile is not None:
        return Path(opts.profile), str(opts.profile)
    from specsim.profiling.writer import write_profile

    report = measure_for(scenario, opts, drafter_spec, f"{scenario.name}-measured")
    write_profile(report.profile, staging / "profile.yaml", report.side_files)
    return staging / "profile.yaml", str(Path(out) / "profile.yaml")


def _simulate_the_engine(scenario: Scenario, profile_path: Path, records: Path, opts):
    """The simulation of the engine run (its summary written beside ``records``) and the
    summaries of the further replications. The engine pads every batched pass to its longest
    row: the simulated engine does too."""
    from specsim.simulation import run_simulation

    padded = scenario.engine.model_copy(update={"padded_attention": True})
    simulated = scenario.model_copy(
        update={"profile": str(profile_path.resolve()), "engine": padded}
    )
    simulated.with_source(scenario.source)
    records.parent.mkdir()
    result = run_simulation(simulated, records_path=records)
    (records.parent / "summary.json").write_text(dump_json(result.summary), encoding="utf-8")
    replicas = []
    with progress_bar(opts, max(opts.replications - 1, 0), "simulations", "run") as bar:
        for i in range(1, opts.replications):
            replicas.append(run_simulation(simulated, replication=i).summary)
            bar.update(1)
    return result, replicas


def _run_engine_timed(scenario: Scenario, opts, drafters, profile):
    """The engine run, and the machine's speed on the profile's reference pass timed before
    and after it (``_machine_speed``)."""
    from specsim.engine.run import run_engine
    from specsim.engine.speed_reference import clock_setting
    from specsim.validation.drift import speed_check

    target_latency = profile.latency_model("target")
    before = speed_check(opts.target, target_latency, opts.device, opts.clock, opts.dtype)
    with progress_bar(opts, scenario.workload.requests, "engine run", "request") as engine_bar:
        run = run_engine(
            scenario,
            target=opts.target,
            drafters=drafters,
            prompts=opts.prompts,
            device=opts.device,
            clock=clock_setting(opts.clock, profile.profile.provenance.speed_reference),
            dtype=opts.dtype,
            progress=engine_bar,
        )
    after = speed_check(opts.target, target_latency, opts.device, opts.clock, opts.dtype)
    return run, _machine_speed(before, after, opts.clock, run.summary)


def _machine_speed(before, after, clock: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The reference pass timed before and after the engine run, against the profile."""
    from specsim.engine.speed_reference import steady
    from specsim.validation.drift import CONTEXT

    speed = {
        "reference_pass": f"target decode, batch 1, context {CONTEXT}",
        "clock": clock,
        "profile_predicts_s": before.predicted_s,
        "measured_before_s": before.measured_s,
        "measured_after_s": after.measured_s,
        "ratio_before": before.ratio,
        "ratio_after": after.ratio,
    }
    if "machine_speed" in summary:
        speed["reference_clock"] = summary["machine_speed"]
        speed["steady"] = steady(summary["machine_speed"])
    return speed


def _speed(speed: dict[str, Any]) -> str:
    text = (
        f"machine speed: {speed['reference_pass']} took {speed['measured_before_s'] * 1e3:.2f} ms "
        f"before and {speed['measured_after_s'] * 1e3:.2f} ms after the engine run; the profile "
        f"predicts {speed['profile_predicts_s'] * 1e3:.2f} ms (x{speed['ratio_before']:.2f}, "
        f"x{speed['ratio_after']:.2f}). Far from 1, the machine's speed drifted since profiling."
    )
    if speed.get("reference_clock"):
        from specsim.engine.speed_reference import describe

        text += describe(speed["reference_clock"], speed.get("steady", True))
    return text


def _report(scenario: Scenario, comparison: Comparison, profile: str) -> str:
    spec = scenario.speculation
    what = f"k={spec.k} drafter {spec.drafter}" if spec.enabled else "k=0 (no speculation)"
    if spec.enabled and spec.tree is not None:
        shape = spec.tree_shape
        what = (
            f"tree {spec.tree} ({shape.num_nodes} nodes, depth {shape.depth}, "
            f"{spec.tree_drafts} children) drafter {spec.drafter}"
        )
    head = (
        f"{scenario.name}: {what}, verifier {spec.verifier}, T={spec.temperature:g}, "
        f"max_batch {scenario.engine.max_batch}; profile {profile}"
    )
    verdict = (
        "PASS"
        if comparison.passed
        else ("FAIL: " + ", ".join(r.metric for r in comparison.failures) + " beyond threshold")
    )
    notes = explain_failures(comparison)
    return "\n".join([head, comparison_table(comparison), verdict, *notes])
