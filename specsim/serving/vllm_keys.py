"""vLLM 0.33's speculative-config vocabulary (engine-formats.md §3.2-3.5), and ``check``, which
holds a config to the constraints documented there before anything is written."""

from __future__ import annotations

import itertools
import json
from typing import Any

from specsim.serving.setting import violation

SPEC_FILE, ARGS_FILE = "vllm.json", "vllm.args"
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
METHODS = frozenset(KIND_METHODS.values())
NEEDS_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "dspark"})  # §3.5
# On Model Runner V1 a batch-size schedule is dropped for any other method (§3.4).
SCHEDULE_METHODS = frozenset({"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash"})
REJECTION_METHODS = frozenset({"standard", "synthetic", "block", "fly"})  # §3.3


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
