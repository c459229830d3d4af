"""The options ``specsim plan`` and ``specsim report`` share, and what they become: the sweep
(workers, cluster, seed), ``--emit``, the tree search, the deployments ``plan capacity``
searches, and the write-and-print step every planning command ends with.
"""

from __future__ import annotations

import argparse

from specsim.cli.common import SEED, Number, emit

MAX_WORKERS = 4096
# As specsim.profile.schema.TREE_DRAFTS (a test holds them equal).
TREE_DRAFTS = ("top-k", "iid", "without-replacement")


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


def add_deployment_options(parser: argparse.ArgumentParser) -> None:
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


def sweep_options(args: argparse.Namespace):
    from specsim.api.plan_run import SweepOptions
    from specsim.planning.sweep.cluster import ClusterTls

    tls = ClusterTls(args.cluster_tls_ca_file, args.cluster_tls_cert, args.cluster_tls_key)
    return SweepOptions(args.workers, args.cluster, tls, not args.no_progress)


def finish(args, planned, human: str) -> int:
    """Write the report files atomically, print the summary, and pick the exit code."""
    from specsim.api.plan_run import refuse_all_failed, write_plan
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


def deployment_search(args: argparse.Namespace):
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
