"""TensorRT-LLM's LLM-API options for a recommended setting: ``trtllm.yaml``.

The file is what ``trtllm-serve`` and ``trtllm-bench`` take with ``--extra_llm_api_options``
(engine-formats.md §5.1): ``max_batch_size``, ``max_num_tokens``, ``tensor_parallel_size``
(§5.5) and, when speculating, ``speculative_config`` with the class literal ``decoding_type``
(``Draft_Target``, ``NGram``, ``Eagle``/``Eagle3``, ``MTP``; §5.2), ``max_draft_len``,
``speculative_model`` and for a k-by-batch table ``draft_len_schedule`` (§5.3): keys are
inclusive upper bounds of the running batch, larger batches draft nothing, and the value at the
smallest key must equal ``max_draft_len``. A static k's cut-off is ``max_concurrency`` (which
TensorRT-LLM turns into the schedule {max_concurrency: max_draft_len}; the two are exclusive),
and the acceptance off-switch ``acceptance_rate_threshold`` with
``acceptance_rate_window_size`` (DecodingBaseConfig, §5.3; ``simulation/engine_policies.py``).
A tree is Eagle's static ``eagle_choices`` (the
paths of child ranks, specsim's own form) with ``max_draft_len`` its depth (§5.4); the other
decoding types draft chains only. The scenario's KV block size is ``kv_cache_config``'s
``tokens_per_block`` and cached prefixes its ``enable_block_reuse``; a split fleet's servers add
``cache_transceiver_config`` and ``trtllm-disagg.yaml`` holds the router's (§5.7). ``check``
holds the options to §5.2-5.5 and §5.7 first.
"""

from __future__ import annotations

import shlex
from typing import Any

from specsim.fileio import dump_yaml
from specsim.serving.setting import (
    EngineSetting,
    Rendered,
    Speculative,
    draft_tp_unexpressed,
    engine_method,
    header_lines,
    medusa_refusal,
    method_refusal,
    role_file,
    unknown_formats,
    violation,
)
from specsim.serving.setting import comment_block as comments

YAML_FILE = "trtllm.yaml"

# The decoding_type per specsim drafter kind (§5.2: the docs write ``DraftTarget``, the class
# says ``Draft_Target``); the target's MTP layers are ``MTP``, loaded from its checkpoint.
KIND_METHODS = {
    "draft_model": "Draft_Target",
    "ngram": "NGram",
    "heads": "Eagle",
    "heads-eagle3": "Eagle3",
    "mtp": "MTP",
    "dflash": "DFlash",
    "dspark": "DSpark",
    "pard": "PARD",
}
DECODING_TYPES = frozenset(
    {"Draft_Target", "Eagle3", "Eagle", "MTP", "NGram", "SA", "PARD", "DFlash", "DSpark"}
)
NEEDS_MODEL = frozenset({"Draft_Target", "Eagle", "Eagle3"})  # §5.4
TOP_KEYS = frozenset(
    {
        "max_batch_size",
        "max_num_tokens",
        "tensor_parallel_size",
        "moe_expert_parallel_size",
        "cache_transceiver_config",
        "kv_cache_config",
    }
)
KV_CACHE_KEYS = frozenset({"tokens_per_block", "enable_block_reuse"})  # KvCacheConfig (§5.7)
# A split fleet's servers move the KV cache through a cache transceiver (§5.7).
TRANSCEIVER_BACKENDS = frozenset({"DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"})
DISAGG_FILE = "trtllm-disagg.yaml"  # trtllm-serve disaggregated's own configuration
FIRST_PORT = 8001  # the context servers' ports count up from it, then the generation servers'
ROUTER_PORT = 8000
ROUTER = f"trtllm-serve disaggregated -c {DISAGG_FILE}"
SPEC_KEYS = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "speculative_model",
        "draft_len_schedule",
        "max_matching_ngram_size",
        "max_concurrency",
        "eagle_choices",
        "acceptance_rate_threshold",
        "acceptance_rate_window_size",
    }
)
TREE_TYPES = frozenset({"Eagle", "Eagle3"})  # eagle_choices (§5.4)


def refuses(setting: EngineSetting) -> str | None:
    """Why TensorRT-LLM cannot run the setting's tree (None: it can, or there is none)."""
    if missing := method_refusal(setting, KIND_METHODS, "TensorRT-LLM"):
        return missing
    spec = setting.speculation
    medusa = medusa_refusal(setting, "TensorRT-LLM", "§5.2: Medusa left its decoding configs")
    if medusa is not None or spec is None or spec.tree is None:
        return medusa
    if decoding_type(spec) in TREE_TYPES:
        return None
    return (
        f"TensorRT-LLM's {decoding_type(spec)} decoding drafts a chain only; trees "
        "(eagle_choices) are Eagle/Eagle3's, for decoding-head drafters (§5.4)"
    )


def decoding_type(spec: Speculative) -> str:
    """The class literal for the drafter (``KIND_METHODS``)."""
    return engine_method(KIND_METHODS, spec, "TensorRT-LLM")


def draft_len_schedule(spec: Speculative) -> tuple[dict[int, int], str | None]:
    """specsim's rows as the schedule, and the note when it had to change to be valid.

    The smallest batch must draft the most tokens (§5.3). When the table's first row does not,
    the nearest valid schedule changes the fewest batch sizes: the later rows capped at the
    first row's k, or the first row raised to the largest k (always, when the first is 0).
    """
    rows = spec.by_batch
    first, top = rows[0].k, max(row.k for row in rows)
    if first == top:
        return {row.max_batch: row.k for row in rows}, None
    widths = [row.max_batch - (rows[i - 1].max_batch if i else 0) for i, row in enumerate(rows)]
    capped = sum(w for w, row in zip(widths, rows, strict=True) if row.k > first)
    why = f"a k-by-batch table whose first row (k = {first}) is not its largest k (k = {top}): "
    why += "draft_len_schedule's smallest batch must draft max_draft_len (§5.3); written with "
    if first > 0 and capped <= widths[0]:
        schedule = {row.max_batch: min(row.k, first) for row in rows}
        return schedule, why + f"the later rows capped at k = {first}"
    schedule = {row.max_batch: (top if i == 0 else row.k) for i, row in enumerate(rows)}
    return schedule, why + f"the first row (batches 1-{rows[0].max_batch}) at k = {top}"


def options(setting: EngineSetting) -> tuple[dict[str, Any], list[str]]:
    """The YAML mapping, and the notes on what could not be written as planned."""
    out: dict[str, Any] = {
        "max_batch_size": setting.max_batch,
        "max_num_tokens": setting.max_batched_tokens,
        "tensor_parallel_size": setting.tensor_parallel_size,
    }
    if setting.expert_parallel:
        # BaseLlmArgs.moe_expert_parallel_size (llmapi/llm_args.py): experts over every device.
        out["moe_expert_parallel_size"] = setting.tensor_parallel_size
    cache = kv_cache_config(setting)
    if cache:
        out["kv_cache_config"] = cache
    if setting.role is not None:
        out["cache_transceiver_config"] = {"backend": "DEFAULT"}
    notes: list[str] = []
    spec = setting.speculation
    if spec is None:
        return out, notes
    name = decoding_type(spec)
    config: dict[str, Any] = {"decoding_type": name}
    if spec.by_batch:
        schedule, note = draft_len_schedule(spec)
        config["max_draft_len"] = schedule[min(schedule)]
        if note:
            notes.append(note)
    else:
        schedule = None
        config["max_draft_len"] = spec.k
    if spec.model is not None:
        config["speculative_model"] = spec.model.path
    if spec.tree is not None:
        config["max_draft_len"] = spec.tree.depth  # TensorRT-LLM resets it to the depth (§5.4)
        config["eagle_choices"] = spec.tree.to_paths()
    if name == "NGram":
        config["max_matching_ngram_size"] = spec.ngram_size
    if schedule is not None:
        config["draft_len_schedule"] = schedule
    elif spec.max_concurrency is not None:
        config["max_concurrency"] = spec.max_concurrency  # {max_concurrency: max_draft_len}
    if spec.acceptance_gate is not None:
        config["acceptance_rate_threshold"], config["acceptance_rate_window_size"] = (
            spec.acceptance_gate
        )
    out["speculative_config"] = config
    return out, notes


def kv_cache_config(setting: EngineSetting) -> dict[str, Any]:
    """The scenario's KV block size as ``tokens_per_block``, and block reuse when its requests
    hit cached prefixes (on by default; written to state what the plan assumed, §5.7)."""
    out: dict[str, Any] = {}
    if setting.block_size is not None:
        out["tokens_per_block"] = setting.block_size
    if setting.prefix_caching:
        out["enable_block_reuse"] = True
    return out


def check(document: dict[str, Any], yaml_file: str = YAML_FILE) -> None:
    """Refuse options TensorRT-LLM rejects (§5.2-5.5)."""
    for key in document:
        if key not in TOP_KEYS | {"speculative_config"}:
            raise violation(yaml_file, key, "is not an option this writer knows", "§5.5")
    for key in ("max_batch_size", "max_num_tokens", "tensor_parallel_size"):
        if not _whole(document.get(key)) or document[key] < 1:
            raise violation(yaml_file, key, "must be a whole number above 0", "§5.5")
    cache = document.get("kv_cache_config") or {}
    for key in cache:
        if key not in KV_CACHE_KEYS:
            raise violation(yaml_file, f"kv_cache_config.{key}", "is not known", "§5.7")
    tokens = cache.get("tokens_per_block", 1)
    if not _whole(tokens) or tokens < 1:
        raise violation(yaml_file, "kv_cache_config.tokens_per_block", "must be > 0", "§5.7")
    if not isinstance(cache.get("enable_block_reuse", True), bool):
        raise violation(yaml_file, "kv_cache_config.enable_block_reuse", "not a bool", "§5.7")
    transceiver = document.get("cache_transceiver_config")
    if transceiver is not None and transceiver.get("backend") not in TRANSCEIVER_BACKENDS:
        raise violation(yaml_file, "cache_transceiver_config.backend", "is unknown", "§5.7")
    config = document.get("speculative_config")
    if config is None:
        return
    for key in config:
        if key not in SPEC_KEYS:
            raise violation(yaml_file, f"speculative_config.{key}", "is not known", "§5.3")
    name = config.get("decoding_type")
    if name not in DECODING_TYPES:
        raise violation(yaml_file, "speculative_config.decoding_type", f"{name!r}", "§5.2")
    top = config.get("max_draft_len")
    if not _whole(top) or top < 1:
        raise violation(yaml_file, "speculative_config.max_draft_len", "must be > 0", "§5.4")
    if name in NEEDS_MODEL and not config.get("speculative_model"):
        raise violation(yaml_file, "speculative_config.speculative_model", "required", "§5.4")
    if name == "MTP" and "speculative_model" in config:
        key = "speculative_config.speculative_model"
        raise violation(yaml_file, key, "MTP layers are the target checkpoint's", "§5.4")
    if name == "NGram":
        size = config.get("max_matching_ngram_size")
        if not _whole(size) or size < 1:
            key = "speculative_config.max_matching_ngram_size"
            raise violation(yaml_file, key, "must be a positive whole number", "§5.4")
    if "draft_len_schedule" in config:
        _check_schedule(config, top, yaml_file)
    if "eagle_choices" in config:
        _check_choices(config, name, top, yaml_file)
    _check_switches(config, yaml_file)


def _check_switches(config: dict[str, Any], yaml_file: str) -> None:
    """max_concurrency is a positive whole number; the acceptance off-switch needs both of its
    keys (the executor builds its gate only then) with a threshold in (0, 1] (§5.3)."""
    cut = config.get("max_concurrency", 1)
    if not _whole(cut) or cut < 1:
        raise violation(yaml_file, "speculative_config.max_concurrency", "must be >= 1", "§5.3")
    threshold = config.get("acceptance_rate_threshold")
    window = config.get("acceptance_rate_window_size")
    if (threshold is None) != (window is None):
        key = "speculative_config.acceptance_rate_threshold"
        raise violation(yaml_file, key, "and its window size go together", "§5.3")
    if threshold is None:
        return
    key = "speculative_config.acceptance_rate_threshold"
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise violation(yaml_file, key, "must be a number", "§5.3")
    if not 0 < threshold <= 1:
        raise violation(yaml_file, key, "must be in (0, 1]", "§5.3")
    if not _whole(window) or window < 1:
        key = "speculative_config.acceptance_rate_window_size"
        raise violation(yaml_file, key, "must be a whole number >= 1 (0 turns it off)", "§5.3")


def _check_choices(config: dict[str, Any], name: str, top: int, yaml_file: str) -> None:
    key = "speculative_config.eagle_choices"
    choices = config["eagle_choices"]
    if name not in TREE_TYPES:
        raise violation(yaml_file, key, f"is Eagle's, not {name}'s", "§5.4")
    if not isinstance(choices, list) or not choices:
        raise violation(yaml_file, key, "must be a non-empty list of paths", "§5.4")
    paths = [tuple(path) for path in choices]
    if any(len(path) > 1 and path[:-1] not in paths for path in paths):
        raise violation(yaml_file, key, "must be connected (every parent listed)", "§5.4")
    if top != max(len(path) for path in paths):
        raise violation(yaml_file, "speculative_config.max_draft_len", "is not the depth", "§5.4")


def _check_schedule(config: dict[str, Any], top: int, yaml_file: str) -> None:
    key = "speculative_config.draft_len_schedule"
    schedule = config["draft_len_schedule"]
    if "max_concurrency" in config:
        raise violation(yaml_file, key, "is exclusive with max_concurrency", "§5.3")
    if not isinstance(schedule, dict) or not schedule:
        raise violation(yaml_file, key, "must map batch sizes to draft lengths", "§5.3")
    if not all(_whole(b) and b >= 1 and _whole(n) and n >= 0 for b, n in schedule.items()):
        raise violation(yaml_file, key, "needs keys >= 1 and values >= 0", "§5.3")
    if schedule[min(schedule)] != top:
        raise violation(yaml_file, key, "must draft max_draft_len at its smallest key", "§5.3")
    if max(schedule.values()) > top:
        raise violation(yaml_file, key, "has a value above max_draft_len", "§5.3")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def not_expressible(setting: EngineSetting, notes: list[str]) -> list[str]:
    out = [*setting.unexpressed, *notes]
    spec = setting.speculation
    if spec is not None and spec.adaptive_steps is not None:
        out.append(
            "SGLang's adaptive steps: TensorRT-LLM chooses no draft length from acceptance "
            f"(draft_len_schedule follows the batch only); written with max_draft_len = {spec.k}, "
            "the initial steps"
        )
    if spec is not None and spec.adaptive_verification:
        out.append(
            "vLLM's adaptive verification: TensorRT-LLM verifies every draft of a step; "
            f"written with max_draft_len = {spec.k}"
        )
    if setting.speculation is not None and setting.verifier == "typical":
        out.append(
            "verifier typical: TensorRT-LLM's relaxed acceptance is MTP's thinking-phase rule "
            "(§5.4), not typical acceptance; written with its default verification"
        )
    return out + draft_tp_unexpressed(setting, "TensorRT-LLM", "§5.3-5.5")


def notes(setting: EngineSetting) -> list[str]:
    spec = setting.speculation
    out = unknown_formats(setting, "TensorRT-LLM")
    if setting.prefix_caching:
        out.append(
            "the scenario's workload.prefix assumes prefix caching on: TensorRT-LLM reuses KV "
            "blocks by default, and kv_cache_config.enable_block_reuse states it (§5.7)"
        )
    if setting.max_batch > setting.max_batched_tokens:
        out.append("max_batch_size is above max_num_tokens: TensorRT-LLM logs a warning (§5.5)")
    if spec is not None and decoding_type(spec) == "Draft_Target":
        out.append(
            "decoding_type Draft_Target is the class literal; TensorRT-LLM's docs write "
            "DraftTarget (§5.2)"
        )
    if spec is not None and spec.tree is not None:
        out.append(
            "eagle_choices is a static tree, which TensorRT-LLM marks deprecated (to be removed "
            "in release 1.4; its dynamic tree, use_dynamic_tree, picks nodes per step) (§5.4)"
        )
        if spec.tree_drafts not in (None, "top-k"):
            out.append(
                f"the plan's tree drafts its children {spec.tree_drafts}; Eagle's tree takes "
                "the heads' top-k, so acceptance will follow the profile's top-k trees"
            )
    if spec is not None and decoding_type(spec) == "MTP":
        out.append(
            "MTP's draft length is max_draft_len: num_nextn_predict_layers is now internal, "
            "filled from the checkpoint, and moved into max_draft_len when given (§5.4); with "
            "one MTP layer TensorRT-LLM runs it EAGLE-style (MTP_EAGLE_ONE_MODEL: the one layer "
            "autoregressively), as the profile costs it"
        )
    if spec is not None and decoding_type(spec) == "Eagle":
        out.append(
            "on the PyTorch backend Eagle is run as Eagle3, and EAGLE v1/v2 checkpoints do "
            "not load as Eagle3 (§5.2)"
        )
    return out


def render(setting: EngineSetting, header: list[str]) -> Rendered:
    document, schedule_notes = options(setting)
    name = role_file(YAML_FILE, setting.role)
    check(document, name)
    missing, remarks = not_expressible(setting, schedule_notes), notes(setting)
    model = shlex.quote(setting.target.path)
    start = f"trtllm-serve {model} --extra_llm_api_options {name}"
    usage = ["Start the server from this folder:", f"  {start}"]
    text = comments(header_lines(header, missing, remarks, usage)) + dump_yaml(document)
    return Rendered("trtllm", {name: text}, document, missing, remarks, start)


def router_file(label: str, prefill_replicas: int, decode_replicas: int) -> tuple[str, dict]:
    """``trtllm-disagg.yaml``'s text for a split layout, and the configuration it holds."""
    config = disaggregated_config(prefill_replicas, decode_replicas)
    top = [
        f"specsim: trtllm-serve disaggregated's configuration for {label}.",
        "Start each context server with --extra_llm_api_options trtllm-prefill.yaml and "
        "each generation server with trtllm-decode.yaml, on the ports the urls name "
        "(trtllm-serve MODEL --port PORT ...), then the router:",
        f"  {ROUTER}",
    ]
    return comments(top) + dump_yaml(config), config


def disaggregated_config(prefill_replicas: int, decode_replicas: int) -> dict[str, Any]:
    """``trtllm-serve disaggregated -c trtllm-disagg.yaml``: the router, its context (prefill)
    servers and generation (decode) servers, on one host's ports counting up (§5.7)."""
    ports = iter(range(FIRST_PORT, FIRST_PORT + prefill_replicas + decode_replicas))
    servers = {}
    pools = (("context_servers", prefill_replicas), ("generation_servers", decode_replicas))
    for key, count in pools:
        servers[key] = {
            "num_instances": count,
            "urls": [f"localhost:{next(ports)}" for _ in range(count)],
        }
    return {"hostname": "localhost", "port": ROUTER_PORT, "backend": "pytorch", **servers}
