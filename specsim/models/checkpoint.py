"""Checkpoint key layouts that differ from the decoder's module names.

Phi-3 stores the q/k/v projections as one ``qkv_proj`` matrix and the MLP's gate and up
projections as one ``gate_up_proj``; Mixtral names its MoE block ``block_sparse_moe`` and its
experts' matrices ``w1`` (gate), ``w3`` (up) and ``w2`` (down). They are split and renamed on
load, and fused and named back on save, so a folder written by ``save_model`` is the family's.
DeepSeek-V3's multi-token-prediction modules are skipped on load (``is_unused``).
"""

from __future__ import annotations

import re

import torch

from specsim.errors import SpecsimError
from specsim.models.config import ModelConfig

_MIXTRAL_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL_KEY = re.compile(r"(.*)\.block_sparse_moe\.(gate|experts\.\d+\.(w1|w2|w3))\.weight$")
_SPECSIM_EXPERT = re.compile(
    r"(.*)\.mlp\.(gate|experts\.\d+\.(gate_proj|up_proj|down_proj))\.weight$"
)


def is_unused(config: ModelConfig, key: str) -> bool:
    """A stored weight the decoder does not use: DeepSeek-V3's multi-token-prediction modules,
    stored as layers num_hidden_layers onwards (transformers skips them too)."""
    if not config.mtp_layers or not key.startswith("model.layers."):
        return False
    index = key.split(".")[2]
    return (
        index.isdigit() and config.num_layers <= int(index) < config.num_layers + config.mtp_layers
    )


def _fused_parts(config: ModelConfig, key: str) -> tuple[str, list[str], list[int]] | None:
    """(prefix, our names, sizes along dim 0) of a fused Phi-3 weight, or None."""
    if config.model_type != "phi3":
        return None
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for fused, names, sizes in (
        ("self_attn.qkv_proj.weight", ["q_proj", "k_proj", "v_proj"], [q, kv, kv]),
        ("mlp.gate_up_proj.weight", ["gate_proj", "up_proj"], [config.intermediate_size] * 2),
    ):
        if key.endswith(fused):
            prefix = key[: -len(fused)] + fused.split(".")[0]
            return prefix, names, sizes
    return None


def to_model_keys(
    config: ModelConfig, key: str, tensor: torch.Tensor, source: str
) -> list[tuple[str, torch.Tensor]]:
    """The decoder's (key, tensor) pairs for one checkpoint entry."""
    fused = _fused_parts(config, key)
    if fused is not None:
        prefix, names, sizes = fused
        if tensor.dim() != 2 or tensor.shape[0] != sum(sizes):
            raise SpecsimError(
                f"shape {tuple(tensor.shape)} does not match the config's "
                f"({sum(sizes)}, {config.hidden_size})",
                file=source,
                key=key,
                fix="use the config.json that belongs to these weights",
            )
        parts = tensor.split(sizes, dim=0)
        return [(f"{prefix}.{n}.weight", p) for n, p in zip(names, parts, strict=True)]
    if config.model_type == "mixtral" and (match := _MIXTRAL_KEY.match(key)):
        inner = match.group(2)
        if match.group(3):
            inner = inner[: -len(match.group(3))] + _MIXTRAL_EXPERT[match.group(3)]
        return [(f"{match.group(1)}.mlp.{inner}.weight", tensor)]
    return [(key, tensor)]


def to_checkpoint_keys(
    config: ModelConfig, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The family's checkpoint entries for the decoder's state dict (``to_model_keys``'s
    inverse)."""
    state, out = dict(state), {}
    if config.model_type == "phi3":
        for layer in range(config.num_layers):
            base = f"model.layers.{layer}"
            for fused, names in (
                ("self_attn.qkv_proj", ["q_proj", "k_proj", "v_proj"]),
                ("mlp.gate_up_proj", ["gate_proj", "up_proj"]),
            ):
                module = fused.split(".")[0]
                keys = [f"{base}.{module}.{n}.weight" for n in names]
                out[f"{base}.{fused}.weight"] = torch.cat([state.pop(k) for k in keys], dim=0)
    inverse = {v: k for k, v in _MIXTRAL_EXPERT.items()}
    for key, tensor in state.items():
        match = _SPECSIM_EXPERT.match(key) if config.model_type == "mixtral" else None
        if match is None:
            out[key] = tensor
            continue
        inner = match.group(2)
        if match.group(3):
            inner = inner[: -len(match.group(3))] + inverse[match.group(3)]
        out[f"{match.group(1)}.block_sparse_moe.{inner}.weight"] = tensor
    return dict(sorted(out.items()))
