"""Plan from simulations: the best k per load, or the replicas a target rate needs.

  specsim plan window SCENARIO.yaml [--k 0..8] [--loads 1,2,4] --out DIR
      every k and the adaptive policy at every load: best static k per load, the load where
      speculation stops paying, and a k-by-batch-size table for the serving engine
  specsim plan capacity SCENARIO.yaml --target-rps R --out DIR
      the highest rate one replica sustains within the SLO (bisection), with and without
      speculation and for each k / drafter; the replicas and cost for R, confirmed by one
      fleet simulation at R

Sweeps run on a local process pool (--workers N) or a Dask cluster (--cluster HOST:PORT; the
workers need specsim installed and the scenario and profile files at the same paths). The
cluster's results come back as pickles that this process unpickles, which runs whatever code
the sender chose: use only a cluster you trust, over TLS (--cluster-tls-*) on a shared network.
Results are kept per simulation under DIR/points: rerunning an interrupted command with the
same --out computes only what is missing. Exit codes: 0 done, 1 done but some simulations
failed (listed), 2 bad input.
"""

from __future__ import annotations

import argparse

from specsim.bounds import MAX_RATE
from specsim.cli.common import Number, add_json, add_out, add_set, emit
from specsim.cli.plan_options import (
    add_deployment_options,
    add_emit_options,
    add_sweep_options,
    add_tree_options,
    deployment_search,
    emit_request,
    finish,
    sweep_options,
    tree_options,
)
from specsim.errors import SpecsimError

MAX_DISAGG_REPLICAS = 64  # --max-replicas: the (x, y) grid grows as its square
SCREEN_FROM = 200  # as specsim.planning.sweep.screen.SCREEN_FROM (a test holds them equal)

WINDOW_DESCRIPTION = """Choose the window size k at each load.

  specsim plan window SCENARIO.yaml [--k 0..8] [--loads 2 6 10 14] --out DIR

Simulates every k (and the adaptive policy) at every load level: the best static k per load,
the load where speculation stops paying, and a k-by-batch-size table for the serving engine
(DIR/k_by_batch.yaml), checked by its own simulation at every load. Writes DIR/report.html,
DIR/report.md, DIR/summary.json, the figures (PNG and CSV) and DIR/points (for resuming).
Exit codes: 0 done, 1 done but some simulations failed (listed), 2 bad input.
"""

CAPACITY_DESCRIPTION = """The replicas a target arrival rate needs, with and without speculation.

  specsim plan capacity SCENARIO.yaml --target-rps R [--drafter NAME ...] [--k 1..4] --out DIR

For speculation off, each (drafter, k) and each drafter's adaptive policy: the highest rate one
replica sustains with --attainment of its requests within the scenario's SLO (bisection to
--tolerance), the replicas and cost R then needs, and one fleet simulation at R that confirms
the cheapest candidate. The scenario needs an open-loop workload and an slo. Writes
DIR/report.html, DIR/report.md, DIR/summary.json, the figures and DIR/points (for resuming).

With --disaggregated (a scenario with fleet.disaggregation): the cheapest prefill/decode layout
(xPyD) and the cheapest co-located fleet at R, with the scenario's speculation and with it off;
with the deployment options (--tp, --precision, --profile) each pool's TP and precision too,
and each choice's capacity bisected to --tolerance. Writes DIR/summary.json, DIR/layouts.csv,
DIR/candidates.csv (why each deployment won or lost), DIR/report.html, DIR/report.md and
DIR/points.
Exit codes: 0 done, 1 done but some simulations failed (listed), 2 bad input.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="plan", metavar="WHAT", required=True)
    window = sub.add_parser(
        "window",
        help="choose k per load",
        description=WINDOW_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    window.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    window.add_argument(
        "--k",
        default=None,
        metavar="K",
        help="window sizes to try, e.g. 0..8 or 0,2,4 (default 0..8, capped by the profile)",
    )
    window.add_argument(
        "--loads",
        nargs="+",
        default=None,
        metavar="LOAD",
        help="load levels: arrival rates (req/s) for an open-loop workload, client counts for a "
        "closed loop, speed factors for a trace (default: a ladder around the scenario's load)",
    )
    screening = window.add_mutually_exclusive_group()
    screening.add_argument(
        "--screen",
        dest="screen",
        action="store_const",
        const=True,
        default=None,
        help="rank every point by a closed-form estimate first and simulate only the k that "
        "can win at each load (k = 0 and the adaptive policy always run); the summary lists "
        f"what was pruned and why (default for grids of more than {SCREEN_FROM} points)",
    )
    screening.add_argument(
        "--exhaustive",
        dest="screen",
        action="store_const",
        const=False,
        help="simulate every point, however large the grid",
    )
    window.add_argument(
        "--policies",
        default=None,
        metavar="KIND",
        help="window policies to run beside the static k, the goodput policy and the k-by-batch "
        "table, comma-separated: adaptive_steps (SGLang's, at its default tiers or the "
        "scenario's speculation.adaptive_steps), adaptive_verification (vLLM's per-step verify "
        "budget, drafting the sweep's largest k); the report's 'Window policy per load' names "
        "the winner at each load",
    )
    add_tree_options(window)
    _common(window)

    capacity = sub.add_parser(
        "capacity",
        help="replicas for a target rate",
        description=CAPACITY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    capacity.add_argument(
        "scenario", metavar="SCENARIO", help="scenario YAML file (open-loop workload, with an slo)"
    )
    capacity.add_argument(
        "--target-rps",
        type=Number(float, 0, MAX_RATE, low_open=True),
        required=True,
        metavar="RATE",
        help="the arrival rate the fleet must sustain (requests per second)",
    )
    capacity.add_argument(
        "--drafter",
        action="append",
        default=None,
        metavar="NAME",
        help="drafter to consider (repeatable; default: the scenario's)",
    )
    capacity.add_argument(
        "--k",
        default=None,
        metavar="K",
        help="window sizes to consider, e.g. 1..4 (default 1..8, capped by the profile)",
    )
    capacity.add_argument(
        "--tolerance",
        type=Number(float, 0, 0.5, low_open=True, high_open=True),
        default=0.02,
        metavar="FRACTION",
        help="relative width at which the bisection stops (default 0.02 = 2%%); with "
        "--disaggregated, the bisection of each chosen layout's capacity above the target",
    )
    capacity.add_argument(
        "--attainment",
        type=Number(float, 0, 1, low_open=True),
        default=0.99,
        metavar="FRACTION",
        help="share of requests that must meet the SLO for a rate to count as sustained "
        "(default 0.99)",
    )
    capacity.add_argument(
        "--disaggregated",
        action="store_true",
        help="a disaggregated scenario (fleet.disaggregation): size its prefill and decode "
        "pools (x and y) against co-located replicas, with and without speculation, instead; "
        "with the deployment options each pool's TP and precision too (the pools may differ "
        "in TP, not in precision), and each choice's capacity bisected to --tolerance",
    )
    capacity.add_argument(
        "--max-replicas",
        type=Number(int, 2, MAX_DISAGG_REPLICAS),
        default=8,
        metavar="N",
        help="with --disaggregated: the most replicas a layout holds (default 8)",
    )
    capacity.add_argument(
        "--policies",
        default=None,
        metavar="KIND",
        help="window policies to compare at the target beside the static k and the goodput "
        "policy, comma-separated: by_batch (a k-by-batch table per drafter), adaptive_steps "
        "(SGLang's), adaptive_verification (vLLM's per-step verify budget); the report's "
        "'Window policy at the target' gives the replicas each needs, the winner and those "
        "needing more replicas than speculation off",
    )
    add_deployment_options(capacity)
    _common(capacity, disaggregated=True)


def _common(parser: argparse.ArgumentParser, disaggregated: bool = False) -> None:
    add_sweep_options(parser)
    add_emit_options(parser, disaggregated)
    add_set(parser)
    add_out(parser)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    if args.plan == "window":
        return _window(args)
    return _capacity(args)


def _window(args: argparse.Namespace) -> int:
    from specsim.api.plan_run import window_run
    from specsim.planning.common import parse_k_values, parse_loads
    from specsim.planning.window import window_report
    from specsim.planning.window.window_policies import parse_policies

    emit = emit_request(args)
    planned = window_run(
        args.scenario,
        args.overrides,
        parse_k_values(args.k),
        parse_loads(args.loads),
        args.seed,
        args.out,
        sweep_options(args),
        emit,
        screen=args.screen,
        policies=parse_policies(args.policies),
        **tree_options(args),
    )
    return finish(args, planned, window_report.human(planned.plan, planned.summary))


def _capacity(args: argparse.Namespace) -> int:
    if args.disaggregated:
        return _disaggregated(args)
    from specsim.api.plan_run import capacity_run
    from specsim.planning.capacity import capacity_policies, capacity_report
    from specsim.planning.common import parse_k_values
    from specsim.planning.policy_compare import compared_policies

    emit = emit_request(args)
    planned = capacity_run(
        args.scenario,
        args.overrides,
        args.target_rps,
        args.drafter,
        parse_k_values(args.k),
        args.tolerance,
        args.attainment,
        args.seed,
        args.out,
        sweep_options(args),
        emit,
        deployment_search(args),
        compared_policies(args.policies, "plan capacity"),
    )
    human = capacity_report.human(planned.plan, planned.summary)
    if planned.plan.policies:
        human += "\n" + capacity_policies.human(planned.summary)
    return finish(args, planned, human)


def _disaggregated(args: argparse.Namespace) -> int:
    from specsim.api.plan_run import refuse_all_failed
    from specsim.api.plan_split import disaggregated_run, write_disaggregated
    from specsim.planning.capacity import disagg_report
    from specsim.planning.emit.emit import human as engine_line

    refused = (("--drafter", args.drafter), ("--k", args.k), ("--policies", args.policies))
    for option, given in refused:
        if given:
            raise SpecsimError(
                f"{option} does not apply with --disaggregated (it sizes the scenario's own "
                "speculation and speculation off)",
                key=option,
                fix=f"drop {option}, or set the scenario's speculation with --set",
            )
    planned = disaggregated_run(
        args.scenario,
        args.overrides,
        args.target_rps,
        args.tolerance,
        args.attainment,
        args.max_replicas,
        args.seed,
        args.out,
        sweep_options(args),
        deployment_search(args),
        emit_request(args),
    )
    refuse_all_failed(planned.summary)
    write_disaggregated(args.out, planned)
    summary = planned.summary
    human = disagg_report.human(summary)
    engine = engine_line(summary)
    if engine:
        human += f"\n{engine}"
    emit(args, summary, human + f"\nreport: {args.out}/report.html")
    return 1 if summary["failed"] else 0
