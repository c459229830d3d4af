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
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.models.config_keys import get_key, token_id
from specsim.models.families import (
    ARCHITECTURES,
    check_model_type,
    family_fields,
    family_hf_keys,
)
from specsim.models.fp8 import read_block_size
from specsim.parsing import parse_json


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, rotary embeddings, grouped-query attention, a gated MLP
    (or a mixture of such experts); the fields after ``sliding_window`` are the families' flags."""

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
    # The families' small differences (families.py reads them from config.json).
    # None: every layer uses sliding_window; else "sliding" or "full" per layer (Gemma 2/3).
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None  # Gemma 3's sliding layers: their own unscaled RoPE
    activation: str = "silu"  # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3)
    gemma_norms: bool = False  # norms scale by 1 + weight; embeddings by sqrt(hidden_size)
    sandwich_norms: bool = False  # norms after attention and MLP outputs too (Gemma 2/3)
    query_pre_attn_scalar: float | None = None  # scores scale by its ** -0.5; None: head_dim's
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # the same on the output logits
    # Mixture of experts: each token's MLP is the router's top experts_per_token of num_experts.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    normalize_top_k: bool = True  # renormalise the chosen experts' weights to sum to 1
    dense_layers: tuple[int, ...] = ()  # MoE models' layers that keep a dense MLP (Qwen3-MoE)
    # DeepSeek-V3's router: sigmoid scores, the top groups_per_token of expert_groups groups
    # (ranked with a learned score bias), their scores times routed_scaling_factor; and
    # shared_experts experts' width of an MLP that every token runs beside its routed experts.
    router: str = "softmax"  # or "sigmoid_grouped"
    expert_groups: int = 1
    groups_per_token: int = 1
    routed_scaling_factor: float = 1.0
    shared_experts: int = 0
    # Multi-head latent attention (kv_lora_rank > 0, DeepSeek-V3): queries through a
    # q_lora_rank bottleneck (None: one q_proj), keys and values expanded from a shared latent
    # of kv_lora_rank plus one rotary key of qk_rope_head_dim (head_dim = qk_nope + qk_rope).
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # rotary pairs are adjacent (x0, x1), not half a head apart
    mtp_layers: int = 0  # multi-token-prediction modules after the last layer (deepseek_mtp)
    weight_block_size: tuple[int, int] | None = None  # FP8 block-quantised weights (fp8.py)

    # ---- sizes -------------------------------------------------------------------------------

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def rotary_dim(self) -> int:
        """The width each head rotates: the decoupled rotary part under latent attention."""
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    def layer_window(self, layer: int) -> int | None:
        """The sliding window layer ``layer`` attends within (None: the whole context)."""
        if self.layer_types is not None and self.layer_types[layer] == "full":
            return None
        return self.sliding_window

    @property
    def _moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def _attention_matmul_params(self) -> int:
        if self.is_mla:
            return _mla_matmul_params(self)
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size

    def _mlp_matmul_params(self, experts: int) -> int:
        """MLP weights of all layers with ``experts`` experts counted per MoE layer (the
        router's matrix included)."""
        dense = 3 * self.hidden_size * self.intermediate_size
        expert = 3 * self.hidden_size * self.expert_intermediate_size
        moe = (experts + self.shared_experts) * expert + self.hidden_size * self.num_experts
        return (self.num_layers - self._moe_layers) * dense + self._moe_layers * moe

    def _small_params_per_layer(self) -> int:
        if self.is_mla:  # two layer norms and the latents' own
            return 2 * self.hidden_size + (self.q_lora_rank or 0) + self.kv_lora_rank
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = (q_out + 2 * kv_out) if self.attention_bias else 0
        bias += self.hidden_size if self.attention_out_bias else 0
        norms = (4 if self.sandwich_norms else 2) * self.hidden_size
        return bias + norms + (2 * self.head_dim if self.qk_norm else 0)

    def param_count(self) -> int:
        """Stored parameters, every expert included (a tied output projection counts once)."""
        return self._params(self.num_experts)

    def active_param_count(self) -> int:
        """Parameters one token's pass uses: only its experts_per_token experts of each MoE
        layer (equal to ``param_count`` for a dense model)."""
        return self._params(self.experts_per_token)

    def _params(self, experts: int) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_embeddings else embed
        layers = self.num_layers * (
            self._attention_matmul_params() + self._small_params_per_layer()
        )
        score_bias = self._moe_layers * self.num_experts if self.router == "sigmoid_grouped" else 0
        mlp = self._mlp_matmul_params(experts) + score_bias
        return embed + head + layers + mlp + self.hidden_size

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of the stored weights (all experts) at ``dtype_bytes`` per parameter."""
        return self.param_count() * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies: keys and values of every layer (under latent
        attention the latent and the rotary key, as vLLM and SGLang store them and the cache
        here does)."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def matmul_params(self) -> int:
        """Weights that take part in a matrix multiply per token: the active experts and the
        router, not the embedding lookup, the norms or the biases; the output projection counts
        even when tied."""
        attention = self.num_layers * self._attention_matmul_params()
        mlp = self._mlp_matmul_params(self.experts_per_token)
        return attention + mlp + self.vocab_size * self.hidden_size

    def flops_per_token(self) -> float:
        """Weight FLOPs of one token's forward pass: 2 per multiply-add."""
        return 2.0 * self.matmul_params()

    def attention_flops_per_context_token(self) -> float:
        """Extra FLOPs per new token per token it attends to: q·k and the weighted sum of v,
        2 FLOPs each per head dimension, in every layer. Latent attention is counted as the
        engines decode it, on the latent (the key and value projections absorbed into the
        query and output): q·(latent, rotary key) and the weighted sum of the latent."""
        if self.is_mla:
            per_head = 4 * self.kv_lora_rank + 2 * self.qk_rope_head_dim
            return float(self.num_layers * self.num_heads * per_head)
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    def forward_flops(self, new_tokens: int, context_len: int) -> float:
        """FLOPs of one row's pass that appends ``new_tokens`` to ``context_len`` cached tokens
        (causal: the i-th new token attends to context_len + i positions, at most its layer's
        sliding window)."""
        n, c = new_tokens, context_len
        per_layer = self.attention_flops_per_context_token() / self.num_layers
        attention = 0.0
        for layer in range(self.num_layers):
            window = self.layer_window(layer)
            uncapped = n if window is None else max(0, min(n, window - c))
            attended = uncapped * c + uncapped * (uncapped + 1) / 2
            if window is not None:
                attended += (n - uncapped) * window
            attention += per_layer * attended
        return n * self.flops_per_token() + attention

    # ---- Hugging Face config.json ------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` mapping that Hugging Face libraries and ``from_hf_dict`` both read."""
        data: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
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
            "torch_dtype": "float16",
            **family_hf_keys(self),
        }
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
        data = parse_json(
            text, str(path), "repair the file or copy it again from the model repository"
        )
        if not isinstance(data, dict):
            raise SpecsimError(
                "expected a JSON object", file=str(path), fix="give a model's config.json"
            )
        return _parse_hf_config(data, str(path), name if name is not None else path.parent.name)


def _mla_matmul_params(c: ModelConfig) -> int:
    """Latent attention's matrices: the query's (through its bottleneck, if any), the latent's
    down-projection with the rotary key, its up-projection to keys and values, the output."""
    h, heads = c.hidden_size, c.num_heads
    q_width = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    q = h * q_width if c.q_lora_rank is None else c.q_lora_rank * (h + q_width)
    kv = h * (c.kv_lora_rank + c.qk_rope_head_dim)
    kv += c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim)
    return q + kv + heads * c.v_head_dim * h


def _parse_hf_config(data: dict[str, Any], source: str, name: str) -> ModelConfig:
    model_type = check_model_type(data, source)
    hidden = get_key(data, "hidden_size", int, source)
    heads = get_key(data, "num_attention_heads", int, source)
    kv_heads = get_key(data, "num_key_value_heads", int, source, heads)
    if hidden % heads and "head_dim" not in data:
        raise SpecsimError(
            f"hidden_size {hidden} is not divisible by num_attention_heads {heads}",
            file=source,
            key="num_attention_heads",
            fix="give head_dim or a head count that divides hidden_size",
        )
    head_dim = get_key(data, "head_dim", int, source, hidden // heads)
    if heads % kv_heads:
        raise SpecsimError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            file=source,
            key="num_key_value_heads",
            fix="give a key/value head count that divides the head count",
        )
    if get_key(data, "mlp_bias", bool, source, False):
        raise SpecsimError(
            "MLP biases (mlp_bias: true) are not supported",
            file=source,
            key="mlp_bias",
            fix="use a model without MLP biases (the released models of these families)",
        )
    tokenizer = data.get("specsim_tokenizer")
    if tokenizer not in (None, "bytes"):
        raise SpecsimError(
            f"unknown tokenizer {tokenizer!r}",
            file=source,
            key="specsim_tokenizer",
            fix="use 'bytes' or remove the key to use tokenizer.json",
        )
    num_layers = get_key(data, "num_hidden_layers", int, source)
    # A family may set the head sizes its own way (latent attention's head_dim is its own).
    fields = {
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        **family_fields(data, source, model_type, num_layers),
    }
    return ModelConfig(
        vocab_size=get_key(data, "vocab_size", int, source),
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=get_key(data, "intermediate_size", int, source),
        max_position=get_key(data, "max_position_embeddings", int, source, 4096),
        norm_eps=get_key(data, "rms_norm_eps", float, source, 1e-6),
        model_type=model_type,
        name=name,
        bos_id=token_id(data, "bos_token_id", source),
        eos_id=token_id(data, "eos_token_id", source),
        tokenizer=tokenizer,
        weight_block_size=read_block_size(data, source),
        **fields,
    )
