"""Checks of a model's ``config.json`` keys that the loader (torch) and the roofline (no torch)
both apply, so that the two read a config alike: counts that may be 0, the experts a token
takes, and Qwen3-MoE's dense layers."""

from __future__ import annotations

from typing import Any

from specsim.errors import SpecsimError


def count_key(data: dict[str, Any], key: str, source: str, highest: int, default: int) -> int:
    """A whole number from 0 to ``highest`` (``default`` when absent or null)."""
    value = data.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= highest:
        raise SpecsimError(
            f"expected a whole number from 0 to {highest}, got {value!r:.40}",
            file=source,
            key=key,
            fix="copy the key from the model's config.json",
        )
    return value


def check_experts_per_token(chosen: int, experts: int, source: str) -> None:
    if chosen > experts:
        raise SpecsimError(
            f"num_experts_per_tok {chosen} exceeds the {experts} experts",
            file=source,
            key="num_experts_per_tok",
            fix="give at most as many experts per token as the model has",
        )


def moe_dense_layers(data: dict[str, Any], step: int, num_layers: int, source: str) -> tuple:
    """Qwen3-MoE's layers with a dense MLP: those in mlp_only_layers and, with
    decoder_sparse_step ``step``, those whose 1-based index is not a multiple of it."""
    only = data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in only
    ):
        raise SpecsimError(
            f"expected layer indices from 0 to {num_layers - 1}, got {only!r:.60}",
            file=source,
            key="mlp_only_layers",
            fix="list the dense layers' indices, or give []",
        )
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
