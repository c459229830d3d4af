"""vLLM's configuration for a recommended setting: ``vllm.json`` and ``vllm.args``.

``vllm.json`` is exactly the ``--speculative-config`` value (vLLM 0.33 parses the option with
``json.loads``, engine-formats.md §3.1), so it can be passed as ``--speculative-config
"$(cat vllm.json)"``; JSON has no comments, so the header naming the specsim version, scenario
and profile lives in ``vllm.args``: the whole ``vllm serve`` argument list (the same JSON
inline, ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--tensor-parallel-size``; §3.6), and
``--quantization fp8`` / ``--kv-cache-dtype fp8`` for a profile in those formats (§3.7).
With speculation off there is no ``vllm.json``: the plain server takes no speculative config.

Keys are vLLM 0.33's (``SpeculativeConfig``, §3.2); ``vllm_keys.check`` holds a config to the
constraints §3.3-3.5 document before anything is written.
"""

from __future__ import annotations

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
)
from specsim.serving.setting import comment_block as comments
from specsim.serving.vllm_keys import (
    ARGS_FILE,
    KIND_METHODS,
    METHODS,
    NEEDS_MODEL,
    SCHEDULE_METHODS,
    SPEC_FILE,
    check,
    check_transfer,
)

ROUTER = (
    "vllm serve has no prefill/decode router: put a proxy in front (vLLM's "
    "disaggregated-prefilling examples ship one) that sends each request to a prefill instance "
    "and then to a decode instance; instances on one host each need their own "
    "VLLM_NIXL_SIDE_CHANNEL_PORT"
)
KV_CONNECTOR = "NixlConnector"  # vLLM V1's connector between prefill and decode instances
# P-EAGLE and PARD: EAGLE-3 heads and draft models trained to draft in parallel (§3.2).
PARALLEL_DRAFTING = frozenset({"p_eagle", "pard"})
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
    for flag, value in cache_arguments(setting):
        written[flag.removeprefix("--").replace("-", "_")] = True if value is None else int(value)
    for flag, value in format_arguments(setting):
        written[flag.removeprefix("--").replace("-", "_")] = value
    return Rendered("vllm", files, written, missing, remarks, start)
