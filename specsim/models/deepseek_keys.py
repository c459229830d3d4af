"""DeepSeek-V3's ``config.json`` keys: multi-head latent attention, the grouped sigmoid router,
shared experts and the leading dense layers, read to ``ModelConfig`` fields and written back.

The defaults of absent keys are transformers' ``DeepseekV3Config``'s (those of DeepSeek-V3
itself), those the roofline reads too from ``specsim.model_keys``. The original checkpoint's
``scoring_func`` / ``topk_method`` keys are checked against the one router transformers (and
this decoder) implement.
"""

from __future__ import annotations

from typing import Any

from specsim.errors import SpecsimError
from specsim.model_keys import DEEPSEEK_V3_DEFAULTS, deepseek_layer_counts
from specsim.models.config_keys import get_key

# (ModelConfig field, config.json key).
_SIZES = (
    ("kv_lora_rank", "kv_lora_rank"),
    ("qk_nope_head_dim", "qk_nope_head_dim"),
    ("qk_rope_head_dim", "qk_rope_head_dim"),
    ("v_head_dim", "v_head_dim"),
    ("num_experts", "n_routed_experts"),
    ("experts_per_token", "num_experts_per_tok"),
    ("expert_intermediate_size", "moe_intermediate_size"),
    ("shared_experts", "n_shared_experts"),
    ("expert_groups", "n_group"),
    ("groups_per_token", "topk_group"),
)


def deepseek_fields(data: dict[str, Any], source: str, num_layers: int) -> dict[str, Any]:
    default = DEEPSEEK_V3_DEFAULTS
    fields: dict[str, Any] = {
        ours: get_key(data, key, int, source, default[key]) for ours, key in _SIZES
    }
    # An explicit null means no query bottleneck (DeepSeek-V2-Lite); absent, transformers' 1536.
    has_null_q = "q_lora_rank" in data and data["q_lora_rank"] is None
    fields["q_lora_rank"] = (
        None if has_null_q else get_key(data, "q_lora_rank", int, source, default["q_lora_rank"])
    )
    heads = get_key(data, "num_attention_heads", int, source)
    kv_heads = data.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise SpecsimError(
            f"num_key_value_heads {kv_heads!r:.20} differs from num_attention_heads {heads}",
            file=source,
            key="num_key_value_heads",
            fix="latent attention expands one key and value per query head: give the head count",
        )
    fields["num_kv_heads"] = heads
    fields["head_dim"] = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
    fields["routed_scaling_factor"] = get_key(data, "routed_scaling_factor", float, source, 2.5)
    fields["normalize_top_k"] = get_key(data, "norm_topk_prob", bool, source, True)
    fields["rope_interleave"] = get_key(data, "rope_interleave", bool, source, True)
    fields["router"] = "sigmoid_grouped"
    dense, mtp = deepseek_layer_counts(data, num_layers, source)
    fields["dense_layers"] = tuple(range(dense))
    fields["mtp_layers"] = mtp
    _check_router(data, source, fields)
    for key, allowed in (("attention_bias", False), ("moe_layer_freq", 1)):
        if data.get(key, allowed) != allowed:
            raise SpecsimError(
                f"{key} {data[key]!r:.20} is not supported",
                file=source,
                key=key,
                fix=f"use a model with {key} {str(allowed).lower()} (as DeepSeek-V3 is released)",
            )
    return fields


def _check_router(data: dict[str, Any], source: str, fields: dict[str, Any]) -> None:
    experts, groups = fields["num_experts"], fields["expert_groups"]
    chosen, chosen_groups = fields["experts_per_token"], fields["groups_per_token"]
    for key, expected in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if data.get(key, expected) != expected:
            raise SpecsimError(
                f"{key} {data[key]!r:.30} is not supported",
                file=source,
                key=key,
                fix=f"use {key} {expected} (DeepSeek-V3's router)",
            )
    # Groups are ranked by their two best scores, so each holds at least two experts.
    if experts % groups or experts // groups < 2:
        raise SpecsimError(
            f"{experts} experts do not split into {groups} groups of at least 2",
            file=source,
            key="n_group",
            fix="give a group count that divides n_routed_experts at most in halves",
        )
    if chosen_groups > groups:
        raise SpecsimError(
            f"topk_group {chosen_groups} exceeds the {groups} groups",
            file=source,
            key="topk_group",
            fix="give at most n_group groups per token",
        )
    if chosen > chosen_groups * (experts // groups):
        raise SpecsimError(
            f"num_experts_per_tok {chosen} exceeds the {chosen_groups * (experts // groups)} "
            "experts of the chosen groups",
            file=source,
            key="num_experts_per_tok",
            fix="give at most topk_group x (n_routed_experts / n_group) experts per token",
        )


def deepseek_hf_keys(config) -> dict[str, Any]:
    """``deepseek_fields``' keys for ``config`` (a ``ModelConfig``), as transformers names them
    (its head_dim is the rotary part's)."""
    data = {key: getattr(config, ours) for ours, key in _SIZES}
    data.update(
        q_lora_rank=config.q_lora_rank,
        head_dim=config.qk_rope_head_dim,
        routed_scaling_factor=config.routed_scaling_factor,
        norm_topk_prob=config.normalize_top_k,
        rope_interleave=config.rope_interleave,
        first_k_dense_replace=len(config.dense_layers),
        num_nextn_predict_layers=config.mtp_layers,
    )
    return data
