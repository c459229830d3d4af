"""DeepSeek-V3's multi-token-prediction (MTP) module as a drafter (DeepSeek-V3 technical report,
section 2.2; composed as vLLM's ``deepseek_mtp`` model and its proposer run it).

The module is stored in the target's checkpoint as layer ``num_hidden_layers``: ``enorm``,
``hnorm``, ``eh_proj`` (2h -> h), one decoder block (latent attention and MoE, the target's
layout) and ``shared_head`` (a norm and the vocabulary head). Its entry at position p reads the
target's last hidden state at p (before the final norm) and the embedding of token p + 1:

    x = eh_proj([enorm(embed(token[p + 1])), hnorm(h[p])])     (the embedding zeroed at p = 0)
    h'[p] = block(x)      logits = shared_head.head(shared_head.norm(h'[p]))  -> token p + 2

and it keeps its own KV cache (one layer, latent entries). For k > 1 the module is run again on
its own output: position p + 1 reads h'[p] in place of the target's state and the draft it just
made. Only entries fed the target's hidden states are kept between steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specsim.errors import SpecsimError
from specsim.models.blocks import make_norm
from specsim.models.cache import KVCache
from specsim.models.config import ModelConfig

# The module's own weights under ``model.layers.{num_hidden_layers}.``; everything else there
# is its decoder block's. ``embed_tokens`` and ``shared_head.head`` may be stored (DeepSeek-V3
# keeps copies) or left out (then the target's are used).
_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
OPTIONAL = ("embed_tokens.weight", "shared_head.head.weight")


def mtp_prefix(config: ModelConfig) -> str:
    return f"model.layers.{config.num_layers}."


def module_key(config: ModelConfig, key: str) -> str | None:
    """The module's parameter name for a checkpoint key, or None if the key is not its."""
    prefix = mtp_prefix(config)
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    return rest if rest.startswith(_OWN) else "block." + rest


def check_has_mtp(config: ModelConfig, source: str) -> None:
    """One line for a target the MTP drafter cannot run on."""
    if config.mtp_layers == 0:
        raise SpecsimError(
            "the target has no multi-token-prediction layers (num_nextn_predict_layers is 0)",
            file=source,
            key="num_nextn_predict_layers",
            fix="use a DeepSeek-V3 checkpoint with its MTP layer, or give a draft model",
        )
    if config.mtp_layers > 1:
        raise SpecsimError(
            f"the engine runs one MTP module; this target stores {config.mtp_layers}",
            file=source,
            key="num_nextn_predict_layers",
            fix="use a checkpoint with num_nextn_predict_layers 1 (DeepSeek-V3's)",
        )


class MTPModule(nn.Module):
    """The stored weights, named as in the checkpoint (less the layer prefix)."""

    def __init__(self, config: ModelConfig, with_embed: bool, with_head: bool, **factory):
        # Imported here: the decoder imports this package's attention blocks.
        from specsim.models.transformer import DecoderLayer

        super().__init__()
        h = config.hidden_size
        self.enorm = make_norm(config, **factory)
        self.hnorm = make_norm(config, **factory)
        self.eh_proj = nn.Linear(2 * h, h, bias=False, **factory)
        # The block is layer num_hidden_layers for the router's dense/MoE choice; it writes
        # layer 0 of the module's own one-layer cache.
        self.block = DecoderLayer(config, config.num_layers, **factory)
        self.block.self_attn.layer = 0
        self.shared_head = nn.Module()
        self.shared_head.norm = make_norm(config, **factory)
        if with_head:
            self.shared_head.head = nn.Linear(h, config.vocab_size, bias=False, **factory)
        if with_embed:
            self.embed_tokens = nn.Embedding(config.vocab_size, h, **factory)


class MTPDrafter:
    """The MTP module bound to its target (whose embedding, rotary tables and head it shares
    where the checkpoint stores no copy). ``drafter(tokens, hidden, cache, n_new)`` returns
    (float32 logits, the module's output states), row b's tokens at positions
    ``cache.lengths[b] + t``."""

    is_mtp = True

    def __init__(self, target, module: MTPModule):
        self.target = target
        self.module = module
        self.config: ModelConfig = target.config

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    def parameters(self):
        return self.module.parameters()

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache(
            1,
            batch_size,
            1,
            max_len,
            c.kv_lora_rank,
            value_dim=c.qk_rope_head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        table = getattr(self.module, "embed_tokens", None)
        return (self.target.model.embed_tokens if table is None else table)(tokens)

    def _head(self) -> torch.Tensor:
        head = getattr(self.module.shared_head, "head", None)
        if head is not None:
            return head.weight
        target = self.target
        return target.model.embed_tokens.weight if target.lm_head is None else target.lm_head.weight

    def __call__(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        cache: KVCache,
        n_new: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from specsim.models.masks import CacheStep

        target, m = self.target, self.module
        tokens = torch.as_tensor(tokens).to(self.device, torch.long)
        target._check_shape(tokens)
        n_new = torch.as_tensor(n_new, dtype=torch.long).to(self.device)
        t = tokens.shape[1]
        real = torch.arange(t, device=self.device)[None, :] < n_new[:, None]
        longest = target._check_values(tokens, n_new, real, cache.lengths + n_new)
        if longest > cache.max_len:
            raise SpecsimError(
                f"rows would hold {longest} tokens, past the MTP cache's max_len {cache.max_len}",
                key="max_len",
                fix="make the cache longer or stop generating earlier",
            )
        step = CacheStep(cache, real, longest, None)
        embedded = self._embed(tokens.masked_fill(~real, 0))
        # vLLM zeroes the embedding at position 0 (the module was not trained on it).
        embedded = embedded.masked_fill((step.positions_bt == 0)[..., None], 0.0)
        x = m.eh_proj(torch.cat((m.enorm(embedded), m.hnorm(hidden.to(self.dtype))), dim=-1))
        cos, sin = target._rotary(step.positions_bt, False)
        out = m.block(x, cos, sin, cache, step)
        logits = F.linear(m.shared_head.norm(out), self._head()).float()
        cache.lengths += n_new
        return logits, out
