"""EAGLE and EAGLE-3 draft heads, sized from the head's own ``config.json`` as published.

Both are a few decoder layers (one, in the published heads) run on the target's hidden states,
with the target's embedding (held once, by the target; a pass gathers one row per token):

* EAGLE (Li et al. 2024, arXiv:2401.15077), vLLM's method ``eagle`` (``llama_eagle.py``): an
  fc over [embedding; the target's last hidden state], 2 h -> h without bias; the first layer
  has no input norm and the head no final norm; its logits come from the target's LM head
  (the full vocabulary), which every pass multiplies by.
* EAGLE-3 (Li et al. 2025, arXiv:2503.01840), vLLM's method ``eagle3`` (``llama_eagle3.py``):
  an fc over ``num_aux_hidden_states`` taps (3: a low, a middle and a high layer's hidden
  states of the target), 3 h -> h without bias; the first layer's q, k and v read
  [embedding; hidden state], 2 h wide, and every layer adds a norm of the hidden state; its
  own LM head over ``draft_vocab_size`` tokens (32,000 for Llama 3.1's heads), which a table
  maps to the target's ids.

A head is a ``ModelShape`` with ``shares_embeddings`` (the embedding is the target's),
``extra_matmul_params`` (the fc, and EAGLE-3's wider first q, k and v), ``draft_vocab_size``
(EAGLE-3's own LM head) and ``extra_norm_params``, so the shape's own arithmetic gives its
weights, FLOPs and one-layer KV cache. A config in the speculators format (``Eagle3Speculator``,
e.g. RedHatAI's heads) keeps the layer's sizes under ``transformer_layer_config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.profiling.flops import ModelShape
from specsim.profiling.model_configs import config_label, read_config, shape_from_config

# Autoregressive heads (kind heads), and the parallel drafters sized here (kind block).
BLOCK_METHODS = ("p_eagle", "dflash")
HEAD_METHODS = ("eagle", "eagle3", *BLOCK_METHODS)
EAGLE3_TAPS = 3  # vLLM's default when the config names no tap layers


@dataclass(frozen=True)
class Head:
    """A head's shape and how many of the target's hidden states its fc reads per token."""

    method: str
    shape: ModelShape
    taps: int
    max_k: int | None = None  # a parallel drafter's most drafts per pass (its trained block)

    @property
    def is_block(self) -> bool:
        return self.method in BLOCK_METHODS

    @property
    def fc_inputs(self) -> int:
        """Hidden-size vectors the fc reads: EAGLE's embedding and tap, EAGLE-3's taps."""
        return self.taps + 1 if self.method == "eagle" else self.taps


def load_head(method: str, path: str | Path, target: ModelShape, max_k: int | None = None) -> Head:
    """The ``method`` head described by the config at ``path``, drafting for ``target``;
    ``max_k``: a parallel drafter's block, when the config does not give it."""
    config, path = read_config(path)
    source = str(path)
    layer = config.get("transformer_layer_config", config)
    if not isinstance(layer, dict):
        raise SpecsimError(
            "expected a JSON object of the draft layer's sizes",
            file=source,
            key="transformer_layer_config",
            fix="give the head's config.json as published",
        )
    base = shape_from_config(layer, config_label(config, path), source)
    _check_fits_target(base, layer, target, source)
    if method == "eagle":
        return Head(method, eagle_shape(base), taps=1)
    if method == "dflash":
        taps = len(_dflash(config).get("target_layer_ids") or range(target.num_layers))
        block = max_k or _dflash_block(config, source)
        return Head(method, dflash_shape(base, taps), taps, block)
    taps = _whole(config, "num_aux_hidden_states", _tap_layers(config), target.num_layers, source)
    draft_vocab = _whole(config, "draft_vocab_size", target.vocab_size, target.vocab_size, source)
    norms = _fc_norms(config, base.hidden_size, taps)
    head = Head(method, eagle3_shape(base, taps, draft_vocab, norms), taps)
    if method != "p_eagle":
        return head
    if max_k is None:  # P-EAGLE's parallel width is a training choice its config does not keep
        raise SpecsimError(
            "a P-EAGLE head's config does not say how many drafts one pass proposes",
            file=source,
            fix="give it after the config: NAME=p_eagle:CONFIG:K (K from its model card)",
        )
    return dataclasses.replace(head, max_k=max_k)


def dflash_shape(base: ModelShape, taps: int) -> ModelShape:
    """DFlash: the draft layers (Qwen3 blocks, vLLM ``qwen3_dflash.py``), an fc projecting the
    ``taps`` target hidden states into its context, the target's embedding and LM head."""
    h = base.hidden_size
    return dataclasses.replace(
        base, shares_embeddings=True, tie_word_embeddings=False, extra_matmul_params=taps * h * h
    )


def _dflash(config: dict[str, Any]) -> dict[str, Any]:
    section = config.get("dflash_config")
    return section if isinstance(section, dict) else {}


def _dflash_block(config: dict[str, Any], source: str) -> int:
    """Drafts per pass: the trained block less its first position, the last verified token
    (SGLang's DFLASH verifies ``block_size`` tokens; vLLM queries 1 + k per request)."""
    block = config.get("block_size", _dflash(config).get("block_size"))
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise SpecsimError(
            f"expected the DFlash block size, a whole number above 1, got {str(block)[:40]}",
            file=source,
            key="block_size",
            fix="give the drafter's config.json as published, or NAME=dflash:CONFIG:K",
        )
    return block - 1


def eagle_shape(base: ModelShape) -> ModelShape:
    """EAGLE: the layers, the 2 h x h fc, the target's embedding and LM head."""
    h = base.hidden_size
    return dataclasses.replace(
        base,
        shares_embeddings=True,
        tie_word_embeddings=False,
        extra_matmul_params=2 * h * h,
        extra_norm_params=-2 * h,  # no input norm in the first layer, no final norm
    )


def eagle3_shape(base: ModelShape, taps: int, draft_vocab: int, fc_norms: int) -> ModelShape:
    """EAGLE-3: the layers (the first one's q, k and v over 2 h), a hidden-state norm per
    layer, the taps x h x h fc, the target's embedding, its own LM head over ``draft_vocab``."""
    h = base.hidden_size
    qkv_width = (base.num_heads + 2 * base.num_kv_heads) * base.head_dim
    return dataclasses.replace(
        base,
        shares_embeddings=True,
        tie_word_embeddings=False,
        draft_vocab_size=draft_vocab,
        extra_matmul_params=taps * h * h + h * qkv_width,
        extra_norm_params_per_layer=base.extra_norm_params_per_layer + h,
        extra_norm_params=fc_norms,
    )


def _check_fits_target(base: ModelShape, layer: dict[str, Any], target: ModelShape, source):
    """The head reads the target's embedding and hidden states: its width and vocabulary are
    the target's."""
    for key, ours, theirs in (
        ("hidden_size", base.hidden_size, target.hidden_size),
        (
            "target_hidden_size",
            layer.get("target_hidden_size", target.hidden_size),
            target.hidden_size,
        ),
        ("vocab_size", base.vocab_size, target.vocab_size),
    ):
        if ours != theirs:
            raise SpecsimError(
                f"{ours!r} here, {theirs} in the target {target.name}: the head reads the "
                "target's embedding and hidden states",
                file=source,
                key=key,
                fix="give the config of a head trained for this target",
            )


def _tap_layers(config: dict[str, Any]) -> int:
    """Taps the config names by layer (vLLM reads ``eagle_config``), else vLLM's default 3."""
    eagle = config.get("eagle_config")
    layers = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return len(layers) if isinstance(layers, list) and layers else EAGLE3_TAPS


def _fc_norms(config: dict[str, Any], hidden: int, taps: int) -> int:
    """Norm weights some heads put before the fc (``norm_before_fc``, ``fc_norm``)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    before = bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False)))
    per_tap = bool(config.get("fc_norm", False))
    return (taps * hidden if before else 0) + (taps * hidden if per_tap else 0)


def _whole(config: dict[str, Any], key: str, default: int, most: int, source: str) -> int:
    """An optional whole-number key from 1 to ``most`` (absent or null: ``default``)."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise SpecsimError(
            f"expected a whole number from 1 to {most:,}, got {str(value)[:40]}",
            file=source,
            key=key,
            fix="give the head's config.json as published",
        )
    return value
