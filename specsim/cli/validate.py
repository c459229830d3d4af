"""Run the real engine on a scenario and compare it with the simulator's prediction.

  specsim validate scenarios/validate-b1-small-k4.yaml --out runs/v1
  specsim validate SCENARIO --profile profiles/builtin-cpu.yaml --out DIR   # skip profiling

Without --profile the scenario's target and drafter are profiled on this machine first (the
timing grid, the engine's overhead waves and acceptance on 64 prompts: most of the run's time,
over ten minutes on a shared 2-core CPU; --profile-budget caps the timing grid). Each long phase
shows a progress bar on stderr when it is a terminal (none with --json). A latency fit whose
median held-out error exceeds 10 % is flagged: the latency thresholds cannot be judged against
it. On a shared machine, --clock cpu times both the profiling and the engine by this process's
CPU time (idle waits for arrivals are skipped, not slept), so other processes' load does not
enter either side. Other tenants still slow this process's own CPU time (caches, memory
bandwidth), so --clock reference also times a decode and a prefill pass of the target and of
the drafter every quarter second and rescales both sides, pass by pass, to the machine's speed
when profiling began (the profile's provenance.speed_reference; wide passes slow down
differently from decodes, and a drafter differently from the target):

  OMP_NUM_THREADS=1 specsim validate scenarios/validate-b1-small-k4.yaml --clock reference \\
      --out runs/v1

The engine serves the scenario's workload (same seed, so the same arrivals and lengths as the
simulation) on the built-in models, or on --target / --drafter NAME=MODEL. The engine prefills
whole prompts in their own iteration, so the scenario needs engine.chunked_prefill: false, one
replica, and a fixed or by_batch window, or a tree (speculation.tree, drafted by a draft
model; the profiling step measures its acceptance). It pads every batched pass to its longest
row, so the simulation runs with engine.padded_attention: true.

Writes DIR/engine/ and DIR/simulation/ (requests.csv, summary.json), DIR/comparison.json,
DIR/comparison.md, DIR/validation.png and its numbers DIR/validation.csv (and DIR/profile.yaml
when it profiled). With --clock cpu or reference, comparison.md also splits every iteration
group's time into the target pass, the drafter passes and the engine's own work, measured
against predicted. The simulator serves the
same requests --replications times with other acceptance and jitter draws (default 20; the
first is DIR/simulation/): the prediction is each metric's median over them, and beside it
stand their p10..p90 and, for a miss, how many of them lie below the measured value. The
engine's run is one draw as well: a miss inside the band is one this workload's own randomness
can produce (a p90 of ~100 requests can hinge on a few that finished in the same step). Exit 0
when every metric is within its threshold (mean E2E and throughput 5 %, p90 TTFT/TPOT/E2E 10 %, mean
acceptance length 3 %), 1 when one is not, 2 on bad input.

With --bench DIR the measured side is a serving engine's own load tests instead of the built-in
engine: the result files the bench.sh that plan writes leaves (DIR/engine/bench/, vLLM JSON or
SGLang JSONL), or every file under DIR (vLLM, SGLang or the normalised CSV, told apart by their
content). Each run's workload is rebuilt as profile from-bench rebuilds it (its own send times
and lengths when saved), served by the scenario's engine, speculation and fleet on --profile
(default: the scenario's profile) with the batch caps the scenario sets, else those
--server-args FILE states, else the runs' engine version's defaults for the profile's device
(the output names each cap's source), and every figure the file holds (TTFT, TPOT, ITL, E2E
percentiles, throughputs, the counted acceptance length) compared as the benchmark client
measured it, with the thresholds, bands and exit codes above (a latency without a p90 has the
p90 threshold on its next percentile up: p95 or p99, which published runs carry). Files under
DIR that are no results (a server.log, a README, a /metrics scrape) are skipped with a note:

  specsim validate scenarios/poisson.yaml --bench runs/window --out runs/check

It writes DIR/comparison.json, DIR/comparison.md, DIR/validation.png and .csv and
DIR/runs/NN-LABEL/ (the replayed trace, and the simulator's requests.csv and summary.json of
it). Runs of two models or engines, a speculative run without counters for a speculating
scenario (or one that drafted another k), and a folder without any result file are bad input.
"""

from __future__ import annotations

import argparse

from specsim.cli.common import POSITIVE_SECONDS, Number, add_json, add_out, add_set, emit
from specsim.errors import SpecsimError

MAX_REPLICATIONS = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specsim.profiling.measure_inputs import DTYPES

    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    parser.add_argument(
        "--bench",
        metavar="DIR",
        help="compare with the serving engine's own benchmark results in DIR (DIR/engine/bench/ "
        "as the bench.sh that plan writes leaves them, or any result files under DIR) instead "
        "of running the built-in engine",
    )
    parser.add_argument(
        "--metrics",
        metavar="RESULT=SCRAPE",
        action="append",
        default=[],
        help="with --bench: the acceptance of the runs in RESULT (a result file that counts "
        "none) from SCRAPE, its server's /metrics scrape; repeatable",
    )
    parser.add_argument(
        "--prefix-hit",
        metavar="RESULT=FRACTION",
        action="append",
        default=[],
        help="with --bench: the share of the prompt tokens of the runs in RESULT that the "
        "server's prefix cache held (vLLM's prefix_cache_hits / prefix_cache_queries; a "
        "--metrics scrape gives it too), replayed as workload.prefix source 'fraction'; runs "
        "without one keep the scenario's own workload.prefix; repeatable",
    )
    parser.add_argument(
        "--server-args",
        metavar="FILE",
        help="with --bench: the server's log or flags file (vllm serve's command line or "
        "startup log, SGLang's server_args, a TensorRT-LLM options YAML), for the batch caps "
        "it states and whether SGLang mixes prompt chunks into decode batches "
        "(--enable-mixed-chunk; SGLang's runs otherwise replay with prefill batches apart); "
        "otherwise the scenario's own engine.max_batch / max_batched_tokens where it sets "
        "them, else the runs' engine version's defaults for the profile's device (the output "
        "says which)",
    )
    parser.add_argument(
        "--profile",
        metavar="PROFILE",
        help="use this profile instead of measuring (with --bench: default the scenario's)",
    )
    add_out(parser)
    add_set(parser)
    parser.add_argument(
        "--target",
        default="specsim-target",
        metavar="MODEL",
        help="the target model the engine serves and the profiling measures: a built-in name "
        "or a model directory (default: the built-in specsim-target)",
    )
    parser.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help="the model behind a scenario drafter name (default: small, tiny, ngram built-ins)",
    )
    parser.add_argument("--prompts", metavar="FILE", help="prompt set (default: built-in)")
    parser.add_argument("--device", metavar="DEVICE", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="float32",
        help="the models' parameter type, in the profiling and in the engine (default float32; "
        "with --profile, give the type that profile was measured in)",
    )
    parser.add_argument(
        "--profile-budget",
        type=POSITIVE_SECONDS,
        metavar="SECONDS",
        help="cap the profiling grid's time",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu", "reference"],
        default="wall",
        help="time the engine (and the profiling) by wall-clock time (default), by this "
        "process's CPU time on a machine shared with other busy processes (one torch thread), "
        "or by CPU time rescaled to a reference pass's speed (reference: for machines whose "
        "speed drifts)",
    )
    parser.add_argument(
        "--replications",
        type=Number(int, 0, MAX_REPLICATIONS),
        default=20,
        metavar="N",
        help="simulate the same requests N times (other acceptance and jitter draws) for each "
        "metric's p10..p90 beside the prediction (default 20; 0 or 1: the seeded run alone, "
        "no band)",
    )
    add_json(parser)


def _drafters(texts: list[str]) -> dict[str, str] | None:
    if not texts:
        return None
    from specsim.engine.run import DEFAULT_DRAFTERS

    out = dict(DEFAULT_DRAFTERS)
    for text in texts:
        name, sep, spec = text.partition("=")
        if not sep or not name.strip() or not spec.strip():
            raise SpecsimError(
                f"expected NAME=MODEL, got {text!r}", file="--drafter", fix="e.g. small=DIR"
            )
        out[name.strip()] = spec.strip()
    return out


# The built-in engine's options and their defaults: refused with --bench, which runs no engine.
ENGINE_ONLY = {
    "--target": ("target", "specsim-target"),
    "--drafter": ("drafter", []),
    "--prompts": ("prompts", None),
    "--device": ("device", "cpu"),
    "--dtype": ("dtype", "float32"),
    "--profile-budget": ("profile_budget", None),
    "--clock": ("clock", "wall"),
}


def run_bench(args: argparse.Namespace, scenario) -> int:
    from specsim.validation.bench_report import write_bench_validation

    for option, (dest, default) in ENGINE_ONLY.items():
        if getattr(args, dest) != default:
            raise SpecsimError(
                "sets up the built-in engine, and --bench runs none",
                file="command line",
                key=option,
                fix=f"drop {option} (or --bench, to run the built-in engine)",
            )
    result = write_bench_validation(
        scenario,
        args.bench,
        args.profile,
        args.replications,
        args.out,
        tuple(args.metrics),
        args.server_args,
        tuple(args.prefix_hit),
    )
    summary = {"out": args.out, **result.payload}
    emit(args, summary, result.report)
    return 0 if result.passed else 1


def run(args: argparse.Namespace) -> int:
    from specsim.scenario import load_scenario
    from specsim.validation.validate import ValidateOptions, validate

    scenario = load_scenario(args.scenario, args.overrides)
    if args.bench is not None:
        return run_bench(args, scenario)
    if args.metrics:
        raise SpecsimError(
            "gives a benchmark result file its scrape, and no --bench is given",
            file="command line",
            key="--metrics",
            fix="add --bench DIR, or drop --metrics",
        )
    if args.prefix_hit:
        raise SpecsimError(
            "gives benchmark runs their prefix-cache hit share, and no --bench is given",
            file="command line",
            key="--prefix-hit",
            fix="add --bench DIR, or drop --prefix-hit",
        )
    if args.server_args is not None:
        raise SpecsimError(
            "gives benchmark runs their server's caps, and no --bench is given",
            file="command line",
            key="--server-args",
            fix="add --bench DIR, or drop --server-args",
        )
    if args.prompts is not None:  # a bad prompt file fails now, not after the profiling
        from specsim.workload.prompts import read_prompts

        read_prompts(args.prompts)
    options = ValidateOptions(
        profile=args.profile,
        target=args.target,
        drafters=_drafters(args.drafter),
        prompts=args.prompts,
        device=args.device,
        dtype=args.dtype,
        profile_budget_s=args.profile_budget,
        clock=args.clock,
        replications=args.replications,
        progress=not args.json,
    )
    result = validate(scenario, options, args.out)
    summary = {
        "scenario": scenario.name,
        "out": args.out,
        "profile": result.profile_path,
        **result.comparison.to_dict(),
        "profile_fit": result.profile_fit,
    }
    emit(args, summary, result.report)
    return 0 if result.comparison.passed else 1
