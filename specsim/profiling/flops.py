"""FLOPs and bytes of a decoder-only transformer, from its configuration.

Counts follow the usual convention: one multiply-add is 2 FLOPs, and only matrix products are
counted (norms, activations and softmax are a few percent of a pass and are left out). The
weights part of a forward pass costs ``2 x matmul params`` FLOPs per new token, including the LM
head but not the embedding lookup (a gather, no multiply). Attention adds, per layer, a
``Q K^T`` and a ``softmax(...) V`` product for every (new token, attended token) pair:
``2 x 2 x heads x head_dim`` FLOPs per pair per layer.

A mixture-of-experts model holds every expert in memory (``param_count``, ``weight_bytes``) but
a token's pass multiplies only by its ``experts_per_token`` experts and the router
(``active_param_count``, ``flops_per_token``).

A ``ModelShape`` is built from a Hugging Face ``config.json`` (dict or file) of a model type it
can size (``SIZED_MODEL_TYPES``; another is refused, since its layout is unknown) or from any
object with the same attribute names (the loader's ``ModelConfig``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.bounds import MAX_DIMENSION
from specsim.errors import SpecsimError
from specsim.fileio import read_text

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


@dataclass(frozen=True)
class ModelShape:
    """The shape numbers that decide a model's cost. ``gated_mlp``: SwiGLU (3 matrices) or not.
    ``moe_layers`` of the layers hold ``num_experts`` gated MLPs of ``expert_intermediate_size``
    (and a router) instead of the dense MLP; ``extra_norm_params_per_layer`` counts norms beyond
    the two every layer has (q/k norms, Gemma 2/3's sandwich norms)."""

    name: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    attention_bias: bool = False
    attention_out_bias: bool = False  # a bias on the output projection too (Llama's flag)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    moe_layers: int = 0
    extra_norm_params_per_layer: int = 0

    # -- parameters ---------------------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        bias = (
            (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        return q + kv + o + bias + (self.hidden_size if self.attention_out_bias else 0)

    @property
    def mlp_params_per_layer(self) -> int:
        matrices = 3 if self.gated_mlp else 2
        return matrices * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate LM-head matrix; zero when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    def _mlp_params(self, experts: int) -> int:
        """MLP weights of all layers, ``experts`` experts (and the router) per MoE layer."""
        dense = (self.num_layers - self.moe_layers) * self.mlp_params_per_layer
        router = self.hidden_size * self.num_experts
        return dense + self.moe_layers * (experts * self.expert_params + router)

    def _params(self, experts: int) -> int:
        norms = 2 * self.hidden_size + self.extra_norm_params_per_layer
        layers = self.num_layers * (self.attention_params_per_layer + norms)
        final_norm = self.hidden_size
        return (
            layers
            + self._mlp_params(experts)
            + self.embedding_params
            + self.lm_head_params
            + final_norm
        )

    def param_count(self) -> int:
        """Stored parameters, every expert included."""
        return self._params(self.num_experts)

    def active_param_count(self) -> int:
        """Parameters one token's pass uses: its experts only (all, for a dense model)."""
        return self._params(self.experts_per_token)

    def matmul_params(self) -> int:
        """Parameters used in a matrix product per new token: the active experts and the router
        (the LM head always is one)."""
        attention = self.num_layers * self.attention_params_per_layer
        mlp = self._mlp_params(self.experts_per_token)
        return attention + mlp + self.vocab_size * self.hidden_size

    def experts_read(self, tokens: int) -> float:
        """Experts per MoE layer that ``tokens`` tokens' routes touch, expected under uniform
        independent routing: E (1 - (1 - k / E) ** tokens)."""
        if not self.num_experts:
            return 0.0
        untouched = (1.0 - self.experts_per_token / self.num_experts) ** tokens
        return self.num_experts * (1.0 - untouched)

    # -- per-token costs ------------------------------------------------------------------------
    def weight_bytes(self, dtype_bytes: float) -> int:
        """Bytes of the stored weights: every expert is held in memory."""
        return round(self.param_count() * dtype_bytes)

    def weight_bytes_read(self, tokens: int, dtype_bytes: float) -> int:
        """Weight bytes a pass over ``tokens`` tokens reads: the dense weights and, of each MoE
        layer, the experts its tokens touch (``experts_read``)."""
        if not self.num_experts:
            return self.weight_bytes(dtype_bytes)
        unread = (self.num_experts - self.experts_read(tokens)) * self.expert_params
        return round((self.param_count() - self.moe_layers * unread) * dtype_bytes)

    def kv_bytes_per_token(self, dtype_bytes: float) -> int:
        """K and V of every layer for one cached token."""
        return round(2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes)

    def flops_per_token(self) -> float:
        """Weights part of a forward pass, per new token: 2 x matmul params."""
        return 2.0 * self.matmul_params()

    def attention_flops_per_pair(self) -> float:
        """FLOPs per (new token, attended token) pair, over all layers: QK^T plus AV."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim


@dataclass(frozen=True)
class PassCost:
    """FLOPs and bytes of one forward pass over a batch."""

    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float

    @property
    def bytes_moved(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


def pass_cost(
    shape: ModelShape, batch: int, context: int, new_tokens: int, dtype_bytes: float
) -> PassCost:
    """Cost of one pass where each of ``batch`` sequences has ``context`` cached tokens and adds
    ``new_tokens`` (1 = decode, k + 1 = verification, prompt length = prefill). The new tokens
    attend causally: token j of a sequence sees ``context + j + 1`` keys, so the pairs per
    sequence are ``new x (context + (new + 1) / 2)`` — the same ``P`` as the latency fit. A
    mixture of experts reads only the experts its ``batch x new_tokens`` tokens touch."""
    if batch < 1 or new_tokens < 1 or context < 0:
        raise ValueError("batch and new_tokens must be >= 1 and context >= 0")
    tokens = batch * new_tokens
    pairs = batch * new_tokens * (context + (new_tokens + 1) / 2.0)
    flops = tokens * shape.flops_per_token() + pairs * shape.attention_flops_per_pair()
    kv_token = shape.kv_bytes_per_token(dtype_bytes)
    return PassCost(
        flops=flops,
        weight_bytes=float(shape.weight_bytes_read(tokens, dtype_bytes)),
        kv_read_bytes=float(batch * context * kv_token),
        kv_write_bytes=float(tokens * kv_token),
    )


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
    return ModelShape(
        name=name,
        vocab_size=need("vocab_size"),
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=need("intermediate_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        gated_mlp=True,
        attention_bias=bool(biased),
        attention_out_bias=bool(biased) and model_type != "qwen2",
        extra_norm_params_per_layer=extra_norms,
        **_moe_shape(config, model_type, num_layers, checked, source),
    )


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
    if chosen > experts:
        raise SpecsimError(
            f"num_experts_per_tok {chosen} exceeds the {experts} experts",
            file=source,
            key="num_experts_per_tok",
            fix="give at most as many experts per token as the model has",
        )
    dense = 0
    if model_type == "qwen3_moe":  # dense layers: mlp_only_layers, and off the sparse step
        step = (
            checked("decoder_sparse_step") if config.get("decoder_sparse_step") is not None else 1
        )
        only = config.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in only
        ):
            raise SpecsimError(
                f"expected layer indices from 0 to {num_layers - 1}",
                file=source,
                key="mlp_only_layers",
                fix="list the dense layers' indices, or give []",
            )
        dense = sum(1 for i in range(num_layers) if i in only or (i + 1) % step)
    return {
        "num_experts": experts,
        "experts_per_token": chosen,
        "expert_intermediate_size": width,
        "moe_layers": num_layers - dense,
    }


def load_shape(path: str | Path, name: str | None = None) -> ModelShape:
    """Read a ``config.json`` file (or a model folder holding one) into a ``ModelShape``."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    text = read_text(path, "model config")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecsimError(
            f"invalid JSON: {exc.msg}" if text.strip() else "file is empty",
            file=str(path),
            key=f"line {exc.lineno}" if text.strip() else None,
            fix="give a model's config.json: one JSON object of its sizes",
        ) from None
    if not isinstance(config, dict):
        raise SpecsimError(
            f"expected a JSON object, found {type(config).__name__}",
            file=str(path),
            fix="give a model's config.json: one JSON object of its sizes",
        )
    label = name or str(config.get("_name_or_path") or path.parent.name or path.stem)
    return shape_from_config(config, label, str(path))


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
    )
