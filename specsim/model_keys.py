"""Checks of a model's ``config.json`` keys that the loader (torch) and the roofline (no torch)
both apply, so that the two read a config alike: counts that may be 0, the experts a token
takes, Qwen3-MoE's dense layers, and DeepSeek-V3's defaults."""

from __future__ import annotations

from typing import Any

from specsim.errors import SpecsimError

# DeepSeek-V3's whole-number keys and the values transformers' DeepseekV3Config (and DeepSeek-V3
# itself) gives when they are absent; the loader and the roofline both read absent keys as these.
DEEPSEEK_V3_DEFAULTS: dict[str, int] = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
}


def count_key(data: dict[str, Any], key: str, source: str, highest: int, default: int) -> int:
    """A whole number from 0 to ``highest`` (``default`` when absent or null)."""
    value = data.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= highest:
        raise SpecsimError(
            f"expected a whole number from 0 to {highest}, got {value!r:.40}",
            file=source,
            key=key,
            fix="copy the key from the model's config.json",
        )
    return value


def check_experts_per_token(chosen: int, experts: int, source: str) -> None:
    if chosen > experts:
        raise SpecsimError(
            f"num_experts_per_tok {chosen} exceeds the {experts} experts",
            file=source,
            key="num_experts_per_tok",
            fix="give at most as many experts per token as the model has",
        )


def moe_dense_layers(data: dict[str, Any], step: int, num_layers: int, source: str) -> tuple:
    """Qwen3-MoE's layers with a dense MLP: those in mlp_only_layers and, with
    decoder_sparse_step ``step``, those whose 1-based index is not a multiple of it."""
    only = data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in only
    ):
        raise SpecsimError(
            f"expected layer indices from 0 to {num_layers - 1}, got {only!r:.60}",
            file=source,
            key="mlp_only_layers",
            fix="list the dense layers' indices, or give []",
        )
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step)


def deepseek_layer_counts(data: dict[str, Any], num_layers: int, source: str) -> tuple[int, int]:
    """DeepSeek-V3's leading dense layers (first_k_dense_replace) and its multi-token-prediction
    modules (num_nextn_predict_layers)."""
    dense_key, mtp_key = "first_k_dense_replace", "num_nextn_predict_layers"
    dense = count_key(data, dense_key, source, num_layers, DEEPSEEK_V3_DEFAULTS[dense_key])
    return dense, count_key(data, mtp_key, source, 2**10, DEEPSEEK_V3_DEFAULTS[mtp_key])
