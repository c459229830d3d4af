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

Effective means multiplied by a stated efficiency: model FLOP utilisation (MFU) for compute and a
bandwidth efficiency for memory, plus a per-layer launch overhead. Nothing here is measured; the
profile says so in its provenance.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from specsim.bounds import Bytes, PositiveFlops, Price, Seconds
from specsim.config import StrictModel, load_yaml_as
from specsim.errors import SpecsimError
from specsim.fileio import read_yaml
from specsim.profile.schema import Hardware, Latency, LatencyFit
from specsim.profiling.flops import ModelShape, load_shape
from specsim.profiling.writer import (
    acceptance_entries,
    build_profile,
    model_spec,
    ngram_spec,
    software_versions,
    today,
)


class Efficiency(StrictModel):
    """How far below the datasheet a serving engine runs (stated, not measured)."""

    mfu: float = Field(default=0.5, gt=0, le=1, description="share of peak FLOP/s reached")
    bandwidth: float = Field(default=0.8, gt=0, le=1, description="share of peak bandwidth")
    launch_s_per_layer: Seconds = Field(
        default=1.0e-5, description="kernel-launch and framework cost per layer per pass"
    )
    memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="share of device memory for weights and KV cache"
    )


class HardwareSpec(StrictModel):
    """A device's datasheet numbers (``profiles/hardware/*.yaml``)."""

    name: str
    memory_bytes: Bytes
    peak_flops: PositiveFlops = Field(description="dense FLOP/s at the profile dtype (bf16)")
    memory_bandwidth_bytes_per_s: Bytes
    dtype: str = "bfloat16"
    price_per_hour_usd: Price = Field(description="example price; edit to your own")
    price_note: str = ""
    source: str = Field(default="", description="where the datasheet numbers come from")
    efficiency: Efficiency = Field(default_factory=Efficiency)

    def as_profile_hardware(self) -> Hardware:
        return Hardware(
            name=self.name,
            memory_bytes=self.memory_bytes * self.efficiency.memory_utilization,
            price_per_hour_usd=self.price_per_hour_usd,
            peak_flops=self.peak_flops,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
        )


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "int8": 1}


def load_hardware(path: str | Path) -> HardwareSpec:
    spec = load_yaml_as(HardwareSpec, path, what="hardware spec")
    if spec.dtype not in DTYPE_BYTES:
        raise SpecsimError(
            f"unknown dtype {spec.dtype!r}",
            file=str(path),
            key="dtype",
            fix=f"use one of {', '.join(DTYPE_BYTES)}",
        )
    return spec


def roofline_fit(shape: ModelShape, hw: HardwareSpec) -> LatencyFit:
    """The latency fit of ``shape`` on ``hw`` under the roofline model (see module docstring)."""
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.efficiency.bandwidth
    peak = hw.peak_flops * hw.efficiency.mfu
    memory_s = shape.weight_bytes(dtype_bytes) / bandwidth
    per_token_s = shape.flops_per_token() / peak
    return LatencyFit(
        fixed_s=memory_s + shape.num_layers * hw.efficiency.launch_s_per_layer,
        per_sequence_s=0.0,
        per_batched_token_s=per_token_s,
        knee_tokens=memory_s / per_token_s,
        per_kv_token_s=shape.kv_bytes_per_token(dtype_bytes) / bandwidth,
        per_attention_pair_s=shape.attention_flops_per_pair() / peak,
    )


def roofline_latency(shape: ModelShape, hw: HardwareSpec) -> Latency:
    """A ``Latency`` section: the roofline fit, no samples, valid everywhere (an estimate)."""
    return Latency(fit=roofline_fit(shape, hw), valid_range=None, outside_range="extrapolate")


def efficiency_note(hw: HardwareSpec) -> str:
    eff = hw.efficiency
    return (
        f"Roofline estimate, not a measurement: {hw.name} at {hw.dtype}, "
        f"peak {hw.peak_flops / 1e12:g} TFLOP/s x MFU {eff.mfu:g}, "
        f"bandwidth {hw.memory_bandwidth_bytes_per_s / 1e12:g} TB/s x efficiency "
        f"{eff.bandwidth:g}, launch overhead {eff.launch_s_per_layer * 1e6:g} us per layer per "
        f"pass, {eff.memory_utilization:g} of device memory for weights and KV cache. A pass "
        "takes max(weight read, matmul compute) plus KV-cache read plus attention compute; "
        "single device, no tensor parallelism. Price per hour is an example: edit it."
    )


def moe_note(shape: ModelShape) -> str:
    """How a mixture of experts enters the roofline (the fit's form has one weight read)."""
    return (
        f"{shape.name} is a mixture of experts: {shape.param_count() / 1e9:.1f} B parameters "
        f"in memory, {shape.active_param_count() / 1e9:.1f} B active per token "
        f"({shape.experts_per_token} of {shape.num_experts} experts). FLOPs per token count the "
        "active experts; a pass is taken to read every expert's weights, as a batch of B tokens "
        f"touches E(1 - (1 - k/E)^B) experts per layer ({shape.experts_read(8):.1f} at B = 8), so "
        "passes of a few tokens are estimated slow."
    )


def check_fits(shapes: list[ModelShape], hw: HardwareSpec, source: str) -> None:
    """The models' weights must fit on one device with room left for a KV cache."""
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    weights = sum(s.weight_bytes(dtype_bytes) for s in shapes)
    usable = hw.memory_bytes * hw.efficiency.memory_utilization
    if weights >= usable:
        names = " + ".join(s.name for s in shapes)
        raise SpecsimError(
            f"weights of {names} ({weights / 1e9:.1f} GB) do not fit in "
            f"{usable / 1e9:.1f} GB usable on {hw.name}",
            file=source,
            key="memory_bytes",
            fix="use a device with more memory or smaller models (tensor parallelism is not "
            "modelled)",
        )


def roofline_profile(
    *,
    hardware_path: str | Path,
    target_path: str | Path,
    drafters: list,
    name: str,
    acceptance_path: str | Path | None = None,
    ngram_step_s: float = 1.0e-4,
    overhead_step_s: float = 5.0e-4,
    overhead_sequence_s: float = 1.0e-5,
    command: str | None = None,
):
    """A complete roofline profile (validated ``Profile``) for a target and its drafters.

    ``drafters`` are ``specs.DrafterArg``; model drafters give a ``config.json`` path.
    Acceptance entries are copied from ``acceptance_path`` (an acceptance file or another
    profile: acceptance does not depend on the hardware) and must name the given drafters.
    """
    hw = load_hardware(hardware_path)
    dtype_bytes = DTYPE_BYTES[hw.dtype]
    target = load_shape(target_path)
    model_drafters = {d.name: load_shape(d.spec) for d in drafters if not d.is_ngram}
    check_fits([target, *model_drafters.values()], hw, str(hardware_path))

    drafter_specs = {}
    for d in drafters:
        if d.is_ngram:
            drafter_specs[d.name] = ngram_spec(d.ngram, ngram_step_s)
        else:
            shape = model_drafters[d.name]
            drafter_specs[d.name] = model_spec(
                shape, "draft_model", dtype_bytes, roofline_latency(shape, hw), shape.name
            )
    notes = [efficiency_note(hw)]
    notes += [moe_note(s) for s in (target, *model_drafters.values()) if s.num_experts]
    if any(d.is_ngram for d in drafters):
        notes.append(
            f"Prompt-lookup draft_step_s {ngram_step_s:g} s per step is stated (a CPU n-gram "
            "search over the context), not measured."
        )
    notes.append(
        f"Engine overhead {overhead_step_s:g} s per step and {overhead_sequence_s:g} s per "
        "sequence is stated (scheduling, sampling), not measured."
    )
    acceptance = []
    if acceptance_path is not None:
        acceptance, note = copied_acceptance(acceptance_path, set(drafter_specs))
        notes.append(note)
    data = {
        "version": 1,
        "name": name,
        "provenance": {
            "source": "roofline",
            "device": hw.name,
            "date": today(),
            "software": software_versions(),
            "command": command,
            "notes": " ".join(notes),
        },
        "hardware": hw.as_profile_hardware().model_dump(mode="json", exclude_none=True),
        "target": model_spec(target, "target", dtype_bytes, roofline_latency(target, hw)),
        "drafters": drafter_specs,
        "overhead": {
            "per_step_s": overhead_step_s,
            "per_sequence_s": overhead_sequence_s,
            "source": "stated",
        },
        "acceptance": acceptance,
    }
    return build_profile(data, f"{name} (from the command line)")


def copied_acceptance(path: str | Path, drafters: set[str]) -> tuple[list[dict], str]:
    """Acceptance entries of an acceptance file or another profile, checked against the given
    drafter names, and a provenance note saying where they came from."""
    data = read_yaml(path, "acceptance file")
    entries = acceptance_entries(data, str(path))
    for i, entry in enumerate(entries):
        if entry["drafter"] not in drafters:
            raise SpecsimError(
                f"acceptance names drafter {entry['drafter']!r}, not given with --drafter",
                file=str(path),
                key=f"acceptance[{i}].drafter",
                fix=f"add --drafter {entry['drafter']}=... or use a matching file",
            )
    extra = data.get("notes") if isinstance(data.get("notes"), str) else ""
    return entries, f"Acceptance copied from {Path(path).name}. {extra}".strip()
