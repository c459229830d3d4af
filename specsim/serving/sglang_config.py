"""SGLang's server arguments for a recommended setting: ``sglang.args``.

The options are SGLang 0.5.23's (engine-formats.md §4.5): ``--speculative-algorithm``,
``--speculative-draft-model-path``, ``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``, ``--max-running-requests`` and ``--tp-size``. specsim's
chain is topk 1 with draft tokens steps + 1, which SGLang enforces. A tree is SGLang's three
knobs: the (num_steps, topk, num_draft_tokens) the plan searched (``planning.trees``), or for a
given shape its depth, its widest node's children and its nodes + 1, when SGLang's beams can
hold it (at most topk nodes per depth expand, §4.5); SGLang rebuilds its tree every step from
the drafter's scores, so the knobs set its budget and the shape is the plan's stand-in.
SGLang has no batch-size schedule: a k-by-batch table is written as the static k the plan found
best at its chosen load, and said so. Adaptive steps (``policy: adaptive_steps``) are
``--speculative-adaptive`` with ``--speculative-adaptive-config sglang-adaptive.json``, the
tiers and constants beside the arguments (EAGLE/EAGLE3 chains only, as SGLang runs them).
The scenario's KV block size is ``--page-size``; the
radix cache (prefix reuse) is left on, SGLang's default, which has no flag to enable it (§4.8).
A split fleet's pool adds ``--disaggregation-mode`` and its transfer backend (§4.8). ``check``
holds the arguments to §4.5 and §4.8 first.
"""

from __future__ import annotations

import json
import shlex

from specsim.serving.setting import (
    EngineSetting,
    Rendered,
    Speculative,
    args_text,
    draft_tp_unexpressed,
    engine_method,
    header_lines,
    medusa_refusal,
    method_refusal,
    role_file,
    unknown_formats,
    use,
    violation,
)
from specsim.serving.setting import comment_block as comments

ARGS_FILE = "sglang.args"
ADAPTIVE_FILE = "sglang-adaptive.json"  # --speculative-adaptive-config's file
# SGLang runs adaptive steps for these only, with topk 1 (adaptive_spec_params.py
# adaptive_unsupported_reason); for others it logs a warning and keeps the static steps.
ADAPTIVE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3"})

# The algorithm per specsim drafter kind: a separate draft model is STANDALONE, prompt lookup
# NGRAM, heads EAGLE, the target's MTP layers EAGLE (SGLang's NEXTN resolves to it, §4.5).
KIND_METHODS = {
    "draft_model": "STANDALONE",
    "ngram": "NGRAM",
    "heads": "EAGLE",
    "heads-eagle3": "EAGLE3",
    "mtp": "EAGLE",
    "dflash": "DFLASH",
    "dspark": "DSPARK",
}
# One draft pass per step: SGLang forces num_steps and topk to 1 and verifies the
# last token plus k drafts (speculative_hook.py, _handle_dflash / _handle_dspark).
BLOCK_ALGORITHMS = frozenset({"DFLASH", "DSPARK"})
ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"})
CHAIN_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})  # steps, topk, tokens
FLAGS = frozenset(
    {
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--speculative-ngram-max-bfs-breadth",
        "--disable-overlap-schedule",
        "--max-running-requests",
        "--tp-size",
        "--ep-size",
        "--disaggregation-mode",
        "--disaggregation-transfer-backend",
        "--page-size",
        "--speculative-adaptive",
        "--speculative-adaptive-config",
    }
)
# A split fleet's pools (§4.8): each server's mode, and the KV transfer engine between them.
DISAGGREGATION_MODES = frozenset({"prefill", "decode"})
TRANSFER_BACKENDS = frozenset({"mooncake", "nixl"})
TRANSFER_BACKEND = "mooncake"  # SGLang's default transfer engine, written out
ROUTER = (
    "python -m sglang_router.launch_router --pd-disaggregation "
    "--prefill http://PREFILL_HOST:PORT ... --decode http://DECODE_HOST:PORT ... (one "
    "--prefill per prefill server, one --decode per decode server)"
)


def algorithm(spec: Speculative) -> str:
    """SGLang's algorithm for the drafter (``KIND_METHODS``)."""
    return engine_method(KIND_METHODS, spec, "SGLang")


def tree_knobs(spec: Speculative) -> tuple[int, int, int] | str:
    """(num_steps, topk, num_draft_tokens) of the setting's tree, or why SGLang cannot hold it."""
    if spec.sglang_knobs is not None:
        return spec.sglang_knobs
    shape = spec.tree
    topk = max(len(shape.children(node)) for node in (-1, *range(shape.num_nodes)))
    for depth in range(1, shape.depth):
        expanding = [i for i in range(shape.num_nodes) if shape.depths[i] == depth]
        expanding = [i for i in expanding if shape.children(i)]
        if len(expanding) > topk:
            return (
                f"{len(expanding)} nodes at depth {depth} have children, but SGLang expands only "
                f"its topk = {topk} best nodes per depth (§4.5)"
            )
    return shape.depth, topk, shape.num_nodes + 1


def refuses(setting: EngineSetting) -> str | None:
    """Why SGLang cannot run the setting's tree (None: it can, or there is no tree)."""
    if missing := method_refusal(setting, KIND_METHODS, "SGLang 0.5.23"):
        return missing
    spec = setting.speculation
    medusa = medusa_refusal(setting, "SGLang", "§4.5: its builtin algorithms")
    if medusa is not None or spec is None or spec.tree is None:
        return medusa
    if algorithm(spec) == "NGRAM":
        return "SGLang's NGRAM builds its own trie-based tree, not a drafted one (§4.5)"
    knobs = tree_knobs(spec)
    return knobs if isinstance(knobs, str) else None


def arguments(setting: EngineSetting, k: int) -> list[tuple[str, str | None]]:
    """The options for window ``k`` (0: the plain server, no speculative option at all)."""
    spec = setting.speculation
    out: list[tuple[str, str]] = []
    if spec is not None and k > 0:
        name = algorithm(spec)
        out.append(("--speculative-algorithm", name))
        if name == "NGRAM":
            # NGRAM's topk is its BFS breadth (an --speculative-eagle-topk is replaced by it):
            # breadth 1 drafts a chain. Its draft tokens are taken to count the root as a
            # chain's do (§4.5 does not say).
            out.append(("--speculative-ngram-max-bfs-breadth", "1"))
        elif spec.tree is not None:
            steps, topk, tokens = tree_knobs(spec)
            out.append(("--speculative-draft-model-path", draft_path(setting)))
            out.append(("--speculative-num-steps", str(steps)))
            out.append(("--speculative-eagle-topk", str(topk)))
        else:
            out.append(("--speculative-draft-model-path", draft_path(setting)))
            out.append(("--speculative-num-steps", "1" if name in BLOCK_ALGORITHMS else str(k)))
            out.append(("--speculative-eagle-topk", "1"))
        tokens = tree_knobs(spec)[2] if spec.tree is not None and name != "NGRAM" else k + 1
        out.append(("--speculative-num-draft-tokens", str(tokens)))
        if spec.tree is not None:
            # SGLang's overlap scheduler runs topk-1 chains only and refuses a tree without this.
            out.append(("--disable-overlap-schedule", None))
        if adaptive(spec):
            out.append(("--speculative-adaptive", None))
            out.append(("--speculative-adaptive-config", role_file(ADAPTIVE_FILE, setting.role)))
    # Always given: with speculation SGLang would otherwise reset it to 48 (§4.5).
    out.append(("--max-running-requests", str(setting.max_batch)))
    out.append(("--tp-size", str(setting.tensor_parallel_size)))
    if setting.expert_parallel:
        # ServerArgs.ep_size (sglang/srt/arg_groups/fields/parallel.py): experts over every device.
        out.append(("--ep-size", str(setting.tensor_parallel_size)))
    if setting.block_size is not None:
        # Tokens per KV page, as the scenario's engine.block_size counts them (§4.8).
        out.append(("--page-size", str(setting.block_size)))
    if setting.role is not None:
        out.append(("--disaggregation-mode", setting.role))
        out.append(("--disaggregation-transfer-backend", TRANSFER_BACKEND))
    return out


def adaptive(spec: Speculative) -> bool:
    """Whether SGLang runs the setting's adaptive steps (EAGLE or EAGLE3 chains)."""
    chain = spec.tree is None
    return spec.adaptive_steps is not None and chain and algorithm(spec) in ADAPTIVE_ALGORITHMS


def adaptive_steps(config: dict) -> list[int]:
    """Every tier's candidate steps (SGLang's resolve_candidate_steps_from_config)."""
    tiers = [entry for key, entry in config.items() if key.isdigit()]
    return sorted({s for entry in tiers for s in entry.get("candidate_steps", [])})


def draft_path(setting: EngineSetting) -> str:
    """The drafter's checkpoint: its own, or for MTP the target's, which holds the NextN layers
    (SGLang's default draft path for DeepSeek-V3, written out, §4.5)."""
    spec = setting.speculation
    return setting.target.path if spec.is_mtp else spec.model.path


def check(options: list[tuple[str, str]], args_file: str = ARGS_FILE) -> None:
    """Refuse arguments SGLang 0.5.23 rejects or would change (§4.5, §4.8)."""
    given = dict(options)
    for flag in given:
        if flag not in FLAGS:
            raise violation(args_file, flag, "is not an option this writer knows", "§4.5")
    if "--max-running-requests" not in given:
        raise violation(args_file, "--max-running-requests", "unset, it becomes 48", "§4.5")
    page = given.get("--page-size")
    if page is not None and _count(given, "--page-size") < 1:
        raise violation(args_file, "--page-size", f"{page!r} is not a whole number above 0", "§4.8")
    mode = given.get("--disaggregation-mode")
    if mode is not None and mode not in DISAGGREGATION_MODES:
        raise violation(args_file, "--disaggregation-mode", f"{mode!r} is not a pool", "§4.8")
    backend = given.get("--disaggregation-transfer-backend")
    if (mode is None) != (backend is None) or (backend and backend not in TRANSFER_BACKENDS):
        flag = "--disaggregation-transfer-backend"
        raise violation(args_file, flag, "needs a mode and mooncake or nixl", "§4.8")
    name = given.get("--speculative-algorithm")
    if name is None:
        spec_flags = [f for f in given if f.startswith("--speculative")]
        if spec_flags:
            raise violation(args_file, spec_flags[0], "without an algorithm", "§4.5")
        return
    if name not in ALGORITHMS:
        raise violation(args_file, "--speculative-algorithm", f"{name!r} is unknown", "§4.5")
    tokens = _count(given, "--speculative-num-draft-tokens")
    if name == "NGRAM":
        if "--speculative-draft-model-path" in given:
            raise violation(args_file, "--speculative-draft-model-path", "NGRAM has none", "§4.5")
        if "--speculative-eagle-topk" in given:
            raise violation(args_file, "--speculative-eagle-topk", "NGRAM replaces it", "§4.5")
        if tokens < 2:
            raise violation(args_file, "--speculative-num-draft-tokens", "below 2", "§4.5")
        return
    if name in CHAIN_ALGORITHMS | BLOCK_ALGORITHMS and not given.get(
        "--speculative-draft-model-path"
    ):
        raise violation(args_file, "--speculative-draft-model-path", f"{name} needs one", "§4.5")
    if name in BLOCK_ALGORITHMS:
        if given.get("--speculative-num-steps") != "1" or tokens < 2:
            flag = "--speculative-num-steps"
            raise violation(args_file, flag, f"{name} drafts in 1 step of 2+ tokens", "§4.5")
        return
    steps = _count(given, "--speculative-num-steps")
    topk = _count(given, "--speculative-eagle-topk")
    if min(steps, topk, tokens) < 1:
        # Unset, SGLang picks its own (steps, topk, draft tokens) for the model.
        raise violation(args_file, "--speculative-num-steps", "needs topk and tokens", "§4.5")
    if topk == 1 and tokens != steps + 1:
        raise violation(args_file, "--speculative-num-draft-tokens", "is not steps + 1", "§4.5")
    if tokens > steps * topk + 1:
        # More than the nodes SGLang drafts: bench_speculative refuses it (§4.7).
        flag = "--speculative-num-draft-tokens"
        raise violation(args_file, flag, "is above steps x topk + 1", "§4.7")
    if "--speculative-adaptive" in given:
        _check_adaptive(given, name, steps, topk, args_file)


def _check_adaptive(given: dict, name: str, steps: int, topk: int, args_file: str) -> None:
    """SGLang's adaptive steps run for EAGLE/EAGLE3 chains, from the config file the flag
    names (its checks: adaptive_spec_params.py, speculative_hook.py)."""
    if name not in ADAPTIVE_ALGORITHMS or topk != 1:
        raise violation(args_file, "--speculative-adaptive", "needs EAGLE(3) with topk 1", "§4.5")
    if not given.get("--speculative-adaptive-config"):
        # Without one SGLang runs its built-in tiers, not the plan's.
        flag = "--speculative-adaptive-config"
        raise violation(args_file, flag, "must name the plan's config file", "§4.5")


def check_adaptive_config(config: dict, steps: int) -> None:
    """The config SGLang's _load_adaptive_config accepts: at least one tier (an integer key)
    with a non-empty list of non-negative whole candidate steps; and the initial steps among
    them (SGLang raises otherwise)."""
    tiers = {key: entry for key, entry in config.items() if key.isdigit()}
    if not tiers:
        raise violation(ADAPTIVE_FILE, "tiers", "needs an integer batch-size key", "§4.5")
    for key, entry in tiers.items():
        candidates = entry.get("candidate_steps")
        whole = isinstance(candidates, list) and candidates
        if not whole or not all(isinstance(c, int) and c >= 0 for c in candidates):
            raise violation(ADAPTIVE_FILE, f"{key}.candidate_steps", "non-negative ints", "§4.5")
    if steps not in adaptive_steps(config):
        flag = "--speculative-num-steps"
        raise violation(ARGS_FILE, flag, "is not among the adaptive candidate steps", "§4.5")


def _count(given: dict[str, str], flag: str) -> int:
    text = given.get(flag, "0")
    return int(text) if text.isdigit() else -1


def not_expressible(setting: EngineSetting) -> list[str]:
    notes = list(setting.unexpressed)
    spec = setting.speculation
    if spec is None:
        return notes
    if spec.adaptive_steps is not None and not adaptive(spec):
        notes.append(
            f"adaptive steps: SGLang runs them for EAGLE/EAGLE3 chains only, not "
            f"{algorithm(spec)}{' trees' if spec.tree is not None else ''} (it would warn and "
            f"keep the static steps); written with k = {spec.k}, the initial steps"
        )
    if spec.adaptive_verification:
        notes.append(
            "vLLM's adaptive verification: SGLang 0.5.23's nearest rule, DSpark's ragged-verify "
            "budget (SGLANG_RAGGED_VERIFY_MODE, --speculative-dspark-sps-table-path), needs a "
            f"step-cost table profiled on the server; written with k = {spec.k}, every draft "
            "verified"
        )
    if spec.max_concurrency is not None and not spec.by_batch:
        notes.append(
            f"max_concurrency {spec.max_concurrency}: SGLang has no cut-off by batch size "
            "(§4.5); written without it, so speculation stays on at every batch"
        )
    if spec.acceptance_gate is not None:
        notes.append(
            "the acceptance off-switch (TensorRT-LLM's acceptance_rate_threshold): SGLang has "
            "none (§4.5); written without it, so speculation stays on however acceptance falls"
        )
    if spec.by_batch:
        fallback = f"k = {spec.fallback_k}" if spec.fallback_k else "speculation off"
        notes.append(
            "the k-by-batch table: SGLang has no batch-size schedule (its speculative_adaptive "
            "follows acceptance, not the batch, §4.5); written instead: "
            f"{fallback}, the best static choice at the plan's chosen load"
        )
    if spec.tree is not None and spec.tree_drafts not in (None, "top-k"):
        notes.append(
            f"the plan's tree drafts its children {spec.tree_drafts}; SGLang's EAGLE tree takes "
            "the drafter's top-k, so its acceptance will follow the profile's top-k trees"
        )
    if setting.verifier == "typical":
        notes.append(
            "verifier typical: SGLang's relaxed acceptance (speculative_accept_threshold_*) is "
            "another rule; written with its default verification"
        )
    return notes + draft_tp_unexpressed(setting, "SGLang", "§4.5")


def notes(setting: EngineSetting) -> list[str]:
    spec = setting.speculation
    formats = unknown_formats(setting, "SGLang")
    if setting.prefix_caching:
        formats.append(
            "the scenario's workload.prefix assumes prefix caching on: SGLang's radix cache is "
            "on by default and has no flag to enable it (--disable-radix-cache turns it off), "
            "so none is written (§4.8)"
        )
    if spec is not None and spec.tree is not None:
        formats.append(
            f"SGLang rebuilds its tree each step from the drafter's scores: the three knobs set "
            f"its depth, beams and node budget, and the plan's {spec.tree.describe()} is the "
            "static tree it stands for; --disable-overlap-schedule is written because SGLang's "
            "overlap scheduler runs topk-1 chains only"
        )
    if spec is not None and spec.is_mtp:
        formats.append(
            "the target's MTP (NextN) layers run as SGLang's EAGLE algorithm with the target's "
            "checkpoint as the draft model path (NEXTN resolves to EAGLE; for DeepSeek-V3 the "
            "draft path defaults to the target's, §4.5)"
        )
    if spec is None or algorithm(spec) != "NGRAM":
        return formats
    return [
        *formats,
        "SGLang's NGRAM drafts from a trie of earlier n-grams (§4.5), not from the last n "
        "tokens' latest earlier match as specsim's prompt lookup does, so its acceptance can "
        "differ from the profile's; its draft-token count is taken to include the verified "
        "token, as a chain's does (§4.5 does not say)",
    ]


def render(setting: EngineSetting, header: list[str]) -> Rendered:
    spec = setting.speculation
    k = 0 if spec is None else (spec.fallback_k if spec.by_batch else spec.k)
    options = arguments(setting, k)
    args_file = role_file(ARGS_FILE, setting.role)
    check(options, args_file)
    missing, remarks = not_expressible(setting), notes(setting)
    launch = f"python -m sglang.launch_server --model-path {shlex.quote(setting.target.path)}"
    start = use(launch, args_file)
    usage = ["Start the server from this folder (--model-path names the target):", f"  {start}"]
    top = header_lines(header, missing, remarks, usage)
    written = {
        flag.removeprefix("--").replace("-", "_"): True
        if value is None
        else int(value)
        if value.isdigit()
        else value
        for flag, value in options
    }
    files = {args_file: args_text(comments(top), options)}
    if "--speculative-adaptive" in dict(options):
        # The config file sits beside the arguments, which name it by its bare file name.
        check_adaptive_config(spec.adaptive_steps, k)
        text = json.dumps(spec.adaptive_steps, indent=2) + "\n"
        files[role_file(ADAPTIVE_FILE, setting.role)] = text
    return Rendered("sglang", files, written, missing, remarks, start)
