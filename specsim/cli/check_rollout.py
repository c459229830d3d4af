"""Did speculation change the output? Two engine runs, or whole toy runs of your own code.

Compare two engine runs, or judge whole toy runs of your verifier or step function against the
target.

  specsim check rollout --baseline RUN_A --candidate RUN_B [--alpha 0.01] [--out DIR]
  specsim check rollout --verifier path/to/file.py:verify [--tree 2,1 | --k 3] [--tokens 6]
  specsim check rollout --step path/to/file.py:step [--k 3]
  specsim check rollout --control kept-rejected-entry       # a planted bug, flagged

Engine runs: RUN is the folder of a real-engine run with per-request records (requests.csv with
the target's log-likelihood), such as the engine/ folder ``specsim validate`` writes.
Two-sample tests (Mann-Whitney U and Kolmogorov-Smirnov on the per-request mean target
log-likelihood and on the output lengths, Fisher's exact test on the EOS share),
Bonferroni-corrected to ``--alpha`` overall.

Whole runs: bugs that only show across steps (uniforms reused from step to step, a rejected
draft's KV entry kept, a bonus token from a stale position) pass every one-step check. Here
--samples runs of --tokens n tokens each from the prompt of the checker's toy order-2
target/drafter pair (vocab --vocab) are generated with your code in the loop, and the
distribution of the n-token sequences is compared with the target's exact one: a Cressie-Read
test of the first j tokens for each j = 1..n at level alpha / n, reporting the sample size, the
seed and the smallest TV distance each test detects with 99% power.
- --verifier: a tree verifier (the signature in ``specsim check sampler --help``; a built-in
  name, MODULE:FUNCTION or path/to/file.py:function) in specsim's loop: each step drafts the
  --tree (default: a chain of --k drafts) after each row's last two tokens, calls the verifier
  with fresh uniforms and commits what it emits. It may keep state between calls (that is what
  is being checked).
- --step: your whole step, owning the KV cache, called once per step as
    step(target, drafter, cache, last, randomness) -> (accepted [B], tokens [B, k+1])
  cache.tokens [B, L] and cache.length [B] hold the KV entries of every committed token but the
  last one, last [B]; target(cache, tokens [B, m]) appends m entries and returns p [B, m, V],
  row j the next-token distribution after tokens[:, j] (the toy target reads the entry before
  each token); drafter(a, b) returns q [B, V] after the token pair (a, b); randomness.draft,
  .accept [B, k] and .sample [B] are uniforms. The step must roll cache.length back to keep
  the entries of last and the accepted drafts.
- --control: a planted bug that must be flagged (exact-step must pass).
Exit 0 with the verdict (1 with --fail-on-shift when a shift is found, or when your code is
found lossy); 2 on bad input.
"""

from __future__ import annotations

import argparse

from specsim.bounds import MIN_FACTOR
from specsim.cli.common import LEVEL, Number, add_json, add_out, emit

SEQUENCE_CONTROLS = (
    "exact-step", "reused-uniforms", "kept-rejected-entry", "stale-bonus-position",
    "unnormalised-residual",
)  # fmt: skip  # a test checks them against sequences.SEQUENCE_CONTROLS


# The whole-run options, at their defaults: comparing engine runs refuses any other value.
TOY_DEFAULTS = {
    "tree": None, "k": 3, "drafts": "iid", "tokens": 6, "vocab": 4, "samples": 200_000,
    "seed": 0, "problem_seed": 0, "temperature": 1.0,
}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", metavar="RUN", help="engine run before the change")
    parser.add_argument("--candidate", metavar="RUN", help="engine run after the change")
    parser.add_argument(
        "--verifier", metavar="NAME|MODULE:FUNCTION", help="a tree verifier to run in the loop"
    )
    parser.add_argument("--step", metavar="MODULE:FUNCTION", help="your step function (chains)")
    parser.add_argument("--control", choices=SEQUENCE_CONTROLS, help="a planted whole-run bug")
    parser.add_argument("--tree", metavar="SHAPE", help="with --verifier: the drafted tree")
    parser.add_argument(
        "--k", metavar="K", type=Number(int, 1, 8), default=3, help="chain drafts (default 3)"
    )
    parser.add_argument(
        "--drafts", choices=("iid", "without-replacement"), default="iid",
        help="how each node's children are drawn from q (default iid)",
    )  # fmt: skip
    for option, kind, default, what in (
        ("--tokens", Number(int, 1, 16), 6, "tokens n per run"),
        ("--vocab", Number(int, 2, 16), 4, "toy vocabulary size"),
        ("--samples", Number(int, 1, 10_000_000), 200_000, "runs"),
    ):
        parser.add_argument(
            option, metavar="N", type=kind, default=default, help=f"{what} (default {default})"
        )
    for option, what in (("--seed", "run seed"), ("--problem-seed", "toy pair seed")):
        parser.add_argument(
            option, metavar="SEED", type=Number(int, 0, 2**63 - 1), default=0,
            help=f"{what} (default 0)",
        )  # fmt: skip
    parser.add_argument(
        "--temperature", metavar="T", type=Number(float, MIN_FACTOR, 100), default=1.0,
        help="shared temperature (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--alpha",
        metavar="FRACTION",
        type=LEVEL,
        default=0.01,
        help="false-alarm rate over all tests (default 0.01)",
    )
    add_out(parser, required=False, help="also write DIR/rollout.json")
    parser.add_argument("--fail-on-shift", action="store_true", help="exit 1 when a shift is found")
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from specsim.errors import SpecsimError

    runs = args.baseline is not None or args.candidate is not None
    toy = any(x is not None for x in (args.verifier, args.step, args.control))
    if runs == toy or (runs and None in (args.baseline, args.candidate)):
        raise SpecsimError(
            "compare two engine runs or judge whole toy runs",
            key="--baseline",
            fix="give --baseline and --candidate, or one of --verifier, --step and --control",
        )
    if runs:
        for name, default in TOY_DEFAULTS.items():
            if getattr(args, name) != default:
                option = "--" + name.replace("_", "-")
                raise SpecsimError(
                    "applies to whole toy runs only (with --verifier, --step or --control)",
                    key=option,
                    fix="drop it when comparing two engine runs",
                )
    return _engine_runs(args) if runs else _toy_runs(args)


def _engine_runs(args: argparse.Namespace) -> int:
    from specsim.validation.rollout import check_rollout, describe, load_rollout_records

    baseline = load_rollout_records(args.baseline)
    candidate = load_rollout_records(args.candidate)
    check = check_rollout(baseline, candidate, args.alpha)
    summary = {"baseline": str(args.baseline), "candidate": str(args.candidate)}
    summary.update(check.to_dict())
    _write(args, summary)
    emit(args, summary, describe(check))
    return 1 if (args.fail_on_shift and check.shifted) else 0


def _toy_runs(args: argparse.Namespace) -> int:
    from specsim.sampling.sequences import check_sequences, describe

    check = check_sequences(
        args.verifier, step=args.step, control=args.control, tree=args.tree, k=args.k,
        drafts=args.drafts, tokens=args.tokens, vocab=args.vocab, samples=args.samples,
        seed=args.seed, temperature=args.temperature, problem_seed=args.problem_seed,
        alpha=args.alpha,
    )  # fmt: skip
    summary = check.to_json()
    _write(args, summary)
    emit(args, summary, describe(check))
    failed = not (check.lossless or check.negative_control)
    return 1 if (args.fail_on_shift and failed) else 0


def _write(args: argparse.Namespace, summary: dict) -> None:
    if args.out:
        from specsim.fileio import atomic_output_dir, dump_json

        with atomic_output_dir(args.out) as staging:
            (staging / "rollout.json").write_text(dump_json(summary), encoding="utf-8")
