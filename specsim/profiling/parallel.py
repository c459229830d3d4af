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

Weights in fp8, int4, nvfp4 or mxfp4 apply to the decoder layers' matrices; the embedding, LM
head, router and norms stay in the hardware file's dtype, as vLLM's fp8, AWQ/GPTQ and FP4
checkpoints keep them.

Expert parallelism (``--enable-expert-parallel``, vLLM's flag): a mixture of experts' experts are
not sharded but dealt out whole, ``ceil(E / EP)`` of them to the device holding the most, over
EP = TP x DP devices (vLLM's ``FusedMoEParallelConfig.make``; one replica here is one engine,
DP = 1, so EP = TP). Attention stays tensor parallel with its all-reduce. An MoE layer's
all-reduce after the MLP becomes, over ``p`` devices with each dispatching ``N / p`` of the
pass's ``N`` tokens and a token's ``k`` experts spread evenly (so ``(p - 1) / p`` of its copies
leave the device):

* dispatch, an all-to-all: ``N / p x k x (p - 1) / p`` hidden states of ``2 x hidden`` bytes
  sent by each device;
* combine, an all-to-all: the same bytes back to the tokens' devices;
* an all-gather of the ``N / p`` combined outputs, so that every device has the activations
  the next tensor-parallel attention needs: ``(p - 1) / p x N`` hidden states per device;

each ``p - 1`` pairwise steps of the link's latency and its bytes at the link's bandwidth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specsim.errors import SpecsimError
from specsim.hardware import HardwareSpec, Link
from specsim.profile.tp_scaling import (
    ACTIVATION_BYTES,
    ALLREDUCES_PER_LAYER,
    ring_allreduce_seconds,
)
from specsim.profiling.flops import ModelShape

# Bytes per parameter: the values and their block scales (WEIGHT_FORMAT_NOTES).
WEIGHT_BYTES = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int4": 0.5 + 2.0 / 128,
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
}
WEIGHT_FORMAT_NOTES = {
    "fp8": "E4M3 values, per-tensor or per-channel scales",
    "int4": "4-bit values, a 16-bit scale per group of 128 (GPTQ's and AWQ's default group)",
    # NVIDIA's NVFP4 (Blackwell's FP4 tensor-core format; ModelOpt checkpoints): its one
    # FP32 scale per tensor is left out.
    "nvfp4": "E2M1 values, an FP8 (E4M3) scale per block of 16",
    # OCP Microscaling Formats (MX) v1.0 spec: MXFP4 = E2M1 elements, E8M0 scale per 32.
    "mxfp4": "E2M1 values, an E8M0 scale per block of 32",
}
KV_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


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
    expert_parallel: bool = False  # experts dealt out whole over the tp devices (EP = TP)

    def with_tp(self, tp: int) -> Layout:
        return dataclasses.replace(self, tp=tp)

    def ep_size(self, shape: ModelShape) -> int:
        """Devices a model's experts are dealt over: TP with expert parallelism on a mixture
        of experts, else 1 (sharded like every other matrix)."""
        return self.tp if self.expert_parallel and shape.num_experts else 1


def hardware_layout(
    hw: HardwareSpec, tp: int, weights: str | None, kv_cache: str | None, source: str
) -> Layout:
    """The deployment over ``tp`` devices of ``hw``, all-reducing over NVLink where the file has
    it."""
    name, link = hw.interconnect()
    if tp > 1 and link is None:
        raise SpecsimError(
            f"--tp {tp} needs the devices' interconnect",
            file=source,
            key="nvlink",
            fix="add nvlink (or pcie) with bandwidth_bytes_per_s and latency_s",
        )
    return Layout(tp, weights, kv_cache, link, name, hw.efficiency.interconnect)


def quantised_params(shape: ModelShape) -> int:
    """The decoder layers' matrices: what quantised weights apply to (every expert, the
    shared ones too)."""
    dense_mlp = (shape.num_layers - shape.moe_layers) * shape.mlp_params_per_layer
    experts = shape.moe_layers * (shape.num_experts + shape.shared_experts) * shape.expert_params
    return shape.num_layers * shape.attention_params_per_layer + dense_mlp + experts


def quantised_flops_per_token(shape: ModelShape) -> float:
    """FLOPs per token of the quantised matrices: the layers' own, through the active experts
    and the shared ones (every token passes through those)."""
    dense_mlp = (shape.num_layers - shape.moe_layers) * shape.mlp_params_per_layer
    active = shape.experts_per_token + shape.shared_experts
    experts = shape.moe_layers * active * shape.expert_params
    return 2.0 * (shape.num_layers * shape.attention_params_per_layer + dense_mlp + experts)


def weight_bytes(shape: ModelShape, layout: Layout, base_bytes: float) -> int:
    """Stored weight bytes of the whole model (all devices together)."""
    if layout.weights is None or WEIGHT_BYTES[layout.weights] == base_bytes:
        return shape.weight_bytes(base_bytes)
    quantised = quantised_params(shape)
    rest = shape.param_count() - quantised
    return round(quantised * WEIGHT_BYTES[layout.weights] + rest * base_bytes)


def bytes_per_param(layout: Layout, base_bytes: float) -> float:
    """Bytes of one quantised-matrix parameter (the layers' matrices, every expert)."""
    return base_bytes if layout.weights is None else WEIGHT_BYTES[layout.weights]


def device_weight_bytes(shape: ModelShape, layout: Layout, base_bytes: float) -> int:
    """Weight bytes on the device holding the most: a 1/tp shard of everything, or, with
    expert parallelism, a 1/tp shard of all but the experts and ``ceil(E / EP)`` whole experts
    per MoE layer."""
    total = weight_bytes(shape, layout, base_bytes)
    ep = layout.ep_size(shape)
    if ep == 1:
        return round(total / layout.tp)
    experts = shape.moe_layers * shape.num_experts * shape.expert_params
    expert_bytes = experts * bytes_per_param(layout, base_bytes)
    most = shape.moe_layers * -(-shape.num_experts // ep) * shape.expert_params
    return round((total - expert_bytes) / layout.tp + most * bytes_per_param(layout, base_bytes))


def check_expert_parallel(shape: ModelShape, layout: Layout, source: str) -> None:
    """Expert parallelism needs experts, more than one device, and no more devices than
    experts (a device with none would idle)."""
    if not layout.expert_parallel:
        return
    if not shape.num_experts:
        raise SpecsimError(
            f"{shape.name} has no experts to deal out",
            file=source,
            key="--enable-expert-parallel",
            fix="drop --enable-expert-parallel for a dense model",
        )
    if layout.tp == 1:
        raise SpecsimError(
            "expert parallelism over one device splits nothing",
            file=source,
            key="--enable-expert-parallel",
            fix="give --tp 2 or more, or drop --enable-expert-parallel",
        )
    if layout.tp > shape.num_experts:
        raise DoesNotFit(
            f"{shape.name} has {shape.num_experts} experts, fewer than the {layout.tp} devices "
            "expert parallelism deals them over",
            file=source,
            key="--enable-expert-parallel",
            fix=f"give --tp {shape.num_experts} or fewer, or drop --enable-expert-parallel",
        )


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
    bandwidth = link.bandwidth_bytes_per_s * efficiency
    return ring_allreduce_seconds(nbytes, devices, bandwidth, link.latency_s)


def allreduce_bytes_per_token(shape: ModelShape) -> int:
    """Bytes one token adds to each all-reduce: its hidden state."""
    return shape.hidden_size * ACTIVATION_BYTES


def allreduce_terms(shape: ModelShape, layout: Layout) -> tuple[float, float]:
    """(seconds per token in the pass, seconds per pass) of the pass's all-reduces, and with
    expert parallelism its MoE layers' exchanges instead of their second all-reduce: the
    bandwidth term grows with the tokens, the latency term does not."""
    if layout.tp == 1:
        return 0.0, 0.0
    moe = shape.moe_layers if layout.ep_size(shape) > 1 else 0
    count = ALLREDUCES_PER_LAYER * shape.num_layers - moe
    no_latency = layout.link.model_copy(update={"latency_s": 0.0})
    per_token = count * ring_allreduce_s(
        allreduce_bytes_per_token(shape), layout.tp, no_latency, layout.link_efficiency
    )
    per_pass = count * 2 * (layout.tp - 1) * layout.link.latency_s
    if moe:
        token_s, pass_s = expert_exchange_terms(shape, layout)
        per_token += moe * token_s
        per_pass += moe * pass_s
    return per_token, per_pass


def expert_exchange_bytes_per_token(shape: ModelShape, devices: int) -> float:
    """Bytes one device sends per token of the pass in one MoE layer (module docstring):
    dispatch and combine, 2 k (p - 1) / p^2 hidden states, and the all-gather, (p - 1) / p."""
    p = devices
    hidden = allreduce_bytes_per_token(shape)
    return (2 * shape.experts_per_token * (p - 1) / p**2 + (p - 1) / p) * hidden


def expert_exchange_terms(shape: ModelShape, layout: Layout) -> tuple[float, float]:
    """(seconds per token, seconds per pass) of one MoE layer's dispatch, combine and
    all-gather over the replica's devices: three exchanges of ``p - 1`` steps each."""
    p = layout.ep_size(shape)
    bandwidth = layout.link.bandwidth_bytes_per_s * layout.link_efficiency
    return expert_exchange_bytes_per_token(shape, p) / bandwidth, 3 * (
        p - 1
    ) * layout.link.latency_s
