"""The decoder's building blocks that the families vary: RMSNorm (Gemma's scales by 1 + weight),
attention with soft-capped scores (Gemma 2, which SDPA cannot do), the gated MLP (SiLU or
tanh-GELU) and a mixture of such MLPs (Mixtral, Qwen3-MoE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specsim.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, plus_one: bool = False, **factory):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.eps = eps
        self.plus_one = plus_one  # Gemma: scale by 1 + weight, in float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the weights' dtype, as the reference implementation does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.plus_one:
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


def make_norm(config: ModelConfig, dim: int | None = None, **factory) -> RMSNorm:
    dim = config.hidden_size if dim is None else dim
    return RMSNorm(dim, config.norm_eps, plus_one=config.gemma_norms, **factory)


def softcapped_attention(q, k, v, mask, is_causal: bool, scale: float | None, cap: float):
    """Attention whose scores are soft-capped (``cap * tanh(s / cap)``) before the softmax, as
    Gemma 2 does; SDPA cannot. Softmax in float32, as the reference implementation does."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if is_causal:
        t_q, t_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, intermediate_size: int | None = None, **factory):
        super().__init__()
        h = config.hidden_size
        i = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False, **factory)
        self.up_proj = nn.Linear(h, i, bias=False, **factory)
        self.down_proj = nn.Linear(i, h, bias=False, **factory)
        self.gelu = config.activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class SparseMoE(nn.Module):
    """A mixture of expert MLPs: the router's softmax over the experts, each token's top
    ``experts_per_token`` of them, their weights renormalised to sum to 1 where the family does.

    Every expert runs on every token and unchosen ones weigh exactly 0, so the sum is the
    reference's (chosen experts added in expert order) with no data-dependent indexing and no
    host sync, at num_experts / experts_per_token times the MLP compute (fine on CPU)."""

    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.top_k, self.normalize = config.experts_per_token, config.normalize_top_k
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False, **factory)
        self.experts = nn.ModuleList(
            MLP(config, config.expert_intermediate_size, **factory)
            for _ in range(config.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x).float(), dim=-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, chosen, top)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out += (expert(x) * weights[..., e, None]).to(x.dtype)
        return out
