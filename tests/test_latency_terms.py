"""The latency fit's optional terms: padding to captured CUDA-graph sizes and a mixture of
experts' routed-expert read (``LatencyFit.graph_sizes`` / ``LatencyFit.experts``).

- each term by hand: the staircase's steps and eager above the largest size; the union of
  experts E (1 - (1 - k/E)^N): k experts at N = 1, every expert for large N;
- the roofline: vLLM's default sizes, the MoE fit's weight read equal to the bytes the
  tokens' experts hold, the shipped files' fits unchanged without the options;
- the reference (``LatencyModel``, ``StepCosts``), the estimate's array form and the compiled
  kernel (``compiled_step_kernel._latency``) charge them bit for bit, and whole runs on the
  fast path (compiled loops) equal the per-iteration reference;
- the TP scaling and the calibration's factors carry the experts' read along, and a
  calibration recovers a known deployment's factors on a prior with both terms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.calibration.terms import _scaled
from specsim.costs import PassTotals, StepCosts
from specsim.errors import SpecsimError
from specsim.hardware import DTYPE_BYTES, load_hardware
from specsim.profile import LatencyModel, LoadedProfile, Profile, load_profile
from specsim.profile.latency import Latency, LatencyFit, fit_seconds
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import Layout
from specsim.profiling.roofline import roofline_fit, vllm_graph_sizes
from specsim.simulation.compiled import kernel_module

REPO = Path(__file__).resolve().parent.parent
ROOFLINE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
H100 = REPO / "profiles" / "hardware" / "h100-sxm.yaml"
QWEN3_30B = REPO / "profiles" / "models" / "qwen3-30b-a3b.json"


def model(**fit) -> LatencyModel:
    return LatencyModel(Latency(fit=LatencyFit(**fit)), "m")


def test_a_pass_pays_its_matmuls_on_the_captured_size_it_is_padded_to():
    """1 ms fixed, 10 us a token past a knee of 0, graphs of 1, 2, 4, 8 and 16 tokens: a pass
    of 3 tokens pays 4, of 5 to 8 pays 8, of 9 pays 16; above 16 it runs eager, unpadded."""
    m = model(fixed_s=1e-3, per_batched_token_s=1e-5, graph_sizes=[1, 2, 4, 8, 16])
    paid = {n: (m.seconds_from_totals(1, n, 0.0, 0.0) - 1e-3) / 1e-5 for n in range(1, 21)}
    expected = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 17, 20: 20}
    for n, tokens in expected.items():
        assert paid[n] == pytest.approx(tokens, rel=1e-12), n
    # a staircase: flat between captured sizes, a step at each
    assert m.seconds_from_totals(1, 5, 0, 0) == m.seconds_from_totals(1, 8, 0, 0)
    assert m.seconds_from_totals(1, 9, 0, 0) > m.seconds_from_totals(1, 8, 0, 0)


def test_padding_below_the_knee_costs_nothing_and_past_it_counts_the_padded_tokens():
    """Knee at 10 tokens: a 7-token pass padded to 8 stays flat; a 12-token pass padded to 16
    pays 6 tokens past the knee, not 2."""
    m = model(fixed_s=2e-3, per_batched_token_s=1e-5, knee_tokens=10.0, graph_sizes=[8, 16])
    assert m.seconds_from_totals(1, 7, 0, 0) == 2e-3
    assert m.seconds_from_totals(1, 12, 0, 0) == pytest.approx(2e-3 + 6e-5, rel=1e-12)


def test_without_graph_sizes_or_experts_the_formula_is_todays():
    m = model(fixed_s=1e-3, per_sequence_s=2e-5, per_batched_token_s=1e-5, knee_tokens=4.0)
    by_hand = 1e-3 + 2e-5 * 3 + 1e-5 * (9 - 4)
    assert m.seconds_from_totals(3, 9, 0.0, 0.0) == by_hand
    assert m.graph_sizes is None and m.experts is None


@pytest.mark.parametrize(("tokens", "share"), [(1, 2 / 8), (2, 1 - 0.75**2), (3, 1 - 0.75**3)])
def test_a_pass_reads_the_union_of_the_experts_its_tokens_pick(tokens, share):
    """8 experts, top-2, 10 ms to read them all: one token reads 2 of 8; N tokens a share
    1 - (6/8)^N (each expert missed by every token with probability 6/8)."""
    m = model(fixed_s=1e-3, experts={"weights_s": 0.01, "experts": 8, "experts_per_token": 2})
    assert m.seconds_from_totals(1, tokens, 0, 0) == pytest.approx(1e-3 + 0.01 * share, rel=1e-12)


def test_many_tokens_read_every_expert_and_top_e_reads_all_at_once():
    m = model(fixed_s=1e-3, experts={"weights_s": 0.01, "experts": 128, "experts_per_token": 8})
    assert m.seconds_from_totals(64, 4096, 0, 0) == pytest.approx(1e-3 + 0.01, rel=1e-12)
    every = model(fixed_s=0.0, experts={"weights_s": 0.01, "experts": 4, "experts_per_token": 4})
    assert every.seconds_from_totals(1, 1, 0, 0) == 0.01


@pytest.mark.parametrize(
    ("fit", "words"),
    [
        ({"graph_sizes": [1, 4, 4]}, "ascend"),
        ({"graph_sizes": [8, 2]}, "ascend"),
        ({"experts": {"weights_s": 0.01, "experts": 4, "experts_per_token": 8}}, "above"),
    ],
)
def test_bad_terms_are_refused_with_a_fix(fit, words):
    with pytest.raises(ValueError, match=words):
        LatencyFit(fixed_s=1e-3, **fit)


def test_vllm_default_capture_sizes():
    """vLLM 0.33: 1, 2, 4, multiples of 8 below 256, multiples of 16 from 256 to the ceiling
    (512 by default: 51 sizes), and the ceiling itself where it is off the grid."""
    sizes = vllm_graph_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512]
    assert len(sizes) == 3 + 31 + 17
    assert 248 in sizes and 252 not in sizes and 264 not in sizes and 272 in sizes
    assert vllm_graph_sizes(100)[-3:] == [88, 96, 100]
    assert vllm_graph_sizes(3) == [1, 2, 3]


def test_the_roofline_reads_the_experts_its_tokens_route_to():
    """Qwen3-30B-A3B on one H100: the fit's weight read of a pass over N tokens is the bytes
    ``ModelShape.weight_bytes_read(N)`` counts (the non-expert weights and the union of the
    routed experts), at the effective bandwidth; the knee meets the non-expert read only."""
    shape, hw = load_shape(QWEN3_30B), load_hardware(H100)
    fit = roofline_fit(shape, hw)
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.efficiency.bandwidth
    launch = shape.num_layers * hw.efficiency.launch_s_per_layer
    m = LatencyModel(Latency(fit=fit), "qwen3-30b-a3b")
    assert fit.experts.experts == 128 and fit.experts.experts_per_token == 8
    for tokens in (1, 4, 16):  # below the knee: the weight read alone
        read = (m.seconds_from_totals(1, tokens, 0, 0) - launch) * bandwidth
        assert read == pytest.approx(shape.weight_bytes_read(tokens, 2), rel=1e-9)
    experts = shape.weight_bytes(2) - shape.weight_bytes_read(0, 2)
    dense = shape.weight_bytes(2) / bandwidth - experts / bandwidth
    assert fit.knee_tokens * fit.per_batched_token_s == pytest.approx(dense, rel=1e-12)


def test_past_the_knee_a_pass_pays_the_routed_experts_read_on_top_of_its_compute():
    """Qwen3-30B-A3B on one H100, a pass of 2048 tokens (every expert read): by hand, 48 MoE
    layers x 128 experts x 3 x 2048 x 768 weights x 2 bytes = 57.98 GB at 0.8 x 3.35 TB/s =
    21.64 ms, added to the launches and the 2048 tokens' compute (the roofline's max() would
    hide it under the compute: 2048 x 16.2 us = 33.1 ms is past the whole 22.8 ms read)."""
    shape, hw = load_shape(QWEN3_30B), load_hardware(H100)
    fit = roofline_fit(shape, hw)
    m = LatencyModel(Latency(fit=fit), "qwen3-30b-a3b")
    launch = shape.num_layers * hw.efficiency.launch_s_per_layer
    compute = 2048 * fit.per_batched_token_s
    assert compute > shape.weight_bytes(2) / (3.35e12 * 0.8)  # compute-bound by the old form
    read = 48 * 128 * 3 * 2048 * 768 * 2 / (3.35e12 * 0.8)
    assert read == pytest.approx(21.64e-3, abs=1e-5)
    assert m.seconds_from_totals(1, 2048, 0, 0) - launch == pytest.approx(compute + read, rel=1e-6)


def test_the_roofline_of_a_dense_model_has_no_experts_and_no_padding_unless_asked():
    shape, hw = load_shape(REPO / "profiles/models/llama3.1-8b.json"), load_hardware(H100)
    plain = roofline_fit(shape, hw)
    assert plain.experts is None and plain.graph_sizes is None
    graphed = roofline_fit(shape, hw, Layout(), vllm_graph_sizes(512))
    assert graphed.graph_sizes == vllm_graph_sizes(512)
    assert graphed.model_copy(update={"graph_sizes": None}) == plain


def test_expert_parallel_devices_read_their_own_whole_experts():
    """EP over 8 devices: 16 of the 128 experts whole on each, all 48 layers."""
    from specsim.profiling.roofline import device_expert_bytes

    shape = load_shape(QWEN3_30B)
    layout = Layout(tp=8, expert_parallel=True)
    expected = 48 * 16 * shape.expert_params * 2
    assert device_expert_bytes(shape, layout, DTYPE_BYTES["bfloat16"]) == expected
    assert device_expert_bytes(shape, Layout(tp=8), 2) == pytest.approx(expected, rel=1e-12)


def _with_terms(loaded: LoadedProfile) -> LoadedProfile:
    """The 8B roofline with graphs on both models and an experts term on each (a made-up
    mixture, so that every term is exercised in one vector)."""
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
    target = data["target"]["latency"]["fit"]
    target["graph_sizes"] = vllm_graph_sizes(512)
    target["experts"] = {"weights_s": 4e-3, "experts": 128, "experts_per_token": 8}
    draft = data["drafters"]["llama3.2-1b"]["latency"]["fit"]
    draft["graph_sizes"] = [1, 2, 4, 8, 16, 24, 32]
    draft["experts"] = {"weights_s": 5e-4, "experts": 64, "experts_per_token": 6}
    return LoadedProfile(Profile.model_validate(data), loaded.path)


@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram"])
def test_the_kernel_charges_the_terms_as_the_reference_bit_for_bit(drafter):
    """Decode-only and mixed iterations of random totals (seed 5), across the graph sizes'
    steps and above the largest: ``cost_parts`` and ``mixed_seconds`` equal
    ``StepCosts.iteration_s``."""
    costs = StepCosts(_with_terms(load_profile(ROOFLINE)), drafter)
    vector = np.array(costs.terms)
    kernel = kernel_module("compiled_step_kernel")
    rng = np.random.default_rng(5)
    for k in (0, 1, 3) if drafter else (0,):
        rows = rng.integers(1, 300, 60).astype(np.float64)
        tokens = rows * (k + 1.0) - rng.integers(0, 2, 60) * rows
        kv = rows * rng.integers(16, 9000, 60)
        pairs = kv * (k + 1) + rng.integers(0, 1000, 60)
        out = np.empty(3)
        for i in range(60):
            kernel.cost_parts(vector, k, rows[i], tokens[i], kv[i], pairs[i], out)
            decode = PassTotals(int(rows[i]), float(tokens[i]), float(kv[i]), float(pairs[i]))
            assert out[0] == costs.iteration_s(k, decode)
            p_tokens = float(rng.integers(1, 700))
            prompt = PassTotals(2, p_tokens, 100.0, p_tokens * 60.0)
            mixed = kernel.mixed_seconds(
                vector, k, *(float(x) for x in (rows[i], tokens[i], kv[i], pairs[i])),
                2, p_tokens, 100.0, p_tokens * 60.0,
            )  # fmt: skip
            assert mixed == costs.iteration_s(k, decode, prompt)


def test_the_estimates_array_form_equals_the_reference():
    fit = _with_terms(load_profile(ROOFLINE)).profile.target.latency.fit
    m = LatencyModel(Latency(fit=fit), "target")
    tokens = np.array([1.0, 3.0, 7.0, 250.0, 257.0, 512.0, 513.0, 4096.0])
    rows = np.array([1.0, 3.0, 7.0, 50.0, 257.0, 128.0, 9.0, 2.0])
    kv = rows * 1000.0
    pairs = tokens * 1000.0
    arrays = fit_seconds(fit, rows, tokens, kv, pairs)
    for i in range(tokens.size):
        expected = m.seconds_from_totals(rows[i], tokens[i], kv[i], pairs[i])
        assert arrays[i] == pytest.approx(expected, rel=1e-14)


def test_the_decode_factor_scales_the_experts_read():
    fit = LatencyFit(
        fixed_s=1e-3,
        per_batched_token_s=1e-5,
        experts={"weights_s": 0.01, "experts": 8, "experts_per_token": 2},
    )
    scaled = _scaled(fit, ("fixed_s", "per_sequence_s", "per_kv_token_s"), 2.0)
    assert scaled.experts.weights_s == 0.02 and scaled.fixed_s == 2e-3
    assert _scaled(fit, ("per_batched_token_s",), 2.0).experts.weights_s == 0.01


def test_a_scaled_moe_roofline_is_the_roofline_written_for_that_tp(tmp_path):
    """Qwen3-30B-A3B over 2 H100s scaled to 4 equals the roofline written for 4, experts
    term and all (to the 6 significant digits profiles are written in)."""
    from specsim.cli import main
    from specsim.profile.tp_scaling import TensorParallelScaling, scale_profile

    base = ["profile", "roofline", "--hardware", str(H100), "--target", str(QWEN3_30B)]
    paths = {n: tmp_path / f"tp{n}.yaml" for n in (2, 4)}
    for n, path in paths.items():
        assert main([*base, "--tp", str(n), "--out", str(path)]) == 0
    link = load_hardware(H100).nvlink
    scaled = scale_profile(
        load_profile(paths[2]).profile,
        4,
        TensorParallelScaling(
            bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s
        ),
        "test",
    )
    ours = scaled.target.latency.fit
    theirs = load_profile(paths[4]).profile.target.latency.fit
    for name in ("per_batched_token_s", "knee_tokens", "per_kv_token_s"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name), rel=2e-5), name
    # fixed_s is the whole read (knee x slope, each rounded to 6 digits) less the experts':
    # a difference of rounded terms, exact to their rounding (~1e-6 of the 11 ms read)
    assert ours.fixed_s == pytest.approx(theirs.fixed_s, abs=5e-8)
    assert ours.experts.weights_s == pytest.approx(theirs.experts.weights_s, rel=2e-5)


def test_profile_roofline_cuda_graphs_writes_the_sizes_on_every_model(tmp_path):
    from specsim.cli import main

    out = tmp_path / "p.yaml"
    argv = ["profile", "roofline", "--hardware", str(H100), "--cuda-graphs", "512", "--out"]
    argv += [str(out), "--target", str(REPO / "profiles/models/llama3.1-8b.json")]
    argv += ["--drafter", f"d={REPO / 'profiles/models/llama3.2-1b.json'}"]
    assert main(argv) == 0
    profile = load_profile(out).profile
    assert profile.target.latency.fit.graph_sizes == vllm_graph_sizes(512)
    assert profile.drafters["d"].latency.fit.graph_sizes == vllm_graph_sizes(512)
    assert "CUDA graphs" in profile.provenance.notes


def test_cuda_graphs_of_zero_tokens_is_refused(tmp_path, capsys):
    from specsim.cli import main

    argv = ["profile", "roofline", "--hardware", str(H100), "--cuda-graphs", "0"]
    argv += ["--target", str(QWEN3_30B), "--out", str(tmp_path / "p.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "--cuda-graphs" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


def test_a_profile_with_descending_graph_sizes_is_one_line_refusal(tmp_path):
    data = load_profile(ROOFLINE).profile.model_dump(mode="json", exclude_none=True)
    data["target"]["latency"]["fit"]["graph_sizes"] = [4, 2]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as refused:
        load_profile(path)
    assert "graph_sizes" in str(refused.value) and "\n" not in str(refused.value)


def test_a_calibration_recovers_the_factors_of_a_prior_with_both_terms(tmp_path):
    """Recovery: the calibration prior made a mixture of experts (5 of its 8 ms are 64 experts'
    read, top 4) with vLLM's graphs; runs simulated on it with decode x 1.4 and prefill x 0.7
    (``bench_runs``: the truth; its loads and one of long prompts) are fitted back onto it
    (measured: decode -0.1 %, prefill +0.9 %). The decode factor carries the
    experts' read: both factors come back within test_from_bench's tolerances (2 % and 8 %)."""
    import math
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_runs

    data = load_profile(bench_runs.PRIOR).profile.model_dump(mode="json", exclude_none=True)
    fit = data["target"]["latency"]["fit"]
    fit["fixed_s"] = 0.003
    fit["experts"] = {"weights_s": 0.005, "experts": 64, "experts_per_token": 4}
    fit["graph_sizes"] = vllm_graph_sizes(512)
    # Long prompts tell the prefill from the engine's cost per admitted request (fitted for
    # vLLM's runs), as in test_request_cost.
    cases = (*bench_runs.LOADS, bench_runs.Case("long-r5", 5.0, prompt=(256, 1024)))
    calibration = bench_runs.calibrate_on(tmp_path, data, cases=cases)
    report = calibration.report
    values = {t["name"]: t["value"] for t in report["terms"]}
    assert abs(math.log(values["target.decode"] / 1.4)) <= 0.02
    assert abs(math.log(values["target.prefill"] / 0.7)) <= 0.08
    fitted = calibration.profile.target.latency.fit
    assert fitted.experts.weights_s == pytest.approx(0.005 * values["target.decode"], rel=1e-5)
    assert fitted.graph_sizes == vllm_graph_sizes(512)


@pytest.fixture(scope="module")
def graphed_moe(tmp_path_factory) -> Path:
    """``test_sim_compiled_step``'s every-term profile with graphs and an experts term on the
    target and the draft model (a folder a scenario can point at)."""
    import sys

    import yaml

    sys.path.insert(0, str(Path(__file__).parent))
    from test_sim_compiled_step import DATA, DRAFTERS, FIT

    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    terms = {"graph_sizes": [1, 2, 4, 8, 16, 32, 64]}
    experts = {"weights_s": 0.004, "experts": 32, "experts_per_token": 2}
    target = {**FIT, "fixed_s": 0.007, "knee_tokens": 4, **terms, "experts": experts}
    profile["target"]["latency"]["fit"] = target
    model = dict(DRAFTERS["model"])
    model["latency"] = {"fit": {**FIT, **terms, "experts": dict(experts, weights_s=4e-4)}}
    profile["drafters"]["model"] = model
    rates = [0.8, 0.7, 0.6, 0.5, 0.4]
    profile["acceptance"].append(
        {"drafter": "model", "verifier": "rejection", "temperature": 1.0, "per_position": rates}
    )
    folder = tmp_path_factory.mktemp("graphed-moe")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


@pytest.mark.parametrize("speculation", [{}, {"drafter": "model", "k": 3}])
def test_the_fast_path_charges_the_terms_as_the_reference_does(
    speculation, graphed_moe, tmp_path, monkeypatch
):
    """Whole runs, fast path (the compiled serving loop) against the per-iteration reference:
    every record, summary and replica statistic equal."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_sim_compiled_step import loop_iterations
    from test_sim_identity import assert_identical, make

    scenario = make({"speculation": speculation, "workload": {"rate": 4.0}}, graphed_moe)
    engine = scenario.engine.model_copy(update={"jitter": False})
    scenario = scenario.model_copy(update={"engine": engine})
    assert loop_iterations(scenario, monkeypatch)[0] > 0  # the compiled loop did run
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("drafter", [None, "llama3.2-1b"])
def test_the_estimates_prompt_price_is_what_the_engine_charges_with_the_terms(chunked, drafter):
    """``test_estimate``'s check on the profile with graphs and experts: a prompt's chunk
    beside 8 rows verifying 43 positions (padded to 48 alone, and past it with the chunk) costs
    the iteration with it less the one without; alone, its own iteration."""
    from specsim.costs import NO_ROWS
    from specsim.estimate.passes import Passes
    from specsim.scenario import load_scenario

    scenario = load_scenario(REPO / "scenarios" / "poisson.yaml", [])
    engine = scenario.engine.model_copy(update={"chunked_prefill": chunked})
    costs = StepCosts(_with_terms(load_profile(ROOFLINE)), drafter)
    passes = Passes(costs, engine)
    prompts = np.array([5.0, 300.0, 2000.0])
    decode = PassTotals(8, 43.0, 8 * 1500.0, 43.0 * 1500.0)
    got = passes.prompt_s(prompts, decode.tokens if chunked else 0.0)
    for prompt, seconds in zip(prompts.tolist(), got.tolist(), strict=True):
        chunk = PassTotals(1, prompt, 0.0, prompt * (prompt + 1.0) / 2.0)
        if chunked:
            want = costs.iteration_s(3, decode, chunk) - costs.iteration_s(3, decode)
        else:
            want = costs.iteration_s(0, NO_ROWS, chunk)
        assert seconds == pytest.approx(want, rel=1e-9)
