"""DeepSeek-V3's blocks: multi-head latent attention (MLA), the grouped sigmoid router with
shared experts, and YaRN's rotary frequencies and attention scale.

MLA projects each token to a small latent (``kv_lora_rank``) plus one rotary key shared by all
heads (``qk_rope_head_dim``); keys and values are expanded from the latent per head. The cache
holds the latent and the rotary key (``KVCache``'s keys and values, one head each), as vLLM and
SGLang do, and every call expands the cached latents again, as transformers does: exact, and
the memory the engines' cache takes (``ModelConfig.kv_bytes_per_token``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specsim.models.blocks import MLP, make_norm
from specsim.models.config import ModelConfig


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(config: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """YaRN (Peng et al. 2023, as transformers computes it): the fast pairs kept, the slow ones
    divided by the factor, a linear ramp between the pairs of ``beta_fast`` and ``beta_slow``
    rotations over the pretrained context."""
    s = config.rope_scaling
    dim, base = config.rotary_dim, config.rope_theta
    factor, old_len = float(s["factor"]), float(s["original_max_position_embeddings"])

    def pair_of(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_of(s.get("beta_fast") or 32), pair_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # transformers' guard against a zero ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(
        0, 1
    )
    kept = 1 - ramp
    return inv_freq / factor * (1 - kept) + inv_freq * kept


def yarn_attention_factor(config: ModelConfig) -> float:
    """YaRN's scale on cos and sin (1 where mscale equals mscale_all_dim, as in DeepSeek-V3)."""
    s = config.rope_scaling
    if s is None or s["rope_type"] != "yarn":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor, mscale, all_dim = float(s["factor"]), s.get("mscale"), s.get("mscale_all_dim")
    if mscale and all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim)
    return _yarn_mscale(factor)


def mla_softmax_scale(config: ModelConfig) -> float:
    """The query-key head's ``1/sqrt(d)``, times YaRN's mscale(all_dim) squared when scaled."""
    scale = config.head_dim**-0.5
    s = config.rope_scaling
    if s is not None and s.get("mscale_all_dim"):
        scale *= _yarn_mscale(float(s["factor"]), s["mscale_all_dim"]) ** 2
    return scale


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool):
    """Rotary embedding; ``interleave``: pairs (x0, x1), (x2, x3), ... laid out as all first
    elements then all second ones (transformers' layout; q and k alike, so q·k is unchanged)."""
    half = x.shape[-1] // 2
    if not interleave:
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LatentAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, **factory):
        super().__init__()
        self.layer, self.num_heads = layer, config.num_heads
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.rank = config.v_head_dim, config.kv_lora_rank
        h, heads = config.hidden_size, config.num_heads
        q_width = heads * (self.nope + self.rope)
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(h, q_width, bias=False, **factory)
        else:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=False, **factory)
            self.q_a_layernorm = make_norm(config, config.q_lora_rank, **factory)
            self.q_b_proj = nn.Linear(config.q_lora_rank, q_width, bias=False, **factory)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.rank + self.rope, bias=False, **factory)
        self.kv_a_layernorm = make_norm(config, self.rank, **factory)
        self.kv_b_proj = nn.Linear(
            self.rank, heads * (self.nope + self.v_dim), bias=False, **factory
        )
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=False, **factory)
        self.interleave = config.rope_interleave
        self.scale = mla_softmax_scale(config)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x, cos, sin, cache, step):
        b, t, _ = x.shape
        q = self._queries(x).view(b, t, self.num_heads, -1).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent)[:, None]  # [b, 1, t, rank]
        q_rot = _rotate(q_rot, cos, sin, self.interleave)
        k_rot = _rotate(k_rot[:, None], cos, sin, self.interleave)  # [b, 1, t, rope]
        if cache is not None:
            cache.write(self.layer, latent, k_rot, step.slots)
            latent = cache.keys[self.layer][:, :, : step.kv_len]
            k_rot = cache.values[self.layer][:, :, : step.kv_len]
        s = latent.shape[2]
        kv = self.kv_b_proj(latent[:, 0]).view(b, s, self.num_heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_rot.expand(-1, self.num_heads, -1, -1)), dim=-1)
        q = torch.cat((q_nope, q_rot), dim=-1)
        mask = None if step is None else step.mask
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class GroupedSigmoidMoE(nn.Module):
    """DeepSeek-V3's MoE: sigmoid scores; the experts' groups ranked by their two best scores
    plus the learned correction bias; the token's top experts of its best groups, weighted by
    their (bias-free) scores, renormalised where the config says, times routed_scaling_factor;
    plus the shared experts, which every token runs. Every routed expert runs on every token
    with unchosen ones weighted 0 (as ``SparseMoE``: no data-dependent indexing)."""

    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.top_k, self.normalize = config.experts_per_token, config.normalize_top_k
        self.groups, self.top_groups = config.expert_groups, config.groups_per_token
        self.scaling = config.routed_scaling_factor
        h, n = config.hidden_size, config.num_experts
        self.gate = nn.Linear(h, n, bias=False, **factory)
        self.gate.e_score_correction_bias = nn.Parameter(torch.zeros(n, **factory))
        width = config.expert_intermediate_size
        self.experts = nn.ModuleList(MLP(config, width, **factory) for _ in range(n))
        self.shared_experts = MLP(config, width * config.shared_experts, **factory)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """Each token's weight on each expert ``[..., experts]`` (float32; 0 where unchosen)."""
        scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        ranked = scores + self.gate.e_score_correction_bias.float()
        grouped = ranked.unflatten(-1, (self.groups, -1))
        best_groups = grouped.topk(2, dim=-1).values.sum(-1).topk(self.top_groups, dim=-1)[1]
        keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(-1, best_groups, True)
        ranked = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)
        chosen = ranked.topk(self.top_k, dim=-1)[1]
        weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return torch.zeros_like(scores).scatter(-1, chosen, weights * self.scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.route(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out += (expert(x) * weights[..., e, None]).to(x.dtype)
        return out + self.shared_experts(x)
