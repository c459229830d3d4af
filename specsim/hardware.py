"""The hardware file (``profiles/hardware/*.yaml``): a device's datasheet figures, its links and
the stated efficiencies a serving engine reaches.

It sits below the simulator because a disaggregated fleet's KV transfer reads a link from it, as
the roofline's all-reduces do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from specsim.bounds import Bytes, PositiveFlops, Price, Seconds, Share
from specsim.config import StrictModel, load_yaml_as
from specsim.errors import SpecsimError
from specsim.profile.schema import Hardware

FP4_FORMATS = ("nvfp4", "mxfp4")


class Link(StrictModel):
    """A device-to-device interconnect (NVLink, PCIe) as an all-reduce sees it."""

    bandwidth_bytes_per_s: Bytes = Field(
        description="per device, per direction (datasheets quote both directions summed)"
    )
    latency_s: Seconds = Field(description="per ring step (not on datasheets: stated)")


class Efficiency(StrictModel):
    """How far below the datasheet a serving engine runs: each hardware file says where its
    values come from (fitted on bundled public runs, or stated)."""

    mfu: Share = Field(default=0.5, description="share of peak FLOP/s reached")
    bandwidth: Share = Field(default=0.8, description="share of peak bandwidth")
    launch_s_per_layer: Seconds = Field(
        default=1.0e-5, description="kernel-launch and framework cost per layer per pass"
    )
    memory_utilization: Share = Field(
        default=0.9, description="share of device memory for weights and KV cache"
    )
    interconnect: Share = Field(
        default=0.8, description="share of link bandwidth an all-reduce reaches"
    )


class HardwareSpec(StrictModel):
    """A device's datasheet numbers (``profiles/hardware/*.yaml``)."""

    name: str
    memory_bytes: Bytes
    peak_flops: PositiveFlops = Field(description="dense FLOP/s at the profile dtype (bf16)")
    peak_flops_fp8: PositiveFlops | None = Field(
        default=None, description="dense FP8 tensor-core FLOP/s; absent: fp8 weights run at bf16"
    )
    peak_flops_fp4: dict[Literal[FP4_FORMATS], PositiveFlops] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="dense FP4 tensor-core FLOP/s per format the tensor cores run (nvfp4, "
        "mxfp4); a format absent here runs its matrix products at the bf16 peak",
    )
    memory_bandwidth_bytes_per_s: Bytes
    dtype: str = "bfloat16"
    price_per_hour_usd: Price = Field(description="example price; edit to your own")
    price_note: str = ""
    source: str = Field(default="", description="where the datasheet numbers come from")
    nvlink: Link | None = Field(default=None, description="device-to-device NVLink, if any")
    pcie: Link | None = Field(default=None, description="PCIe, used for TP without NVLink")
    efficiency: Efficiency = Field(default_factory=Efficiency)

    def as_profile_hardware(self, tp: int = 1) -> Hardware:
        return Hardware(
            name=self.name,
            memory_bytes=self.memory_bytes * self.efficiency.memory_utilization,
            price_per_hour_usd=self.price_per_hour_usd * tp,
            peak_flops=self.peak_flops,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
            tensor_parallel_size=tp if tp > 1 else None,
        )

    def quantised_peak(self, weights: str | None) -> float | None:
        """Dense FLOP/s of the matrix products of weights in ``weights`` where the tensor
        cores run that format (FP8; NVFP4 or MXFP4 with activations quantised alike, W4A4),
        else None: the weights are dequantised and multiplied at the bf16 peak (int4's AWQ and
        GPTQ, FP4 on a device without FP4 tensor cores: weight-only, bandwidth only)."""
        if weights == "fp8":
            return self.peak_flops_fp8
        return (self.peak_flops_fp4 or {}).get(weights)

    def interconnect(self) -> tuple[str, Link | None]:
        """The link a tensor-parallel replica all-reduces over: NVLink where the file has it."""
        return ("NVLink", self.nvlink) if self.nvlink else ("PCIe", self.pcie)


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
