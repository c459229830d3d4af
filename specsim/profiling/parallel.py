"""Tensor parallelism and number formats in the roofline.

A replica of ``tp`` devices shards every weight matrix, the embedding and LM head, and the KV
heads over them (Megatron-LM's layout, which vLLM follows: Shoeybi et al. 2019,
arXiv:1909.08053), so each device reads ``W / tp`` weight bytes and does ``F / tp`` FLOPs per
token, and the shards' layer outputs are summed by two all-reduces per layer (after attention
and after the MLP) of ``tokens x hidden`` activations in 16 bits. An all-reduce of ``n`` bytes
over ``p`` devices in a ring (a reduce-scatter then an all-gather, ``p - 1`` steps of ``n / p``
bytes each) takes

    2 (p - 1) alpha + 2 (p - 1) / p x n / beta

(Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005), with ``beta`` the link bandwidth per direction times a stated
efficiency and ``alpha`` its latency per step, both from the hardware file.

Weights in fp8 or int4 apply to the decoder layers' matrices; the embedding, LM head, router
and norms stay in the hardware file's dtype, as vLLM's fp8 and AWQ/GPTQ checkpoints keep them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pydantic import Field

from specsim.bounds import Bytes, Seconds
from specsim.config import StrictModel
from specsim.errors import SpecsimError
from specsim.profiling.flops import ModelShape

# Bytes per parameter. int4: 4-bit weights with a 16-bit scale per group of 128 (GPTQ's and
# AWQ's default group size).
WEIGHT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int4": 0.5 + 2.0 / 128}
KV_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}
ACTIVATION_BYTES = 2  # the all-reduced activations stay in 16 bits whatever the weights
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP


class Link(StrictModel):
    """A device-to-device interconnect (NVLink, PCIe) as an all-reduce sees it."""

    bandwidth_bytes_per_s: Bytes = Field(
        gt=0, description="per device, per direction (datasheets quote both directions summed)"
    )
    latency_s: Seconds = Field(description="per ring step (not on datasheets: stated)")


@dataclass(frozen=True)
class Layout:
    """How a model is deployed: over ``tp`` devices, in these formats (None: the hardware
    file's dtype), all-reducing over ``link`` (needed when tp > 1)."""

    tp: int = 1
    weights: str | None = None
    kv_cache: str | None = None
    link: Link | None = None
    link_name: str = ""
    link_efficiency: float = 1.0

    def with_tp(self, tp: int) -> Layout:
        return dataclasses.replace(self, tp=tp)


def quantised_params(shape: ModelShape) -> int:
    """The decoder layers' matrices: what fp8 or int4 weights apply to (every expert)."""
    dense_mlp = (shape.num_layers - shape.moe_layers) * shape.mlp_params_per_layer
    experts = shape.moe_layers * shape.num_experts * shape.expert_params
    return shape.num_layers * shape.attention_params_per_layer + dense_mlp + experts


def quantised_flops_per_token(shape: ModelShape) -> float:
    """FLOPs per token of the quantised matrices: the layers' own, through the active experts."""
    dense_mlp = (shape.num_layers - shape.moe_layers) * shape.mlp_params_per_layer
    experts = shape.moe_layers * shape.experts_per_token * shape.expert_params
    return 2.0 * (shape.num_layers * shape.attention_params_per_layer + dense_mlp + experts)


def weight_bytes(shape: ModelShape, layout: Layout, base_bytes: float) -> int:
    """Stored weight bytes of the whole model (all devices together)."""
    if layout.weights is None or WEIGHT_BYTES[layout.weights] == base_bytes:
        return shape.weight_bytes(base_bytes)
    quantised = quantised_params(shape)
    rest = shape.param_count() - quantised
    return round(quantised * WEIGHT_BYTES[layout.weights] + rest * base_bytes)


def kv_heads_per_device(shape: ModelShape, tp: int) -> int:
    """KV heads one device holds: sharded, or one replicated head when heads < devices."""
    return max(1, shape.num_kv_heads // tp)


def device_kv_bytes_per_token(shape: ModelShape, layout: Layout, base_bytes: float) -> int:
    kv_bytes = base_bytes if layout.kv_cache is None else KV_BYTES[layout.kv_cache]
    heads = kv_heads_per_device(shape, layout.tp)
    return dataclasses.replace(shape, num_kv_heads=heads).kv_bytes_per_token(kv_bytes)


class DoesNotFit(SpecsimError):
    """A deployment the model does not fit: heads that do not split over the devices, or
    weights over a device's memory (a capacity plan reports it and goes on)."""


def check_split(shape: ModelShape, tp: int, source: str) -> None:
    """vLLM's rule: query heads divide over the devices, KV heads divide or are replicated."""
    kv = shape.num_kv_heads
    if shape.num_heads % tp or (kv % tp and tp % kv):
        raise DoesNotFit(
            f"{shape.name} ({shape.num_heads} heads, {kv} KV heads) cannot be split over {tp} "
            "devices",
            file=source,
            key="--tp",
            fix="give a tensor-parallel size that divides the heads (and divides or is a "
            "multiple of the KV heads)",
        )


def ring_allreduce_s(nbytes: float, devices: int, link: Link, efficiency: float = 1.0) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``devices`` (module docstring)."""
    if devices == 1:
        return 0.0
    steps = 2 * (devices - 1)
    bandwidth = link.bandwidth_bytes_per_s * efficiency
    return steps * link.latency_s + steps / devices * nbytes / bandwidth


def allreduce_bytes_per_token(shape: ModelShape) -> int:
    """Bytes one token adds to each all-reduce: its hidden state."""
    return shape.hidden_size * ACTIVATION_BYTES


def allreduce_terms(shape: ModelShape, layout: Layout) -> tuple[float, float]:
    """(seconds per token in the pass, seconds per pass) of the pass's all-reduces: the
    bandwidth term grows with the tokens, the latency term does not."""
    if layout.tp == 1:
        return 0.0, 0.0
    count = ALLREDUCES_PER_LAYER * shape.num_layers
    no_latency = layout.link.model_copy(update={"latency_s": 0.0})
    per_token = count * ring_allreduce_s(
        allreduce_bytes_per_token(shape), layout.tp, no_latency, layout.link_efficiency
    )
    per_pass = count * 2 * (layout.tp - 1) * layout.link.latency_s
    return per_token, per_pass
