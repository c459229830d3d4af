"""Estimate a deployment you do not have from datasheet numbers (a roofline model) and write a
profile YAML.

  specsim profile roofline --hardware profiles/hardware/h100-sxm.yaml \\
      --target profiles/models/llama3.1-8b.json \\
      --drafter llama3.2-1b=profiles/models/llama3.2-1b.json --drafter ngram \\
      --acceptance-from profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml \\
      --out profiles/llama3.1-8b_llama3.2-1b_h100-roofline.yaml

A replica over 4 devices, or in FP8 (weights and KV cache), is --tp 4 / --weights-dtype fp8
--kv-dtype fp8 (and --draft-tp 1 for a draft model on one device); --weights-dtype nvfp4 or
mxfp4 for FP4 checkpoints. A drafter may also be ngram or ngram:N (prompt lookup with n-gram
size N), mtp: the target's multi-token-prediction module (DeepSeek-V3's), costed as a draft
model, or eagle:CONFIG / eagle3:CONFIG: an EAGLE or EAGLE-3 head given by its own config.json
(profiles/models/eagle3-llama3.1-8b.json), costed as heads drafting one pass per depth, or a
parallel drafter, dflash:CONFIG or p_eagle:CONFIG:K (K: the drafts one pass proposes; DFlash's
config gives its block), costed as kind block drafting the window in one pass.
"""

from __future__ import annotations

import argparse

from specsim.bounds import MAX_TENSOR_PARALLEL
from specsim.cli.common import SECONDS, Number
from specsim.cli.profile_shared import add_drafter_models, add_output, out_path, summarise
from specsim.profiling.engine_costs import (
    DEFAULT_REQUEST_S,
    DEFAULT_SEQUENCE_S,
    DEFAULT_STEP_S,
    EngineCosts,
)

TENSOR_PARALLEL = Number(int, 1, MAX_TENSOR_PARALLEL)
# The command line's short names for the profile's formats.
WEIGHT_FORMATS = {
    "bf16": "bfloat16",
    "fp8": "fp8",
    "int4": "int4",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
}
KV_FORMATS = {"bf16": "bfloat16", "fp8": "fp8"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hardware", metavar="HW", required=True, help="hardware spec YAML (profiles/hardware)"
    )
    parser.add_argument(
        "--target", metavar="CONFIG", required=True, help="the target model's config.json"
    )
    add_drafter_models(parser, "a config.json")
    add_output(parser)
    parser.add_argument(
        "--acceptance-from",
        metavar="FILE",
        help="copy acceptance entries from an acceptance file or another profile",
    )
    parser.add_argument(
        "--tp",
        metavar="N",
        type=TENSOR_PARALLEL,
        default=1,
        help="devices one replica spans (tensor parallelism; default 1)",
    )
    parser.add_argument(
        "--draft-tp",
        metavar="N",
        type=TENSOR_PARALLEL,
        help="devices a draft model spans: 1 or --tp (default --tp, as vLLM's "
        "draft_tensor_parallel_size)",
    )
    parser.add_argument(
        "--enable-expert-parallel",
        "--ep",
        dest="expert_parallel",
        action="store_true",
        help="deal a mixture of experts' experts out whole over the --tp devices (vLLM's "
        "flag: EP = TP) instead of sharding each",
    )
    parser.add_argument(
        "--weights-dtype",
        choices=sorted(WEIGHT_FORMATS),
        help="weight format of the decoder layers (default: the hardware file's dtype); fp8 and "
        "FP4 (nvfp4, mxfp4) multiply at the hardware file's peak for the format where it gives "
        "one, else (and int4) at the bf16 peak",
    )
    parser.add_argument(
        "--kv-dtype",
        choices=sorted(KV_FORMATS),
        help="KV-cache format (default: the hardware file's dtype)",
    )
    parser.add_argument(
        "--cuda-graphs",
        metavar="N",
        type=Number(int, 1, 65536),
        help="the engine captures CUDA graphs for passes of up to N tokens at vLLM's default "
        "sizes, padding each pass to the next (vLLM 0.33: 512, 1024 on B200/GB200/GB300, at "
        "most max_num_batched_tokens); default: no padding",
    )
    for option, what, default in (
        ("--ngram-step-s", "prompt-lookup cost per step", 1.0e-4),
        ("--overhead-step-s", "engine overhead per iteration", DEFAULT_STEP_S),
        ("--overhead-sequence-s", "engine overhead per sequence per iteration", DEFAULT_SEQUENCE_S),
        (
            "--overhead-request-s",
            "API-server delay per request (TTFT and E2E pay it)",
            DEFAULT_REQUEST_S,
        ),
        ("--overhead-admit-s", "engine cost per admitted request (its iteration pays it)", 0.0),
    ):
        parser.add_argument(
            option,
            metavar="SECONDS",
            type=SECONDS,
            default=default,
            help=f"stated {what} (default {default:g})",
        )


def run(args: argparse.Namespace) -> int:
    from specsim.profiling.roofline import roofline_profile
    from specsim.profiling.specs import parse_drafters
    from specsim.profiling.writer import command_line, write_profile

    out, name = out_path(args.out, args.name)
    profile = roofline_profile(
        hardware_path=args.hardware,
        target_path=args.target,
        drafters=parse_drafters(args.drafter),
        name=name,
        acceptance_path=args.acceptance_from,
        ngram_step_s=args.ngram_step_s,
        engine=EngineCosts(
            args.overhead_step_s,
            args.overhead_sequence_s,
            args.overhead_request_s,
            args.overhead_admit_s,
        ),
        command=command_line(),
        tp=args.tp,
        draft_tp=args.draft_tp,
        weights_dtype=WEIGHT_FORMATS.get(args.weights_dtype),
        kv_dtype=KV_FORMATS.get(args.kv_dtype),
        expert_parallel=args.expert_parallel,
        cuda_graphs=args.cuda_graphs,
    )
    write_profile(profile, out)
    summarise(args, profile, out)
    return 0
