"""FP8 block-quantised checkpoints (DeepSeek-V3's own format), dequantised at load.

``config.json`` says ``quantization_config: {quant_method: fp8, fmt: e4m3, weight_block_size:
[128, 128]}``; each quantised matrix is stored as ``float8_e4m3fn`` with a float32
``<name>.weight_scale_inv`` holding one factor per block of ``weight_block_size`` (rows, columns;
the last blocks partial). The weight is the FP8 value times its block's factor, computed in
float32 (as DeepSeek's ``fp8_cast_bf16.py`` does) and then cast to the compute dtype. Norms,
embeddings, the router and the head are stored unquantised and read as they are.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specsim.errors import SpecsimError

SCALE_SUFFIX = ".weight_scale_inv"
FORMATS = {"e4m3": torch.float8_e4m3fn}
_FIX = "use the config.json that belongs to these weights, or a bf16 copy of the checkpoint"


def read_block_size(data: dict[str, Any], source: str) -> tuple[int, int] | None:
    """``quantization_config``'s block size, or None for an unquantised checkpoint."""
    quant = data.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise SpecsimError(
            "quantization_config must be a mapping",
            file=source,
            key="quantization_config",
            fix=_FIX,
        )
    method = quant.get("quant_method")
    if method != "fp8":
        raise SpecsimError(
            f"quant_method {method!r} is not read; only FP8 block-quantised checkpoints are",
            file=source,
            key="quantization_config.quant_method",
            fix="load a bf16 copy of the checkpoint",
        )
    fmt = quant.get("fmt", "e4m3")
    if fmt not in FORMATS:
        raise SpecsimError(
            f"FP8 format {fmt!r} is not read (only e4m3)",
            file=source,
            key="quantization_config.fmt",
            fix="load a bf16 copy of the checkpoint",
        )
    block = quant.get("weight_block_size")
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(type(b) is int and 1 <= b <= 2**16 for b in block)
    ):
        raise SpecsimError(
            f"weight_block_size must be two block sides (rows, columns) from 1 to 65536, got "
            f"{block!r} (per-tensor FP8 is not read)",
            file=source,
            key="quantization_config.weight_block_size",
            fix="give the checkpoint's block size, e.g. [128, 128]",
        )
    return block[0], block[1]


def is_scale(key: str) -> bool:
    return key.endswith(SCALE_SUFFIX)


def scale_key(key: str) -> str:
    """The scale tensor's key of weight ``key`` (``...proj.weight``)."""
    return key.removesuffix(".weight") + SCALE_SUFFIX


def dequantise(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], key: str, source: str
) -> torch.Tensor:
    """``weight`` (FP8) times its block's factor in ``scale``, in float32."""
    if weight.dtype not in FORMATS.values():
        raise SpecsimError(
            f"a weight with block scales must be stored as FP8 (e4m3), not {weight.dtype}",
            file=source,
            key=key,
            fix=_FIX,
        )
    if weight.dim() != 2:
        raise SpecsimError(
            f"a block-quantised weight must be a matrix, got shape {tuple(weight.shape)}",
            file=source,
            key=key,
            fix=_FIX,
        )
    rows, cols = weight.shape
    blocks = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale.shape) != blocks:
        raise SpecsimError(
            f"scale of shape {tuple(scale.shape)} does not fit blocks of {list(block)} over a "
            f"{rows} x {cols} weight (expected {blocks})",
            file=source,
            key=scale_key(key),
            fix="check quantization_config.weight_block_size against the checkpoint",
        )
    factors = scale.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)
    return weight.float() * factors[:, :cols]


def check_stored(tensor: torch.Tensor, key: str, block: tuple[int, int] | None, source: str):
    """Refuse an FP8 tensor without a scale (or in a checkpoint that declares no quantisation):
    its values alone are not the weights."""
    if tensor.dtype not in FORMATS.values():
        return
    if block is None:
        raise SpecsimError(
            "an FP8 weight, but config.json has no quantization_config",
            file=source,
            key=key,
            fix=_FIX,
        )
    raise SpecsimError(
        "an FP8 weight without its block scales", file=source, key=scale_key(key), fix=_FIX
    )
