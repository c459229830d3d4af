"""The model families the loader reads, and what each one's ``config.json`` adds to Llama's.

Every family is the Llama decoder with a few flags set (``ModelConfig``'s fields): Qwen3 adds
RMS norms over each query and key head; Gemma scales norms by ``1 + weight``, the embeddings by
``sqrt(hidden_size)`` and gates its MLP with tanh-approximated GELU; Gemma 2 and 3 add norms after
attention and the MLP, a query scale of their own, soft-capping (``cap * tanh(x / cap)``) of
attention scores and logits, and layers that alternate between a sliding window and full
attention (Gemma 3's sliding layers with their own RoPE base); Phi-3 stores fused q/k/v and
gate/up weights (split on load, ``checkpoint.py``); Mixtral and Qwen3-MoE route each token to its
top experts; DeepSeek-V3 adds latent attention and a grouped sigmoid router beside shared experts
(``deepseek_keys.py``). The defaults of absent keys are Hugging Face's for the family.
"""

from __future__ import annotations

from typing import Any

from specsim.errors import SpecsimError
from specsim.model_keys import check_experts_per_token, moe_dense_layers
from specsim.models.config_keys import YARN_FAMILIES, get_key, read_rope, read_rope_scaling
from specsim.models.deepseek_keys import deepseek_fields, deepseek_hf_keys

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
GEMMA = ("gemma", "gemma2", "gemma3_text")
MOE = ("mixtral", "qwen3_moe")
# Families whose ``attention_bias`` puts a bias on all four projections (Qwen2 always has q/k/v
# biases; Phi-3 and Mixtral never have any).
_BIAS_FLAG = ("llama", "mistral", "qwen3", "qwen3_moe", *GEMMA)
_WINDOW_ON_EVERY_LAYER = ("mistral", "mixtral", "phi3")
_NO_SLIDING = ("qwen2", "qwen3", "qwen3_moe")  # their use_sliding_window is off when released
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
_DEFAULT_THETA = {"mixtral": 1_000_000.0, "gemma3_text": 1_000_000.0}


def check_model_type(data: dict[str, Any], source: str) -> str:
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = " (give its text_config as the config.json)" if model_type == "gemma3" else ""
        raise SpecsimError(
            f"model_type {model_type!r} is not supported{hint}",
            file=source,
            key="model_type",
            fix=f"use a model of type {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    return model_type


def family_fields(
    data: dict[str, Any], source: str, model_type: str, num_layers: int
) -> dict[str, Any]:
    """The ``ModelConfig`` fields that depend on the family (all but the common sizes)."""
    fields: dict[str, Any] = {"activation": _activation(data, source, model_type)}
    bias = model_type in _BIAS_FLAG and get_key(data, "attention_bias", bool, source, False)
    fields["attention_bias"] = model_type == "qwen2" or bias
    fields["attention_out_bias"] = bias
    fields["tie_embeddings"] = get_key(
        data, "tie_word_embeddings", bool, source, model_type in GEMMA
    )
    fields["qk_norm"] = model_type in ("qwen3", "qwen3_moe", "gemma3_text")
    fields["gemma_norms"] = model_type in GEMMA
    fields["sandwich_norms"] = model_type in ("gemma2", "gemma3_text")
    fields.update(_rope_fields(data, source, model_type))
    fields.update(_window_fields(data, source, model_type, num_layers))
    if model_type in ("gemma2", "gemma3_text"):
        fields["query_pre_attn_scalar"] = get_key(
            data, "query_pre_attn_scalar", float, source, 256.0
        )
        gemma2 = model_type == "gemma2"  # Gemma 2 caps by default, Gemma 3 does not
        for ours, key, default in (
            ("attn_softcap", "attn_logit_softcapping", 50.0),
            ("final_softcap", "final_logit_softcapping", 30.0),
        ):
            # An explicit null turns the cap off; an absent key is the family's default.
            absent_means = default if gemma2 and key not in data else None
            fields[ours] = get_key(data, key, float, source, absent_means)
    if model_type == "phi3":
        _check_full_rotary(data, source)
    if model_type in MOE:
        fields.update(_moe_fields(data, source, model_type, num_layers))
    if model_type == "deepseek_v3":
        fields.update(deepseek_fields(data, source, num_layers))
    return fields


def _activation(data: dict[str, Any], source: str, model_type: str) -> str:
    if model_type not in GEMMA:
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise SpecsimError(
                f"activation {act!r} is not supported",
                file=source,
                key="hidden_act",
                fix="use silu",
            )
        return "silu"
    # Gemma 2/3 read hidden_activation only; Gemma's legacy "gelu" means the tanh approximation.
    key = "hidden_act" if model_type == "gemma" else "hidden_activation"
    if model_type == "gemma" and data.get("hidden_activation") is not None:
        key = "hidden_activation"
    act = data.get(key) or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh" and not (model_type == "gemma" and act == "gelu"):
        raise SpecsimError(
            f"activation {act!r} is not supported for {model_type}",
            file=source,
            key=key,
            fix="use gelu_pytorch_tanh",
        )
    return "gelu_tanh"


def _rope_fields(data: dict[str, Any], source: str, model_type: str) -> dict[str, Any]:
    default = _DEFAULT_THETA.get(model_type, 10000.0)
    if model_type != "gemma3_text":
        theta, scaling = read_rope(data, source, default, yarn=model_type in YARN_FAMILIES)
        return {"rope_theta": theta, "rope_scaling": scaling}
    params = data.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # transformers 5, per layer type
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        key = "rope_parameters.full_attention"
        theta = get_key(
            {f"{key}.rope_theta": full.get("rope_theta")},
            f"{key}.rope_theta",
            float,
            source,
            default,
        )
        scaling = read_rope_scaling(full, source, key)
        local_key = "rope_parameters.sliding_attention"
        if read_rope_scaling(local, source, local_key) is not None:
            raise SpecsimError(
                "RoPE scaling on the sliding layers is not supported",
                file=source,
                key=f"{local_key}.rope_type",
                fix="use rope_type default for sliding_attention (as Gemma 3 is released)",
            )
        local_theta = get_key(
            {f"{local_key}.rope_theta": local.get("rope_theta")},
            f"{local_key}.rope_theta",
            float,
            source,
            10000.0,
        )
    else:
        theta, scaling = read_rope(data, source, default)
        local_theta = get_key(data, "rope_local_base_freq", float, source, 10000.0)
    return {"rope_theta": theta, "rope_scaling": scaling, "rope_local_theta": local_theta}


def _window_fields(
    data: dict[str, Any], source: str, model_type: str, num_layers: int
) -> dict[str, Any]:
    if model_type in _WINDOW_ON_EVERY_LAYER:
        return {"sliding_window": get_key(data, "sliding_window", int, source, None)}
    if model_type in _NO_SLIDING and data.get("use_sliding_window"):
        family = {"qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3-MoE"}[model_type]
        raise SpecsimError(
            f"{family} sliding-window attention is not supported",
            file=source,
            key="use_sliding_window",
            fix=f"set use_sliding_window to false (the released {family} models do)",
        )
    if model_type not in ("gemma2", "gemma3_text"):
        return {}
    if data.get("use_bidirectional_attention"):
        raise SpecsimError(
            "bidirectional attention is not supported",
            file=source,
            key="use_bidirectional_attention",
            fix="use a causal language model (set it to false)",
        )
    window = get_key(data, "sliding_window", int, source, 4096)
    types = data.get("layer_types")
    if types is None:
        every = (
            2 if model_type == "gemma2" else get_key(data, "sliding_window_pattern", int, source, 6)
        )
        types = [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or any(t not in _LAYER_TYPES for t in types)
    ):
        raise SpecsimError(
            f"expected {num_layers} of sliding_attention or full_attention, got {types!r:.60}",
            file=source,
            key="layer_types",
            fix="give one attention type per layer, or remove layer_types",
        )
    return {"sliding_window": window, "layer_types": tuple(_LAYER_TYPES[t] for t in types)}


def _check_full_rotary(data: dict[str, Any], source: str) -> None:
    """Phi-3 may rotate only part of each head (Phi-4-mini does); the loader rotates all of it."""
    for key, where in (
        ("partial_rotary_factor", data),
        ("rope_parameters", data.get("rope_parameters")),
    ):
        factor = where.get("partial_rotary_factor", 1.0) if isinstance(where, dict) else 1.0
        if factor != 1.0:
            raise SpecsimError(
                f"partial rotary embeddings are not supported, got {factor!r}",
                file=source,
                key=key if key == "partial_rotary_factor" else f"{key}.partial_rotary_factor",
                fix="use a model that rotates whole heads (partial_rotary_factor 1.0)",
            )


def _moe_fields(
    data: dict[str, Any], source: str, model_type: str, num_layers: int
) -> dict[str, Any]:
    if model_type == "mixtral":
        experts = get_key(data, "num_local_experts", int, source, 8)
        chosen = get_key(data, "num_experts_per_tok", int, source, 2)
        size = get_key(data, "intermediate_size", int, source)
        normalize, dense = True, ()
    else:
        key = "num_experts" if data.get("num_experts") is not None else "num_local_experts"
        experts = get_key(data, key, int, source, 128)
        chosen = get_key(data, "num_experts_per_tok", int, source, 8)
        size = get_key(data, "moe_intermediate_size", int, source, 768)
        normalize = get_key(data, "norm_topk_prob", bool, source, False)
        step = get_key(data, "decoder_sparse_step", int, source, 1)
        dense = moe_dense_layers(data, step, num_layers, source)
    check_experts_per_token(chosen, experts, source)
    return {
        "num_experts": experts,
        "experts_per_token": chosen,
        "expert_intermediate_size": size,
        "normalize_top_k": normalize,
        "dense_layers": dense,
    }


def family_hf_keys(config) -> dict[str, Any]:
    """The family's own ``config.json`` keys for ``config`` (a ``ModelConfig``), so that
    ``family_fields`` reads them back to the same flags."""
    kind = config.model_type
    data: dict[str, Any] = {}
    data["hidden_act"] = "gelu_pytorch_tanh" if config.activation == "gelu_tanh" else "silu"
    if kind in GEMMA:
        data["hidden_activation"] = data["hidden_act"]
    if kind in _BIAS_FLAG:
        data["attention_bias"] = config.attention_out_bias
    if config.rope_local_theta is not None:
        data["rope_local_base_freq"] = config.rope_local_theta
    if kind in ("gemma2", "gemma3_text"):
        scalar = config.query_pre_attn_scalar  # an int in transformers' config classes
        data["query_pre_attn_scalar"] = int(scalar) if scalar.is_integer() else scalar
        data["attn_logit_softcapping"] = config.attn_softcap
        data["final_logit_softcapping"] = config.final_softcap
        inverse = {v: k for k, v in _LAYER_TYPES.items()}
        data["layer_types"] = [inverse[t] for t in config.layer_types]
    if kind == "mixtral":
        data["num_local_experts"] = config.num_experts
        data["num_experts_per_tok"] = config.experts_per_token
    if kind == "qwen3_moe":
        data["num_experts"] = config.num_experts
        data["num_experts_per_tok"] = config.experts_per_token
        data["moe_intermediate_size"] = config.expert_intermediate_size
        data["norm_topk_prob"] = config.normalize_top_k
        data["mlp_only_layers"] = list(config.dense_layers)
    if kind == "deepseek_v3":
        data.update(deepseek_hf_keys(config))
    return data
