"""Bad-input cases of the model families' own config.json keys: for the loader (``profile``
measuring a config.json target, which reads every model's config before any loads) and for the
roofline's sizing (``profile roofline --target``), a model_type neither knows, the
mixture-of-experts keys, and DeepSeek-V3's latent-attention, router and YaRN keys.

Each family has a small valid base (``LOADER_BASES``, ``ROOFLINE_BASES``; ``test_bad_inputs``
checks they are accepted); every case spoils one key of one base.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from bad_input_bases import BASE_COMMANDS, TARGET_CONFIG, D
from bad_input_corpus import Bounds, Case, bad_numbers

SMALL = {
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
}
LOADER_BASES: dict[str, dict[str, Any]] = {
    "qwen3": {**SMALL, "model_type": "qwen3", "use_sliding_window": False},
    "gemma2": {
        **SMALL,
        "model_type": "gemma2",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    "gemma3_text": {
        **SMALL,
        "model_type": "gemma3_text",
        "sliding_window": 4,
        "sliding_window_pattern": 2,
        "rope_theta": 1e6,
        "rope_local_base_freq": 10000.0,  # transformers 5's rope_parameters is a spoil below
    },
    "phi3": {**SMALL, "model_type": "phi3", "sliding_window": 5, "partial_rotary_factor": 1.0},
    "mixtral": {**SMALL, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {
        **SMALL,
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "norm_topk_prob": True,
    },
    "deepseek_v3": {
        **SMALL,
        "model_type": "deepseek_v3",
        "num_key_value_heads": 4,
        "q_lora_rank": 12,
        "kv_lora_rank": 10,
        "qk_nope_head_dim": 6,
        "qk_rope_head_dim": 4,
        "v_head_dim": 5,
        "n_routed_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        # DeepSeek-V3's own: FP8 weights in blocks (the folder's weights dequantised at load)
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [8, 8]},
    },
}
_DEEPSEEK_SIZES = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
)
_YARN = LOADER_BASES["deepseek_v3"]["rope_scaling"]
_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
_BLOCK_KEY = "quantization_config.weight_block_size"
# Gemma 3's sliding_window_pattern is read only without layer_types (its base has none).
LOADER_NUMBERS = {
    "gemma2": {
        "query_pre_attn_scalar": float,
        "attn_logit_softcapping": float,
        "final_logit_softcapping": float,
        "sliding_window": int,
    },
    "gemma3_text": {"sliding_window_pattern": int, "rope_local_base_freq": float},
    "phi3": {"sliding_window": int},
    "mixtral": {"num_local_experts": int, "num_experts_per_tok": int},
    "qwen3_moe": {
        "num_experts": int,
        "num_experts_per_tok": int,
        "moe_intermediate_size": int,
        "decoder_sparse_step": int,
    },
    "deepseek_v3": {
        **dict.fromkeys(_DEEPSEEK_SIZES, int),
        "n_group": int,
        "topk_group": int,
        "routed_scaling_factor": float,
    },
}
# (base, changed keys, the key the error names)
LOADER_SPOILS = [
    ("gemma2", {"model_type": "gpt2"}, "model_type"),
    ("gemma2", {"model_type": "gemma3"}, "model_type"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, "layer_types"),
    ("gemma2", {"layer_types": ["local", "full_attention", "sliding_attention"]}, "layer_types"),
    ("gemma2", {"hidden_activation": "relu"}, "hidden_activation"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    (
        "gemma3_text",
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0},
            }
        },
        "rope_parameters.sliding_attention.rope_type",
    ),
    (
        "gemma3_text",
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": -1.0},
            }
        },
        "rope_parameters.sliding_attention.rope_theta",
    ),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window"),
    ("phi3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("phi3", {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_scaling.rope_type"),
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("qwen3_moe", {"mlp_only_layers": [7]}, "mlp_only_layers"),
    ("qwen3_moe", {"mlp_only_layers": "all"}, "mlp_only_layers"),
    ("qwen3_moe", {"norm_topk_prob": "yes"}, "norm_topk_prob"),
    # YaRN is read for DeepSeek-V3 only.
    (
        "qwen3",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
        "rope_scaling.rope_type",
    ),
    ("deepseek_v3", {"intermediate_size": None}, "intermediate_size"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("deepseek_v3", {"n_group": 3}, "n_group"),
    ("deepseek_v3", {"n_group": 8}, "n_group"),  # groups of one expert
    ("deepseek_v3", {"topk_group": 5}, "topk_group"),
    ("deepseek_v3", {"num_experts_per_tok": 5}, "num_experts_per_tok"),  # > 2 groups of 2
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func"),
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method"),
    ("deepseek_v3", {"first_k_dense_replace": 4}, "first_k_dense_replace"),
    ("deepseek_v3", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ("deepseek_v3", {"num_nextn_predict_layers": 1.5}, "num_nextn_predict_layers"),
    ("deepseek_v3", {"attention_bias": True}, "attention_bias"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v3", {"rope_interleave": "yes"}, "rope_interleave"),
    ("deepseek_v3", {"norm_topk_prob": 1}, "norm_topk_prob"),
    (
        "deepseek_v3",
        {"rope_scaling": {"type": "yarn", "factor": 4.0}},
        "rope_scaling.original_max_position_embeddings",
    ),
    ("deepseek_v3", {"rope_scaling": {**_YARN, "factor": -4.0}}, "rope_scaling.factor"),
    (
        "deepseek_v3",
        {"rope_scaling": {**_YARN, "mscale_all_dim": float("nan")}},
        "rope_scaling.mscale_all_dim",
    ),
    ("deepseek_v3", {"rope_scaling": {**_YARN, "beta_fast": "fast"}}, "rope_scaling.beta_fast"),
    ("deepseek_v3", {"rope_scaling": {**_YARN, "truncate": "yes"}}, "rope_scaling.truncate"),
    # FP8 block-quantised checkpoints: their config's declaration (the weights' own layout is
    # tests/test_deepseek_fp8.py's: it needs weight files).
    ("deepseek_v3", {"quantization_config": "fp8"}, "quantization_config"),
    (
        "deepseek_v3",
        {"quantization_config": {**_FP8, "quant_method": "awq"}},
        "quantization_config.quant_method",
    ),
    ("deepseek_v3", {"quantization_config": {**_FP8, "fmt": "e5m2"}}, "quantization_config.fmt"),
    *(
        ("deepseek_v3", {"quantization_config": {**_FP8, "weight_block_size": bad}}, _BLOCK_KEY)
        for bad in (None, [128], [128, 0], [128, 1.5], [128, True], "128x128", [128, 2**17])
    ),
]

MIXTRAL_TARGET = {
    **TARGET_CONFIG,
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
QWEN3_MOE_TARGET = {
    **TARGET_CONFIG,
    "model_type": "qwen3_moe",
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
}
DEEPSEEK_TARGET = {
    **TARGET_CONFIG,
    "model_type": "deepseek_v3",
    "num_key_value_heads": 16,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1,
}
ROOFLINE_BASES = {
    "mixtral": MIXTRAL_TARGET,
    "qwen3_moe": QWEN3_MOE_TARGET,
    "deepseek_v3": DEEPSEEK_TARGET,
}
ROOFLINE_NUMBERS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "decoder_sparse_step",
    ),
    "deepseek_v3": _DEEPSEEK_SIZES,
}
ROOFLINE_SPOILS = [
    ("mixtral", {"model_type": None}, "model_type"),
    ("mixtral", {"model_type": "gpt2"}, "model_type"),
    ("mixtral", {"model_type": "gemma3"}, "model_type"),
    ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("qwen3_moe", {"mlp_only_layers": [99]}, "mlp_only_layers"),
    ("qwen3_moe", {"mlp_only_layers": [True]}, "mlp_only_layers"),
    ("deepseek_v3", {"num_experts_per_tok": 17}, "num_experts_per_tok"),
    ("deepseek_v3", {"first_k_dense_replace": 9}, "first_k_dense_replace"),  # of 8 layers
    ("deepseek_v3", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ("deepseek_v3", {"num_nextn_predict_layers": "one"}, "num_nextn_predict_layers"),
]


def _measure_with(config: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    argv = list(BASE_COMMANDS["profile measure"])
    argv[argv.index("specsim-target")] = f"{D}/model.json"
    return tuple(argv), (("model.json", json.dumps(config)),)


def _roofline_with(config: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    return tuple(BASE_COMMANDS["profile roofline"]), (("target.json", json.dumps(config)),)


def _spoilt(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    doc = {**base, **change}
    return {k: v for k, v in doc.items() if v is not None}


def _number_bounds(kind: type) -> Bounds:
    return Bounds(int, 1) if kind is int else Bounds(float, 0, low_open=True)


def family_config_cases() -> Iterator[Case]:
    for family, keys in LOADER_NUMBERS.items():
        for key, kind in keys.items():
            for name, value in bad_numbers(_number_bounds(kind)):
                argv, files = _measure_with(_spoilt(LOADER_BASES[family], {key: value}))
                yield Case(
                    f"model-config:{family}:{key}={name}", argv, files, (("model.json",), (key,))
                )
    for family, change, key in LOADER_SPOILS:
        argv, files = _measure_with(_spoilt(LOADER_BASES[family], change))
        label = ",".join(f"{k}={json.dumps(v)[:20]}" for k, v in change.items())
        yield Case(f"model-config:{family}:{label}", argv, files, (("model.json",), (key,)))
    for family, keys in ROOFLINE_NUMBERS.items():
        for key in keys:
            for name, value in bad_numbers(Bounds(int, 1)):
                argv, files = _roofline_with(_spoilt(ROOFLINE_BASES[family], {key: value}))
                yield Case(
                    f"model-json:{family}:{key}={name}", argv, files, (("target.json",), (key,))
                )
    for family, change, key in ROOFLINE_SPOILS:
        argv, files = _roofline_with(_spoilt(ROOFLINE_BASES[family], change))
        label = ",".join(f"{k}={json.dumps(v)[:20]}" for k, v in change.items())
        yield Case(f"model-json:{family}:{label}", argv, files, (("target.json",), (key,)))
