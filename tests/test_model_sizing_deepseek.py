"""DeepSeek-V3's roofline sizing, hand-worked: latent attention's KV bytes and FLOPs per pair,
a decode pass's cost, the latent on every device of a tensor-parallel replica, and the
multi-token-prediction module sized apart, as a drafter.

The parameter counts (671 B total, 37 B active) are checked with the other families in
``test_model_sizing``; its hand counts are reused here.
"""

from __future__ import annotations

import json

import pytest
from test_model_sizing import (
    DEEPSEEK_ATTENTION,
    DEEPSEEK_DENSE,
    DEEPSEEK_EXPERT,
    DEEPSEEK_NORMS,
    DEEPSEEK_ROUTER,
    deepseek_v3,
    roofline,
)

from specsim.model_keys import DEEPSEEK_V3_DEFAULTS
from specsim.models.config import ModelConfig
from specsim.profile import load_profile
from specsim.profiling.flops import pass_cost
from specsim.profiling.model_configs import load_shape, shape_from_config
from specsim.profiling.parallel import Layout, check_split, device_kv_bytes_per_token

LATENT = 512 + 64  # kv_lora_rank + qk_rope_head_dim, per token per layer
V, H = 129280, 7168


@pytest.fixture
def shape(repo):
    return load_shape(repo / "profiles" / "models" / "deepseek-v3.json")


def test_the_kv_cache_holds_the_latent(shape):
    """vLLM and SGLang cache the latent and the rotary key: 61 x 576 x 2 bytes in bf16, where
    the expanded keys (192 wide) and values (128 wide) of 128 heads would take 71 x more."""
    assert shape.kv_bytes_per_token(2) == 61 * LATENT * 2 == 70_272
    assert shape.kv_bytes_per_token(1) == 35_136  # an fp8 cache
    expanded = 61 * 128 * (192 + 128) * 2
    assert expanded // shape.kv_bytes_per_token(2) == 71


def test_attention_is_counted_on_the_latent_as_engines_decode(shape):
    # Per head and pair: q against (latent, rotary key), 2 x 576, and the weighted latent, 2 x 512.
    assert shape.attention_flops_per_pair() == 61 * 128 * (2 * LATENT + 2 * 512) == 16_990_208


def test_a_tokens_flops_run_its_8_experts_and_the_shared_one(shape):
    matmuls = (
        61 * DEEPSEEK_ATTENTION
        + 3 * DEEPSEEK_DENSE
        + 58 * (9 * DEEPSEEK_EXPERT + 7168 * 256)  # 8 routed + 1 shared, the router
        + V * H  # the LM head (the embedding is a lookup)
    )
    assert shape.flops_per_token() == 2 * matmuls  # 73.2 GFLOP per token


def test_a_decode_pass_reads_the_latent_cache_and_the_touched_experts(shape):
    one = pass_cost(shape, batch=1, context=1000, new_tokens=1, dtype_bytes=2)
    assert one.kv_read_bytes == 1000 * 70_272 and one.kv_write_bytes == 70_272
    # One token touches 8 of the 256 routed experts per MoE layer; the shared one always runs.
    assert one.weight_bytes == 2 * (deepseek_v3(256) - 58 * 248 * DEEPSEEK_EXPERT)
    assert one.flops == shape.flops_per_token() + 1001 * 16_990_208


def test_tensor_parallel_devices_each_hold_the_whole_latent(shape):
    """The latent is shared by all heads, so it is not split by head: each of 8 devices caches
    all of it (vLLM's MLA), while the 128 query heads split 16 a device."""
    check_split(shape, 8, "deepseek-v3.json")
    assert device_kv_bytes_per_token(shape, Layout(tp=8), 2) == 70_272
    assert device_kv_bytes_per_token(shape, Layout(tp=8, kv_cache="fp8"), 2) == 35_136


def test_the_mtp_module_is_a_one_layer_drafter_on_the_targets_embeddings(shape):
    """DeepSeek-V3's MTP module: norms of the embedding and of the hidden state, their joint
    projection, one MoE layer, a final norm; it uses the target's embedding and LM head. The
    checkpoint stores copies of those two with it: 13.46 B in all, the model card's 14 B."""
    mtp = shape.mtp_shape()
    own = 2 * H * H + DEEPSEEK_ATTENTION + DEEPSEEK_NORMS + 2 * H  # + enorm, hnorm
    own += 257 * DEEPSEEK_EXPERT + DEEPSEEK_ROUTER + H  # + the final norm
    assert mtp.param_count() == own == 11_610_068_224
    assert abs(own + 2 * V * H - 14e9) <= 0.55e9
    assert mtp.weight_bytes(2) == 2 * own  # the embedding and head are the target's
    # Per drafted token: the projection, the layer with 9 experts, and the shared LM head.
    per_token = 2 * H * H + DEEPSEEK_ATTENTION + 9 * DEEPSEEK_EXPERT + 7168 * 256 + V * H
    assert mtp.flops_per_token() == 2 * per_token
    assert mtp.kv_bytes_per_token(2) == LATENT * 2  # its one layer's latent cache
    assert mtp.attention_flops_per_pair() == 128 * (2 * LATENT + 2 * 512)
    assert shape.mtp_layers == 1 and mtp.mtp_layers == 0
    with pytest.raises(ValueError, match="no multi-token-prediction"):
        mtp.mtp_shape()


def test_the_roofline_profile_of_deepseek_v3_on_8_h200s_in_fp8(repo, tmp_path, capsys):
    code, out = roofline(
        repo, tmp_path, "h200-sxm", "deepseek-v3", "--tp", "8", "--weights-dtype", "fp8"
    )
    assert code == 0
    target = load_profile(out).profile.target
    assert target.params == deepseek_v3(256)
    assert target.kv_bytes_per_token == 70_272
    assert target.attention_flops_per_context_token == pytest.approx(16_990_208, rel=1e-5)
    # In bf16, 1.34 TB of weights over 8 devices is more than an H200's 127 GB usable: refused.
    (tmp_path / "bf16").mkdir()
    code, out = roofline(repo, tmp_path / "bf16", "h200-sxm", "deepseek-v3", "--tp", "8")
    assert code == 2 and not out.exists()
    assert "167.8 GB per device" in capsys.readouterr().err


def test_both_readers_give_absent_keys_deepseek_v3s_own_values(repo):
    """The loader and the roofline share one table of defaults: a released config.json with
    every defaulted key left out reads, in each, as the full one does."""
    full = json.loads((repo / "profiles" / "models" / "deepseek-v3.json").read_text())
    bare = {key: value for key, value in full.items() if key not in DEEPSEEK_V3_DEFAULTS}
    assert len(full) - len(bare) == len(DEEPSEEK_V3_DEFAULTS) == 13
    assert ModelConfig.from_hf_dict(bare, "bare.json") == ModelConfig.from_hf_dict(full, "full")
    assert shape_from_config(bare, "v3", "bare.json") == shape_from_config(full, "v3", "full")
