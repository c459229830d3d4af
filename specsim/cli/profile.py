"""Measure drafter/target pairs (or estimate them) and write a profile YAML.

Measure real models on this machine (latency grid, acceptance on a prompt set):
  specsim profile --target specsim-target --drafter small=specsim-draft-small \\
      --drafter ngram --device cpu --out profiles/mine.yaml

Estimate hardware you do not have from datasheet numbers (a roofline model):
  specsim profile --roofline --hardware profiles/hardware/h100-sxm.yaml \\
      --target profiles/models/llama3.1-8b.json \\
      --drafter llama3.2-1b=profiles/models/llama3.2-1b.json --drafter ngram \\
      --acceptance-from profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml \\
      --out profiles/llama3.1-8b_llama3.2-1b_h100-roofline.yaml
A replica over 4 devices, or in FP8 (weights and KV cache), is --tp 4 / --weights-dtype fp8
--kv-dtype fp8 (and --draft-tp 1 for a draft model on one device).

Calibrate acceptance from a production vLLM's Prometheus counters, or from saved responses
that carry per-request acceptance (vLLM --per-request-spec-decode-metrics, SGLang meta_info;
their histograms keep the spread across requests):
  specsim profile --calibrate metrics.txt --into profiles/mine.yaml --drafter small \\
      --verifier rejection --temperature 1.0 --out profiles/mine-calibrated.yaml

Calibrate a profile to the serving engine's own benchmark runs (vllm bench serve
--save-result JSON, SGLang bench_serving JSONL, or specsim's normalised CSV): the prior's
latency terms are scaled until simulating every run reproduces its TTFT, TPOT, ITL and E2E
figures and throughput; the report (per run and figure: measured, fitted, held out) goes
beside the profile as NEW.calibration.json:
  specsim profile --from-bench runs/*.json --into profiles/mine-roofline.yaml \\
      --drafter llama3.2-1b --out profiles/mine-calibrated.yaml

MODEL is a local Hugging Face folder, a config.json alone (random weights), or a built-in name;
a drafter may also be ngram or ngram:N (prompt lookup with n-gram size N), or mtp: the
target's multi-token-prediction module (DeepSeek-V3's), measured or costed as a draft model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specsim.bounds import MAX_TEMPERATURE, MAX_TENSOR_PARALLEL, MAX_TOKENS
from specsim.cli.common import POSITIVE_SECONDS, SECONDS, SEED, Number, add_json, emit
from specsim.cli.profile_bench import add_bench_arguments
from specsim.errors import SpecsimError
from specsim.sampling.kinds import DEFAULT_VERIFIER, LOSSY_VERIFIERS, VERIFIER_KINDS

MAX_REPEATS = 10_000
TENSOR_PARALLEL = Number(int, 1, MAX_TENSOR_PARALLEL)
# The command line's short names for the profile's formats.
WEIGHT_FORMATS = {"bf16": "bfloat16", "fp8": "fp8", "int4": "int4"}
KV_FORMATS = {"bf16": "bfloat16", "fp8": "fp8"}
MAX_PROMPTS = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_argument_group("mode (default: measure)")
    mode.add_argument("--roofline", action="store_true", help="estimate from datasheet numbers")
    mode.add_argument(
        "--calibrate",
        metavar="METRICS",
        help="Prometheus text dump of vLLM, or per-request responses as JSON or JSON Lines "
        "(vLLM metrics.speculative_decoding, SGLang meta_info)",
    )
    mode.add_argument(
        "--from-bench",
        metavar="FILE",
        nargs="+",
        help="benchmark result files of one deployment (vllm bench serve --save-result JSON, "
        "SGLang bench_serving JSONL, specsim's normalised CSV: docs/reference/bench-csv.md) "
        "to calibrate the --into profile to",
    )
    parser.add_argument("--target", metavar="MODEL", help="target model (config.json for roofline)")
    parser.add_argument(
        "--drafter",
        metavar="NAME=MODEL",
        action="append",
        default=[],
        help="a drafter: NAME=MODEL, NAME=ngram, NAME=ngram:N, or NAME=mtp "
        "(the target's own MTP module, DeepSeek-V3's) (repeatable)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE|DIR",
        required=True,
        help="profile YAML to write (a path ending in .yaml), or a folder to write NAME.yaml in",
    )
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.set_defaults(_check_out=_check_out_path)
    add_json(parser)

    measure = parser.add_argument_group("measuring")
    measure.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    measure.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    measure.add_argument(
        "--grid",
        metavar="AXIS=V1,V2,...",
        action="append",
        default=[],
        help="grid axis values: batch=, context=, new= (tokens per sequence: 1 decode, k+1 "
        "verify) or prefill= (prompt lengths); repeatable; default on CPU batch=1,2,4,8 "
        "context=16,128,384 new=1,3,5,9 prefill=32,128",
    )
    measure.add_argument(
        "--prompts",
        metavar="FILE",
        help='prompt set: .jsonl lines {"prompt": ...}, or text with one prompt per '
        "paragraph or line (default: the built-in set)",
    )
    measure.add_argument(
        "--temperature",
        metavar="T",
        type=Number(float, 0, MAX_TEMPERATURE),
        action="append",
        default=None,
        help="temperature for exact and typical acceptance (repeatable; default 1.0; greedy "
        "verification is always measured at 0)",
    )
    measure.add_argument(
        "--time-budget",
        type=POSITIVE_SECONDS,
        metavar="S",
        help="stop the timing grid after S seconds (largest points go last) and fit on what "
        "was measured",
    )
    measure.add_argument(
        "--repeats",
        metavar="N",
        type=Number(int, 1, MAX_REPEATS),
        default=None,
        help="timed repeats per point (default 7 on CPU, 20 on CUDA)",
    )
    measure.add_argument(
        "--clock",
        choices=["wall", "cpu", "reference"],
        default="wall",
        help="CPU passes: wall-clock time (default), the process's CPU time, which leaves out "
        "time taken by other processes on a shared machine (needs OMP_NUM_THREADS=1), or "
        "reference: CPU time rescaled to the machine's quiet speed, re-measured every 0.25 s "
        "with a decode and a prefill reference pass of each model (records "
        "provenance.speed_reference)",
    )
    measure.add_argument(
        "--seed",
        type=SEED,
        default=0,
        help="weights of config-only models, grid tokens, sampled text and the estimated tree "
        "scores (default 0)",
    )
    measure.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=Number(int, 1, MAX_TOKENS),
        default=None,
        help="tokens generated per prompt (default 48 on CPU, 128 on CUDA)",
    )
    measure.add_argument(
        "--max-prompts",
        metavar="N",
        type=Number(int, 1, MAX_PROMPTS),
        default=None,
        help="prompts scored (default 24 on CPU, 64 on CUDA)",
    )
    measure.add_argument(
        "--tree",
        metavar="SHAPE",
        action="append",
        default=None,
        help="also measure tree acceptance for this shape (widths per depth, 2,2,1, or a list "
        "of paths, [[0],[1],[0,0]]; repeatable): each draft model's accepted-length "
        "distribution per step under greedy and exact verification, into tree_acceptance",
    )
    measure.add_argument(
        "--tree-drafts",
        metavar="KIND",
        action="append",
        default=None,
        help="with --tree: keep only the entries whose children were drafted so (repeatable; "
        "default all): top-k (the drafter's ranking, EAGLE-2), iid (independent draws from "
        "q, SpecInfer; at T > 0 only) or without-replacement (draws from q without "
        "replacement, Sequoia; at T > 0 only; nodes past three children are estimated, "
        "seeded by --seed, with the standard error in the entry)",
    )
    measure.add_argument("--no-acceptance", action="store_true", help="latency only")
    measure.add_argument(
        "--sequences",
        action="store_true",
        help="also write per-request acceptance sequences beside the profile (for "
        "trace-driven simulation)",
    )

    roof = parser.add_argument_group("roofline")
    roof.add_argument("--hardware", metavar="HW.yaml", help="hardware spec (profiles/hardware)")
    roof.add_argument(
        "--acceptance-from",
        metavar="FILE",
        help="copy acceptance entries from an acceptance file or another profile",
    )
    roof.add_argument(
        "--tp",
        metavar="N",
        type=TENSOR_PARALLEL,
        default=1,
        help="devices one replica spans (tensor parallelism; default 1)",
    )
    roof.add_argument(
        "--draft-tp",
        metavar="N",
        type=TENSOR_PARALLEL,
        help="devices a draft model spans: 1 or --tp (default --tp, as vLLM's "
        "draft_tensor_parallel_size)",
    )
    roof.add_argument(
        "--enable-expert-parallel",
        "--ep",
        dest="expert_parallel",
        action="store_true",
        help="deal a mixture of experts' experts out whole over the --tp devices (vLLM's "
        "flag: EP = TP) instead of sharding each",
    )
    roof.add_argument(
        "--weights-dtype",
        choices=sorted(WEIGHT_FORMATS),
        help="weight format of the decoder layers (default: the hardware file's dtype)",
    )
    roof.add_argument(
        "--kv-dtype",
        choices=sorted(KV_FORMATS),
        help="KV-cache format (default: the hardware file's dtype)",
    )
    roof.add_argument(
        "--ngram-step-s",
        metavar="S",
        type=SECONDS,
        default=1.0e-4,
        help="stated prompt-lookup cost per step (default 1e-4)",
    )
    roof.add_argument(
        "--overhead-step-s",
        metavar="S",
        type=SECONDS,
        default=5.0e-4,
        help="stated engine overhead per step (default 5e-4)",
    )
    roof.add_argument(
        "--overhead-sequence-s",
        metavar="S",
        type=SECONDS,
        default=1.0e-5,
        help="stated engine overhead per sequence per step (default 1e-5)",
    )

    cal = parser.add_argument_group("calibration")
    cal.add_argument(
        "--into",
        metavar="PROFILE",
        help="--calibrate: the profile to add the acceptance to; --from-bench: the prior (a "
        "roofline or measured profile of the same model and device) whose terms are fitted",
    )
    cal.add_argument(
        "--verifier",
        choices=tuple(VERIFIER_KINDS),
        help="the verifier the server ran (the acceptance entry's verifier; --from-bench "
        f"default {DEFAULT_VERIFIER})",
    )
    cal.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only count series with this label (repeatable)",
    )
    add_bench_arguments(parser)


def _out_path(out: str, name: str | None) -> tuple[Path, str]:
    """``--out x.yaml`` is the file; any other ``--out`` is a folder for ``NAME.yaml``."""
    path = Path(out)
    option = "--name" if name else "--out"
    if path.suffix in (".yaml", ".yml"):
        return path, _profile_name(name or path.stem, option)
    name = _profile_name(name or "profile", option)
    return path / f"{name}.yaml", name


def _profile_name(name: str, option: str) -> str:
    """The profile's name goes into its file name and its reports: a plain, printable one."""
    from specsim.config import check_name

    try:
        check_name(name)
    except ValueError as exc:
        message, _, fix = str(exc).partition("; fix: ")
        raise SpecsimError(message, file="command line", key=option, fix=fix) from None
    if "/" in name or "\\" in name:
        raise SpecsimError(
            f"name {name!r} holds a path separator",
            file="command line",
            key=option,
            fix="give the folder in --out and a plain name in --name",
        )
    return name


def _check_out_path(args: argparse.Namespace) -> None:
    from specsim.fileio import check_output_file

    check_output_file(_out_path(args.out, args.name)[0])


def _need(args: argparse.Namespace, *names: str, mode: str) -> None:
    for name in names:
        if getattr(args, name.replace("-", "_")) in (None, [], ""):
            raise SpecsimError(
                f"{mode} needs --{name}",
                file="command line",
                key=f"--{name}",
                fix=f"add --{name} (see specsim profile --help)",
            )


def run(args: argparse.Namespace) -> int:
    from specsim.profiling.specs import parse_drafters

    modes = [m for m in ("roofline", "calibrate", "from_bench") if getattr(args, m)]
    if len(modes) > 1:
        chosen = " and ".join("--" + m.replace("_", "-") for m in modes)
        raise SpecsimError(
            f"choose one mode, not {chosen}", file="command line", fix=f"keep one of {chosen}"
        )
    if modes and (args.tree or args.tree_drafts):
        raise SpecsimError(
            "--tree measures trees on real models; --" + modes[0].replace("_", "-") + " does not",
            file="--tree",
            fix="drop --tree, or measure (no mode option)",
        )
    out, name = _out_path(args.out, args.name)
    deployment = [
        flag
        for flag, given in (
            ("--tp", args.tp != 1),
            ("--draft-tp", args.draft_tp is not None),
            ("--weights-dtype", args.weights_dtype is not None),
            ("--kv-dtype", args.kv_dtype is not None),
            ("--enable-expert-parallel", args.expert_parallel),
        )
        if given
    ]
    if deployment and not args.roofline:
        raise SpecsimError(
            f"{', '.join(deployment)} describe a roofline's deployment; a measured or "
            "calibrated profile describes the one it ran on (one device, its dtype)",
            file="command line",
            key=deployment[0],
            fix="add --roofline, or drop " + ", ".join(deployment),
        )
    if args.roofline:
        return _run_roofline(args, out, name, parse_drafters(args.drafter))
    if args.calibrate:
        return _run_calibrate(args, out)
    if args.from_bench:
        from specsim.cli.profile_bench import run_from_bench

        return run_from_bench(args, out, name)
    return _run_measure(args, out, name, parse_drafters(args.drafter))


def _run_roofline(args, out: Path, name: str, drafters) -> int:
    from specsim.profiling.roofline import roofline_profile
    from specsim.profiling.writer import command_line, write_profile

    _need(args, "hardware", "target", mode="--roofline")
    profile = roofline_profile(
        hardware_path=args.hardware,
        target_path=args.target,
        drafters=drafters,
        name=name,
        acceptance_path=args.acceptance_from,
        ngram_step_s=args.ngram_step_s,
        overhead_step_s=args.overhead_step_s,
        overhead_sequence_s=args.overhead_sequence_s,
        command=command_line(),
        tp=args.tp,
        draft_tp=args.draft_tp,
        weights_dtype=WEIGHT_FORMATS.get(args.weights_dtype),
        kv_dtype=KV_FORMATS.get(args.kv_dtype),
        expert_parallel=args.expert_parallel,
    )
    write_profile(profile, out)
    _summarise(args, profile, out)
    return 0


def _run_calibrate(args, out: Path) -> int:
    from specsim.calibration.prometheus import calibrate_profile
    from specsim.profiling.writer import write_profile

    _need(args, "into", "drafter", "verifier", "temperature", mode="--calibrate")
    if len(args.drafter) != 1 or "=" in args.drafter[0]:
        raise SpecsimError(
            "--calibrate takes one --drafter NAME (a drafter of the --into profile)",
            file="command line",
            key="--drafter",
            fix="give exactly one --drafter NAME",
        )
    if len(args.temperature) != 1:
        raise SpecsimError(
            "--calibrate takes one --temperature",
            file="--temperature",
            fix="give the one temperature the server sampled at",
        )
    labels = {}
    for text in args.label:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise SpecsimError(
                f"label {text!r} is not KEY=VALUE",
                file="--label",
                fix="write --label NAME=VALUE, e.g. --label model_name=my-model",
            )
        labels[key] = value
    profile, counters = calibrate_profile(
        args.into,
        args.calibrate,
        args.drafter[0],
        args.verifier,
        args.temperature[0],
        out,
        labels,
    )
    write_profile(profile, out)
    entry = profile.acceptance[-1]
    summary = {
        "out": str(out),
        "drafter": entry.drafter,
        "verifier": entry.verifier,
        "temperature": entry.temperature,
        "k": counters.k,
        "speculative_steps": counters.drafts,
        counters.series_of.replace(" ", "_"): counters.series,
        "mean_acceptance_length": counters.mean_acceptance_length,
        "draft_acceptance_rate": counters.draft_acceptance_rate,
        "per_position_unconditional": counters.unconditional_rates(),
        "per_position_conditional": entry.per_position,
    }
    rates = ", ".join(f"{r:.3f}" for r in entry.per_position)
    human = (
        f"wrote {out}: {entry.drafter}/{entry.verifier} at T={entry.temperature:g} calibrated "
        f"from {counters.drafts:.0f} steps ({counters.series} {counters.series_of}), "
        f"k={counters.k}\n"
        f"  mean acceptance length {counters.mean_acceptance_length:.3f}, draft acceptance rate "
        f"{counters.draft_acceptance_rate:.3f}, conditional per-position rates [{rates}]"
    )
    emit(args, summary, human)
    return 0


def _run_measure(args, out: Path, name: str, drafters) -> int:
    from specsim.profiling.measure import MeasureOptions, measure_profile
    from specsim.profiling.writer import command_line, write_profile

    _need(args, "target", mode="measuring")
    trees = _tree_shapes(args, drafters)
    temperatures = args.temperature if args.temperature is not None else [1.0]
    opts = MeasureOptions(
        target=args.target,
        drafters=drafters,
        name=name,
        device=args.device,
        dtype=args.dtype,
        grid=args.grid,
        prompts=args.prompts,
        temperatures=temperatures,
        time_budget=args.time_budget,
        repeats=args.repeats,
        clock=args.clock,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        max_prompts=args.max_prompts,
        acceptance=not args.no_acceptance,
        sequences_prefix=out.stem if args.sequences else None,
        command=command_line(),
        trees=trees,
        tree_drafts=args.tree_drafts or [],
    )
    if args.prompts is not None:  # fail on a bad prompt file before minutes of timing
        from specsim.workload.prompts import read_prompts

        read_prompts(args.prompts)
    report = measure_profile(opts)
    write_profile(report.profile, out, report.side_files)
    _summarise(args, report.profile, out, report.lines)
    return 0


def _tree_shapes(args, drafters) -> list:
    """The --tree shapes, checked before any model loads."""
    from specsim.tree import TreeShape

    if args.tree_drafts and not args.tree:
        raise SpecsimError(
            "--tree-drafts needs --tree", file="--tree-drafts", fix="add --tree SHAPE or drop it"
        )
    from specsim.profile.schema import TREE_DRAFTS

    for kind in args.tree_drafts or []:
        if kind not in TREE_DRAFTS:
            raise SpecsimError(
                f"--tree-drafts {kind!r} is not a drafting",
                file="--tree-drafts",
                fix="give " + " or ".join(TREE_DRAFTS),
            )
    if not args.tree:
        return []
    if args.no_acceptance:
        raise SpecsimError(
            "--tree measures acceptance, which --no-acceptance turns off",
            file="--tree",
            fix="drop one of the two",
        )
    if all(d.scored_by_start for d in drafters):
        raise SpecsimError(
            "--tree measures draft models' trees, and no --drafter is a draft model (prompt "
            "lookup and MTP draft chains)",
            file="--tree",
            fix="add --drafter NAME=MODEL",
        )
    shapes = []
    for text in args.tree:
        try:
            shapes.append(TreeShape.parse(text))
        except SpecsimError as exc:
            raise SpecsimError(exc.message, file="--tree", fix=exc.fix) from None
    return list(dict.fromkeys(shapes))


def _summarise(args, profile, out: Path, extra: list[str] | None = None) -> None:
    from specsim.profile import LatencyModel

    context = _summary_context(profile.target.latency)
    target = LatencyModel(profile.target.latency, "target")
    decode = target.pass_seconds([context], 1)
    lines = [
        f"wrote {out} ({profile.provenance.source}, {profile.provenance.device})",
        *(extra or []),
        f"  target: {profile.target.description}: decode at context {context} "
        f"{decode * 1e3:.2f} ms/pass",
    ]
    summary = {
        "out": str(out),
        "source": profile.provenance.source,
        "device": profile.provenance.device,
        "summary_context": context,
        "target_decode_s": decode,
        "drafters": {},
        "acceptance_entries": len(profile.acceptance),
    }
    for dname, spec in profile.drafters.items():
        if spec.latency is not None:
            secs = LatencyModel(spec.latency, dname).pass_seconds([context], 1)
            lines.append(f"  drafter {dname}: decode at context {context} {secs * 1e3:.2f} ms/pass")
        else:
            secs = spec.draft_step_s
            lines.append(f"  drafter {dname}: {spec.kind}, {secs * 1e3:.3g} ms per step")
        summary["drafters"][dname] = {"kind": spec.kind, "step_s": secs}
    for entry in profile.acceptance:
        mal = entry.mean_acceptance_length
        k = 4 if 4 in mal else max(mal)
        lines.append(
            f"  acceptance {entry.drafter}/{entry.verifier}@T={entry.temperature:g} "
            f"({entry.source}{', lossy' if entry.verifier in LOSSY_VERIFIERS else ''}): "
            f"mean acceptance length at k={k}: {mal[k]:.2f}"
        )
    emit(args, summary, "\n".join(lines))


def _summary_context(latency) -> int:
    """1024 tokens of context, or the largest measured context if the grid stopped short."""
    if latency.valid_range is None:
        return 1024
    return min(1024, latency.valid_range.context[1])
