"""What-if reports.

  specsim report drafter-swap SCENARIO --drafter A --drafter B [--profile PROFILE ...] --out DIR
  specsim report drafter-swap SCENARIO --drafter A --tree-drafter A=2,2,1 --out DIR
      the drafters (or a chain against a tree) side by side across load: acceptance, latency
      percentiles, throughput, wasted FLOPs, cost per million tokens, best k per load, and a
      recommendation with its reasons. A lossy verifier is flagged with its distance from the
      target's distribution.

Writes DIR/report.html (self-contained: opens in a browser with no network), DIR/report.md, the
PNG figures and a CSV of every number plotted. Sweep options as for ``specsim plan``; an
interrupted run resumes from DIR/points. Exit codes: 0 done, 1 done but some simulations failed,
2 bad input.
"""

from __future__ import annotations

import argparse

from specsim.cli.common import add_json, add_out, add_set
from specsim.cli.plan_options import (
    TREE_DRAFTS,
    add_emit_options,
    add_sweep_options,
    emit_request,
    finish,
    sweep_options,
)

SWAP_DESCRIPTION = """Compare two or more drafters side by side, and recommend one.

  specsim report drafter-swap SCENARIO --drafter A --drafter B [--profile PROFILE ...] \\
      [--k 0..4] [--loads 2 6 10] --out DIR

Each drafter gets the plan-window grid (every k at every load, with its own profile when one is
given); a tree drafter (--tree-drafter NAME=SHAPE) its tree and k = 0 at every load; the
drafters are compared load by load at their best setting. The recommendation states its
reasons, and every compared metric (TTFT, TPOT and E2E mean, p50, p90, p99, throughput, goodput,
cost) that is worse with it than with each other drafter and than with speculation off, with
the range over loads. A lossy verifier is flagged with its distance from the target's
distribution.
Writes DIR/report.html, DIR/report.md, DIR/summary.json, the figures and DIR/points (for
resuming). Exit codes: 0 done, 1 done but some simulations failed, 2 bad input.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="report", metavar="WHAT", required=True)
    swap = sub.add_parser(
        "drafter-swap",
        help="compare drafters side by side",
        description=SWAP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    swap.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    swap.add_argument(
        "--drafter",
        action="append",
        required=True,
        metavar="NAME",
        help="a drafter to compare (give two or more)",
    )
    swap.add_argument(
        "--profile",
        action="append",
        default=None,
        metavar="PROFILE",
        help="profile to take the drafters from: once for all, or once per --drafter in order "
        "(default: the scenario's profile)",
    )
    swap.add_argument(
        "--tree-drafter",
        action="append",
        default=[],
        metavar="NAME=SHAPE",
        help="also compare drafter NAME drafting the tree SHAPE (children per node at each "
        "depth, 2,2,1, or a JSON list of paths) against the chains (repeatable)",
    )
    swap.add_argument(
        "--tree-drafts",
        default=None,
        choices=TREE_DRAFTS,
        help="how the tree drafters' children are drafted (default: the scenario's "
        "speculation.tree_drafts)",
    )
    swap.add_argument("--k", default=None, metavar="K", help="window sizes, e.g. 0..8")
    swap.add_argument(
        "--loads",
        nargs="+",
        default=None,
        metavar="LOAD",
        help="load levels (as for plan window; default: a ladder around the scenario's load)",
    )
    swap.add_argument(
        "--policies",
        default=None,
        metavar="KIND",
        help="window policies to compare with the drafters at every load beside the static k, "
        "comma-separated: by_batch, adaptive (the goodput policy), adaptive_steps (SGLang's), "
        "adaptive_verification (vLLM's per-step verify budget); "
        "the report's 'Drafter and window policy per load' names the winning drafter and "
        "policy there and those that lose to k = 0",
    )
    add_sweep_options(swap)
    add_emit_options(swap)
    add_set(swap)
    add_out(swap)
    add_json(swap)


def tree_drafters(texts: list[str]):
    from specsim.planning.trees import parse_tree_drafter

    return [parse_tree_drafter(text) for text in texts]


def run(args: argparse.Namespace) -> int:
    from specsim.api.plan_run import swap_run
    from specsim.planning.common import parse_k_values, parse_loads
    from specsim.planning.policy_compare import compared_policies
    from specsim.planning.swap import swap_policies, swap_report

    emit = emit_request(args)
    planned = swap_run(
        args.scenario,
        args.overrides,
        args.drafter,
        args.profile,
        parse_k_values(args.k),
        parse_loads(args.loads),
        args.seed,
        args.out,
        sweep_options(args),
        emit,
        tree_drafters(args.tree_drafter),
        args.tree_drafts,
        compared_policies(args.policies, "report drafter-swap"),
    )
    human = swap_report.human(planned.plan, planned.summary)
    if planned.plan.policies:
        human += "\n" + swap_policies.human(planned.summary)
    return finish(args, planned, human)
