"""A prompt chunk's query-key pairs at a cost of their own (``LatencyFit.per_prefill_pair_s``):
vLLM runs latent attention decompressed for prefill and absorbed for decode
(docs/notes/2026-12-03-moe-priors.md, "2026-12-03, fifth session")."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.calibration.terms import apply, terms_for
from specsim.costs import NO_ROWS, PassTotals, StepCosts
from specsim.hardware import load_hardware
from specsim.profile import load_profile
from specsim.profile.latency import LATENCY_BLOCK, Latency, LatencyFit, LatencyModel, latency_s
from specsim.profile.schema import ModelSpec
from specsim.profile.tp_scaling import TensorParallelScaling, scaled_fit
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import hardware_layout
from specsim.profiling.roofline import roofline_fit

DATA = Path(__file__).parent / "data"
FIT = {
    "fixed_s": 0.011,
    "per_sequence_s": 3.1e-5,
    "per_batched_token_s": 2.3e-6,
    "knee_tokens": 64,
    "per_kv_token_s": 7.0e-9,
    "per_attention_pair_s": 1.3e-10,
}
DECODE, PREFILL = 1.3e-10, 0.4e-10  # the two pair costs where they differ
DRAFT_PREFILL = 0.2e-10


def _profile(folder: Path, prefill: float | None, draft_prefill: float | None) -> Path:
    """The simulator's test profile with every target term non-zero and a draft model."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    target = {**FIT}
    draft = {**FIT, "fixed_s": 0.002, "per_attention_pair_s": 0.5e-10}
    if prefill is not None:
        target["per_prefill_pair_s"] = prefill
    if draft_prefill is not None:
        draft["per_prefill_pair_s"] = draft_prefill
    profile["target"]["latency"]["fit"] = target
    profile["drafters"]["c05"]["latency"]["fit"] = draft
    profile["overhead"] = {"per_step_s": 3.0e-4, "per_prefill_s": 4.0e-4}
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_prompt_chunks_pay_their_own_pair_cost_interpreted_and_compiled(tmp_path):
    """An iteration of 9 decoding rows and 2 prompt chunks: the target's pass prices the rows'
    pairs at per_attention_pair_s and the chunks' at per_prefill_pair_s, the draft model's pass
    over the chunks at its own prefill cost; the compiled kernel charges the same, to the bit."""
    from specsim.simulation.compiled import kernel_module

    costs = StepCosts(load_profile(_profile(tmp_path, PREFILL, DRAFT_PREFILL)), "c05")
    decode = PassTotals(9, 27.0, 9 * 1500.0, 27.0 * 1500.0)
    chunk = PassTotals(2, 3000.0, 1000.0, 4.0e6)
    target, draft, _ = costs.iteration_parts(2, decode, chunk)
    past_knee = decode.tokens + chunk.tokens - FIT["knee_tokens"]
    want = (
        FIT["fixed_s"]
        + FIT["per_sequence_s"] * 11
        + FIT["per_batched_token_s"] * past_knee
        + FIT["per_kv_token_s"] * (decode.kv + chunk.kv)
        + DECODE * decode.pairs
        + PREFILL * chunk.pairs
    )
    assert target == pytest.approx(want, rel=1e-14)
    alone = costs.draft_s(9, 2, decode.kv)
    prefill_draft = draft - alone
    own = 0.002 + FIT["per_sequence_s"] * 2 + FIT["per_batched_token_s"] * (3000.0 - 64)
    own += FIT["per_kv_token_s"] * chunk.kv + DRAFT_PREFILL * chunk.pairs
    assert prefill_draft == pytest.approx(own, rel=1e-12)
    kernel = kernel_module("compiled_step_kernel")
    rows = (decode.rows, decode.tokens, decode.kv, decode.pairs)
    chunks = (chunk.rows, chunk.tokens, chunk.kv, chunk.pairs)
    got = kernel.mixed_seconds(np.array(costs.terms), 2, *rows, *chunks)
    assert got == costs.iteration_s(2, decode, chunk)


def test_a_fit_without_a_prefill_cost_prices_as_one_product_to_the_bit():
    """Absent (or equal to the decode cost), the chunks' pairs join the rows' before the one
    product, as every profile written before the term was priced: 2,000 random passes."""
    rng = np.random.default_rng(5)
    for _ in range(2000):
        fit = LatencyFit(
            fixed_s=float(rng.uniform(1e-4, 1e-2)),
            per_sequence_s=float(rng.uniform(0, 1e-4)),
            per_batched_token_s=float(rng.uniform(0, 1e-5)),
            knee_tokens=float(rng.integers(0, 300)),
            per_kv_token_s=float(rng.uniform(0, 1e-8)),
            per_attention_pair_s=float(rng.uniform(1e-12, 1e-9)),
        )
        block = LatencyModel(Latency(fit=fit), "m").block
        assert len(block) == LATENCY_BLOCK
        batch, tokens = int(rng.integers(1, 256)), float(rng.integers(1, 8192))
        kv, pairs, chunk_pairs = (float(x) for x in rng.integers(0, 10**9, size=3))
        over = max(0.0, tokens - fit.knee_tokens)
        before = (
            fit.fixed_s
            + fit.per_sequence_s * batch
            + fit.per_batched_token_s * over
            + fit.per_kv_token_s * kv
            + fit.per_attention_pair_s * (pairs + chunk_pairs)
        )
        assert latency_s(block, 0, batch, tokens, kv, pairs, chunk_pairs) == before


def test_the_roofline_prices_latent_prefill_pairs_decompressed_and_dense_ones_alike(repo):
    """DeepSeek-V3 over 8 H200s: decode pairs in the absorbed form, 128 heads x (4 x 512 +
    2 x 64) FLOPs a layer, prompt chunks' decompressed, 128 x 2 (192 + 128), both over 8
    devices at the bf16 peak x MFU (989.4 TFLOP/s x 0.38); a dense model writes no prefill
    cost (its fit is the one it was)."""
    hw = load_hardware(repo / "profiles" / "hardware" / "h200-sxm.yaml")
    shape = load_shape(repo / "profiles" / "models" / "deepseek-v3.json")
    fit = roofline_fit(shape, hw, hardware_layout(hw, 8, "fp8", None, "h200-sxm.yaml"))
    peak = 989.4e12 * 0.38
    assert fit.per_attention_pair_s == pytest.approx(61 * 128 * 2176 / 8 / peak, rel=1e-12)
    assert fit.per_prefill_pair_s == pytest.approx(61 * 128 * 640 / 8 / peak, rel=1e-12)
    dense = roofline_fit(load_shape(repo / "profiles" / "models" / "llama3.1-8b.json"), hw)
    assert dense.per_prefill_pair_s is None


@pytest.mark.parametrize("chunked", [False, True])
def test_the_estimate_prices_a_prompt_at_the_prefill_cost(tmp_path, chunked, repo):
    """``Passes.prompt_s`` against ``StepCosts.iteration_s`` on a profile whose two pair costs
    differ (as test_estimate does with one)."""
    from specsim.estimate.passes import Passes
    from specsim.scenario import load_scenario

    scenario = load_scenario(repo / "scenarios" / "poisson.yaml", [])
    engine = scenario.engine.model_copy(update={"chunked_prefill": chunked})
    costs = StepCosts(load_profile(_profile(tmp_path, PREFILL, DRAFT_PREFILL)), "c05")
    decode = PassTotals(8, 40.0, 8 * 1500.0, 40.0 * 1500.0)
    prompts = np.array([300.0, 2000.0])
    got = Passes(costs, engine).prompt_s(prompts, decode.tokens if chunked else 0.0)
    for prompt, seconds in zip(prompts.tolist(), got.tolist(), strict=True):
        chunk = PassTotals(1, prompt, 0.0, prompt * (prompt + 1.0) / 2.0)
        if chunked:
            want = costs.iteration_s(3, decode, chunk) - costs.iteration_s(3, decode)
        else:
            want = costs.iteration_s(0, NO_ROWS, chunk)
        assert seconds == pytest.approx(want, rel=1e-9)


def test_tensor_parallel_scaling_shrinks_the_prefill_cost_with_the_decode_cost():
    fit = LatencyFit(
        fixed_s=0.01, per_batched_token_s=1e-5, knee_tokens=500, per_attention_pair_s=DECODE,
        per_prefill_pair_s=PREFILL,
    )  # fmt: skip
    spec = ModelSpec(kind="target", layers=32, hidden_size=4096, latency={"fit": fit})
    link = TensorParallelScaling(bandwidth_bytes_per_s=4.5e11, latency_s=1e-6)
    scaled = scaled_fit(fit, spec, 2, 8, link, "p.yaml")
    assert scaled.per_prefill_pair_s == pytest.approx(PREFILL / 4, rel=1e-15)
    assert scaled.per_attention_pair_s == pytest.approx(DECODE / 4, rel=1e-15)
    plain = scaled_fit(fit.model_copy(update={"per_prefill_pair_s": None}), spec, 2, 8, link, "p")
    assert plain.per_prefill_pair_s is None


def test_the_attention_factor_keeps_the_priors_prefill_ratio_and_says_so():
    """One factor on both pair costs (the runs cannot part them: the note's fifth session)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_runs

    prior = load_profile(bench_runs.PRIOR).profile
    fit = prior.target.latency.fit.model_copy(update={"per_prefill_pair_s": 0.5e-10})
    latency = prior.target.latency.model_copy(update={"fit": fit})
    prior = prior.model_copy(
        update={"target": prior.target.model_copy(update={"latency": latency})}
    )
    terms = terms_for(prior, None)
    attention = next(t for t in terms if t.name == "target.attention")
    assert "prior's ratio 0.25" in attention.description
    theta = [math.log(3.0) if t is attention else t.theta0 for t in terms]
    after = apply(prior, terms, theta).target.latency.fit
    assert after.per_attention_pair_s == pytest.approx(3 * 2.0e-10, rel=1e-15)
    assert after.per_prefill_pair_s == pytest.approx(3 * 0.5e-10, rel=1e-15)


def test_a_calibration_recovers_the_attention_factor_of_a_prior_with_both_pair_costs(tmp_path):
    """Recovery: the calibration prior with decode pairs at 2e-8 s and prompt chunks' at a
    quarter of that (latent attention's ratio, about 0.29 on DeepSeek-V3); runs simulated with
    decode x 1.4, prefill x 0.7 and attention x 2 (both pair costs), two of them over prompts
    of 4-12 k tokens, are fitted back (measured: decode -0.5 %, prefill +6.1 %, attention
    -3.7 %), within test_from_bench's tolerances (2 % and 8 %; 8 % for attention). Both pair
    costs come back doubled, at the prior's ratio."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_runs

    data = load_profile(bench_runs.PRIOR).profile.model_dump(mode="json", exclude_none=True)
    fit = data["target"]["latency"]["fit"]
    fit.update(per_attention_pair_s=2.0e-8, per_prefill_pair_s=5.0e-9)
    truth = {k: v for k, v in bench_runs.TRUTH.items() if not k.startswith("drafters.")}
    truth["target.attention"] = 2.0
    long = (4096, 12288)
    cases = (
        *bench_runs.LOADS,
        bench_runs.Case("long-r2", 2.0, prompt=long),
        bench_runs.Case("long-c8", math.inf, 8, prompt=long),
    )
    calibration = bench_runs.calibrate_on(tmp_path, data, truth, cases)
    report = calibration.report
    assert report["undetermined"] == []
    errors = bench_runs.log_errors(report, truth)
    assert abs(errors["target.decode"]) <= 0.02
    assert abs(errors["target.prefill"]) <= 0.08
    assert abs(errors["target.attention"]) <= 0.08
    fitted = calibration.profile.target.latency.fit
    factor = {t["name"]: t["value"] for t in report["terms"]}["target.attention"]
    assert fitted.per_attention_pair_s == pytest.approx(2.0e-8 * factor, rel=1e-5)
    assert fitted.per_prefill_pair_s == pytest.approx(5.0e-9 * factor, rel=1e-5)
