"""Roofline estimates of pass latency for hardware you do not have.

A forward pass reads every weight once (memory time ``W / BW``) and does ``N x F`` FLOPs of
matrix products for its ``N`` new tokens (compute time ``N x F / peak``); it takes the larger of
the two. Attention then adds a KV-cache read (``KV x bytes per token / BW``) and ``P`` query-key
pairs of FLOPs. This maps exactly onto the profile's fit form, because
``max(a, c N) = a + c x max(0, N - a / c)``:

* ``fixed_s``              = weight bytes / effective bandwidth + kernel-launch overhead
* ``per_batched_token_s``  = FLOPs per token / effective peak
* ``knee_tokens``          = where the compute time reaches the memory time
* ``per_kv_token_s``       = KV bytes per token / effective bandwidth
* ``per_attention_pair_s`` = attention FLOPs per pair / effective peak
* ``per_prefill_pair_s``   = the same for a prompt chunk's pairs, where latent attention runs
  in its decompressed form (absent for other attention: the same cost)

A mixture of experts' routed experts leave ``fixed_s`` for the fit's ``experts`` term: a pass
reads the union of the experts its tokens route to, and pays that read on top of its compute
(the knee meets the other weights' read only). With ``--cuda-graphs`` the fit lists the
engine's captured CUDA-graph sizes, and a pass pays its matmuls on the padded token count.

Effective means multiplied by a stated efficiency: model FLOP utilisation (MFU) for compute and a
bandwidth efficiency for memory, plus a per-layer launch overhead. Nothing here is measured; the
profile says so in its provenance. A replica may span several devices (``--tp``) and hold its
weights in fp8, int4, nvfp4 or mxfp4 and its KV cache in fp8 (``--weights-dtype``, ``--kv-dtype``):
``specsim.profiling.parallel`` says how that enters each term; the profile's hardware block then
describes one device's memory and the replica's price. Quantised weights are read at their bytes
per parameter; their matrix products run at that format's peak where the hardware file gives one
(FP8; FP4 on devices with FP4 tensor cores, activations quantised alike), otherwise at the bf16
peak (weight-only: int4, FP4 elsewhere). EAGLE heads (``--drafter NAME=eagle3:CONFIG``,
``profiling.heads``) are kind ``heads`` with ``passes: autoregressive`` and a fit of their own
(``head_latency``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.hardware import DTYPE_BYTES, HardwareSpec, load_hardware
from specsim.profile.latency import ExpertRead, Latency, LatencyFit
from specsim.profile.tp_scaling import ACTIVATION_BYTES
from specsim.profiling.engine_costs import EngineCosts
from specsim.profiling.flops import ModelShape
from specsim.profiling.heads import Head, load_head
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import (
    DoesNotFit,
    Layout,
    allreduce_terms,
    bytes_per_param,
    check_expert_parallel,
    check_split,
    device_kv_bytes_per_token,
    device_weight_bytes,
    hardware_layout,
    quantised_flops_per_token,
    weight_bytes,
)
from specsim.profiling.roofline_notes import roofline_notes
from specsim.profiling.writer import (
    build_profile,
    copied_acceptance,
    model_spec,
    ngram_spec,
    software_versions,
    today,
)


def roofline_fit(
    shape: ModelShape,
    hw: HardwareSpec,
    layout: Layout | None = None,
    graph_sizes: list[int] | None = None,
) -> LatencyFit:
    """The latency fit of ``shape`` on ``hw`` under the roofline model (see module docstring),
    on one device of ``layout.tp``; the all-reduces' per-token seconds join the compute slope,
    and the knee is where that slope reaches the weight read. A mixture of experts reads its
    routed experts by the share a pass's tokens pick (``LatencyFit.experts``), paid on top of
    the compute (not under the knee), the rest in ``fixed_s``; ``graph_sizes``: the engine's
    captured CUDA-graph sizes (None: no padding)."""
    layout = layout or Layout()
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.efficiency.bandwidth
    peak = hw.peak_flops * hw.efficiency.mfu
    memory_s = device_weight_bytes(read_shape(shape), layout, dtype_bytes) / bandwidth
    per_token_s = matmul_s_per_token(shape, hw, layout) / layout.tp
    allreduce_token_s, allreduce_pass_s = allreduce_terms(shape, layout)
    slope = per_token_s + allreduce_token_s
    experts = None
    experts_s = 0.0
    if shape.num_experts:
        experts_s = device_expert_bytes(shape, layout, dtype_bytes) / bandwidth
        experts = ExpertRead(
            weights_s=experts_s,
            experts=shape.num_experts,
            experts_per_token=shape.experts_per_token,
        )
    launch_s = shape.num_layers * hw.efficiency.launch_s_per_layer
    # The knee meets the dense weights' read only: the grouped GEMM streams each routed expert
    # for its own N x k / E tokens, too few to hide that read under the pass's compute.
    dense_s = memory_s - experts_s
    return LatencyFit(
        fixed_s=dense_s + launch_s + allreduce_pass_s,
        per_sequence_s=0.0,
        per_batched_token_s=slope,
        knee_tokens=dense_s / slope,
        per_kv_token_s=device_kv_bytes_per_token(shape, layout, dtype_bytes) / bandwidth,
        per_attention_pair_s=shape.attention_flops_per_pair() / layout.tp / peak,
        per_prefill_pair_s=shape.prefill_attention_flops_per_pair() / layout.tp / peak
        if shape.is_mla
        else None,
        graph_sizes=graph_sizes,
        experts=experts,
    )


def device_expert_bytes(shape: ModelShape, layout: Layout, dtype_bytes: float) -> float:
    """Bytes of routed experts on the device holding the most: a 1/tp shard of every expert,
    or ``ceil(E / EP)`` whole ones per MoE layer (shared experts are read by every token)."""
    ep = layout.ep_size(shape)
    held = shape.num_experts / layout.tp if ep == 1 else -(-shape.num_experts // ep)
    return shape.moe_layers * held * shape.expert_params * bytes_per_param(layout, dtype_bytes)


def vllm_graph_sizes(largest: int) -> list[int]:
    """vLLM's default CUDA-graph capture sizes up to ``largest`` tokens (0.33,
    ``VllmConfig._set_cudagraph_sizes``): 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256, and ``largest`` itself (vLLM's ceiling is min(512 (1024 on data-centre
    Blackwell), 2 x max_num_seqs x tokens per decode row, max_num_batched_tokens))."""
    sizes = [n for n in (1, 2, 4) if n <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    return sorted({*sizes, largest})


def read_shape(shape: ModelShape) -> ModelShape:
    """The weights a pass reads: an MTP module or an EAGLE head holds none of the target's
    embedding and LM head, but reads the head (vocab x hidden, once) in every pass; an EAGLE-3
    head reads its own (``draft_vocab_size``), which it holds."""
    if not shape.shares_embeddings or shape.draft_vocab_size:
        return shape
    return dataclasses.replace(shape, shares_embeddings=False, tie_word_embeddings=True)


def mtp_drafter_shape(target: ModelShape, source: str) -> ModelShape:
    """``--drafter NAME=mtp``: the target's MTP module, or a one-line refusal."""
    if not target.mtp_layers:
        raise SpecsimError(
            f"{target.name} has no MTP layers (num_nextn_predict_layers 0), so NAME=mtp has "
            "nothing to draft with",
            file=source,
            key="num_nextn_predict_layers",
            fix="give a target with MTP layers (DeepSeek-V3), or a draft model's config.json",
        )
    return target.mtp_shape()


def matmul_s_per_token(shape: ModelShape, hw: HardwareSpec, layout: Layout) -> float:
    """Seconds of one token's matrix products on one device: fp8 or FP4 weights at that
    format's peak where the file gives one (``HardwareSpec.quantised_peak``), else at the bf16
    peak; the embedding, LM head and router stay at the bf16 peak."""
    peak = hw.peak_flops * hw.efficiency.mfu
    low_peak = hw.quantised_peak(layout.weights)
    if low_peak is None:
        return shape.flops_per_token() / peak
    quantised = quantised_flops_per_token(shape)
    rest = shape.flops_per_token() - quantised
    return quantised / (low_peak * hw.efficiency.mfu) + rest / peak


def head_layout(layout: Layout) -> Layout:
    """An EAGLE head's deployment: the drafter's split and the KV-cache format (vLLM's cache
    config is the engine's), its weights in 16 bits (module ``heads``)."""
    return dataclasses.replace(layout, weights=None)


def head_latency(
    head: Head, hw: HardwareSpec, layout: Layout, graph_sizes: list[int] | None = None
) -> Latency:
    """A head's one-token pass: the roofline fit of its shape, plus per sequence the bytes its
    taps and its embedding row move (``head_bytes_per_sequence``) at effective bandwidth."""
    fit = roofline_fit(head.shape, hw, layout, graph_sizes)
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.efficiency.bandwidth
    per_sequence = head_bytes_per_sequence(head, DTYPE_BYTES[hw.dtype]) / bandwidth
    return Latency(
        fit=fit.model_copy(update={"per_sequence_s": per_sequence}),
        valid_range=None,
        outside_range="extrapolate",
    )


def head_bytes_per_sequence(head: Head, base_bytes: float) -> float:
    """Bytes a head's pass moves per sequence beyond its weights and KV: each tap's hidden
    state written by the target and read by the fc (16-bit activations), and the embedding
    row the drafted token gathers from the target's embedding."""
    hidden = head.shape.hidden_size
    return 2 * head.taps * hidden * ACTIVATION_BYTES + hidden * base_bytes


def roofline_latency(
    shape: ModelShape,
    hw: HardwareSpec,
    layout: Layout | None = None,
    graph_sizes: list[int] | None = None,
) -> Latency:
    """A ``Latency`` section: the roofline fit, no samples, valid everywhere (an estimate)."""
    return Latency(
        fit=roofline_fit(shape, hw, layout, graph_sizes),
        valid_range=None,
        outside_range="extrapolate",
    )


def check_fits(shapes: list[tuple[ModelShape, Layout]], hw: HardwareSpec, source: str) -> None:
    """The weights one device holds (each model's shard, or the whole of a TP-1 drafter) must
    fit in its memory with room left for a KV cache."""
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    weights = sum(device_weight_bytes(s, lay, dtype_bytes) for s, lay in shapes)
    usable = hw.memory_bytes * hw.efficiency.memory_utilization
    if weights >= usable:
        names = " + ".join(s.name for s, _ in shapes)
        tp = shapes[0][1].tp
        raise DoesNotFit(
            f"weights of {names} ({weights / 1e9:.1f} GB per device) do not fit in "
            f"{usable / 1e9:.1f} GB usable on {hw.name}",
            file=source,
            key="memory_bytes",
            fix="use a device with more memory, smaller models or weights, or more devices "
            f"(--tp above {tp})",
        )


def head_spec(
    head: Head,
    hw: HardwareSpec,
    draft_layout: Layout,
    replica_tp: int,
    graph_sizes: list[int] | None = None,
) -> dict:
    """An EAGLE head's entry: kind heads, one pass per drafted depth, its own latency fit;
    described by its checkpoint's name, which --emit writes as the draft model (and from which
    the engines, and specsim's writers, tell an EAGLE-3 head by its name)."""
    layout = head_layout(draft_layout)
    latency = head_latency(head, hw, layout, graph_sizes)
    kind = "block" if head.is_block else "heads"
    spec = deployed_spec(head.shape, kind, hw, layout, replica_tp, head.shape.name, latency)
    if head.is_block:  # one pass of k + 1 queries per row drafts the window
        spec.update(method=head.method, max_k=head.max_k)
    else:
        spec["passes"] = "autoregressive"
    return spec


def deployed_spec(
    shape: ModelShape,
    kind: str,
    hw: HardwareSpec,
    layout: Layout,
    replica_tp: int,
    label="",
    latency: Latency | None = None,
    graph_sizes: list[int] | None = None,
) -> dict:
    """A model entry of the profile, with its split and formats where they are not the
    defaults (one device, the hardware file's dtype); ``latency``: the roofline's unless
    given."""
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    latency = latency or roofline_latency(shape, hw, layout, graph_sizes)
    spec = model_spec(shape, kind, dtype_bytes, latency, label)
    spec["weight_bytes"] = weight_bytes(shape, layout, dtype_bytes)
    spec["kv_bytes_per_token"] = device_kv_bytes_per_token(shape, layout.with_tp(1), dtype_bytes)
    if replica_tp > 1:
        spec["sharding"] = {
            "tensor_parallel_size": layout.tp,
            "weight_bytes_per_device": device_weight_bytes(shape, layout, dtype_bytes),
            "kv_bytes_per_token_per_device": device_kv_bytes_per_token(shape, layout, dtype_bytes),
        }
        if layout.ep_size(shape) > 1:
            spec["sharding"]["expert_parallel_size"] = layout.ep_size(shape)
    if layout.weights is not None or layout.kv_cache is not None:
        spec["precision"] = {
            "weights": layout.weights or hw.dtype,
            "kv_cache": layout.kv_cache or hw.dtype,
        }
    return spec


def roofline_profile(
    *,
    hardware_path: str | Path,
    target_path: str | Path,
    drafters: list,
    name: str,
    acceptance_path: str | Path | None = None,
    ngram_step_s: float = 1.0e-4,
    engine: EngineCosts | None = None,
    command: str | None = None,
    tp: int = 1,
    draft_tp: int | None = None,
    weights_dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_parallel: bool = False,
    cuda_graphs: int | None = None,
):
    """A complete roofline profile (validated ``Profile``) for a target and its drafters.

    ``drafters`` are ``specs.DrafterArg``; model drafters give a ``config.json`` path.
    Acceptance entries are copied from ``acceptance_path`` (an acceptance file or another
    profile: acceptance does not depend on the hardware) and must name the given drafters.
    A replica spans ``tp`` devices; draft models span ``draft_tp`` (1 or ``tp``; default
    ``tp``, vLLM's default). The formats apply to the target and the draft models alike.
    ``expert_parallel``: a mixture of experts' experts dealt out whole over the ``tp`` devices
    (``specsim.profiling.parallel``). ``cuda_graphs``: the engine captures CUDA graphs up to
    that many tokens at vLLM's default sizes (``vllm_graph_sizes``); None: no padding.
    ``engine``: the costs outside the passes (default: ``EngineCosts()``'s fitted values).
    """
    hw = load_hardware(hardware_path)
    engine = engine or EngineCosts()
    graph_sizes = None if cuda_graphs is None else vllm_graph_sizes(cuda_graphs)
    draft_tp = tp if draft_tp is None else draft_tp
    if draft_tp not in (1, tp):
        raise SpecsimError(
            f"drafter tensor-parallel size {draft_tp} with a target over {tp} devices",
            file="command line",
            key="--draft-tp",
            fix=f"give 1 or {tp} (vLLM's draft_tensor_parallel_size can only be 1 or the target's)",
        )
    layout = hardware_layout(hw, tp, weights_dtype, kv_dtype, str(hardware_path))
    layout = dataclasses.replace(layout, expert_parallel=expert_parallel)
    draft_layout = layout.with_tp(draft_tp)
    target = load_shape(target_path)
    check_expert_parallel(target, layout, "command line")
    mtp = [d.name for d in drafters if d.is_mtp]
    if mtp and draft_tp != tp:
        raise SpecsimError(
            f"--draft-tp {draft_tp}: drafter {mtp[0]} is the target's MTP module, sharded with "
            f"it over {tp} devices",
            file="command line",
            key="--draft-tp",
            fix=f"drop --draft-tp (or give {tp}) with an mtp drafter",
        )
    model_drafters = {
        d.name: mtp_drafter_shape(target, str(target_path)) if d.is_mtp else load_shape(d.spec)
        for d in drafters
        if not (d.is_ngram or d.head)
    }
    heads = {d.name: load_head(d.head, d.spec, target, d.max_k) for d in drafters if d.head}
    deployed = [
        (target, layout),
        *((s, draft_layout) for s in model_drafters.values()),
        *((h.shape, head_layout(draft_layout)) for h in heads.values()),
    ]
    for shape, lay in deployed:
        check_split(shape, lay.tp, "command line")
    check_fits(deployed, hw, str(hardware_path))

    drafter_specs = {}
    for d in drafters:
        if d.is_ngram:
            drafter_specs[d.name] = ngram_spec(d.ngram, ngram_step_s)
        elif d.head:
            drafter_specs[d.name] = head_spec(heads[d.name], hw, draft_layout, tp, graph_sizes)
        else:
            shape = model_drafters[d.name]
            label = f"{target.name} MTP module" if d.is_mtp else shape.name
            drafter_specs[d.name] = deployed_spec(
                shape, "draft_model", hw, draft_layout, tp, label, graph_sizes=graph_sizes
            )
            if d.is_mtp:
                drafter_specs[d.name]["method"] = "mtp"
    stated = tp > 1 or weights_dtype is not None or kv_dtype is not None
    notes = roofline_notes(
        hw, target, (layout, draft_layout), drafters, model_drafters, heads, graph_sizes,
        ngram_step_s, stated,
    )  # fmt: skip
    notes.append(engine.note())
    acceptance = []
    if acceptance_path is not None:
        acceptance, note = copied_acceptance(acceptance_path, set(drafter_specs))
        notes.append(note)
    data = {
        "version": 1,
        "name": name,
        "provenance": {
            "source": "roofline",
            "device": hw.name if tp == 1 else f"{tp} x {hw.name} (tensor parallel)",
            "date": today(),
            "software": software_versions(),
            "command": command,
            "notes": " ".join(notes),
        },
        "hardware": hw.as_profile_hardware(tp).model_dump(mode="json", exclude_none=True),
        "target": deployed_spec(target, "target", hw, layout, tp, graph_sizes=graph_sizes),
        "drafters": drafter_specs,
        "overhead": engine.overhead(),
        "acceptance": acceptance,
    }
    return build_profile(data, f"{name} (from the command line)")
