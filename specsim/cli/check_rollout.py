"""Compare two engine runs' quality signals: did a speculative rollout shift the output?

  specsim check rollout --baseline RUN_A --candidate RUN_B [--alpha 0.01] [--out DIR]

RUN is the folder of a real-engine run with per-request records (requests.csv with the target's
log-likelihood), such as the engine/ folder ``specsim validate`` writes. Two-sample tests
(Mann-Whitney U and Kolmogorov-Smirnov on the per-request mean target log-likelihood and on the
output lengths, Fisher's exact test on the EOS share), Bonferroni-corrected to ``--alpha``
overall. Exit 0 with the verdict (1 with --fail-on-shift when a shift is found); 2 on bad input.
"""

from __future__ import annotations

import argparse

from specsim.cli.common import LEVEL, add_json, add_out, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", metavar="RUN", required=True, help="run before the change")
    parser.add_argument("--candidate", metavar="RUN", required=True, help="run after the change")
    parser.add_argument(
        "--alpha",
        type=LEVEL,
        default=0.01,
        help="false-alarm rate over all tests (0.01)",
    )
    add_out(parser, required=False, help="also write DIR/rollout.json")
    parser.add_argument("--fail-on-shift", action="store_true", help="exit 1 when a shift is found")
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from specsim.fileio import atomic_output_dir, dump_json
    from specsim.validation.rollout import check_rollout, describe, load_rollout_records

    baseline = load_rollout_records(args.baseline)
    candidate = load_rollout_records(args.candidate)
    check = check_rollout(baseline, candidate, args.alpha)
    summary = {"baseline": str(args.baseline), "candidate": str(args.candidate)}
    summary.update(check.to_dict())
    if args.out:
        with atomic_output_dir(args.out) as staging:
            (staging / "rollout.json").write_text(dump_json(summary), encoding="utf-8")
    emit(args, summary, describe(check))
    return 1 if (args.fail_on_shift and check.shifted) else 0
