"""Measure a target and its drafters on this machine and write a profile YAML: a latency grid
of timed forward passes, and acceptance on a prompt set.

  specsim profile measure --target specsim-target --drafter small=specsim-draft-small \\
      --drafter ngram --device cpu --out profiles/mine.yaml

MODEL is a local Hugging Face folder, a config.json alone (random weights), or a built-in name;
a drafter may also be ngram or ngram:N (prompt lookup with n-gram size N), or mtp: the
target's multi-token-prediction module (DeepSeek-V3's), measured as a draft model.
"""

from __future__ import annotations

import argparse

from specsim.bounds import MAX_TOKENS
from specsim.cli.common import POSITIVE_SECONDS, Number
from specsim.cli.profile_shared import (
    TEMPERATURE,
    add_drafter_models,
    add_output,
    add_seed,
    out_path,
    summarise,
)
from specsim.errors import SpecsimError

MAX_REPEATS = 10_000
MAX_PROMPTS = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="MODEL",
        required=True,
        help="the target model: a Hugging Face folder, a config.json or a built-in name",
    )
    add_drafter_models(parser, "a Hugging Face folder, a config.json or a built-in name")
    add_output(parser)
    parser.add_argument(
        "--device", metavar="DEVICE", default="cpu", help="cpu or cuda (default cpu)"
    )
    parser.add_argument("--dtype", metavar="DTYPE", help="float32, bfloat16 or float16")
    parser.add_argument(
        "--grid",
        metavar="AXIS=N,N...",
        action="append",
        default=[],
        help="grid axis values: batch=, context=, new= (tokens per sequence: 1 decode, k+1 "
        "verify) or prefill= (prompt lengths); repeatable; default on CPU batch=1,2,4,8 "
        "context=16,128,384 new=1,3,5,9 prefill=32,128",
    )
    parser.add_argument(
        "--prompts",
        metavar="FILE",
        help='prompt set: .jsonl lines {"prompt": ...}, or text with one prompt per '
        "paragraph or line (default: the built-in set)",
    )
    parser.add_argument(
        "--temperature",
        metavar="T",
        type=TEMPERATURE,
        action="append",
        default=None,
        help="temperature for exact and typical acceptance (repeatable; default 1.0; greedy "
        "verification is always measured at 0)",
    )
    parser.add_argument(
        "--time-budget",
        type=POSITIVE_SECONDS,
        metavar="SECONDS",
        help="stop the timing grid after this long (largest points go last) and fit on what "
        "was measured",
    )
    parser.add_argument(
        "--repeats",
        metavar="N",
        type=Number(int, 1, MAX_REPEATS),
        help="timed repeats per point (default 7 on CPU, 20 on CUDA)",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu", "reference"],
        default="wall",
        help="CPU passes: wall-clock time (default), the process's CPU time, which leaves out "
        "time taken by other processes on a shared machine (needs OMP_NUM_THREADS=1), or "
        "reference: CPU time rescaled to the machine's quiet speed, re-measured every 0.25 s "
        "with a decode and a prefill reference pass of each model (records "
        "provenance.speed_reference)",
    )
    add_seed(parser, "weights of config-only models, grid tokens, sampled text and the estimated "
             "tree scores")  # fmt: skip
    parser.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=Number(int, 1, MAX_TOKENS),
        help="tokens generated per prompt (default 48 on CPU, 128 on CUDA)",
    )
    parser.add_argument(
        "--max-prompts",
        metavar="N",
        type=Number(int, 1, MAX_PROMPTS),
        help="prompts scored (default 24 on CPU, 64 on CUDA)",
    )
    parser.add_argument(
        "--tree",
        metavar="SHAPE",
        action="append",
        default=None,
        help="also measure tree acceptance for this shape (widths per depth, 2,2,1, or a list "
        "of paths, [[0],[1],[0,0]]; repeatable): each draft model's accepted-length "
        "distribution per step under greedy and exact verification, into tree_acceptance",
    )
    parser.add_argument(
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
    parser.add_argument("--no-acceptance", action="store_true", help="latency only")
    parser.add_argument(
        "--sequences",
        action="store_true",
        help="also write per-request acceptance sequences beside the profile (for "
        "trace-driven simulation)",
    )


def run(args: argparse.Namespace) -> int:
    from specsim.profiling.measure import MeasureOptions, measure_profile
    from specsim.profiling.specs import parse_drafters, refuse_heads
    from specsim.profiling.writer import command_line, write_profile

    out, name = out_path(args.out, args.name)
    drafters = parse_drafters(args.drafter)
    refuse_heads(drafters)
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
    summarise(args, report.profile, out, report.lines)
    return 0


def _tree_shapes(args, drafters) -> list:
    """The --tree shapes, checked before any model loads."""
    from specsim.tree import TreeShape

    if args.tree_drafts and not args.tree:
        raise SpecsimError(
            "--tree-drafts needs --tree", file="--tree-drafts", fix="add --tree SHAPE or drop it"
        )
    from specsim.profile.acceptance import TREE_DRAFTS

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
