"""Tensor parallelism and number formats in the roofline, against hand-worked cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_model_sizing import DEEPSEEK_ATTENTION, DEEPSEEK_DENSE, DEEPSEEK_EXPERT, deepseek_v3

# The hand-counted shape of test_profiling_roofline: 2 layers, hidden 8, 2 heads of 4, 1 KV head,
# 2792 parameters (2 x (192 attention + 384 MLP + 16 norms) + 2 x 800 embedding/head + 8).
from test_profiling_roofline import TOY, TOY_PARAMS

from specsim.costs import kv_capacity_tokens
from specsim.costs.kv_cache import engine_reservation_bytes
from specsim.errors import SpecsimError
from specsim.hardware import Efficiency, HardwareSpec, Link, load_hardware
from specsim.profile import LatencyModel, load_profile
from specsim.profile.latency import Latency
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import (
    Layout,
    allreduce_terms,
    device_kv_bytes_per_token,
    hardware_layout,
    quantised_flops_per_token,
    quantised_params,
    ring_allreduce_s,
    weight_bytes,
)
from specsim.profiling.roofline import matmul_s_per_token, roofline_fit
from specsim.scenario import Engine, load_scenario

LINK = Link(bandwidth_bytes_per_s=1e9, latency_s=1e-6)
HW = HardwareSpec(
    name="hand",
    memory_bytes=1e9,
    peak_flops=1e12,
    peak_flops_fp8=2e12,
    memory_bandwidth_bytes_per_s=1e9,
    price_per_hour_usd=3.0,
    nvlink=LINK,
    efficiency=Efficiency(mfu=0.5, bandwidth=0.8, launch_s_per_layer=1e-6, interconnect=0.5),
)
H100_TP4 = "llama3.1-70b_llama3.2-1b_4xh100-tp4-roofline.yaml"
REPO = Path(__file__).resolve().parent.parent
H200_FP8 = "llama3.1-70b_llama3.2-1b_h200-fp8-roofline.yaml"


def test_ring_allreduce_is_two_p_minus_one_steps():
    # 16 KiB over 4 devices at 450 GB/s, 1 us a step: 6 steps of latency, 6/4 of the bytes.
    link = Link(bandwidth_bytes_per_s=450e9, latency_s=1e-6)
    seconds = ring_allreduce_s(16384, 4, link)
    assert seconds == pytest.approx(6e-6 + 1.5 * 16384 / 450e9, rel=1e-12)
    assert ring_allreduce_s(16384, 4, link, efficiency=0.5) == pytest.approx(
        6e-6 + 1.5 * 16384 / 225e9, rel=1e-12
    )
    assert ring_allreduce_s(16384, 1, link) == 0.0  # one device sums nothing


def test_allreduce_terms_of_the_toy_over_two_devices():
    per_token, per_pass = allreduce_terms(TOY, Layout(tp=2, link=LINK, link_efficiency=0.5))
    # 2 layers x 2 all-reduces; each token adds 8 x 2 bytes; a ring of 2 moves 2(1)/2 of them
    # at 0.5 GB/s, and takes 2 steps of 1 us.
    assert per_token == pytest.approx(4 * 1.0 * 16 / 0.5e9, rel=1e-12)
    assert per_pass == pytest.approx(4 * 2 * 1e-6, rel=1e-12)
    assert allreduce_terms(TOY, Layout()) == (0.0, 0.0)


def test_quantised_matrices_include_the_shared_experts(repo):
    """The toy with one MoE layer of 4 experts (2 a token) and 1 shared, each 3 x 8 x 2 = 48
    parameters: 2 x 192 attention + 384 dense MLP + (4 + 1) x 48 experts = 1008 quantised, and
    2 x (384 + 384 + (2 + 1) x 48) = 1824 FLOPs a token through them (the router stays 16-bit).
    DeepSeek-V3 in fp8: its 58 shared experts (2,554,331,136 parameters) at one byte too."""
    moe = dataclasses.replace(
        TOY,
        num_experts=4,
        experts_per_token=2,
        expert_intermediate_size=2,
        moe_layers=1,
        shared_experts=1,
    )
    assert quantised_params(moe) == 1008
    assert quantised_flops_per_token(moe) == 1824
    assert weight_bytes(moe, Layout(weights="fp8"), 2) == 1008 + 2 * (moe.param_count() - 1008)
    deepseek = load_shape(repo / "profiles" / "models" / "deepseek-v3.json")
    quantised = 61 * DEEPSEEK_ATTENTION + 3 * DEEPSEEK_DENSE + 58 * (256 + 1) * DEEPSEEK_EXPERT
    assert quantised_params(deepseek) == quantised
    fp8 = weight_bytes(deepseek, Layout(weights="fp8"), 2)
    assert fp8 == quantised + 2 * (deepseek_v3(256) - quantised)
    assert 58 * DEEPSEEK_EXPERT == 2_554_331_136  # what was left at two bytes


def test_precision_bytes_per_parameter_and_per_token():
    # Layers' matrices: 2 x (192 + 384) = 1152 parameters; the rest (embedding, LM head, norms)
    # stays in 16 bits.
    assert quantised_params(TOY) == 1152
    assert weight_bytes(TOY, Layout(weights="fp8"), 2) == 1152 + 2 * (TOY_PARAMS - 1152)
    assert weight_bytes(TOY, Layout(weights="int4"), 2) == round(
        1152 * (0.5 + 2 / 128) + 2 * (TOY_PARAMS - 1152)
    )
    assert weight_bytes(TOY, Layout(weights="bfloat16"), 2) == 2 * TOY_PARAMS
    # K and V of 2 layers, 1 head of 4: 16 values per token.
    assert device_kv_bytes_per_token(TOY, Layout(kv_cache="fp8"), 2) == 16
    assert device_kv_bytes_per_token(TOY, Layout(), 2) == 32


def test_kv_heads_shard_or_replicate_over_devices():
    eight = dataclasses.replace(TOY, num_heads=8, num_kv_heads=4)
    assert device_kv_bytes_per_token(eight, Layout(tp=2), 2) == 2 * 2 * 2 * 4 * 2
    # Fewer KV heads than devices: each device keeps one (replicated), as vLLM does.
    assert device_kv_bytes_per_token(eight, Layout(tp=8), 2) == 2 * 2 * 1 * 4 * 2


def test_fp8_matmuls_run_at_the_fp8_peak_except_the_lm_head():
    # 2 x 1152 layer FLOPs at 2e12 x 0.5, the LM head's 2 x 800 at 1e12 x 0.5.
    assert matmul_s_per_token(TOY, HW, Layout(weights="fp8")) == pytest.approx(
        2304 / 1e12 + 1600 / 0.5e12, rel=1e-12
    )
    no_fp8 = HW.model_copy(update={"peak_flops_fp8": None})  # weight-only: bf16 compute
    assert matmul_s_per_token(TOY, no_fp8, Layout(weights="fp8")) == pytest.approx(
        3904 / 0.5e12, rel=1e-12
    )


def test_fp8_weights_on_the_a100_are_read_at_one_byte_and_multiplied_at_the_bf16_peak():
    """The shipped A100 file gives no FP8 peak (Ampere has no FP8 tensor cores): engines run
    FP8 checkpoints there as weight-only kernels (Marlin FP8), so the roofline halves the
    layers' weight read and keeps every matrix product at the bf16 peak, by hand on the toy
    shape: 1152 layer weights at 1 byte, the other 1640 parameters at 2."""
    a100 = load_hardware(REPO / "profiles" / "hardware" / "a100-sxm-80gb.yaml")
    assert a100.peak_flops_fp8 is None and a100.quantised_peak("fp8") is None
    bandwidth, peak = 2.039e12 * 0.8, 312e12 * 0.55
    fp8, bf16 = roofline_fit(TOY, a100, Layout(weights="fp8")), roofline_fit(TOY, a100)
    launch = 2 * 1e-5  # two layers at the file's 10 us
    assert fp8.fixed_s == pytest.approx((1152 + 2 * (TOY_PARAMS - 1152)) / bandwidth + launch)
    assert bf16.fixed_s == pytest.approx(2 * TOY_PARAMS / bandwidth + launch)
    assert fp8.per_batched_token_s == bf16.per_batched_token_s
    assert fp8.per_batched_token_s == pytest.approx(TOY.flops_per_token() / peak, rel=1e-12)


def test_tensor_parallel_fit_matches_hand_calculation():
    layout = Layout(tp=2, link=LINK, link_efficiency=0.5)
    fit = roofline_fit(TOY, HW, layout)
    memory_s = 2 * TOY_PARAMS / 2 / 0.8e9  # each device reads half the weights
    compute_s = TOY.flops_per_token() / 2 / 0.5e12
    allreduce_token_s, allreduce_pass_s = 4 * 16 / 0.5e9, 4 * 2e-6
    assert fit.fixed_s == pytest.approx(memory_s + 2e-6 + allreduce_pass_s, rel=1e-12)
    assert fit.per_batched_token_s == pytest.approx(compute_s + allreduce_token_s, rel=1e-12)
    assert fit.knee_tokens == pytest.approx(memory_s / (compute_s + allreduce_token_s))
    assert fit.per_kv_token_s == pytest.approx(32 / 0.8e9, rel=1e-12)  # 1 KV head: replicated
    assert fit.per_attention_pair_s == pytest.approx(64 / 2 / 0.5e12, rel=1e-12)


@pytest.mark.parametrize("tokens", [1, 4000])
def test_tensor_parallel_fit_is_exact_far_below_and_above_the_knee(tokens):
    """max(weights, compute) + all-reduces, against the fit, at one token and far past the
    knee (between, the hinge under-states by at most the all-reduce slope x the knee)."""
    layout = Layout(tp=2, link=LINK, link_efficiency=0.5)
    fit = roofline_fit(TOY, HW, layout)
    seconds = LatencyModel(Latency(fit=fit), "toy").pass_seconds([0], tokens)
    memory_s = 2 * TOY_PARAMS / 2 / 0.8e9
    compute_s = tokens * TOY.flops_per_token() / 2 / 0.5e12
    allreduce_s = 4 * ring_allreduce_s(tokens * 16, 2, LINK, 0.5)
    pairs = tokens * (tokens + 1) / 2
    expected = max(memory_s, compute_s) + allreduce_s + 2e-6 + pairs * 64 / 2 / 0.5e12
    tolerance = 0 if tokens > fit.knee_tokens else 4 * 16 / 0.5e9 * tokens
    assert seconds == pytest.approx(expected, rel=1e-9, abs=tolerance)


def test_shipped_tp4_profile_holds_a_quarter_per_device_and_prices_four(repo):
    loaded = load_profile(repo / "profiles" / H100_TP4)
    profile = loaded.profile
    shape = load_shape(repo / "profiles" / "models" / "llama3.1-70b.json")
    assert shape.param_count() == 70_553_706_496  # published with the weights
    assert profile.hardware.tensor_parallel_size == 4
    assert profile.hardware.price_per_hour_usd == 4 * 3.0
    assert profile.hardware.memory_bytes == 0.9 * 85.06e9  # one device's, as it reports it
    target, draft = profile.target, profile.drafters["llama3.2-1b"]
    assert target.weight_bytes == 2 * 70_553_706_496
    assert target.sharding.weight_bytes_per_device == 2 * 70_553_706_496 // 4
    # 80 layers x K and V x 8 KV heads / 4 devices x 128 x 2 bytes.
    assert target.sharding.kv_bytes_per_token_per_device == 80 * 2 * 2 * 128 * 2
    assert draft.sharding.tensor_parallel_size == 4  # vLLM's default: the target's
    assert draft.sharding.kv_bytes_per_token_per_device == 16 * 2 * 2 * 64 * 2
    # the engine holds 19.5 x 8,192 x 8,192 x 2 B of activations and 0.3 + 1.79 GiB outside torch
    reserved = engine_reservation_bytes(loaded, Engine())
    assert reserved == pytest.approx(2_617_245_696 + 2.09 * 2**30, rel=1e-12)
    free = 76.554e9 - 35_276_853_248 - 2_471_628_800 // 4 - reserved
    capacity = kv_capacity_tokens(loaded, "llama3.2-1b", True, Engine())
    assert capacity == int(free // (81920 + 8192)) == 397_259
    assert kv_capacity_tokens(loaded, None, False, Engine()) == int(
        (76.554e9 - 35_276_853_248 - reserved) // 81920
    )


def test_shipped_fp8_profile_stores_a_byte_per_layer_weight(repo):
    profile = load_profile(repo / "profiles" / H200_FP8).profile
    shape = load_shape(repo / "profiles" / "models" / "llama3.1-70b.json")
    quantised = quantised_params(shape)
    assert profile.target.weight_bytes == quantised + 2 * (shape.param_count() - quantised)
    assert profile.target.kv_bytes_per_token == 80 * 2 * 8 * 128  # one byte a value
    assert profile.target.precision.weights == "fp8"
    assert profile.hardware.tensor_parallel_size is None  # one device
    assert profile.hardware.price_per_hour_usd == 3.8


def test_draft_tp_one_holds_the_whole_drafter_on_one_device(repo, tmp_path, monkeypatch):
    from specsim.cli import main

    monkeypatch.chdir(repo)
    out = tmp_path / "p.yaml"
    argv = [
        *("profile", "roofline", "--hardware", "profiles/hardware/h100-sxm.yaml"),
        *("--target", "profiles/models/llama3.1-70b.json"),
        *("--drafter", "d=profiles/models/llama3.2-1b.json", "--tp", "4", "--draft-tp", "1"),
        *("--out", str(out)),
    ]
    assert main(argv) == 0
    loaded = load_profile(out)
    assert loaded.profile.hardware.price_per_hour_usd == 4 * 3.0  # the replica's four GPUs
    assert loaded.profile.provenance.device == "4 x NVIDIA H100 SXM5 80GB (tensor parallel)"
    draft = loaded.profile.drafters["d"]
    assert draft.sharding.tensor_parallel_size == 1
    assert draft.sharding.weight_bytes_per_device == draft.weight_bytes == 2_471_628_800
    free = 76.554e9 - 35_276_853_248 - 2_471_628_800 - engine_reservation_bytes(loaded, Engine())
    assert kv_capacity_tokens(loaded, "d", True, Engine()) == int(free // (81920 + 32768))
    # On one device the drafter's pass has no all-reduce: the single-device fit.
    shape = load_shape(repo / "profiles" / "models" / "llama3.2-1b.json")
    hw = load_hardware(repo / "profiles" / "hardware" / "h100-sxm.yaml")
    assert draft.latency.fit.fixed_s == pytest.approx(roofline_fit(shape, hw).fixed_s, rel=1e-5)


def test_a_scenario_asking_another_tp_than_the_profile_is_refused(repo):
    scenario = load_scenario(
        repo / "scenarios" / "chat-70b-tp4.yaml", ["engine.tensor_parallel_size=8"]
    )
    loaded = load_profile(scenario.resolve(scenario.profile))
    with pytest.raises(SpecsimError, match=r"engine\.tensor_parallel_size is 8") as caught:
        kv_capacity_tokens(loaded, None, False, scenario.engine)
    assert caught.value.key == "engine.tensor_parallel_size"
    assert "--tp 8" in caught.value.fix
    same = load_scenario(repo / "scenarios" / "chat-70b-tp4.yaml")
    assert kv_capacity_tokens(loaded, None, False, same.engine) > 0


def test_the_capacity_report_names_a_replicas_devices(repo):
    from types import SimpleNamespace

    from specsim.planning.capacity.capacity_report import replica_devices

    tp4 = SimpleNamespace(profile=load_profile(repo / "profiles" / H100_TP4))
    one = SimpleNamespace(profile=load_profile(repo / "profiles" / H200_FP8))
    assert replica_devices(tp4) == "4 devices (tensor parallel)"
    assert replica_devices(one) == "one device"


# -- expert parallelism ---------------------------------------------------------------------------

MIXTRAL = "profiles/models/mixtral-8x7b.json"


def _ep_layout(tp: int, expert_parallel: bool = True) -> Layout:
    hw = load_hardware("profiles/hardware/h100-sxm.yaml")
    return dataclasses.replace(
        hardware_layout(hw, tp, None, None, "h100"), expert_parallel=expert_parallel
    )


def test_expert_exchange_bytes_are_dispatch_combine_and_gather(repo):
    """Mixtral (hidden 4096, 2 experts a token) over 8 devices: per token, each device sends
    2 x 2 x 7/64 hidden states (dispatch and combine of its 1/8 of the tokens, 7/8 of the
    copies off-device) plus 7/8 of one (the all-gather), 8192 bytes each: 10,752 bytes."""
    from specsim.profiling.parallel import expert_exchange_bytes_per_token

    shape = load_shape(repo / MIXTRAL)
    assert expert_exchange_bytes_per_token(shape, 8) == pytest.approx(10_752, rel=1e-12)
    assert expert_exchange_bytes_per_token(shape, 1) == 0


def test_expert_parallel_traffic_of_mixtral_over_eight_h100s(repo):
    """NVLink 450 GB/s x 0.8 = 360 GB/s, 1 us a step, 32 layers, all MoE. Without EP: two
    ring all-reduces a layer, 2 x 7/8 x 8192 B / 360 GB/s = 39.82 ns a token each, 14 us a
    pass each: 2.5486 us a token and 896 us a pass. With EP: one all-reduce a layer (1.2743 us
    a token, 448 us a pass) and per MoE layer 10,752 B / 360 GB/s = 29.87 ns a token and three
    exchanges of 7 steps, 21 us a pass: 2.2300 us a token, 1.120 ms a pass."""
    shape = load_shape(repo / MIXTRAL)
    tp_token, tp_pass = allreduce_terms(shape, _ep_layout(8, expert_parallel=False))
    assert tp_token == pytest.approx(2 * 32 * 14 / 8 * 8192 / 360e9, rel=1e-12)
    assert tp_pass == pytest.approx(896e-6, rel=1e-12)
    ep_token, ep_pass = allreduce_terms(shape, _ep_layout(8))
    assert ep_token == pytest.approx(32 * (14 / 8 * 8192 + 10_752) / 360e9, rel=1e-12)
    assert ep_token == pytest.approx(2.2300444e-6, rel=1e-7)
    assert ep_pass == pytest.approx(32 * (14 + 21) * 1e-6, rel=1e-12)


def test_experts_are_dealt_out_whole_and_the_fullest_device_counts(repo):
    """Mixtral in bf16: 93,405,585,408 bytes, of which the experts 8 x 32 x 176,160,768
    parameters x 2 = 90,194,313,216. Over 8 devices EP holds one expert a layer, as TP's
    shard does; over 3 (a split the heads would refuse, here for the arithmetic) the fullest
    device holds ceil(8/3) = 3 experts a layer: 3,211,272,192 / 3 + 3 x 32 x 176,160,768 x 2
    = 34,893,291,520 bytes, not a third of the whole (31,135,195,136)."""
    from specsim.profiling.parallel import device_weight_bytes

    shape = load_shape(repo / MIXTRAL)
    assert weight_bytes(shape, Layout(), 2) == 93_405_585_408
    assert shape.moe_layers * shape.num_experts * shape.expert_params * 2 == 90_194_313_216
    assert device_weight_bytes(shape, _ep_layout(8), 2) == 93_405_585_408 // 8
    assert device_weight_bytes(shape, _ep_layout(3), 2) == 34_893_291_520
    assert device_weight_bytes(shape, _ep_layout(3, expert_parallel=False), 2) == 31_135_195_136


def test_expert_parallelism_needs_experts_devices_and_no_more_devices_than_experts(repo):
    from specsim.profiling.parallel import DoesNotFit, check_expert_parallel

    mixtral = load_shape(repo / MIXTRAL)
    with pytest.raises(SpecsimError, match="no experts"):
        check_expert_parallel(TOY, _ep_layout(2), "x")
    with pytest.raises(SpecsimError, match="over one device"):
        check_expert_parallel(mixtral, _ep_layout(1), "x")
    with pytest.raises(DoesNotFit, match="8 experts, fewer than the 16 devices"):
        check_expert_parallel(mixtral, _ep_layout(16), "x")
    check_expert_parallel(mixtral, _ep_layout(8), "x")


def test_profile_ep_writes_the_exchange_into_the_fit(tmp_path, repo):
    """``profile roofline --tp 8 --ep`` on Mixtral: the compute slope differs from TP's by
    the traffic difference above, and the notes say how the experts are placed."""
    from specsim.cli import main

    base = ["profile", "roofline", "--hardware", str(repo / "profiles/hardware/h100-sxm.yaml")]
    base += ["--target", str(repo / MIXTRAL), "--tp", "8"]
    assert main([*base, "--out", str(tmp_path / "tp.yaml")]) == 0
    assert main([*base, "--enable-expert-parallel", "--out", str(tmp_path / "ep.yaml")]) == 0
    tp, ep = (load_profile(tmp_path / f"{n}.yaml").profile for n in ("tp", "ep"))
    difference = 32 * (14 / 8 * 8192 - 10_752) / 360e9
    slope = tp.target.latency.fit.per_batched_token_s - ep.target.latency.fit.per_batched_token_s
    assert slope == pytest.approx(difference, rel=1e-4)  # the profile rounds to 6 digits
    assert "Expert parallelism over 8 devices" in ep.provenance.notes
    assert "Expert parallelism" not in tp.provenance.notes


# -- a stated roofline scaling to another TP (engine.tensor_parallel_scaling) ---------------------

NVLINK = {"bandwidth_bytes_per_s": 450e9, "latency_s": 1e-6, "efficiency": 0.8}


def _fit_terms(spec):
    fit = spec.latency.fit
    return [fit.fixed_s, fit.per_batched_token_s, fit.knee_tokens, fit.per_kv_token_s]


@pytest.mark.parametrize(("source_tp", "tp"), [(4, 8), (4, 2), (1, 2)])
def test_a_scaled_roofline_is_the_roofline_written_for_that_tp(tmp_path, repo, source_tp, tp):
    """Scaling the 70B's TP4 roofline to TP8 (or TP2, or a TP1 8B to TP2) over the H100's
    NVLink gives the profile `profile roofline --tp N` writes from the model and hardware
    files, term for term, to the 6 significant digits profiles are written in."""
    from specsim.cli import main
    from specsim.profile.tp_scaling import TensorParallelScaling, scale_profile

    target = "llama3.1-70b" if source_tp > 1 else "llama3.1-8b"
    base = ["profile", "roofline", "--hardware", str(repo / "profiles/hardware/h100-sxm.yaml")]
    base += ["--target", str(repo / f"profiles/models/{target}.json")]
    base += ["--drafter", f"llama3.2-1b={repo}/profiles/models/llama3.2-1b.json"]
    paths = {}
    for n in (source_tp, tp):
        paths[n] = tmp_path / f"tp{n}.yaml"
        assert main([*base, "--tp", str(n), "--out", str(paths[n])]) == 0
    written = load_profile(paths[tp]).profile
    scaled = scale_profile(
        load_profile(paths[source_tp]).profile, tp, TensorParallelScaling(**NVLINK), "test"
    )
    for name in ("target", "llama3.2-1b"):
        ours = scaled.target if name == "target" else scaled.drafters[name]
        theirs = written.target if name == "target" else written.drafters[name]
        assert _fit_terms(ours) == pytest.approx(_fit_terms(theirs), rel=2e-5)
        assert ours.sharding.tensor_parallel_size == tp
        assert ours.sharding.weight_bytes_per_device == pytest.approx(
            theirs.sharding.weight_bytes_per_device, abs=1
        )
        assert ours.device_kv_bytes_per_token == theirs.device_kv_bytes_per_token
    assert scaled.hardware.devices == tp
    assert scaled.hardware.price_per_hour_usd == pytest.approx(3.0 * tp)
    assert scaled.provenance.notes.endswith(f"price x {tp}/{source_tp}.")
    assert "derived" in scaled.provenance.device


def test_scaling_refuses_a_measured_profile(repo):
    from specsim.profile.tp_scaling import TensorParallelScaling, scale_profile

    measured = load_profile(repo / "profiles/builtin-cpu.yaml").profile
    with pytest.raises(SpecsimError, match="how its passes scale from 1 to 2 devices"):
        scale_profile(measured, 2, TensorParallelScaling(**NVLINK), "p.yaml")


def test_a_scenario_opts_in_and_the_run_is_flagged(tmp_path, repo):
    """Without the key a TP the profile does not describe is the one-line error; with it the
    run simulates TP8 from the TP4 roofline and its summary says so."""
    from specsim.simulation.run import run_simulation

    path = repo / "scenarios/chat-70b-tp4.yaml"
    short = ["workload.duration_s=20", "engine.tensor_parallel_size=8"]
    with pytest.raises(SpecsimError, match=r"engine\.tensor_parallel_scaling"):
        run_simulation(load_scenario(path, short))
    scaled = [*short, *(f"engine.tensor_parallel_scaling.{k}={v}" for k, v in NVLINK.items())]
    summary = run_simulation(load_scenario(path, scaled)).summary
    assert summary["profile_derived"].startswith("Derived (engine.tensor_parallel_scaling)")
    assert "from 4 to 8 device(s)" in summary["profile_derived"]
    own = run_simulation(load_scenario(path, ["workload.duration_s=20"])).summary
    assert "profile_derived" not in own
    # The closed-form estimate (plan window's screen) reads the scaled profile too.
    from specsim.estimate import estimate_point

    estimate_point(str(path), scaled)


def test_scaling_refuses_a_replicated_latent_cache(repo):
    """DeepSeek-V3's latent KV cache is whole on every device (35,136 bytes a token on each of
    8): dividing it over the devices, as the scaling does for KV heads, would be wrong."""
    from specsim.profile.tp_scaling import TensorParallelScaling, scale_profile

    path = repo / "profiles/deepseek-v3_mtp_8xh200-fp8-roofline.yaml"
    deepseek = load_profile(path).profile
    assert deepseek.target.sharding.kv_bytes_per_token_per_device == 35_136
    with pytest.raises(SpecsimError, match="not divided over the devices"):
        scale_profile(deepseek, 4, TensorParallelScaling(**NVLINK), str(path))


def test_scaling_refuses_expert_parallelism(repo):
    from specsim.profile.tp_scaling import TensorParallelScaling, scale_profile

    profile = load_profile(repo / "profiles/llama3.1-70b_llama3.2-1b_4xh100-tp4-roofline.yaml")
    target = profile.profile.target
    sharding = target.sharding.model_copy(update={"expert_parallel_size": 4})
    expert = profile.profile.model_copy(
        update={"target": target.model_copy(update={"sharding": sharding})}
    )
    with pytest.raises(SpecsimError, match="expert parallelism"):
        scale_profile(expert, 8, TensorParallelScaling(**NVLINK), "p.yaml")
