"""Check a verifier for losslessness, or compare two rollouts' output quality.

specsim check sampler --verifier rejection
specsim check sampler --verifier typical --json      # lossy: reports its TV distance from p
specsim check sampler --control resample-p           # a known-wrong verifier, flagged
specsim check sampler --verifier rejection --top-k 4 --temperature 0.7 --ragged
specsim check sampler --verifier mypkg.sampling:verify      # your own verifier, judged exactly
specsim check sampler --tree 2,2,1 --drafts without-replacement   # tree verification
specsim check rollout --baseline runs/before/engine --candidate runs/after/engine

"sampler" judges a verifier on a seeded toy target/drafter pair whose p and q depend on the
prefix, over the whole window of k + 1 emitted tokens: an exact result (a closed form, or the
enumeration of your own function) and Monte Carlo goodness-of-fit tests of the real batched
implementation, reporting the sample size, seed, p-values and the smallest TV distance each
detects. Exit 0 whenever a verdict is computed (lossless or not), 2 on bad input; with
--fail-on-lossy, 1 when an exact verifier is found lossy (for CI jobs).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from specsim.cli.check_lines import SAMPLER_DESCRIPTION, sampler_lines, tree_lines
from specsim.cli.common import add_json, add_out, emit
from specsim.sampling.kinds import DEFAULT_VERIFIER, LOSSY_VERIFIERS, VERIFIER_KINDS


@dataclass(frozen=True)
class SubCheck:
    """One ``specsim check <name>``: its help, its options and what it runs."""

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="check", metavar="CHECK", required=True)
    for name, check in CHECKS.items():
        cmd = sub.add_parser(
            name,
            help=check.help,
            description=check.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        check.add_arguments(cmd)
        cmd.set_defaults(_check_run=check.run)


def run(args: argparse.Namespace) -> int:
    return args._check_run(args)


# ----------------------------------------------------------------------------------------------
# specsim check sampler


# The controls are listed here, not imported, so that building the parser (every `specsim` call)
# stays free of numpy/scipy imports; a test checks them against specsim.sampling's registry.
VERIFIER_CHOICES = tuple(VERIFIER_KINDS)
CONTROL_CHOICES = (
    "argmax-on-reject", "raw-q", "resample-p", "residual-0.8q", "shared-uniform", "stale-bonus",
)  # fmt: skip
TREE_CONTROL_CHOICES = ("tree-iid-proposal", "tree-sibling-uniform", "tree-stale-residual")
TREE_DRAFTS = ("iid", "without-replacement")  # a test checks them against kinds.TREE_DRAFTS
MAX_VOCAB, MAX_K, DEFAULT_K = 16, 4, 3


def _add_sampler_arguments(parser: argparse.ArgumentParser) -> None:
    lossy = " and ".join(sorted(LOSSY_VERIFIERS)) + (" is" if len(LOSSY_VERIFIERS) == 1 else " are")
    parser.add_argument(
        "--verifier",
        default=None,
        metavar="NAME|MODULE:FUNCTION",
        help=f"the verifier to check: {', '.join(VERIFIER_CHOICES)} (default {DEFAULT_VERIFIER}; "
        f"{lossy} lossy by design), or your own function as package.module:function or "
        "path/to/file.py:function (the signature is below)",
    )
    parser.add_argument(
        "--control",
        choices=CONTROL_CHOICES + TREE_CONTROL_CHOICES,
        default=None,
        help="run a known-wrong verifier instead (a negative control the check must flag; the "
        "tree-* controls with --tree)",
    )
    parser.add_argument(
        "--tree",
        default=None,
        metavar="SHAPE",
        help="check tree verification on this tree instead of a chain of --k drafts: widths per "
        "depth (2,2,1: two children of the root, two under each, one under each of those) or a "
        "JSON list of paths of child ranks ([[0],[1],[0,0]]); the whole window of depth + 1 "
        "tokens is judged",
    )
    parser.add_argument(
        "--drafts",
        choices=TREE_DRAFTS,
        default=None,
        help="with --tree: how the toy drafter draws each node's children from q, i.i.d. "
        "(default; the rejection verifier is then SpecInfer's rule) or without replacement "
        "(Sequoia's rule); --drafter greedy takes q's top-k tokens instead",
    )
    parser.add_argument(
        "--lossy-by-design",
        action="store_true",
        help="your function is meant to be lossy (e.g. typical acceptance): report its distance "
        "from the target, and --fail-on-lossy does not fail on it",
    )
    parser.add_argument(
        "--reference",
        choices=("sampling", "greedy"),
        default="sampling",
        help="what your function is judged against: sampling from p (default), or target-only "
        "greedy decoding (for a greedy verifier)",
    )
    parser.add_argument(
        "--inputs",
        choices=("probs", "logits"),
        default="probs",
        help="hand your function processed probabilities p and q (default), or the raw logits "
        "plus temperature, top_k and top_p keywords so that its own processing is exercised",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="dtype of the tensors the verifier is given (default float32)",
    )
    parser.add_argument(
        "--vocab",
        metavar="N",
        type=int,
        default=8,
        help=f"toy vocabulary size, 2..{MAX_VOCAB} (default 8)",
    )
    parser.add_argument(
        "--k",
        metavar="K",
        type=int,
        default=None,
        help=f"window size, 1..{MAX_K} (default 3), with vocab^(k+1) <= 65536: the whole "
        "window of k + 1 emitted tokens is judged",
    )
    parser.add_argument(
        "--samples",
        metavar="N",
        type=int,
        default=200_000,
        help="Monte Carlo generations (default 200000; 0 = exact result only)",
    )
    parser.add_argument(
        "--seed", metavar="SEED", type=int, default=0, help="Monte Carlo seed (default 0)"
    )
    parser.add_argument(
        "--problem-seed",
        metavar="SEED",
        type=int,
        default=0,
        help="seed of the toy target/drafter (default 0)",
    )
    parser.add_argument(
        "--temperature",
        metavar="T",
        type=float,
        default=1.0,
        help="shared temperature (default 1; 0 = greedy)",
    )
    parser.add_argument(
        "--top-k", metavar="N", type=int, default=0, help="shared top-k (default 0: off)"
    )
    parser.add_argument(
        "--top-p", metavar="FRACTION", type=float, default=1.0,
        help="shared top-p in (0, 1] (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--drafter",
        choices=("sample", "greedy"),
        default="sample",
        help="sample drafts from q, or draft argmax q (a deterministic drafter, one-hot q)",
    )
    parser.add_argument(
        "--ragged",
        action="store_true",
        help="draw each step's number of drafts uniformly from 0..k (ragged windows, as an "
        "n-gram drafter makes)",
    )
    parser.add_argument(
        "--alpha",
        metavar="FRACTION",
        type=float,
        default=0.01,
        help="level of the Monte Carlo test (default 0.01)",
    )
    add_out(parser, required=False, help="also write the report to DIR/sampler_check.json")
    parser.add_argument(
        "--fail-on-lossy",
        action="store_true",
        help="exit 1 when a verifier meant to be exact is found lossy or breaks its output "
        "contract, so a CI job catches a regression (typical acceptance, --lossy-by-design and "
        "the negative controls still exit 0)",
    )
    add_json(parser)


def _check_upper_bounds(args: argparse.Namespace) -> None:
    """Values no check needs (the checker itself refuses the low ones): a huge --samples would
    run for days, a huge seed or temperature overflows."""
    from specsim.bounds import MAX_DIMENSION, MAX_SEED, MAX_TEMPERATURE
    from specsim.errors import SpecsimError

    limits = {
        "samples": 100_000_000,
        "seed": MAX_SEED,
        "problem_seed": MAX_SEED,
        "temperature": MAX_TEMPERATURE,
        "top_k": MAX_DIMENSION,
    }
    for name, high in limits.items():
        if getattr(args, name) > high:
            option = "--" + name.replace("_", "-")
            raise SpecsimError(
                f"{getattr(args, name):g} is too large",
                key=option,
                fix=f"give {option} of at most {high:,}",
            )


def _run_sampler(args: argparse.Namespace) -> int:
    from specsim.errors import SpecsimError
    from specsim.sampling.checker import check_sampler

    _check_upper_bounds(args)
    if args.verifier is not None and args.control is not None:
        raise SpecsimError(
            "--verifier and --control are exclusive", key="--control", fix="give one of them"
        )
    if args.tree is not None:
        return _run_tree(args)
    if args.drafts is not None:
        raise SpecsimError("applies with --tree only", key="--drafts", fix="add --tree or drop it")
    if args.control in TREE_CONTROL_CHOICES:
        raise SpecsimError(
            f"{args.control} is a tree control",
            key="--control",
            fix="add --tree, e.g. --tree 2,2,1",
        )
    _require_own_verifier(args)
    report = check_sampler(
        args.control or args.verifier or DEFAULT_VERIFIER,
        vocab=args.vocab,
        k=DEFAULT_K if args.k is None else args.k,
        samples=args.samples,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        drafter=args.drafter,
        ragged=args.ragged,
        alpha=args.alpha,
        problem_seed=args.problem_seed,
        greedy_reference=args.reference == "greedy",
        lossy_by_design=args.lossy_by_design,
        inputs=args.inputs,
        dtype=args.dtype,
    )
    return _report(args, report, sampler_lines(report))


def _require_own_verifier(args: argparse.Namespace) -> None:
    from specsim.errors import SpecsimError

    own = args.verifier is not None and ":" in args.verifier
    for flag, used in (
        ("--lossy-by-design", args.lossy_by_design),
        ("--reference", args.reference != "sampling"),
        ("--inputs", args.inputs != "probs"),
    ):
        if used and not own:
            raise SpecsimError(
                "applies to your own verifier only",
                key=flag,
                fix="give --verifier package.module:function, or drop the option",
            )


def _report(args: argparse.Namespace, report, human: str) -> int:
    summary = report.to_json()
    if args.out:
        from specsim.fileio import atomic_output_dir, dump_json

        with atomic_output_dir(args.out) as staging:
            (staging / "sampler_check.json").write_text(dump_json(summary), encoding="utf-8")
    emit(args, summary, human)
    return 1 if args.fail_on_lossy and exact_verifier_failed(report) else 0


def _run_tree(args: argparse.Namespace) -> int:
    from specsim.errors import SpecsimError
    from specsim.sampling.tree_checker import check_tree_sampler

    if args.verifier is not None and args.control is not None:
        raise SpecsimError(
            "--verifier and --control are exclusive", key="--control", fix="give one of them"
        )
    chain_only = (
        ("--k", args.k is not None),
        ("--ragged", args.ragged),
        ("--top-k", args.top_k != 0),
        ("--top-p", args.top_p != 1.0),
        ("--control", args.control in CONTROL_CHOICES),
    )
    for flag, used in chain_only:
        if used:
            raise SpecsimError(
                "does not apply with --tree (the tree problem runs at a temperature, with no "
                "top-k / top-p, on the tree's own window)",
                key=flag,
                fix="drop it, or drop --tree",
            )
    _require_own_verifier(args)
    report = check_tree_sampler(
        args.control or args.verifier or DEFAULT_VERIFIER,
        tree=args.tree,
        drafts=args.drafts,
        vocab=args.vocab,
        samples=args.samples,
        seed=args.seed,
        temperature=args.temperature,
        drafter=args.drafter,
        alpha=args.alpha,
        problem_seed=args.problem_seed,
        dtype=args.dtype,
        greedy_reference=args.reference == "greedy",
        lossy_by_design=args.lossy_by_design,
        inputs=args.inputs,
    )
    return _report(args, report, tree_lines(report))


def exact_verifier_failed(report) -> bool:
    """A verifier meant to be exact found lossy (or malformed): the one verdict that is a
    failure. Typical acceptance is lossy by design, and a negative control is meant to be
    flagged."""
    return not (report.lossless or report.lossy_by_design or report.negative_control)


def _rollout() -> SubCheck:
    from specsim.cli import check_rollout

    doc = check_rollout.__doc__ or ""
    return SubCheck(
        doc.strip().splitlines()[0], doc, check_rollout.add_arguments, check_rollout.run
    )


# To add a check, write its add_arguments/run pair (here or in its own module) and register it
# below; ``specsim check <name>`` then picks it up.
CHECKS: dict[str, SubCheck] = {
    "sampler": SubCheck(
        "check a verifier for losslessness (exact enumeration + Monte Carlo Cressie-Read test)",
        SAMPLER_DESCRIPTION,
        _add_sampler_arguments,
        _run_sampler,
    ),
    "rollout": _rollout(),
}
