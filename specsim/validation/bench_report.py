"""``specsim validate --bench``'s outputs: the comparison of every run (``bench``), written as
the built-in engine's validation writes its one: ``comparison.json``, ``comparison.md``,
``validation.png`` and ``validation.csv``, plus ``runs/NN-LABEL/`` (the replayed trace and the
simulator's seeded run of it), all atomically."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.fileio import atomic_output_dir, dump_json
from specsim.scenario import Scenario
from specsim.validation.bench import RunValidation, validate_bench
from specsim.validation.compare import comparison_table, explain_failures


@dataclass
class BenchValidationResult:
    profile_path: str
    runs: list[RunValidation]
    payload: dict[str, Any]
    report: str

    @property
    def passed(self) -> bool:
        return all(r.comparison.passed for r in self.runs)


def traffic(run) -> dict[str, Any]:
    rate = run.traffic.request_rate
    return {
        "request_rate": rate if math.isfinite(rate) else "inf",
        "burstiness": run.traffic.burstiness if math.isfinite(run.traffic.burstiness) else "inf",
        "max_concurrency": run.traffic.max_concurrency,
        "completed": run.completed,
    }


def load_words(run) -> str:
    t = run.traffic
    if t.max_concurrency is not None and not math.isfinite(t.request_rate):
        return f"a closed loop of {t.max_concurrency} client{'s' if t.max_concurrency > 1 else ''}"
    rate = "all at once" if not math.isfinite(t.request_rate) else f"{t.request_rate:g} requests/s"
    return rate + ("" if t.max_concurrency is None else f", at most {t.max_concurrency} in flight")


def run_payload(result: RunValidation) -> dict[str, Any]:
    run = result.run
    counters = run.speculation
    return {
        "name": result.name,
        "file": run.source,
        "run": run.index + 1,
        "label": run.label,
        "format": run.format,
        "engine": run.engine,
        "engine_version": run.engine_version,
        "model": run.model,
        "traffic": traffic(run),
        "workload": result.workload,
        "speculation": None
        if counters is None
        else {"k": counters.k, "scalar_only": counters.scalar_only},
        **result.comparison.to_dict(),
        "not_compared": result.not_compared,
        "notes": list(run.notes),
    }


def run_text(result: RunValidation) -> str:
    run = result.run
    head = (
        f"{result.name} ({Path(run.source).name}, run {run.index + 1}, {run.engine}): "
        f"{load_words(run)}, {run.completed} requests"
    )
    comparison = result.comparison
    verdict = (
        "PASS"
        if comparison.passed
        else ("FAIL: " + ", ".join(r.metric for r in comparison.failures) + " beyond threshold")
    )
    skipped = [f"not compared: {key}: {why}" for key, why in result.not_compared.items()]
    lines = [head, comparison_table(comparison), verdict]
    return "\n".join([*lines, *explain_failures(comparison), *skipped])


def write_bench_validation(
    scenario: Scenario,
    bench: str | Path,
    profile: str | None,
    replications: int,
    out: str | Path,
    metrics: tuple[str, ...] = (),
    server_args: str | None = None,
    prefix_hits: tuple[str, ...] = (),
) -> BenchValidationResult:
    """Validate every run under ``bench`` (``validate_bench``) and write the outputs to ``out``."""
    from specsim.validation.plot import plot_bench_validation

    with atomic_output_dir(out) as staging:
        profile_path, runs, skipped, caps = validate_bench(
            scenario, bench, profile, replications, staging, metrics, server_args, prefix_hits
        )
        spec = scenario.speculation
        what = f"k={spec.k} drafter {spec.drafter}" if spec.enabled else "k=0 (no speculation)"
        passed = sum(r.comparison.passed for r in runs)
        head = (
            f"{scenario.name}: {len(runs)} benchmark run(s) from {bench} against the simulator "
            f"({what}, max_batch {caps.max_batch}; profile {profile_path}): "
            f"{passed} of {len(runs)} within every threshold"
        )
        head += (
            f"\nengine caps: max_batch {caps.max_batch} from {caps.sources[0]}; "
            f"max_batched_tokens {caps.max_batched_tokens} from {caps.sources[1]}"
        )
        head += "".join(f"\nskipped {path}: {why}" for path, why in skipped.items())
        report = "\n\n".join([head, *(run_text(r) for r in runs)])
        payload = {
            "scenario": scenario.name,
            "profile": profile_path,
            "bench": str(bench),
            "passed": passed == len(runs),
            "engine_caps": {
                cap: {"value": getattr(caps, cap), "source": source}
                for cap, source in zip(
                    ("max_batch", "max_batched_tokens"), caps.sources, strict=True
                )
            },
            "runs": [run_payload(r) for r in runs],
        }
        if skipped:  # absent when nothing was skipped, as before
            payload["skipped"] = skipped
        plot_bench_validation(
            [(r.name, r.comparison, r.records, r.run.metrics) for r in runs],
            f"{scenario.name}: simulator (profile {Path(profile_path).name}) vs benchmark runs",
            staging / "validation.png",
        )
        (staging / "comparison.json").write_text(dump_json(payload), encoding="utf-8")
        (staging / "comparison.md").write_text(
            f"# {scenario.name}\n\n```\n{report}\n```\n", encoding="utf-8"
        )
    return BenchValidationResult(profile_path, runs, payload, report)
