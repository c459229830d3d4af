"""FP8 block-quantised checkpoints (DeepSeek-V3's own format), dequantised at load
(``specsim.models.fp8``).

The test quantises a random DeepSeek-V3 folder (transformers' ``save_pretrained``, with an MTP
layer: ``test_mtp_engine.write_folder``) as DeepSeek-V3's release stores it: every projection
matrix of attention and of the MLPs (dense, routed and shared experts, the MTP layer's block
too) as ``float8_e4m3fn`` plus a float32 ``weight_scale_inv`` per block; the norms, the
embedding, the router (``mlp.gate``, its bias), ``lm_head`` and the MTP layer's ``eh_proj`` and
``shared_head`` unquantised. Blocks of 8 x 4 over matrices such as 44 x 10 leave partial edge
blocks. Its expected weights are dequantised here by an explicit loop over blocks, written as a
plain float32 folder; both load to identical tensors (dequantisation is deterministic).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_mtp_engine import write_folder

from specsim.errors import SpecsimError
from specsim.models import load_model, load_mtp_drafter

BLOCK = [8, 4]  # rows, columns: unequal, so a swap of the two shows
QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"}
# The released checkpoint's quantised matrices: attention and MLP projections (eh_proj is not).
QUANTISED = re.compile(
    r"\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|"
    r"gate_proj|up_proj|down_proj)\.weight$"
)
E4M3_MAX = 448.0


def quantise(weight: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and one float32 factor per block, DeepSeek's way (block max to 448)."""
    rows, cols = weight.shape
    scales = torch.empty(math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    values = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            r, c = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
            scales[i, j] = weight[r, c].abs().max().clamp(min=1e-12) / E4M3_MAX
            values[r, c] = (weight[r, c] / scales[i, j]).to(torch.float8_e4m3fn)
    return values, scales


def dequantised(values: torch.Tensor, scales: torch.Tensor, block=BLOCK) -> torch.Tensor:
    out = torch.empty(values.shape)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            r, c = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
            out[r, c] = values[r, c].float() * scales[i, j]
    return out


def write(folder, config: dict, weights: dict) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(fp8 folder, its dequantised float32 twin)."""
    path = tmp_path_factory.mktemp("fp8")
    source = write_folder(path)[0]
    weights = load_file(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    fp8, plain = {}, {}
    for key, tensor in weights.items():
        if QUANTISED.search(key):
            values, scales = quantise(tensor.float())
            fp8[key], fp8[key.removesuffix(".weight") + ".weight_scale_inv"] = values, scales
            plain[key] = dequantised(values, scales)
        else:
            fp8[key] = plain[key] = tensor
    assert sum(v.dtype == torch.float8_e4m3fn for v in fp8.values()) > 40
    write(
        path / "fp8", {**config, "quantization_config": {**QUANT, "weight_block_size": BLOCK}}, fp8
    )
    write(path / "plain", config, plain)
    return path / "fp8", path / "plain"


@torch.no_grad()
def test_an_fp8_checkpoint_loads_as_its_dequantised_copy(folders):
    quantised, plain = folders
    for dtype in (torch.float32, torch.bfloat16):
        got, expected = load_model(quantised, dtype=dtype), load_model(plain, dtype=dtype)
        a, b = got.state_dict(), expected.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        ids = torch.randint(0, 6, (2, 9), generator=torch.Generator().manual_seed(0))
        assert torch.equal(got(ids), expected(ids))
    # The MTP layer's block is quantised too; its eh_proj and shared head are not.
    target = load_model(quantised)
    mtp, twin = load_mtp_drafter(quantised, target), load_mtp_drafter(plain, load_model(plain))
    a, b = mtp.module.state_dict(), twin.module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_block_by_hand(folders, tmp_path):
    """kv_b_proj of layer 0 is 44 x 10: blocks of 8 x 4 leave a 4 x 2 corner block (5, 2).
    Its value 1.5 (exact in e4m3) with factor 0.25 is 0.375; 2^-9 (e4m3's smallest subnormal)
    with factor 0.25 is 2^-11; in block (5, 0), 2^-9 with factor 2^10 is 2."""
    quantised = folders[0]
    weights = dict(load_file(quantised / "model.safetensors"))
    key = "model.layers.0.self_attn.kv_b_proj.weight"
    values, scales = weights[key].clone(), weights[key.replace("weight", "weight_scale_inv")]
    assert values.shape == (44, 10) and scales.shape == (6, 3)
    values[40, 8], values[43, 9] = 1.5, 0.001953125
    scales = scales.clone()
    scales[5, 2] = 0.25
    scales[5, 0] = 1024.0
    values[41, 3] = 0.001953125
    weights[key], weights[key.replace("weight", "weight_scale_inv")] = values, scales
    write(tmp_path / "m", json.loads((quantised / "config.json").read_text()), weights)
    loaded = load_model(tmp_path / "m").model.layers[0].self_attn.kv_b_proj.weight
    assert loaded[40, 8].item() == 0.375
    assert loaded[43, 9].item() == 0.001953125 * 0.25
    assert loaded[41, 3].item() == 2.0


def spoilt(quantised, tmp_path, change_weights=None, change_config=None):
    weights = dict(load_file(quantised / "model.safetensors"))
    config = json.loads((quantised / "config.json").read_text())
    if change_weights:
        change_weights(weights)
    if change_config:
        change_config(config)
    write(tmp_path / "bad", config, weights)
    return tmp_path / "bad"


SCALE = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"


def _drop_scale(w):
    del w[SCALE]


def _wrong_block(c):
    c["quantization_config"]["weight_block_size"] = [16, 8]


def _other_method(c):
    c["quantization_config"] = {"quant_method": "awq", "bits": 4}


def _no_config(c):
    del c["quantization_config"]


def _orphan_scale(w):
    del w[SCALE.replace("_scale_inv", "")]


@pytest.mark.parametrize(
    "weights, config, message, key",
    [
        (_drop_scale, None, "without its block scales", SCALE),
        (None, _wrong_block, "does not fit blocks of", "weight_scale_inv"),
        (None, _other_method, "quant_method 'awq' is not read", "quant_method"),
        (None, _no_config, "no quantization_config", "model.layers."),
        (_orphan_scale, None, "block scales without their weight", SCALE),
    ],
    ids=["missing-scale", "wrong-block-size", "other-method", "undeclared", "orphan-scale"],
)
def test_bad_fp8_layouts_are_refused_in_one_line(folders, tmp_path, weights, config, message, key):
    folder = spoilt(folders[0], tmp_path, weights, config)
    with pytest.raises(SpecsimError, match=message) as error:
        load_model(folder)
    text = str(error.value)
    assert "\n" not in text and key in text
