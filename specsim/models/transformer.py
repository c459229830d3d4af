"""One Llama-family decoder in plain torch, with Hugging Face parameter names.

RMSNorm, rotary position embeddings (the rotate-half layout Hugging Face checkpoints use),
grouped-query attention and a gated MLP (or a mixture of such experts). Module names mirror
Hugging Face's (``model.layers.0.self_attn.q_proj.weight``, ...), so a checkpoint's state dict
loads as is (the families that fuse or rename weights are mapped in ``checkpoint.py``). The other
families' differences are the config's flags (``families.py``), each applied where it acts.

With a ``KVCache`` every row appends its tokens at its own position ``cache.lengths[b]`` and
attends to everything the row holds; ``n_new`` makes a batch ragged (row b has only its first
``n_new[b]`` tokens real, the rest is padding that is neither attended to nor stored). Without a
cache the call is a plain causal pass from position 0 (training, evaluation). A ``TreeAttention``
lays a cached call's tokens out as a speculation tree instead of a sequence: they still go to the
row's next slots, but take the positions and see the slots the caller gives.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specsim.errors import SpecsimError
from specsim.models.blocks import MLP, SparseMoE, make_norm, softcapped_attention
from specsim.models.cache import KVCache
from specsim.models.config import ModelConfig
from specsim.models.deepseek import (
    GroupedSigmoidMoE,
    LatentAttention,
    yarn_attention_factor,
    yarn_frequencies,
)
from specsim.models.masks import CacheStep, TreeAttention, WindowMask

_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def rope_inverse_frequencies(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """Per-pair rotation frequencies (float32, CPU), with linear, Llama-3 or YaRN scaling
    applied; ``local``: Gemma 3's sliding layers' (their own base, never scaled)."""
    dim = config.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim
    theta = config.rope_local_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta**exponents)
    scaling = None if local else config.rope_scaling
    if scaling is not None:
        factor = float(scaling["factor"])
        if scaling["rope_type"] == "linear":
            inv_freq = inv_freq / factor
        elif scaling["rope_type"] == "yarn":
            inv_freq = yarn_frequencies(config, inv_freq)
        else:  # llama3: slow (long-wavelength) pairs are scaled, fast ones kept, a blend between.
            old_len = float(scaling["original_max_position_embeddings"])
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
            smooth = (old_len / wavelen - low) / (high - low)
            blended = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
            inv_freq = torch.where(medium, blended, scaled)
    return inv_freq.to(torch.float32)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, **factory):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        h, q_out = config.hidden_size, config.num_heads * config.head_dim
        kv_out = config.num_kv_heads * config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(h, q_out, bias=bias, **factory)
        self.k_proj = nn.Linear(h, kv_out, bias=bias, **factory)
        self.v_proj = nn.Linear(h, kv_out, bias=bias, **factory)
        self.o_proj = nn.Linear(q_out, h, bias=config.attention_out_bias, **factory)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = make_norm(config, config.head_dim, **factory)
            self.k_norm = make_norm(config, config.head_dim, **factory)
        scalar = config.query_pre_attn_scalar
        self.scale = None if scalar is None else scalar**-0.5
        self.softcap = config.attn_softcap

    def _sdpa(self, q, k, v, attn_mask=None, is_causal=False, **gqa) -> torch.Tensor:
        if self.softcap is not None:
            return softcapped_attention(q, k, v, attn_mask, is_causal, self.scale, self.softcap)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale, **gqa
        )

    def _attend_causal(self, q, k, v) -> torch.Tensor:
        """Cache-free causal attention (training, evaluation) from position 0."""
        if self.num_kv_heads == self.num_heads:
            return self._sdpa(q, k, v, is_causal=True)
        if _SDPA_HAS_GQA:
            return self._sdpa(q, k, v, is_causal=True, enable_gqa=True)
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self._sdpa(q, k, v, is_causal=True)

    def _attend_masked(self, q, k, v, mask) -> torch.Tensor:
        """Attention under an explicit mask (the cache's, or a sliding window's). Grouped heads
        are folded into the query axis (heads g·kv .. g·kv+group-1 share key/value head kv), so
        keys and values are read in place, never repeated per head, and any SDPA kernel that
        takes a mask can run."""
        group = self.num_heads // self.num_kv_heads
        if group == 1:
            return self._sdpa(q, k, v, attn_mask=mask)
        b, _, t, d = q.shape
        q = q.reshape(b, self.num_kv_heads, group * t, d)
        mask = mask.expand(b, group, t, mask.shape[-1]).reshape(b, 1, group * t, -1)
        out = self._sdpa(q, k, v, attn_mask=mask)
        return out.reshape(b, self.num_heads, t, d)

    def forward(self, x, cos, sin, cache: KVCache | None, step):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is None and step is None:
            out = self._attend_causal(q, k, v)
        elif cache is None:  # a sliding window shorter than the sequence
            out = self._attend_masked(q, k, v, step.mask)
        else:
            cache.write(self.layer, k, v, step.slots)
            keys = cache.keys[self.layer][:, :, : step.kv_len]
            values = cache.values[self.layer][:, :, : step.kv_len]
            out = self._attend_masked(q, keys, values, step.mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, **factory):
        super().__init__()
        self.input_layernorm = make_norm(config, **factory)
        attention = LatentAttention if config.is_mla else Attention
        self.self_attn = attention(config, layer, **factory)
        # With sandwich norms (Gemma 2/3) this one normalises the attention's output.
        self.post_attention_layernorm = make_norm(config, **factory)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(config, **factory)
            self.post_feedforward_layernorm = make_norm(config, **factory)
        moe = GroupedSigmoidMoE if config.router == "sigmoid_grouped" else SparseMoE
        self.mlp = moe(config, **factory) if config.is_moe_layer(layer) else MLP(config, **factory)

    def forward(self, x, cos, sin, cache, step):
        if not self.sandwich:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, step)
            return x + self.mlp(self.post_attention_layernorm(x))
        attended = self.self_attn(self.input_layernorm(x), cos, sin, cache, step)
        x = x + self.post_attention_layernorm(attended)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, **factory) for i in range(config.num_layers)
        )
        self.norm = make_norm(config, **factory)
        # Gemma scales the embeddings by sqrt(hidden_size), rounded to float32 then the dtype.
        self.embed_scale = config.hidden_size**0.5 if config.gemma_norms else None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        if self.embed_scale is None:
            return x
        return x * torch.tensor(self.embed_scale, dtype=torch.float32).to(x.dtype)


class DecoderModel(nn.Module):
    """A causal language model. ``model(tokens, cache, n_new)`` returns float32 logits."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.model = Backbone(config, **factory)
        self.lm_head = (
            None
            if config.tie_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        )
        # Not buffers: derived from the config, never stored in a checkpoint. Gemma 3's sliding
        # layers rotate with their own base (local); every other layer with the model's.
        self._local_rope = [
            config.rope_local_theta is not None and config.layer_window(i) is not None
            for i in range(config.num_layers)
        ]
        self._inv_freq = {
            local: rope_inverse_frequencies(config, local) for local in set(self._local_rope)
        }
        self._rope_scale = yarn_attention_factor(config)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for ``batch_size`` rows of at most ``max_len`` tokens each."""
        if max_len > self.config.max_position:
            raise SpecsimError(
                f"max_len {max_len} exceeds the model's max_position {self.config.max_position}",
                key="max_len",
                fix=f"use at most {self.config.max_position} tokens per row",
            )
        c = self.config
        if c.is_mla:  # the latent and the rotary key, one head each (deepseek.py)
            heads, dim, value_dim = 1, c.kv_lora_rank, c.qk_rope_head_dim
        else:
            heads, dim, value_dim = c.num_kv_heads, c.head_dim, None
        return KVCache(
            c.num_layers,
            batch_size,
            heads,
            max_len,
            dim,
            value_dim=value_dim,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded random weights: N(0, std) matrices, unit norms, zero biases."""
        for name, param in sorted(self.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(0.0 if self.config.gemma_norms else 1.0)  # Gemma scales by 1 + w
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=generator)

    def _rotary(self, positions: torch.Tensor, local: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self._inv_freq[local].device != positions.device:
            self._inv_freq[local] = self._inv_freq[local].to(positions.device)
        angles = positions.to(torch.float32)[..., None] * self._inv_freq[local]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, rotary_dim]
        if self._rope_scale == 1.0:
            return angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        scale = self._rope_scale
        return (angles.cos() * scale).to(self.dtype), (angles.sin() * scale).to(self.dtype)

    @staticmethod
    def _check_shape(tokens: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int16):
            raise SpecsimError(
                f"tokens must be an integer tensor [batch, T], got {tuple(tokens.shape)} "
                f"{tokens.dtype}",
                key="tokens",
                fix="pass a LongTensor of shape [batch, T]",
            )

    def _check_values(
        self, tokens: torch.Tensor, n_new: torch.Tensor, real: torch.Tensor, ends: torch.Tensor
    ) -> int:
        """Validate counts and token ids; return the longest row end. One host sync in all."""
        t = tokens.shape[1]
        outside = ((tokens < 0) | (tokens >= self.config.vocab_size)) & real
        bad_count = ((n_new < 0) | (n_new > t)).any()
        flags = torch.stack([bad_count.long(), outside.any().long(), ends.max()]).tolist()
        if flags[0]:
            raise SpecsimError(
                f"n_new must hold counts between 0 and {t}, got {n_new.tolist()}",
                key="n_new",
                fix="give one count per row, at most the number of token columns",
            )
        if flags[1]:
            raise SpecsimError(
                f"token id {tokens[outside][0].item()} is outside the vocabulary of "
                f"{self.config.vocab_size}",
                key="tokens",
                fix="encode the text with this model's tokenizer",
            )
        return int(flags[2])

    def _check_call(self, batch: int, t: int, n_new, cache: KVCache | None, tree) -> torch.Tensor:
        """``n_new`` as a tensor on the model's device, once the call's arguments agree."""
        if n_new is None:
            n_new = torch.full((batch,), t, dtype=torch.long, device=self.device)
        else:
            n_new = torch.as_tensor(n_new, dtype=torch.long).to(self.device)
            if n_new.shape != (batch,):
                raise SpecsimError(
                    f"n_new must hold {batch} counts, got shape {tuple(n_new.shape)}",
                    key="n_new",
                    fix="give one count per row",
                )
        if tree is not None and (cache is None or tree.visible.shape[:2] != (batch, t)):
            raise SpecsimError(
                f"a tree call needs a cache and a [{batch}, {t}, slots] mask",
                key="tree",
                fix="build it with specsim.engine.tree_attention for these tokens and cache",
            )
        if cache is not None and cache.batch_size != batch:
            raise SpecsimError(
                f"cache has {cache.batch_size} rows but tokens have {batch}",
                key="cache",
                fix="use a cache made with new_cache(batch_size=len(tokens), ...)",
            )
        return n_new

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        n_new: torch.Tensor | None = None,
        tree: TreeAttention | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, vocab]`` (float32) for ``tokens`` ``[B, T]``; with
        ``return_hidden``, also the last layer's output before the final norm ``[B, T, hidden]``
        (what a multi-token-prediction module is fed).

        With a cache, row b's tokens take positions ``cache.lengths[b] + t``; only the first
        ``n_new[b]`` are real (all T by default), and ``cache.lengths`` advances by that many.
        Logits at padding positions are unspecified. ``tree`` (with a cache only) gives the
        tokens' positions and visible slots instead of the causal ones.
        """
        tokens = torch.as_tensor(tokens)
        self._check_shape(tokens)
        tokens = tokens.to(self.device, torch.long)
        batch, t = tokens.shape
        n_new = self._check_call(batch, t, n_new, cache, tree)
        real = torch.arange(t, device=self.device)[None, :] < n_new[:, None]
        ends = n_new if cache is None else cache.lengths + n_new
        longest = self._check_values(tokens, n_new, real, ends)
        tokens = tokens.masked_fill(~real, 0)  # padding may hold any id; keep the lookup in range
        # Layers with one sliding window share a mask (Gemma 2/3 alternate two).
        windows = {self.config.layer_window(i) for i in range(self.config.num_layers)}
        if cache is None:
            positions = torch.arange(t, device=self.device).expand(batch, t)
            steps = {
                w: None if w is None or t <= w else WindowMask(t, w, self.device) for w in windows
            }
        else:
            if longest > cache.max_len:
                raise SpecsimError(
                    f"rows would hold {longest} tokens, past the cache's max_len {cache.max_len}",
                    key="max_len",
                    fix="make the cache longer or stop generating earlier",
                )
            if tree is not None and len(windows) > 1:
                raise SpecsimError(
                    "tree steps on a model whose layers have different sliding windows are not "
                    "supported (one tree mask serves every layer)",
                    key="tree",
                    fix="use a model with one attention window for every layer",
                )
            steps = {w: CacheStep(cache, real, longest, w, tree) for w in windows}
            positions = next(iter(steps.values())).positions_bt
        rotary = {local: self._rotary(positions, local) for local in self._inv_freq}
        x = self.model.embed(tokens)
        for i, layer in enumerate(self.model.layers):
            cos, sin = rotary[self._local_rope[i]]
            x = layer(x, cos, sin, cache, steps[self.config.layer_window(i)])
        hidden = x
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head)
        cap = self.config.final_softcap
        logits = (logits if cap is None else torch.tanh(logits / cap) * cap).float()
        if cache is not None:
            cache.lengths += n_new
        return (logits, hidden) if return_hidden else logits
