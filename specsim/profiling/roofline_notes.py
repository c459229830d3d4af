"""The provenance notes of a roofline profile: what each part of the estimate assumes, in
words, with its figures (``specsim.profiling.roofline`` writes them)."""

from __future__ import annotations

from specsim.hardware import DTYPE_BYTES, HardwareSpec
from specsim.profiling.flops import ModelShape
from specsim.profiling.heads import Head
from specsim.profiling.parallel import (
    WEIGHT_BYTES,
    WEIGHT_FORMAT_NOTES,
    Layout,
    allreduce_terms,
    expert_exchange_terms,
)


def mtp_note(names: list[str], shape: ModelShape, target: ModelShape) -> str:
    """How an MTP drafter is costed: the draft_model kind's arithmetic over one module."""
    return (
        f"Drafter {', '.join(names)}: {target.name}'s multi-token-prediction module "
        f"({shape.param_count() / 1e9:.2f} B parameters of its own: one decoder layer, the "
        "2h x h projection of [embedding; hidden state], norms), costed as a draft model: "
        "k one-token passes per step (vLLM's method mtp runs the one module k times), a pass "
        "over the prompt and its own one-layer latent cache; each pass reads the module and the "
        "target's LM head, which it shares with the embedding (held once, by the target); "
        "sharded like the target."
    )


def mla_note(shape: ModelShape) -> str:
    """How latent attention's two forms are priced."""
    return (
        f"{shape.name}'s latent attention as vLLM runs it: decoding rows' pairs in the absorbed "
        f"form, {shape.attention_flops_per_pair() / 1e6:.3g} MFLOP a pair over all layers; "
        "prompt chunks' pairs decompressed (multi-head attention), "
        f"{shape.prefill_attention_flops_per_pair() / 1e6:.3g} MFLOP a pair "
        "(per_prefill_pair_s); the decompression of a chunk's cached context is not priced."
    )


def head_note(heads: dict[str, Head], layout: Layout, target: ModelShape) -> str:
    """How EAGLE heads are costed, with their sizes."""
    sizes = "; ".join(
        f"{name}: {h.method} head, {h.shape.param_count() / 1e9:.3g} B parameters of its own "
        f"({h.shape.num_layers} layer(s), fc over {h.fc_inputs} x hidden, "
        + (
            f"its own LM head over {h.shape.draft_vocab_size:,} tokens"
            if h.shape.draft_vocab_size
            else f"{target.name}'s LM head over {target.vocab_size:,} tokens"
        )
        + ")"
        for name, h in heads.items()
    )
    return (
        f"Drafters {sizes}. Costed as kind heads with passes autoregressive (vLLM's methods "
        "eagle and eagle3): k one-token passes per step, each reading the head's decoder "
        "layer(s), fc and LM head in 16 bits (published heads are 16-bit checkpoints), its "
        "one-layer KV cache in the target's KV format, and per sequence the fc's taps of the "
        "target's hidden states (written by the target, read by the head) and one embedding "
        "row. The fc and taps are counted in each of the k passes; vLLM runs them once per "
        "step over the k + 1 verified positions, so about one position fewer. Not priced: "
        "the head's pass over prompt tokens (vLLM fills its one-layer KV cache there, about "
        f"1/{target.num_layers} of the target's prefill FLOPs)"
        + (
            f"; sharded like the target over {layout.tp} devices (vLLM replicates the fc: "
            "its bytes per device are under-counted by (tp - 1)/tp of it)."
            if layout.tp > 1
            else "."
        )
    )


def block_note(blocks: dict[str, Head]) -> str:
    """How parallel drafters sized from their configs are costed."""
    sizes = "; ".join(
        f"{name}: {h.method}, {h.shape.param_count() / 1e9:.3g} B parameters of its own "
        f"({h.shape.num_layers} layer(s), fc over {h.fc_inputs} x hidden), at most {h.max_k} "
        "drafts per pass"
        for name, h in blocks.items()
    )
    return (
        f"Parallel drafters {sizes}. Costed as kind block: one pass per step over k + 1 query "
        "tokens per row (the last verified token and k mask slots), reading its layers, fc and "
        "LM head in 16 bits and its own KV cache in the target's KV format, and per sequence "
        "the fc's taps of the target's hidden states; its cache of the context is filled by a "
        "pass over prompt chunks and kept in step by a pass at k = 0."
    )


def efficiency_note(hw: HardwareSpec, tp: int = 1) -> str:
    eff = hw.efficiency
    return (
        f"Roofline estimate, not a measurement: {hw.name} at {hw.dtype}, "
        f"peak {hw.peak_flops / 1e12:g} TFLOP/s x MFU {eff.mfu:g}, "
        f"bandwidth {hw.memory_bandwidth_bytes_per_s / 1e12:g} TB/s x efficiency "
        f"{eff.bandwidth:g}, launch overhead {eff.launch_s_per_layer * 1e6:g} us per layer per "
        f"pass, {eff.memory_utilization:g} of device memory for weights and KV cache. A pass "
        "takes max(weight read, matmul compute) plus KV-cache read plus attention compute; "
        + (
            "single device, no tensor parallelism. Price per hour is an example: edit it."
            if tp == 1
            else f"each of a replica's {tp} devices holds and reads a 1/{tp} shard "
            f"(tensor parallelism). Price per hour is the replica's: {tp} x "
            f"${hw.price_per_hour_usd:g} per device, an example: edit it."
        )
    )


def moe_note(shape: ModelShape) -> str:
    """How a mixture of experts enters the roofline: the routed experts a pass reads."""
    return (
        f"{shape.name} is a mixture of experts: {shape.param_count() / 1e9:.1f} B parameters "
        f"in memory, {shape.active_param_count() / 1e9:.1f} B active per token "
        f"({shape.experts_per_token} of {shape.num_experts} experts). FLOPs per token count the "
        "active experts; a pass over N tokens reads the union of the routed experts they pick, "
        f"E(1 - (1 - k/E)^N) per MoE layer expected under uniform routing "
        f"({shape.experts_read(1):.0f} at N = 1, {shape.experts_read(8):.1f} at N = 8, "
        f"{shape.experts_read(64):.1f} at N = 64; latency fit's experts term), so verifying "
        "(k + 1) x batch tokens reads more experts than one decode token. The knee is where "
        "compute reaches the read of the other weights; the routed experts' read is paid on "
        "top of the compute, not hidden under it (a grouped GEMM streams each expert for its "
        "N k / E tokens: 128 at 2048 tokens, 8 of 128 experts, near the device's ridge)."
    )


def graph_note(sizes: list[int]) -> str:
    """What the captured CUDA graphs add to a pass."""
    return (
        f"CUDA graphs: the engine runs a pass of up to {sizes[-1]} tokens as the captured graph "
        f"of the next size ({len(sizes)} sizes, vLLM 0.33's default list: 1, 2, 4, multiples of "
        "8 below 256, of 16 from 256), its matrix products over the padded count (the "
        "latency fit's graph_sizes: a staircase in step time past the knee); larger passes "
        "run eager, unpadded."
    )


def deployment_note(
    target: ModelShape, hw: HardwareSpec, layout: Layout, draft_tp: int | None, heads=False
) -> str:
    """What the profile assumes of the split and the formats, with the all-reduce's cost;
    ``heads``: EAGLE heads are among the drafters."""
    parts = []
    if layout.tp > 1:
        per_token, per_pass = allreduce_terms(target, layout)
        link = layout.link
        parts.append(
            f"Tensor parallelism {layout.tp}: weights, embedding, LM head and KV heads sharded "
            f"(KV heads replicated where fewer than devices); two ring all-reduces per layer "
            f"of tokens x hidden x 2 bytes over {layout.link_name} "
            f"({link.bandwidth_bytes_per_s / 1e9:g} GB/s per direction x efficiency "
            f"{layout.link_efficiency:g}, {link.latency_s * 1e6:g} us per step): "
            f"{per_pass * 1e3:.3g} ms per target pass plus {per_token * 1e6:.3g} us per token, "
            "added to the compute slope (the fit's knee form under-states passes just below "
            f"the knee by at most that slope x the knee). Memory per device: the weights' "
            f"shard; price: the replica's devices."
        )
        if draft_tp is not None:
            parts.append(
                f"Draft models run over {draft_tp} device(s) (draft_tensor_parallel_size "
                f"{draft_tp}); "
                + (
                    "sharded like the target."
                    if draft_tp > 1
                    else "each whole on one device, which its weights and KV cache then bind."
                )
            )
    if layout.weights is not None or layout.kv_cache is not None:
        weights = layout.weights or hw.dtype
        low_peak = hw.quantised_peak(weights)
        peak = (
            f"at the {weights} peak {low_peak / 1e12:g} TFLOP/s (activations quantised alike)"
            if low_peak
            else "at the bf16 peak (weight-only: dequantised to 16 bits; the format saves "
            "bandwidth, not compute)"
        )
        parts.append(
            f"Weights in {weights} ({WEIGHT_BYTES.get(weights, DTYPE_BYTES[hw.dtype]):g} B per "
            f"parameter: {WEIGHT_FORMAT_NOTES.get(weights, 'no scales')}; decoder layers' "
            f"matrices; embedding, LM head, router and norms in {hw.dtype})"
            + (f", their matrix products {peak}" if weights != hw.dtype else "")
            + f"; KV cache in {layout.kv_cache or hw.dtype}; attention at the bf16 peak; "
            "the formats apply to the draft models too"
            + (" (to EAGLE heads the KV format only)." if heads else ".")
        )
    return " ".join(parts)


def expert_parallel_note(target: ModelShape, hw: HardwareSpec, layout: Layout) -> str:
    """What expert parallelism changes: the experts per device and the MoE layers' traffic."""
    ep = layout.ep_size(target)
    token_s, pass_s = expert_exchange_terms(target, layout)
    return (
        f"Expert parallelism over {ep} devices (vLLM's --enable-expert-parallel, EP = TP x DP "
        f"with DP 1): up to {-(-target.num_experts // ep)} of the {target.num_experts} experts "
        "whole on each device, attention tensor parallel; each of the "
        f"{target.moe_layers} MoE layers replaces its MLP all-reduce with an all-to-all "
        f"dispatch and combine of the tokens' {target.experts_per_token} expert copies (each "
        f"device sending its 1/{ep} of the tokens, (p - 1)/p of the copies off-device) and an "
        f"all-gather of the outputs over {layout.link_name}: {pass_s * 1e6:.3g} us per pass "
        f"plus {token_s * 1e9:.3g} ns per token per MoE layer (stated model, not measured)."
    )


def roofline_notes(
    hw: HardwareSpec, target: ModelShape, layouts: tuple[Layout, Layout], drafters: list,
    model_drafters: dict[str, ModelShape], heads: dict[str, Head], graph_sizes, ngram_step_s,
    stated: bool,
) -> list[str]:  # fmt: skip
    """A roofline profile's notes, in order; ``layouts``: the target's and the drafters';
    ``stated``: a split or formats given on the command line."""
    (layout, draft_layout), tp = layouts, layouts[0].tp
    mtp = [d.name for d in drafters if d.is_mtp]
    notes = [efficiency_note(hw, tp)]
    if stated:
        split = draft_layout.tp if model_drafters or heads else None
        notes.append(deployment_note(target, hw, layout, split, bool(heads)))
    if layout.ep_size(target) > 1:
        notes.append(expert_parallel_note(target, hw, layout))
    notes += [moe_note(s) for s in (target, *model_drafters.values()) if s.num_experts]
    if target.is_mla:
        notes.append(mla_note(target))
    if graph_sizes is not None:
        notes.append(graph_note(graph_sizes))
    if mtp:
        notes.append(mtp_note(mtp, model_drafters[mtp[0]], target))
    chains = {n: h for n, h in heads.items() if not h.is_block}
    if chains:
        notes.append(head_note(chains, draft_layout, target))
    if len(chains) < len(heads):
        notes.append(block_note({n: h for n, h in heads.items() if h.is_block}))
    if any(d.is_ngram for d in drafters):
        notes.append(
            f"Prompt-lookup draft_step_s {ngram_step_s:g} s per step is stated (a CPU n-gram "
            "search over the context), not measured."
        )
    return notes
