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
from specsim.cli.common import SEED, Number, add_json, add_out, add_set, emit
from specsim.errors import SpecsimError

MAX_DISAGG_REPLICAS = 64  # --max-replicas: the (x, y) grid grows as its square

MAX_WORKERS = 4096
SCREEN_FROM = 200  # as specsim.planning.sweep.screen.SCREEN_FROM (a test holds them equal)
# As specsim.profile.schema.TREE_DRAFTS (a test holds them equal).
TREE_DRAFTS = ("top-k", "iid", "without-replacement")

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


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    """Options every sweeping command shares (also used by ``specsim report``)."""
    parser.add_argument(
        "--workers",
        type=Number(int, 1, MAX_WORKERS),
        default=None,
        metavar="N",
        help="local worker processes (default: the CPUs available to this process)",
    )
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        default=None,
        help="run the sweep on a Dask distributed scheduler at HOST:PORT, tcp://HOST:PORT or "
        "tls://HOST:PORT instead; its results are unpickled here, so use only a cluster you "
        "trust (a tls:// address without the options below takes Dask's TLS configuration)",
    )
    parser.add_argument(
        "--cluster-tls-ca-file",
        metavar="PEM",
        default=None,
        help="TLS to the cluster: the CA certificate that signed the cluster's certificates",
    )
    parser.add_argument(
        "--cluster-tls-cert",
        metavar="PEM",
        default=None,
        help="TLS to the cluster: this client's certificate (Dask's TLS is mutual)",
    )
    parser.add_argument(
        "--cluster-tls-key",
        metavar="PEM",
        default=None,
        help="TLS to the cluster: this client's private key, unless it is in the certificate",
    )
    parser.add_argument(
        "--seed",
        type=SEED,
        default=None,
        metavar="SEED",
        help="seed for every simulation (default: the scenario's seed)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr (there is none when stderr is not a terminal)",
    )


def add_emit_options(parser: argparse.ArgumentParser, disaggregated: bool = False) -> None:
    """``--emit`` and ``--model``: the recommended setting in the engines' own configuration.
    ``disaggregated``: the command has ``--disaggregated``, whose files the help names."""
    split = (
        " (with --disaggregated: each pool's, vllm-prefill.args and the like, and "
        "trtllm-disagg.yaml for the router)"
    )
    parser.add_argument(
        "--emit",
        default=None,
        metavar="ENGINES",
        help="also write the recommended setting in these engines' own configuration, a "
        "comma-separated subset of vllm,sglang,trtllm: DIR/engine/vllm.json and vllm.args, "
        "sglang.args, trtllm.yaml, and bench.sh with the load tests that check the prediction"
        + (split if disaggregated else ""),
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="with --emit: the Hugging Face id or folder the engine loads for the target "
        "(target=meta-llama/Llama-3.1-8B-Instruct) or a drafter of the profile (repeatable; "
        "default: the profile's description when it reads as OWNER/NAME, else a placeholder "
        "the files tell you to replace)",
    )


def emit_request(args: argparse.Namespace):
    from specsim.planning.emit.emit import emit_request

    return emit_request(args.emit, args.model)


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """Tree shapes beside the chains: given ones, or SGLang's (steps, topk, tokens) space."""
    parser.add_argument(
        "--trees",
        nargs="+",
        default=None,
        metavar="SHAPE",
        help="speculation trees to try beside the chains at every load: children per node at "
        "each depth (2,2,1) or a JSON list of paths ([[0],[1],[0,0]]); the report says where "
        "trees beat chains, where chains win and where both lose to k = 0",
    )
    for flag, what, default in (
        ("--tree-steps", "SGLang's --speculative-num-steps (tree depth)", "1,3,5,7"),
        ("--tree-topk", "SGLang's --speculative-eagle-topk (children per beam)", "1,2,4,8"),
        ("--tree-tokens", "SGLang's --speculative-num-draft-tokens (nodes + 1)", "2,4,8,16,32"),
    ):
        parser.add_argument(
            flag,
            default=None,
            metavar="N",
            help=f"search trees over {what}, e.g. 1..4 or 2,4 (default {default}, as SGLang's "
            "bench_speculative); each (steps, topk, tokens) becomes the static tree SGLang "
            "builds when its scores are the profile's acceptance",
        )
    parser.add_argument(
        "--tree-drafts",
        default=None,
        choices=TREE_DRAFTS,
        help="how the trees' children are drafted (default: the scenario's "
        "speculation.tree_drafts); picks the profile's tree acceptance",
    )


def tree_options(args: argparse.Namespace) -> dict:
    from specsim.planning.trees import SglangSpace, given_trees

    given = given_trees(args.trees)
    space = SglangSpace.parse(args.tree_steps, args.tree_topk, args.tree_tokens)
    return {"trees": given, "space": space, "tree_drafts": args.tree_drafts}


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
    _deployment_options(capacity)
    _common(capacity, disaggregated=True)


def _deployment_options(parser: argparse.ArgumentParser) -> None:
    """The tensor-parallel and precision choices ``plan capacity`` searches."""
    group = parser.add_argument_group(
        "deployments (TP x precision; default: the scenario's profile only)"
    )
    group.add_argument(
        "--profile",
        action="append",
        default=None,
        metavar="PROFILE",
        help="a deployment given as a profile, with the TP and precision it describes (repeatable)",
    )
    group.add_argument(
        "--tp",
        default=None,
        metavar="N[,N...]",
        help="tensor-parallel sizes to build roofline deployments for, e.g. 2,4,8 (with "
        "--hardware and --target-model; default 1)",
    )
    group.add_argument(
        "--precision",
        action="append",
        default=None,
        metavar="DTYPE[/DTYPE]",
        help="weight[/KV-cache] formats of the roofline deployments, e.g. bf16,fp8 or int4/fp8 "
        "(weights bf16, fp16, fp8, int4, nvfp4 or mxfp4; the KV cache follows the weights "
        "where it can; default bf16)",
    )
    group.add_argument("--hardware", metavar="HW", help="hardware spec YAML for the roofline")
    group.add_argument(
        "--target-model", metavar="CONFIG", help="the target's config.json for the roofline"
    )
    group.add_argument(
        "--draft-model",
        action="append",
        default=None,
        metavar="NAME=MODEL",
        help="a drafter of the roofline deployments: NAME=MODEL (a config.json), NAME=ngram or "
        "NAME=ngram:N (repeatable; as profile roofline takes it)",
    )
    group.add_argument(
        "--acceptance-from",
        metavar="FILE",
        help="acceptance for the roofline deployments (an acceptance file or a profile)",
    )
    group.add_argument(
        "--draft-tp",
        type=Number(int, 1, 1),
        default=None,
        metavar="N",
        help="devices a draft model spans: only 1, draft models on one device (default: "
        "sharded like the target, vLLM's default)",
    )
    group.add_argument(
        "--enable-expert-parallel",
        "--ep",
        dest="expert_parallel",
        action="store_true",
        help="a mixture of experts' experts dealt out whole over each TP above 1 (vLLM's flag)",
    )


def _common(parser: argparse.ArgumentParser, disaggregated: bool = False) -> None:
    add_sweep_options(parser)
    add_emit_options(parser, disaggregated)
    add_set(parser)
    add_out(parser)
    add_json(parser)


def sweep_options(args: argparse.Namespace):
    from specsim.api.plan import SweepOptions
    from specsim.planning.sweep.cluster import ClusterTls

    tls = ClusterTls(args.cluster_tls_ca_file, args.cluster_tls_cert, args.cluster_tls_key)
    return SweepOptions(args.workers, args.cluster, tls, not args.no_progress)


def finish(args, planned, human: str) -> int:
    """Write the report files atomically, print the summary, and pick the exit code."""
    from specsim.api.plan import refuse_all_failed, write_plan
    from specsim.planning.emit.emit import human as engine_line

    refuse_all_failed(planned.summary)
    write_plan(args.out, planned)
    summary = planned.summary
    if summary["failed"]:
        human += f"\n{len(summary['failed'])} simulations failed (listed in summary.json)"
    engine = engine_line(summary)
    if engine:
        human += f"\n{engine}"
    emit(args, summary, human + f"\nreport: {args.out}/report.html")
    return 1 if summary["failed"] else 0


def run(args: argparse.Namespace) -> int:
    if args.plan == "window":
        return _window(args)
    return _capacity(args)


def _window(args: argparse.Namespace) -> int:
    from specsim.api.plan import window_run
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
    from specsim.api.plan import capacity_run
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
        _deployment(args),
        compared_policies(args.policies, "plan capacity"),
    )
    human = capacity_report.human(planned.plan, planned.summary)
    if planned.plan.policies:
        human += "\n" + capacity_policies.human(planned.summary)
    return finish(args, planned, human)


def _deployment(args: argparse.Namespace):
    """The deployment search the options ask for (None: the scenario's own profile)."""
    from specsim.planning.capacity.capacity_deploy import deployment_request

    return deployment_request(
        args.profile,
        args.tp,
        args.precision,
        args.hardware,
        args.target_model,
        args.draft_model,
        args.acceptance_from,
        args.draft_tp,
        args.expert_parallel,
    )


def _disaggregated(args: argparse.Namespace) -> int:
    from specsim.api.plan import refuse_all_failed
    from specsim.api.plan_split import disaggregated_run, write_disaggregated
    from specsim.planning.capacity import disagg_report
    from specsim.planning.emit.emit_split import human as engine_line

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
        _deployment(args),
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
