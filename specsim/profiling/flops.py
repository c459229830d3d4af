"""FLOPs and bytes of a decoder-only transformer, from its configuration.

Counts follow the usual convention: one multiply-add is 2 FLOPs, and only matrix products are
counted (norms, activations and softmax are a few percent of a pass and are left out). The
weights part of a forward pass costs ``2 x matmul params`` FLOPs per new token, including the LM
head but not the embedding lookup (a gather, no multiply). Attention adds, per layer, a
``Q K^T`` and a ``softmax(...) V`` product for every (new token, attended token) pair:
``2 x 2 x heads x head_dim`` FLOPs per pair per layer.

A ``ModelShape`` is built from a Hugging Face ``config.json`` (dict or file) or from any object
with the same attribute names (the built-in models' ``config``).
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


@dataclass(frozen=True)
class ModelShape:
    """The shape numbers that decide a model's cost. ``gated_mlp``: SwiGLU (3 matrices) or not."""

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

    # -- parameters ---------------------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        bias = (
            (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        return q + kv + o + bias

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

    def param_count(self) -> int:
        per_layer = (
            self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size
        )
        final_norm = self.hidden_size
        return (
            self.num_layers * per_layer + self.embedding_params + self.lm_head_params + final_norm
        )

    def matmul_params(self) -> int:
        """Parameters used in a matrix product per new token (the LM head always is one)."""
        per_layer = self.attention_params_per_layer + self.mlp_params_per_layer
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size

    # -- per-token costs ------------------------------------------------------------------------
    def weight_bytes(self, dtype_bytes: float) -> int:
        return round(self.param_count() * dtype_bytes)

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
    sequence are ``new x (context + (new + 1) / 2)`` — the same ``P`` as the latency fit."""
    if batch < 1 or new_tokens < 1 or context < 0:
        raise ValueError("batch and new_tokens must be >= 1 and context >= 0")
    tokens = batch * new_tokens
    pairs = batch * new_tokens * (context + (new_tokens + 1) / 2.0)
    flops = tokens * shape.flops_per_token() + pairs * shape.attention_flops_per_pair()
    kv_token = shape.kv_bytes_per_token(dtype_bytes)
    return PassCost(
        flops=flops,
        weight_bytes=float(shape.weight_bytes(dtype_bytes)),
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

    hidden = need("hidden_size")
    heads = need("num_heads")
    kv_heads = optional(*OPTIONAL_DIMENSION_KEYS[:2]) or heads
    head_dim = optional(OPTIONAL_DIMENSION_KEYS[2]) or hidden // heads
    act = str(config.get("hidden_act", config.get("activation_function", "silu")))
    gated = config.get("gated_mlp", act in ("silu", "swiglu", "gelu_pytorch_tanh_gated"))
    model_type = str(config.get("model_type", ""))
    return ModelShape(
        name=name,
        vocab_size=need("vocab_size"),
        num_layers=need("num_layers"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=need("intermediate_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        gated_mlp=bool(gated),
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
    )


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
    """A ``ModelShape`` from an object with the built-in models' attribute names."""
    heads = int(config.num_heads)
    hidden = int(config.hidden_size)
    return ModelShape(
        name=name or str(getattr(config, "name", "") or "model"),
        vocab_size=int(config.vocab_size),
        num_layers=int(config.num_layers),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_kv_heads", heads) or heads),
        head_dim=int(getattr(config, "head_dim", hidden // heads) or hidden // heads),
        intermediate_size=int(config.intermediate_size),
        tie_word_embeddings=bool(
            getattr(config, "tie_word_embeddings", getattr(config, "tie_embeddings", False))
        ),
        gated_mlp=bool(getattr(config, "gated_mlp", True)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
    )
