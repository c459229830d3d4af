"""FLOPs and bytes of a decoder-only transformer, from its configuration.

Counts follow the usual convention: one multiply-add is 2 FLOPs, and only matrix products are
counted (norms, activations and softmax are a few percent of a pass and are left out). The
weights part of a forward pass costs ``2 x matmul params`` FLOPs per new token, including the LM
head but not the embedding lookup (a gather, no multiply). Attention adds, per layer, a
``Q K^T`` and a ``softmax(...) V`` product for every (new token, attended token) pair:
``2 x 2 x heads x head_dim`` FLOPs per pair per layer.

A mixture-of-experts model holds every expert in memory (``param_count``, ``weight_bytes``) but
a token's pass multiplies only by its ``experts_per_token`` experts, its shared experts (which
every token runs, DeepSeek-V3) and the router (``active_param_count``, ``flops_per_token``).

Multi-head latent attention (DeepSeek-V3, ``kv_lora_rank > 0``) is sized as vLLM and SGLang run
it: the cache holds one latent of ``kv_lora_rank`` plus one rotary key of ``qk_rope_head_dim``
per token per layer (on every device of a tensor-parallel replica: the latent is not split by
head), and decoding attends on the latent with the key and value up-projections absorbed into
the query and output, ``2 (kv_lora_rank + qk_rope_head_dim) + 2 kv_lora_rank`` FLOPs per head
per pair; prefill runs it decompressed, as multi-head attention with keys of ``qk_nope_head_dim +
qk_rope_head_dim`` and values of ``v_head_dim``: ``2 (qk_nope + qk_rope + v)`` FLOPs per head per
pair (vLLM ``v1/attention/backends/mla/common.py``: "compute friendly approach for prefill,
data-movement friendly for decode"). FLOP counts (``flops_total``) use the decode form
throughout. The weights' FLOPs are 2 per parameter in either form. DeepSeek-V3's
multi-token-prediction module (``mtp_shape``) is sized apart from the model: it is a drafter.

``specsim.profiling.model_configs`` builds a ``ModelShape`` from a model's configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    # DeepSeek-V3 (module docstring): shared experts (in routed experts' widths) in every MoE
    # layer, a score-correction bias per routed expert, latent attention (kv_lora_rank > 0;
    # q_lora_rank 0: no query bottleneck), and the multi-token-prediction modules it stores.
    shared_experts: int = 0
    router_bias: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    # A drafter that uses the target's embedding and LM head (an MTP module): held once, by the
    # target, but its head is still multiplied by.
    shares_embeddings: bool = False
    extra_matmul_params: int = 0  # an MTP module's projection of [embedding; hidden state]
    # An EAGLE-3 head's own LM head over a reduced draft vocabulary (held by the head, though
    # its embedding is the target's); 0: the LM head spans ``vocab_size``.
    draft_vocab_size: int = 0
    # Norm weights beyond two per layer and the final one: negative where an architecture
    # drops some (an EAGLE head's first layer has no input norm, and it has no final norm).
    extra_norm_params: int = 0

    # -- parameters ---------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_params_per_layer(self) -> int:
        if self.is_mla:
            return self._mla_params()
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        bias = (
            (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        return q + kv + o + bias + (self.hidden_size if self.attention_out_bias else 0)

    def _mla_params(self) -> int:
        """The query's matrices (through the bottleneck, if any), the latent's down-projection
        with the rotary key, its up-projection to every head's key and value, the output."""
        h, heads = self.hidden_size, self.num_heads
        q_width = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = self.q_lora_rank * (h + q_width) if self.q_lora_rank else h * q_width
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * h

    @property
    def mlp_params_per_layer(self) -> int:
        matrices = 3 if self.gated_mlp else 2
        return matrices * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return 0 if self.shares_embeddings else self.vocab_size * self.hidden_size

    @property
    def lm_head_rows(self) -> int:
        """Rows of the LM head a pass multiplies by: the draft vocabulary where it has one."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def lm_head_params(self) -> int:
        """Separate LM-head matrix; zero when tied to the embedding (or the target's), unless
        it is a head's own over a draft vocabulary."""
        if self.draft_vocab_size:
            return self.draft_vocab_size * self.hidden_size
        tied = self.tie_word_embeddings or self.shares_embeddings
        return 0 if tied else self.vocab_size * self.hidden_size

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    def _mlp_params(self, experts: int) -> int:
        """MLP weights of all layers, ``experts`` routed experts, the shared ones and the router
        per MoE layer."""
        dense = (self.num_layers - self.moe_layers) * self.mlp_params_per_layer
        router = self.hidden_size * self.num_experts
        routed = (experts + self.shared_experts) * self.expert_params
        return dense + self.moe_layers * (routed + router)

    def _params(self, experts: int) -> int:
        norms = 2 * self.hidden_size + self.extra_norm_params_per_layer
        layers = self.num_layers * (self.attention_params_per_layer + norms)
        final_norm = self.hidden_size + self.extra_norm_params
        score_bias = self.moe_layers * self.num_experts if self.router_bias else 0
        return (
            layers
            + score_bias
            + self.extra_matmul_params
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
        return attention + mlp + self.extra_matmul_params + self.lm_head_rows * self.hidden_size

    def mtp_shape(self) -> ModelShape:
        """One of DeepSeek-V3's multi-token-prediction modules as a drafter: the norms of the
        embedding and of the target's hidden state, their joint projection (2 h x h), one MoE
        decoder layer with its latent cache, and a final norm; the embedding and LM head are
        the target's (vLLM's method ``mtp``; module index ``num_hidden_layers`` onwards). k
        drafted tokens are k passes of it."""
        if not self.mtp_layers:
            raise ValueError(f"{self.name} has no multi-token-prediction module")
        h = self.hidden_size
        return dataclasses.replace(
            self,
            name=f"{self.name}-mtp",
            num_layers=1,
            moe_layers=1 if self.num_experts else 0,
            mtp_layers=0,
            shares_embeddings=True,
            extra_matmul_params=2 * h * h,
            extra_norm_params_per_layer=self.extra_norm_params_per_layer + 2 * h,
        )

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
        """K and V of every layer for one cached token (latent attention: the latent and the
        rotary key, whatever ``num_kv_heads`` says)."""
        if self.is_mla:
            width = self.kv_lora_rank + self.qk_rope_head_dim
            return round(self.num_layers * width * dtype_bytes)
        return round(2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes)

    def flops_per_token(self) -> float:
        """Weights part of a forward pass, per new token: 2 x matmul params."""
        return 2.0 * self.matmul_params()

    def attention_flops_per_pair(self) -> float:
        """FLOPs per (new token, attended token) pair, over all layers: QK^T plus AV (latent
        attention: on the latent, module docstring)."""
        if self.is_mla:
            per_head = 4 * self.kv_lora_rank + 2 * self.qk_rope_head_dim
            return float(self.num_layers * self.num_heads * per_head)
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    def prefill_attention_flops_per_pair(self) -> float:
        """FLOPs per pair of a prompt chunk's token, over all layers: latent attention in its
        decompressed form (module docstring); other attention as ``attention_flops_per_pair``."""
        if self.is_mla:
            per_head = 2 * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
            return float(self.num_layers * self.num_heads * per_head)
        return self.attention_flops_per_pair()


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
