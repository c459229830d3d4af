"""Benchmark runs of a known deployment, for the calibration tests: the prior profile with
its terms scaled (the "truth"), simulated by specsim and written as vllm bench serve would."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specsim.calibration.terms import apply, terms_for
from specsim.profile import load_profile
from specsim.profiling.writer import write_profile
from specsim.scenario import Scenario
from specsim.serving.runs import Traffic
from specsim.serving.vllm import bench_result
from specsim.simulation import run_simulation
from specsim.simulation.records import read_records

PRIOR = Path(__file__).parent / "data" / "bench" / "calibration_prior.yaml"
MODEL = "test/target-8b"
DRAFTER = "small"
# The deployment the runs come from: the prior off by these factors and seconds.
TRUTH = {
    "target.decode": 1.4,
    "target.prefill": 0.7,
    f"drafters.{DRAFTER}.latency": 1.6,
    f"drafters.{DRAFTER}.per_speculative_step_s": 0.0015,
    # An API server's delay (the prior states 20 ms). Not 0: a closed loop's next request would
    # then reach the engine exactly at an iteration's end, and any delay at all moves it into
    # the next iteration, a jump the fit cannot follow down to a true 0.
    "overhead.per_request_s": 0.03,
}


@dataclass(frozen=True)
class Case:
    name: str
    rate: float  # math.inf: all at once
    cap: int | None = None  # --max-concurrency
    k: int = 0  # 0: speculation off
    detailed: bool = True  # --save-detailed: send times and lengths saved
    prompt: tuple[int, int] = (64, 320)  # uniform prompt tokens
    output: tuple[int, int] = (16, 48)


def truth_profile(folder: Path, truth: dict[str, float] = TRUTH, prior: Path = PRIOR) -> Path:
    """``prior`` with the terms named in ``truth`` set to its values, the others as they are."""
    loaded = load_profile(prior)
    terms = terms_for(loaded.profile, DRAFTER)
    theta = [
        t.theta0
        if t.name not in truth
        else math.log(truth[t.name])
        if t.kind == "factor"
        else truth[t.name] / t.unit
        for t in terms
    ]
    path = folder / "truth.yaml"
    write_profile(apply(loaded.profile, terms, theta).model_copy(update={"name": "truth"}), path)
    return path


def schedule(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Send times as vllm bench serve 0.33 draws them: Poisson gaps, rescaled to span n / rate
    (all at 0 for an infinite rate)."""
    if math.isinf(rate):
        return np.zeros(n)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return times * (n / rate) / times[-1]


def write_runs(
    folder: Path,
    cases: list[Case],
    requests: int,
    seed: int,
    prior: Path = PRIOR,
    truth: dict[str, float] = TRUTH,
) -> list[str]:
    """One vllm bench serve result file per case, simulated on ``truth`` applied to
    ``prior``."""
    folder.mkdir(parents=True, exist_ok=True)
    profile = truth_profile(folder, truth, prior)
    files = []
    for number, case in enumerate(cases):
        rng = np.random.default_rng([seed, number])
        times = schedule(case.rate, requests, rng)
        prompts = rng.integers(case.prompt[0], case.prompt[1], size=requests, endpoint=True)
        outputs = rng.integers(case.output[0], case.output[1], size=requests, endpoint=True)
        trace = folder / f"{case.name}.trace.csv"
        rows = "".join(
            f"{t!r},{p},{o}\n" for t, p, o in zip(times.tolist(), prompts, outputs, strict=True)
        )
        trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows, "utf-8")
        workload = {"kind": "trace", "trace": str(trace)}
        if case.cap is not None:
            workload["max_concurrency"] = case.cap
        scenario = Scenario.model_validate(
            {
                "seed": seed + number,
                "profile": str(profile),
                "workload": workload,
                "speculation": {"drafter": DRAFTER, "k": case.k} if case.k else {},
            }
        )
        records_path = folder / f"{case.name}.csv"
        result = run_simulation(scenario, records_path=records_path)
        data = bench_result(
            read_records(records_path),
            result.summary,
            Traffic(case.rate, 1.0, case.cap, requests),
            MODEL,
            label=case.name,
            percentiles=(50, 90, 99),
            save_detailed=case.detailed,
        )
        path = folder / f"{case.name}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        files.append(str(path))
    return files


LOADS = (Case("off-r2", 2.0), Case("off-r20", 20.0), Case("off-c16", math.inf, 16))


def calibrate_on(
    folder: Path, data: dict, truth: dict[str, float] = TRUTH, cases=LOADS, requests: int = 80
):
    """The calibration of speculation-off runs (by default 2 and 20 requests/s and a closed
    loop of 16; 80 requests each) simulated on the profile ``data`` with ``truth`` applied,
    fitted back onto ``data`` itself."""
    from specsim.calibration.from_bench import BenchOptions, calibrate_from_bench
    from specsim.profile import Profile

    prior = folder / "prior.yaml"
    write_profile(Profile.model_validate(data), prior)
    files = write_runs(folder / "runs", list(cases), requests, seed=0, prior=prior, truth=truth)
    out = folder / "fit.yaml"
    return calibrate_from_bench(BenchOptions(tuple(files), str(prior), out, "fit", held_out=False))


def recovered(report: dict) -> dict[str, float]:
    return {term["name"]: term["value"] for term in report["terms"]}


def log_errors(report: dict, truth: dict[str, float] = TRUTH) -> dict[str, float]:
    """Each factor's log(recovered / true); each added cost's error in seconds (a term
    ``truth`` does not name is true at the prior's value)."""
    out = {}
    for term in report["terms"]:
        true = truth.get(term["name"], term["prior"])
        if term["kind"] == "factor":
            out[term["name"]] = float(np.log(term["value"] / true))
        else:
            out[term["name"]] = term["value"] - true
    return out


def seed_study(seeds: range, requests: int = 80) -> None:
    """The recovered terms' spread over ``seeds``: where test_from_bench's tolerances come
    from (``python tests/bench_runs.py``; a few seconds a seed)."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from test_from_bench import RECOVERY

    from specsim.calibration.from_bench import BenchOptions, calibrate_from_bench

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            files = write_runs(Path(tmp) / str(seed), RECOVERY, requests, 1000 * (seed + 1))
            out = Path(tmp) / f"{seed}.yaml"
            options = BenchOptions(tuple(files), str(PRIOR), out, "study", DRAFTER, held_out=False)
            errors = log_errors(calibrate_from_bench(options).report)
            rows.append(list(errors.values()))
            print(seed, {name: round(value, 5) for name, value in errors.items()}, flush=True)
    table = np.array(rows)
    for i, name in enumerate(errors):
        column = table[:, i]
        print(
            f"{name}: mean {column.mean():+.4g}, sd {column.std(ddof=1):.4g}, "
            f"largest |error| {np.abs(column).max():.4g}"
        )


if __name__ == "__main__":
    seed_study(range(9))


def vllm_scrape(data: dict) -> str:
    """The /metrics scrape of the server that ran ``data``'s benchmark: its counters as vLLM's
    Prometheus totals (one engine)."""
    labels = 'engine="0",model_name="m"'
    drafts = data["spec_decode_num_drafts"]
    lines = [
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {data['spec_decode_draft_tokens']}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} "
        f"{data['spec_decode_accepted_tokens']}",
    ]
    for i, rate in enumerate(data["spec_decode_per_position_acceptance_rates"]):
        accepted = round(rate * drafts)
        lines.append(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} '
            f"{accepted}"
        )
    return "\n".join(lines) + "\n"
