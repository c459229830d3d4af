"""Calibrate a profile to the serving engine's own benchmark runs (vllm bench serve
--save-result JSON, SGLang bench_serving JSONL, or specsim's normalised CSV) and write it: the
prior's latency terms are scaled until simulating every run reproduces its TTFT, TPOT, ITL and
E2E figures and throughput. The report (per run and figure: measured, fitted, held out) goes
beside the profile as NEW.calibration.json, and the table is printed.

  specsim profile from-bench runs/*.json --into profiles/mine-roofline.yaml \\
      --drafter llama3.2-1b --out profiles/mine-calibrated.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specsim.bounds import MAX_BATCH, MAX_K, MAX_TOKENS
from specsim.calibration.gate import MAX_HELD_OUT_ERROR
from specsim.cli.common import Number, emit
from specsim.cli.profile_shared import add_fit_options, add_output, add_seed, out_path
from specsim.sampling.kinds import DEFAULT_VERIFIER


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        metavar="RESULT",
        nargs="+",
        help="benchmark result files of one deployment (vllm bench serve --save-result JSON, "
        "SGLang bench_serving JSONL, specsim's normalised CSV: docs/reference/bench-csv.md)",
    )
    add_fit_options(
        parser,
        "the prior (required): a roofline or measured profile of the same model and device, whose "
        "terms are fitted",
        required=False,
        defaults={
            "--drafter": " (default: the --into profile's only one)",
            "--verifier": f" (default {DEFAULT_VERIFIER})",
            "--temperature": " (default 1.0)",
        },
    )
    add_seed(parser, "the replayed schedules' seed, where a file saved none")
    add_output(parser)
    bench = parser.add_argument_group("what the files do not state")
    bench.add_argument(
        "--max-batch",
        metavar="N",
        type=Number(int, 1, MAX_BATCH),
        default=None,
        help="the engine's cap on running sequences (vLLM --max-num-seqs, SGLang "
        "--max-running-requests, TensorRT-LLM max_batch_size) for runs whose file does not "
        "state it (SGLang's server_info does); default: --server-args's, else the engine "
        "version's default for the --into profile's device (the output says which)",
    )
    bench.add_argument(
        "--max-batched-tokens",
        metavar="N",
        type=Number(int, 1, MAX_TOKENS),
        default=None,
        help="the engine's token budget per iteration (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size, TensorRT-LLM max_num_tokens); default as --max-batch's",
    )
    bench.add_argument(
        "--server-args",
        metavar="FILE",
        default=None,
        help="the server's log or flags file (vllm serve's command line or startup log, "
        "SGLang's server_args, a TensorRT-LLM options YAML): the batch caps it states, and "
        "whether SGLang mixes prompt chunks into decode batches (--enable-mixed-chunk; SGLang's "
        "runs otherwise replay with prefill batches apart)",
    )
    bench.add_argument(
        "--k",
        metavar="K",
        type=Number(int, 1, MAX_K),
        default=None,
        help="tokens drafted per step, for speculative runs whose file does not say (SGLang "
        "without server_info, vLLM counters without per-position rates)",
    )
    bench.add_argument(
        "--acceptance-length",
        metavar="NAME:K=L",
        action="append",
        default=[],
        help="a mean acceptance length (bonus token included; SGLang's accept_length, a "
        "dashboard's) for drafter NAME at window K, where no run counted it (repeatable); "
        "turned into per-position rates by one constant conditional rate a with a + ... + a^K "
        "= L - 1",
    )
    bench.add_argument(
        "--acceptance-rate",
        metavar="NAME:K=R",
        action="append",
        default=[],
        help="the same from a draft acceptance rate R = accepted / drafted, i.e. L = 1 + K R",
    )
    bench.add_argument(
        "--metrics",
        metavar="RESULT=SCRAPE",
        action="append",
        default=[],
        help="the acceptance of the runs in RESULT (a result file that counts none, e.g. an "
        "older vllm bench serve layout) from SCRAPE, its server's /metrics scrape (vLLM's "
        "spec_decode counters or SGLang's spec_accept gauges); repeatable",
    )
    bench.add_argument(
        "--prefix-hit",
        metavar="RESULT=FRACTION",
        action="append",
        default=[],
        help="the share of the prompt tokens of the runs in RESULT that the server's prefix "
        "cache held (vLLM's prefix_cache_hits / prefix_cache_queries; a --metrics scrape with "
        "those counters gives it too), replayed as workload.prefix source 'fraction'; "
        "repeatable",
    )
    bench.add_argument(
        "--check-runs",
        metavar="RESULT",
        action="append",
        default=[],
        help="benchmark files of the same deployment that the fit does not see: predicted on "
        "the fitted profile, their error per figure goes into the report and the profile's "
        "provenance (calibration.checked); repeatable",
    )
    bench.add_argument(
        "--runs-source",
        metavar="TEXT",
        default=None,
        help="where the runs come from (publication, address, engine version, date of the "
        "runs), written into the profile's provenance (calibration.runs_source)",
    )
    bench.add_argument(
        "--no-held-out",
        action="store_true",
        help="skip the leave-one-run-out fits (one fit per run: the slow part); the quality "
        "gate then judges the fit's own error",
    )
    bench.add_argument(
        "--max-held-out-error",
        metavar="FRACTION",
        type=Number(float, 0, 100),
        default=MAX_HELD_OUT_ERROR,
        help="the quality gate: a fit whose held-out median |predicted / measured - 1| is "
        "above F, or that predicts those runs worse than its prior does, is not written (a "
        "warning, exit 1) unless --accept-poor-fit is given "
        f"(default {MAX_HELD_OUT_ERROR:g}: ten per cent)",
    )
    bench.add_argument(
        "--accept-poor-fit",
        action="store_true",
        help="write a fit the quality gate refuses anyway, with its error and this flag in "
        "its provenance notes and in the report's gate",
    )


def run(args: argparse.Namespace) -> int:
    from specsim.calibration.from_bench import BenchOptions, calibrate_from_bench
    from specsim.calibration.gate import warning_line
    from specsim.fileio import dump_json
    from specsim.profiling.writer import command_line, write_profile

    out, name = out_path(args.out, args.name)
    opts = BenchOptions(
        files=tuple(args.results),
        into=args.into,
        out=out,
        name=name,
        drafter=args.drafter,
        verifier=args.verifier or DEFAULT_VERIFIER,
        temperature=1.0 if args.temperature is None else args.temperature,
        k=args.k,
        caps=given_caps(args),
        server_args=args.server_args,
        prefix_hits=tuple(args.prefix_hit),
        acceptance_lengths=tuple(args.acceptance_length),
        acceptance_rates=tuple(args.acceptance_rate),
        metrics=tuple(args.metrics),
        seed=args.seed,
        held_out=not args.no_held_out,
        command=command_line(),
        max_held_out_error=args.max_held_out_error,
        accept_poor_fit=args.accept_poor_fit,
        check_files=tuple(args.check_runs),
        runs_source=args.runs_source,
    )
    result = calibrate_from_bench(opts)
    report_path = out.parent / result.report_name
    if not result.writable:
        sys.stderr.write(warning_line(result.report["gate"], str(out)) + "\n")
        summary = {"out": None, "report": None, **result.report}
        emit(args, summary, "\n".join(summary_lines(result.report, None, report_path)))
        return 1
    write_profile(result.profile, out, {result.report_name: dump_json(result.report)})
    summary = {"out": str(out), "report": str(report_path), **result.report}
    emit(args, summary, "\n".join(summary_lines(result.report, out, report_path)))
    return 0


def given_caps(args: argparse.Namespace) -> dict[str, tuple[int, str]]:
    """The caps given on the command line, and where."""
    given = {"max_batch": args.max_batch, "max_batched_tokens": args.max_batched_tokens}
    return {
        cap: (value, f"the command line (--{cap.replace('_', '-')})")
        for cap, value in given.items()
        if value is not None
    }


def _percent(value: float) -> str:
    return f"{value:+.1%}"


def summary_lines(report: dict[str, Any], out: Path | None, report_path: Path) -> list[str]:
    """``out`` None: the fit was refused by the quality gate and nothing written."""
    runs = report["runs"]
    files = len({run["file"] for run in runs})
    done = (
        "not written (poor fit)"
        if out is None
        else f"wrote {out} (calibrated) and {report_path.name}"
    )
    lines = [
        f"{done}: {len(runs)} run(s) in {files} "
        f"file(s), on the prior {report['prior']['path']} ({report['prior']['source']})"
    ]
    for term in report["terms"]:
        value = term["value"]
        shown = f"x {value:.4g}" if term["kind"] == "factor" else f"{value * 1e3:.4g} ms"
        verdict = (
            "fitted" if term["determined"] else "kept at the prior: the runs do not determine it"
        )
        lines.append(
            f"  {term['name']}: {shown} ({verdict}; spread {term['spread_ratio']:.2f} of the "
            "prior's)"
        )
    fit, held = report["fit"], report["held_out"]
    line = (
        f"  fit over {fit['figures']} figures: |error| median {fit['median_abs_error']:.1%}, "
        f"max {fit['max_abs_error']:.1%}"
    )
    if held is not None:
        line += (
            f"; held out (each run predicted from a fit without it): median "
            f"{held['median_abs_error']:.1%}, max {held['max_abs_error']:.1%}"
        )
    else:
        line += "; held out: not computed (a single run, or --no-held-out)"
    lines.append(line)
    checked = report.get("checked")
    if checked is not None:
        lines.append(
            f"  runs the fit never saw ({', '.join(checked['runs'])}): "
            + "; ".join(
                f"{name} median {f['median_abs_error']:.1%}, max {f['max_abs_error']:.1%}"
                for name, f in checked["figures"].items()
            )
        )
    lines.append(
        "  engine caps: "
        + "; ".join(
            f"{cap} {c['value']} from {c['source']}" for cap, c in report["engine_caps"].items()
        )
    )
    if report["undetermined"]:
        lines.append(
            "  not determined by these runs (kept at the prior's values): "
            + ", ".join(report["undetermined"])
        )
    gate = report["gate"]
    if not gate["passed"]:
        from specsim.calibration.gate import verdict as gate_words

        lines.append(
            f"  quality gate: {gate_words(gate)}"
            + ("" if gate["accepted_with"] is None else f", written with {gate['accepted_with']}")
        )
    for entry in report["acceptance"]:
        lengths = ", ".join(f"k={k}: {v:.3f}" for k, v in entry["mean_acceptance_length"].items())
        lines.append(
            f"  acceptance {entry['drafter']}/{entry['verifier']}@T={entry['temperature']:g}: "
            f"mean acceptance length {lengths}"
        )
        if entry["from_scalar"]:
            ks = ", ".join(map(str, entry["from_scalar"]))
            lines.append(f"    k = {ks} from a scalar: {entry['rule']}")
    lines += [f"  note: {note}" for note in report["notes"]]
    header = f"  {'run':<28} {'figure':<24} {'measured':>10} {'fitted':>10} {'error':>7}"
    lines.append(header + ("" if held is None else f" {'held out':>10} {'error':>7}"))
    for run in runs:
        label = f"{Path(run['file']).name}#{run['run']}"
        for key, row in run["metrics"].items():
            if "fitted" not in row:
                continue
            line = (
                f"  {label[:28]:<28} {key:<24} {row['measured']:>10.4g} {row['fitted']:>10.4g} "
                f"{_percent(row['error']):>7}"
            )
            if "held_out" in row:
                line += f" {row['held_out']:>10.4g} {_percent(row['held_out_error']):>7}"
            lines.append(line)
    return lines
