"""A ``ModelShape`` from a Hugging Face ``config.json`` (dict or file) of a model type it can
size (``SIZED_MODEL_TYPES``; another is refused, since its layout is unknown) or from any object
with the same attribute names (the loader's ``ModelConfig``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specsim.bounds import MAX_DIMENSION
from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.model_keys import (
    DEEPSEEK_V3_DEFAULTS,
    check_experts_per_token,
    deepseek_layer_counts,
    moe_dense_layers,
)
from specsim.parsing import parse_json
from specsim.profiling.flops import ModelShape

# Hugging Face key aliases, first match wins: (our name, candidate keys).
DIMENSION_KEYS = {
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "num_layers": ("num_hidden_layers", "num_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "num_heads", "n_head"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
}
# Read when present; absent or null, they follow from the above (no GQA, hidden / heads).
OPTIONAL_DIMENSION_KEYS = ("num_key_value_heads", "num_kv_heads", "head_dim")
# The decoder families whose layout is known: a gated MLP (or experts of one) and these extras.
SIZED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
)
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text")  # Hugging Face's default for the family
_QK_NORMS = ("qwen3", "qwen3_moe", "gemma3_text")  # an RMSNorm over each query and key head
_SANDWICH_NORMS = ("gemma2", "gemma3_text")  # two more norms per layer, after attention and MLP
_NO_BIASES = ("phi3", "mixtral")
# Mixture-of-experts keys: (experts, experts per token, expert MLP width); Hugging Face defaults.
MOE_KEYS = {
    "mixtral": (("num_local_experts", 8), ("num_experts_per_tok", 2), ("intermediate_size", None)),
    "qwen3_moe": (("num_experts", 128), ("num_experts_per_tok", 8), ("moe_intermediate_size", 768)),
}


def shape_from_config(config: dict[str, Any], name: str, source: str = "config") -> ModelShape:
    """A ``ModelShape`` from a Hugging Face ``config.json`` mapping."""

    def checked(key: str) -> int:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIMENSION:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            raise SpecsimError(
                f"expected a whole number from 1 to {MAX_DIMENSION:,}, got {shown}",
                file=source,
                key=key,
                fix="give the model's integer size",
            )
        return value

    def need(ours: str) -> int:
        for key in DIMENSION_KEYS[ours]:
            if key in config:
                return checked(key)
        raise SpecsimError(
            "missing model dimension",
            file=source,
            key=DIMENSION_KEYS[ours][0],
            fix="use a Hugging Face config.json of a decoder-only model",
        )

    def optional(*keys: str) -> int | None:
        # A null entry means "not set" in Hugging Face configs, as an absent one does.
        return next((checked(k) for k in keys if config.get(k) is not None), None)

    model_type = config.get("model_type")
    if model_type not in SIZED_MODEL_TYPES:
        shown = repr(model_type) if len(repr(model_type)) <= 40 else repr(model_type)[:40] + "..."
        raise SpecsimError(
            "no model_type" if model_type is None else f"model_type {shown} cannot be sized",
            file=source,
            key="model_type",
            fix=f"give the config.json of a {', '.join(SIZED_MODEL_TYPES)} model"
            + (" (Gemma 3: its text_config)" if model_type == "gemma3" else ""),
        )
    hidden = need("hidden_size")
    heads = need("num_heads")
    kv_heads = optional(*OPTIONAL_DIMENSION_KEYS[:2]) or heads
    head_dim = optional(OPTIONAL_DIMENSION_KEYS[2]) or hidden // heads
    num_layers = need("num_layers")
    extra_norms = (2 * head_dim if model_type in _QK_NORMS else 0) + (
        2 * hidden if model_type in _SANDWICH_NORMS else 0
    )
    biased = model_type not in _NO_BIASES and config.get("attention_bias", model_type == "qwen2")
    fields = {
        "num_kv_heads": int(kv_heads),
        "head_dim": int(head_dim),
        "attention_bias": bool(biased),
        "attention_out_bias": bool(biased) and model_type != "qwen2",
        "extra_norm_params_per_layer": extra_norms,
        **_moe_shape(config, model_type, num_layers, checked, source),
    }
    if model_type == "deepseek_v3":
        fields.update(_deepseek_shape(config, heads, num_layers, checked, source))
    return ModelShape(
        name=name,
        vocab_size=need("vocab_size"),
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=need("intermediate_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        gated_mlp=True,
        **fields,
    )


def _deepseek_shape(
    config: dict[str, Any], heads: int, num_layers: int, checked, source: str
) -> dict[str, Any]:
    """DeepSeek-V3's fields (transformers' defaults, DeepSeek-V3's own, for absent keys): latent
    attention, routed and shared experts after the first_k_dense_replace dense layers, MTP."""

    def size(key: str) -> int:
        return checked(key) if config.get(key) is not None else DEEPSEEK_V3_DEFAULTS[key]

    no_bottleneck = "q_lora_rank" in config and config["q_lora_rank"] is None
    q_lora = 0 if no_bottleneck else size("q_lora_rank")
    kv_lora, nope = size("kv_lora_rank"), size("qk_nope_head_dim")
    rope, experts = size("qk_rope_head_dim"), size("n_routed_experts")
    chosen = size("num_experts_per_tok")
    check_experts_per_token(chosen, experts, source)
    v_dim, width, shared = (
        size(k) for k in ("v_head_dim", "moe_intermediate_size", "n_shared_experts")
    )
    dense, mtp = deepseek_layer_counts(config, num_layers, source)
    return {
        "num_kv_heads": heads,  # one expanded key and value per query head
        "head_dim": nope + rope,
        "kv_lora_rank": kv_lora,
        "q_lora_rank": q_lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v_dim,
        "num_experts": experts,
        "experts_per_token": chosen,
        "expert_intermediate_size": width,
        "shared_experts": shared,
        "router_bias": True,
        "moe_layers": num_layers - dense,
        "mtp_layers": mtp,
        "attention_bias": False,
        "attention_out_bias": False,
        "extra_norm_params_per_layer": q_lora + kv_lora,
    }


def _moe_shape(config: dict[str, Any], model_type: str, num_layers: int, checked, source: str):
    """The MoE fields of a Mixtral or Qwen3-MoE config (none for a dense model)."""
    if model_type not in MOE_KEYS:
        return {}
    keys = MOE_KEYS[model_type]
    if model_type == "qwen3_moe" and config.get("num_experts") is None:
        keys = (("num_local_experts", 128), *keys[1:])  # transformers 5 writes this name
    experts, chosen, width = (
        checked(key) if config.get(key) is not None else default for key, default in keys
    )
    check_experts_per_token(chosen, experts, source)
    dense = 0
    if model_type == "qwen3_moe":  # dense layers: mlp_only_layers, and off the sparse step
        step = (
            checked("decoder_sparse_step") if config.get("decoder_sparse_step") is not None else 1
        )
        dense = len(moe_dense_layers(config, step, num_layers, source))
    return {
        "num_experts": experts,
        "experts_per_token": chosen,
        "expert_intermediate_size": width,
        "moe_layers": num_layers - dense,
    }


def load_shape(path: str | Path, name: str | None = None) -> ModelShape:
    """Read a ``config.json`` file (or a model folder holding one) into a ``ModelShape``."""
    config, path = read_config(path)
    label = name or config_label(config, path)
    return shape_from_config(config, label, str(path))


def config_label(config: dict[str, Any], path: Path) -> str:
    return str(config.get("_name_or_path") or path.parent.name or path.stem)


def read_config(path: str | Path) -> tuple[dict[str, Any], Path]:
    """A ``config.json`` file (or a model folder holding one) as a mapping, and its path."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    text = read_text(path, "model config")
    fix = "give a model's config.json: one JSON object of its sizes"
    if not text.strip():
        raise SpecsimError("file is empty", file=str(path), fix=fix)
    config = parse_json(text, str(path), fix)
    if not isinstance(config, dict):
        raise SpecsimError(
            f"expected a JSON object, found {type(config).__name__}",
            file=str(path),
            fix="give a model's config.json: one JSON object of its sizes",
        )
    return config, path


def shape_from_object(config: Any, name: str = "") -> ModelShape:
    """A ``ModelShape`` from an object with the loader's ``ModelConfig`` attribute names."""
    heads = int(config.num_heads)
    hidden = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", hidden // heads) or hidden // heads)
    layers = int(config.num_layers)
    experts = int(getattr(config, "num_experts", 0) or 0)
    extra_norms = (2 * head_dim if getattr(config, "qk_norm", False) else 0) + (
        2 * hidden if getattr(config, "sandwich_norms", False) else 0
    )
    kv_lora = int(getattr(config, "kv_lora_rank", 0) or 0)
    q_lora = int(getattr(config, "q_lora_rank", 0) or 0)
    if kv_lora:  # latent attention: the bottlenecks' norms
        extra_norms += q_lora + kv_lora
    return ModelShape(
        name=name or str(getattr(config, "name", "") or "model"),
        vocab_size=int(config.vocab_size),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_kv_heads", heads) or heads),
        head_dim=head_dim,
        intermediate_size=int(config.intermediate_size),
        tie_word_embeddings=bool(
            getattr(config, "tie_word_embeddings", getattr(config, "tie_embeddings", False))
        ),
        gated_mlp=bool(getattr(config, "gated_mlp", True)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        attention_out_bias=bool(getattr(config, "attention_out_bias", False)),
        num_experts=experts,
        experts_per_token=int(getattr(config, "experts_per_token", 0) or 0),
        expert_intermediate_size=int(getattr(config, "expert_intermediate_size", 0) or 0),
        moe_layers=0 if not experts else layers - len(getattr(config, "dense_layers", ())),
        extra_norm_params_per_layer=extra_norms,
        shared_experts=int(getattr(config, "shared_experts", 0) or 0),
        router_bias=getattr(config, "router", "softmax") == "sigmoid_grouped",
        kv_lora_rank=kv_lora,
        q_lora_rank=q_lora,
        qk_nope_head_dim=int(getattr(config, "qk_nope_head_dim", 0) or 0),
        qk_rope_head_dim=int(getattr(config, "qk_rope_head_dim", 0) or 0),
        v_head_dim=int(getattr(config, "v_head_dim", 0) or 0),
        mtp_layers=int(getattr(config, "mtp_layers", 0) or 0),
    )
