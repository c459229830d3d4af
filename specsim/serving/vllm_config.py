"""vLLM's configuration for a recommended setting: ``vllm.json`` and ``vllm.args``.

``vllm.json`` is exactly the ``--speculative-config`` value (vLLM 0.33 parses the option with
``json.loads``, engine-formats.md §3.1), so it can be passed as ``--speculative-config
"$(cat vllm.json)"``; JSON has no comments, so the header naming the specsim version, scenario
and profile lives in ``vllm.args``: the whole ``vllm serve`` argument list (the same JSON
inline, ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--tensor-parallel-size``; §3.6), and
``--quantization fp8`` / ``--kv-cache-dtype fp8`` for a profile in those formats (§3.7).
With speculation off there is no ``vllm.json``: the plain server takes no speculative config.

Keys are vLLM 0.33's (``SpeculativeConfig``, §3.2), and ``check`` holds a config to the
constraints §3.3-3.5 document before anything is written.
"""

from __future__ import annotations

import itertools
import json
import shlex
from typing import Any

from specsim.serving.setting import (
    BatchRow,
    EngineSetting,
    Rendered,
    Speculative,
    args_text,
    engine_method,
    header_lines,
    medusa_refusal,
    method_refusal,
    role_file,
    use,
    violation,
)
from specsim.serving.setting import comment_block as comments

SPEC_FILE, ARGS_FILE = "vllm.json", "vllm.args"
ROUTER = (
    "vllm serve has no prefill/decode router: put a proxy in front (vLLM's "
    "disaggregated-prefilling examples ship one) that sends each request to a prefill instance "
    "and then to a decode instance; instances on one host each need their own "
    "VLLM_NIXL_SIDE_CHANNEL_PORT"
)
KV_CONNECTOR = "NixlConnector"  # vLLM V1's connector between prefill and decode instances
KV_ROLES = frozenset({"kv_producer", "kv_consumer", "kv_both"})

# The SpeculativeConfig fields this writer may set (§3.2); anything else is refused.
FIELDS = frozenset(
    {
        "method",
        "model",
        "num_speculative_tokens",
        "draft_tensor_parallel_size",
        "quantization",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "num_speculative_tokens_per_batch_size",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "parallel_drafting",
        "enable_adaptive_verification",
    }
)
# SpeculativeMethod per specsim drafter kind (§3.2: V33 has no medusa; heads are EAGLE).
KIND_METHODS = {
    "draft_model": "draft_model",
    "ngram": "ngram",
    "heads": "eagle",
    "heads-eagle3": "eagle3",
    "mtp": "mtp",
    # Parallel drafters: P-EAGLE and PARD are EAGLE-3 heads and draft models trained to draft
    # in parallel (SpeculativeConfig.parallel_drafting); DFlash and DSpark set it themselves.
    "dflash": "dflash",
    "dspark": "dspark",
    "p_eagle": "eagle3",
    "pard": "draft_model",
}
PARALLEL_DRAFTING = frozenset({"p_eagle", "pard"})
METHODS = frozenset(KIND_METHODS.values())
NEEDS_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "dspark"})  # §3.5
# On Model Runner V1 a batch-size schedule is dropped for any other method (§3.4).
SCHEDULE_METHODS = frozenset({"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash"})
REJECTION_METHODS = frozenset({"standard", "synthetic", "block", "fly"})  # §3.3
# Adaptive verification scores drafts by DSpark's confidence head, or else by an acceptance
# estimate from the draft logits, which prompt lookup has none of (vLLM 0.33
# ``v1/worker/gpu/spec_decode/speculator.py``, ``acceptance_estimator.py``).
ADAPTIVE_METHODS = METHODS - {"ngram"}


def method(spec: Speculative) -> str:
    """vLLM's method for the drafter (``KIND_METHODS``): the target's MTP layers are ``mtp``,
    which takes no model (it uses the target's, §3.5)."""
    return engine_method(KIND_METHODS, spec, "vLLM")


def token_tree(shape) -> str:
    """A tree as vLLM 0.10.2's ``speculative_token_tree`` took it: a string holding a Python
    list of tuples of child ranks, breadth-first (§3.5), e.g. ``[(0,), (1,), (0, 0)]``."""
    return str([tuple(path) for path in shape.paths])


def refuses(setting: EngineSetting) -> str | None:
    """vLLM 0.33 has no tree option: ``speculative_token_tree`` is gone from its
    SpeculativeConfig (§3.2, §3.5), so a tree is refused rather than written as a chain."""
    if missing := method_refusal(setting, KIND_METHODS, "vLLM 0.33"):
        return missing
    spec = setting.speculation
    if spec is not None and spec.schedule_rows and method(spec) not in SCHEDULE_METHODS:
        return (
            f"vLLM 0.33 drops num_speculative_tokens_per_batch_size for method {method(spec)} "
            "(§3.4; DSpark drafts its whole block), so the k-by-batch table cannot be written"
        )
    medusa = medusa_refusal(setting, "vLLM 0.33", "§3.2: medusa left its SpeculativeMethod")
    if medusa is not None or spec is None or spec.tree is None:
        return medusa
    return (
        "vLLM 0.33's speculative_config has no speculative_token_tree (§3.2; vLLM 0.10.2 took "
        f'it for EAGLE methods as "speculative_token_tree": "{token_tree(spec.tree)}" with '
        f"num_speculative_tokens {spec.tree.num_nodes}), so the tree cannot be written"
    )


def schedule(spec: Speculative, max_num_seqs: int) -> list[list[int]]:
    """specsim's rows as vLLM's ``[start, end, K]`` ranges: the first starts at 1 (§3.4). A
    static k's max_concurrency is the ranges [1, cut, k] and [cut + 1, max_num_seqs, 0]: past
    its last range vLLM carries the last K forward, so the zero is written out."""
    rows = spec.schedule_rows
    if not spec.by_batch and rows:
        if rows[0].max_batch >= max_num_seqs:
            return []  # never more than --max-num-seqs run: nothing to cut
        rows = (*rows, BatchRow(max_num_seqs, 0))
    ranges, start = [], 1
    for row in rows:
        ranges.append([start, row.max_batch, row.k])
        start = row.max_batch + 1
    return ranges


def speculative_config(setting: EngineSetting, synthetic: bool = False) -> dict[str, Any] | None:
    """The ``--speculative-config`` object (None: speculation off). ``synthetic``: vLLM's
    forced acceptance at the profile's per-position rates, for a controlled test (§3.3)."""
    spec = setting.speculation
    if spec is None:
        return None
    name = method(spec)
    config: dict[str, Any] = {"method": name}
    if spec.model is not None:
        config["model"] = spec.model.path
    config["num_speculative_tokens"] = spec.k
    if name == "ngram":
        # specsim's prompt lookup matches exactly the last n tokens: both bounds n.
        config["prompt_lookup_min"] = spec.ngram_size
        config["prompt_lookup_max"] = spec.ngram_size
    if name in NEEDS_MODEL:
        config["draft_tensor_parallel_size"] = setting.draft_tp
        if setting.weights_dtype == "fp8":
            config["quantization"] = "fp8"  # the draft model's weights too (§3.2)
    if spec.deployed_kind in PARALLEL_DRAFTING:
        config["parallel_drafting"] = True
    ranges = schedule(spec, setting.max_batch)
    if ranges:
        config["num_speculative_tokens_per_batch_size"] = ranges
    if spec.adaptive_verification and name in ADAPTIVE_METHODS:
        config["enable_adaptive_verification"] = True
    if synthetic:
        config["rejection_sample_method"] = "synthetic"
        config["synthetic_acceptance_rates"] = [round(p, 6) for p in spec.unconditional_rates]
    return config


def server_arguments(setting: EngineSetting, config: dict[str, Any] | None) -> list:
    """``vllm serve``'s options after the model (§3.1, §3.6)."""
    arguments = [
        ("--max-num-seqs", str(setting.max_batch)),
        ("--max-num-batched-tokens", str(setting.max_batched_tokens)),
        ("--tensor-parallel-size", str(setting.tensor_parallel_size)),
    ]
    if setting.expert_parallel:
        arguments.append(("--enable-expert-parallel", None))
    arguments += format_arguments(setting)
    arguments += cache_arguments(setting)
    if setting.role is not None:
        arguments.append(("--kv-transfer-config", json.dumps(kv_transfer_config(setting))))
    if config is not None:
        arguments.append(("--speculative-config", json.dumps(config)))
    return arguments


def kv_transfer_config(setting: EngineSetting) -> dict[str, str]:
    """A split fleet's ``--kv-transfer-config`` (vLLM's disaggregated prefilling): the NIXL
    connector, which both instances run with ``kv_role`` ``kv_both``; the proxy in front sends
    each request to a prefill instance first and then to a decode one."""
    return {"kv_connector": KV_CONNECTOR, "kv_role": "kv_both"}


# Formats vLLM takes from a checkpoint's quantization_config, with its method names (§3.7).
PRE_QUANTISED = {"int4": "AWQ, GPTQ", "nvfp4": "modelopt_fp4", "mxfp4": "mxfp4"}


def format_arguments(setting: EngineSetting) -> list[tuple[str, str]]:
    """fp8 weights (quantised when loaded) and an fp8 KV cache (§3.7); int4 has no flag: its
    method comes with an AWQ or GPTQ checkpoint (``notes``)."""
    out = []
    if setting.weights_dtype == "fp8":
        out.append(("--quantization", "fp8"))
    if setting.kv_cache_dtype == "fp8":
        out.append(("--kv-cache-dtype", "fp8"))
    return out


def cache_arguments(setting: EngineSetting) -> list[tuple[str, str | None]]:
    """The scenario's KV block size, and prefix caching when its requests hit cached prefixes
    (V1 caches prefixes by default; the flag states what the plan assumed)."""
    out: list[tuple[str, str | None]] = []
    if setting.block_size is not None:
        out.append(("--block-size", str(setting.block_size)))
    if setting.prefix_caching:
        out.append(("--enable-prefix-caching", None))
    return out


def check(config: dict[str, Any] | None, max_num_seqs: int, target_tp: int = 1) -> None:
    """Refuse a config that vLLM 0.33 would reject, or silently run differently (§3.2-3.5)."""
    if max_num_seqs < 1:
        raise violation(ARGS_FILE, "--max-num-seqs", "must be at least 1", "§3.6")
    if config is None:
        return
    for key in config:
        if key not in FIELDS:
            raise violation(SPEC_FILE, key, "is not a SpeculativeConfig field", "§3.2")
    name = config.get("method")
    if name not in METHODS:
        raise violation(SPEC_FILE, "method", f"{name!r} is not a method specsim maps to", "§3.2")
    k = config.get("num_speculative_tokens")
    if not _whole(k) or k < 1:
        raise violation(SPEC_FILE, "num_speculative_tokens", f"{k!r} is not above 0", "§3.2")
    if name in NEEDS_MODEL and not config.get("model"):
        raise violation(SPEC_FILE, "model", f"method {name} needs a draft model", "§3.5")
    if name == "mtp" and "model" in config:
        raise violation(SPEC_FILE, "model", "method mtp runs the target's own layers", "§3.5")
    if name == "ngram":
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if not (_whole(low) and _whole(high) and 1 <= low <= high):
            raise violation(
                SPEC_FILE, "prompt_lookup_min", f"[{low}, {high}] is not 1 <= min <= max", "§3.5"
            )
    draft_tp = config.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, target_tp):
        raise violation(
            SPEC_FILE, "draft_tensor_parallel_size", "must be 1 or the target's TP", "§3.5"
        )
    if "num_speculative_tokens_per_batch_size" in config:
        _check_schedule(config["num_speculative_tokens_per_batch_size"], k, name, max_num_seqs)
    _check_synthetic(config, k)


def _check_schedule(ranges: Any, k: int, name: str, max_num_seqs: int) -> None:
    key = "num_speculative_tokens_per_batch_size"
    if name not in SCHEDULE_METHODS:
        raise violation(SPEC_FILE, key, f"is dropped for method {name}", "§3.4")
    if not isinstance(ranges, list) or not ranges:
        raise violation(SPEC_FILE, key, "must be a non-empty list of [start, end, K]", "§3.4")
    previous_end = 0
    for entry in ranges:
        if not (isinstance(entry, list) and len(entry) == 3 and all(map(_whole, entry))):
            raise violation(SPEC_FILE, key, f"{entry!r} is not [start, end, K]", "§3.4")
        start, end, window = entry
        if not 0 < start <= end or window < 0:
            raise violation(SPEC_FILE, key, f"{entry!r} needs 0 < start <= end, K >= 0", "§3.4")
        if start <= previous_end:
            raise violation(SPEC_FILE, key, "ranges must be sorted, not overlapping", "§3.4")
        if window > k:
            # vLLM would clamp it to num_speculative_tokens: the file would not say what runs.
            raise violation(SPEC_FILE, key, f"K {window} is above num_speculative_tokens", "§3.4")
        previous_end = end
    if ranges[0][0] != 1:
        raise violation(SPEC_FILE, key, "the first range must start at 1", "§3.4")
    if previous_end < max_num_seqs:
        # Past the last range vLLM carries its K forward; specsim's table would stop there.
        raise violation(SPEC_FILE, key, "the ranges must reach --max-num-seqs", "§3.4")


def _check_synthetic(config: dict[str, Any], k: int) -> None:
    sampler = config.get("rejection_sample_method", "standard")
    rates = config.get("synthetic_acceptance_rates")
    length = config.get("synthetic_acceptance_length")
    key = "synthetic_acceptance_rates"
    if sampler not in REJECTION_METHODS:
        raise violation(SPEC_FILE, "rejection_sample_method", f"{sampler!r} is unknown", "§3.3")
    if sampler != "synthetic":
        if rates is not None or length is not None:
            raise violation(SPEC_FILE, key, "is valid only with the synthetic sampler", "§3.3")
        return
    if (rates is None) == (length is None):
        raise violation(SPEC_FILE, key, "or the length: exactly one is required", "§3.3")
    if rates is None:
        return
    shaped = isinstance(rates, list) and len(rates) == k and all(0 <= p <= 1 for p in rates)
    if not shaped or any(b > a for a, b in itertools.pairwise(rates)):
        raise violation(SPEC_FILE, key, "needs k non-increasing entries in [0, 1]", "§3.3")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def not_expressible(setting: EngineSetting) -> list[str]:
    notes = list(setting.unexpressed)
    spec = setting.speculation
    if spec is not None and spec.acceptance_gate is not None:
        notes.append(
            "the acceptance off-switch (TensorRT-LLM's acceptance_rate_threshold): vLLM 0.33's "
            "SpeculativeConfig has none (§3.2); written without it, so speculation stays on "
            "however acceptance falls"
        )
    if spec is not None and spec.adaptive_steps is not None:
        notes.append(
            "SGLang's adaptive steps: vLLM 0.33 chooses no k from acceptance (its per-batch "
            f"table follows the batch only, §3.4); written with k = {spec.k}, the initial steps"
        )
    if spec is not None and spec.adaptive_verification and method(spec) not in ADAPTIVE_METHODS:
        notes.append(
            "adaptive verification: vLLM 0.33 scores drafts from draft logits, which prompt "
            f"lookup has none of; written as fixed k = {spec.k}, every draft verified"
        )
    if setting.speculation is not None and setting.verifier == "typical":
        notes.append(
            "verifier typical: vLLM 0.33 has no typical acceptance (only V0's "
            "--spec-decoding-acceptance-method had it, §3.3); written with vLLM's standard "
            "rejection sampler, which is exact, so acceptance will be lower than planned"
        )
    return notes


def notes(setting: EngineSetting) -> list[str]:
    spec = setting.speculation
    out = []
    if setting.weights_dtype in PRE_QUANTISED:
        out.append(
            f"{setting.weights_dtype} weights: vLLM reads the method "
            f"({PRE_QUANTISED[setting.weights_dtype]}) from a pre-quantised checkpoint's config, "
            "so no --quantization is written: serve such a checkpoint (§3.7)"
        )
    if spec is not None and spec.is_mtp:
        out.append(
            "method mtp runs the target checkpoint's MTP layers (num_nextn_predict_layers), the "
            "one module k times per step, with no draft model of its own (§3.2, §3.5)"
        )
    if spec is not None and spec.adaptive_verification and method(spec) in ADAPTIVE_METHODS:
        out.append(
            "enable_adaptive_verification profiles step costs at start-up and runs on Model "
            "Runner V2 with full CUDA graphs: leave --enforce-eager off and "
            "VLLM_USE_V2_MODEL_RUNNER unset"
        )
    if setting.prefix_caching:
        out.append(
            "the scenario's workload.prefix assumes prefix caching on: vLLM V1 enables it by "
            "default, and --enable-prefix-caching states it"
        )
    if spec is None or spec.kind != "heads":
        return out
    return [
        *out,
        f"specsim's heads drafter is written as method {method(spec)} (vLLM 0.33 has no medusa, "
        "§3.2); for MTP layers in the target use method mtp",
    ]


def check_transfer(arguments: list[tuple[str, str | None]], args_file: str) -> None:
    """A ``--kv-transfer-config`` names a connector and one of vLLM's KV roles."""
    given = dict(arguments)
    if "--kv-transfer-config" not in given:
        return
    config = json.loads(given["--kv-transfer-config"])
    if not config.get("kv_connector"):
        raise violation(args_file, "--kv-transfer-config", "needs a kv_connector", "§3.8")
    if config.get("kv_role") not in KV_ROLES:
        raise violation(args_file, "--kv-transfer-config", "kv_role is not vLLM's", "§3.8")


def render(setting: EngineSetting, header: list[str]) -> Rendered:
    """Check, then the files: vllm.json (when speculating) and vllm.args (a split fleet's
    pool: vllm-prefill.args, vllm-decode.args and vllm-decode.json)."""
    config = speculative_config(setting)
    check(config, setting.max_batch, setting.tensor_parallel_size)
    if config is not None:
        synthetic = speculative_config(setting, synthetic=True)
        check(synthetic, setting.max_batch, setting.tensor_parallel_size)
    arguments = server_arguments(setting, config)
    spec_file, args_file = (role_file(f, setting.role) for f in (SPEC_FILE, ARGS_FILE))
    check_transfer(arguments, args_file)
    missing, remarks = not_expressible(setting), notes(setting)
    launch = f"vllm serve {shlex.quote(setting.target.path)}"
    start = use(launch, args_file)
    usage = ["Start the server from this folder (the model is vllm serve's first argument):"]
    usage.append(f"  {start}")
    files = {}
    if config is not None:
        files[spec_file] = json.dumps(config, indent=2) + "\n"
    top = header_lines(header, missing, remarks, usage)
    files[args_file] = args_text(comments(top), arguments)
    written = {
        "speculative_config": config,
        "max_num_seqs": setting.max_batch,
        "max_num_batched_tokens": setting.max_batched_tokens,
        "tensor_parallel_size": setting.tensor_parallel_size,
    }
    if setting.expert_parallel:
        written["enable_expert_parallel"] = True
    if setting.role is not None:
        written["kv_transfer_config"] = kv_transfer_config(setting)
    written.update(
        {
            flag.removeprefix("--").replace("-", "_"): True if value is None else int(value)
            for flag, value in cache_arguments(setting)
        }
    )
    written.update(
        {
            flag.removeprefix("--").replace("-", "_"): value
            for flag, value in format_arguments(setting)
        }
    )
    return Rendered("vllm", files, written, missing, remarks, start)
