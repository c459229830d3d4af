"""The decoder's architecture, read from (and written to) a Hugging Face ``config.json``.

Only the keys that change the computation are read; the many other keys a Hugging Face config
carries are ignored. A key that is present but malformed, or a required key that is missing, is a
one-line ``SpecsimError`` naming the file and the key.

Size helpers (``param_count``, ``weight_bytes``, ``kv_bytes_per_token``, ``flops_per_token``,
``attention_flops_per_context_token``) follow from the architecture alone; the profiler writes
them into a profile's model section.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.fileio import read_text

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU."""

    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    model_type: str = "llama"
    name: str = ""
    attention_bias: bool = False  # biases on the q/k/v projections (Qwen2; Llama's flag)
    attention_out_bias: bool = False  # a bias on the output projection too (Llama's flag only)
    # None, or a Hugging Face rope_scaling mapping with rope_type "linear" or "llama3".
    rope_scaling: dict[str, Any] | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    # "bytes" for the built-in byte-level tokenizer; None means "look for tokenizer.json".
    tokenizer: str | None = None
    # Mistral's sliding-window attention: each token sees only the last this-many positions.
    sliding_window: int | None = None

    # ---- sizes -------------------------------------------------------------------------------

    def _layer_matmul_params(self) -> int:
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    def _layer_params(self) -> int:
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = (q_out + 2 * kv_out) if self.attention_bias else 0
        bias += self.hidden_size if self.attention_out_bias else 0
        return self._layer_matmul_params() + bias + 2 * self.hidden_size  # two norms

    def param_count(self) -> int:
        """Stored parameters (a tied output projection counts once)."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_embeddings else embed
        return embed + head + self.num_layers * self._layer_params() + self.hidden_size

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of the stored weights at ``dtype_bytes`` per parameter."""
        return self.param_count() * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies: keys and values of every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def matmul_params(self) -> int:
        """Weights that take part in a matrix multiply per token (not the embedding lookup, the
        norms or the biases; the output projection counts even when tied)."""
        return self.num_layers * self._layer_matmul_params() + self.vocab_size * self.hidden_size

    def flops_per_token(self) -> float:
        """Weight FLOPs of one token's forward pass: 2 per multiply-add."""
        return 2.0 * self.matmul_params()

    def attention_flops_per_context_token(self) -> float:
        """Extra FLOPs per new token per token it attends to: q·k and the weighted sum of v,
        2 FLOPs each per head dimension, in every layer."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    def forward_flops(self, new_tokens: int, context_len: int) -> float:
        """FLOPs of one row's pass that appends ``new_tokens`` to ``context_len`` cached tokens
        (causal: the i-th new token attends to context_len + i positions, at most the sliding
        window)."""
        n, c = new_tokens, context_len
        uncapped = n if self.sliding_window is None else max(0, min(n, self.sliding_window - c))
        attended = uncapped * c + uncapped * (uncapped + 1) / 2
        if self.sliding_window is not None:
            attended += (n - uncapped) * self.sliding_window
        return n * self.flops_per_token() + self.attention_flops_per_context_token() * attended

    # ---- Hugging Face config.json ------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` mapping that Hugging Face libraries and ``from_hf_dict`` both read."""
        archs = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
        data: dict[str, Any] = {
            "architectures": [archs.get(self.model_type, "Qwen2ForCausalLM")],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float16",
        }
        if self.model_type != "qwen2":
            data["attention_bias"] = self.attention_bias
        if self.rope_scaling is not None:
            data["rope_scaling"] = dict(self.rope_scaling)
        if self.bos_id is not None:
            data["bos_token_id"] = self.bos_id
        if self.eos_id is not None:
            data["eos_token_id"] = self.eos_id
        if self.tokenizer is not None:
            data["specsim_tokenizer"] = self.tokenizer
        if self.sliding_window is not None:
            data["sliding_window"] = self.sliding_window
        return data

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], source: str, name: str = "") -> ModelConfig:
        return _parse_hf_config(data, source, name)

    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> ModelConfig:
        path = Path(path)
        text = read_text(path, "config.json")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecsimError(
                f"invalid JSON: {exc.msg} (line {exc.lineno})",
                file=str(path),
                fix="repair the file or copy it again from the model repository",
            ) from None
        if not isinstance(data, dict):
            raise SpecsimError("expected a JSON object", file=str(path))
        return _parse_hf_config(data, str(path), name if name is not None else path.parent.name)


def _get(data: dict[str, Any], key: str, kind: type, source: str, default: Any = ...) -> Any:
    """One key of a config.json, type-checked. bool is not accepted where int is expected."""
    if key not in data or data[key] is None:
        if default is ...:
            raise SpecsimError(
                "missing key", file=source, key=key, fix=f"add {key!r} to the config.json"
            )
        return default
    value = data[key]
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise SpecsimError(
            f"expected {kind.__name__}, got {value!r}",
            file=source,
            key=key,
            fix=f"give a {kind.__name__}",
        )
    if kind in (int, float) and not (math.isfinite(value) and value > 0):
        raise SpecsimError(
            f"must be positive, got {value!r}", file=source, key=key, fix="give a positive number"
        )
    return value


def _token_id(data: dict[str, Any], key: str, source: str) -> int | None:
    """bos/eos ids; Hugging Face allows a list for eos (several stop tokens): take the first."""
    value = data.get(key)
    if isinstance(value, list) and value:
        value = value[0]
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecsimError(
            f"expected a token id, got {value!r}", file=source, key=key, fix="give an integer"
        )
    return value


def _rope(data: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling). Older configs have ``rope_theta`` and ``rope_scaling``; newer
    ones (transformers 5) one ``rope_parameters`` mapping holding both."""
    if data.get("rope_parameters") is not None:
        params, key = data["rope_parameters"], "rope_parameters"
        if not isinstance(params, dict):
            raise SpecsimError("expected a mapping", file=source, key=key, fix="give a mapping")
        theta = _get(
            {f"{key}.rope_theta": params.get("rope_theta")},
            f"{key}.rope_theta",
            float,
            source,
            10000.0,
        )
        return theta, _rope_scaling(params, source, key)
    theta = _get(data, "rope_theta", float, source, 10000.0)
    scaling = data.get("rope_scaling")
    return theta, None if scaling is None else _rope_scaling(scaling, source, "rope_scaling")


def _rope_scaling(scaling: Any, source: str, key: str) -> dict[str, Any] | None:
    if not isinstance(scaling, dict):
        raise SpecsimError("expected a mapping", file=source, key=key, fix="give a mapping or null")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise SpecsimError(
            f"rope scaling {rope_type!r} is not supported",
            file=source,
            key=f"{key}.rope_type",
            fix=f"use one of {', '.join(SUPPORTED_ROPE_SCALING)} or remove rope_scaling",
        )
    if rope_type == "default":
        return None
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise SpecsimError(
            f"expected a positive factor, got {factor!r}",
            file=source,
            key=f"{key}.factor",
            fix="give a positive number",
        )
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            value = scaling.get(name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise SpecsimError(
                    f"expected a positive number, got {value!r}",
                    file=source,
                    key=f"{key}.{name}",
                    fix=f"copy {key} from the model's original config.json",
                )
    kept = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return {"rope_type": rope_type, **{k: scaling[k] for k in kept if k in scaling}}


def _parse_hf_config(data: dict[str, Any], source: str, name: str) -> ModelConfig:
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SpecsimError(
            f"model_type {model_type!r} is not supported",
            file=source,
            key="model_type",
            fix=f"use a model of type {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise SpecsimError(
            f"activation {act!r} is not supported", file=source, key="hidden_act", fix="use silu"
        )
    hidden = _get(data, "hidden_size", int, source)
    heads = _get(data, "num_attention_heads", int, source)
    kv_heads = _get(data, "num_key_value_heads", int, source, heads)
    if hidden % heads and "head_dim" not in data:
        raise SpecsimError(
            f"hidden_size {hidden} is not divisible by num_attention_heads {heads}",
            file=source,
            key="num_attention_heads",
            fix="give head_dim or a head count that divides hidden_size",
        )
    head_dim = _get(data, "head_dim", int, source, hidden // heads)
    if heads % kv_heads:
        raise SpecsimError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            file=source,
            key="num_key_value_heads",
            fix="give a key/value head count that divides the head count",
        )
    if _get(data, "mlp_bias", bool, source, False):
        raise SpecsimError(
            "MLP biases (mlp_bias: true) are not supported",
            file=source,
            key="mlp_bias",
            fix="use a model without MLP biases (the released Llama, Qwen2 and Mistral models)",
        )
    # Qwen2 always has q/k/v biases and none on the output projection; Llama's attention_bias
    # (default off) puts biases on all four projections.
    llama_bias = model_type != "qwen2" and _get(data, "attention_bias", bool, source, False)
    rope_theta, rope_scaling = _rope(data, source)
    sliding_window = None
    if model_type == "mistral":
        sliding_window = _get(data, "sliding_window", int, source, None)
    elif model_type == "qwen2" and data.get("use_sliding_window"):
        raise SpecsimError(
            "Qwen2 sliding-window attention is not supported",
            file=source,
            key="use_sliding_window",
            fix="set use_sliding_window to false (the released Qwen2 models do)",
        )
    tokenizer = data.get("specsim_tokenizer")
    if tokenizer not in (None, "bytes"):
        raise SpecsimError(
            f"unknown tokenizer {tokenizer!r}",
            file=source,
            key="specsim_tokenizer",
            fix="use 'bytes' or remove the key to use tokenizer.json",
        )
    return ModelConfig(
        vocab_size=_get(data, "vocab_size", int, source),
        num_layers=_get(data, "num_hidden_layers", int, source),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_get(data, "intermediate_size", int, source),
        max_position=_get(data, "max_position_embeddings", int, source, 4096),
        rope_theta=rope_theta,
        norm_eps=_get(data, "rms_norm_eps", float, source, 1e-6),
        tie_embeddings=_get(data, "tie_word_embeddings", bool, source, False),
        model_type=model_type,
        name=name,
        attention_bias=model_type == "qwen2" or llama_bias,
        attention_out_bias=llama_bias,
        rope_scaling=rope_scaling,
        bos_id=_token_id(data, "bos_token_id", source),
        eos_id=_token_id(data, "eos_token_id", source),
        tokenizer=tokenizer,
        sliding_window=sliding_window,
    )
