"""EAGLE and EAGLE-3 heads in the roofline, and FP4 weight formats, against hand counts."""

from __future__ import annotations

import json

import pytest

from specsim.cli import main
from specsim.costs import StepCosts, formula
from specsim.hardware import load_hardware
from specsim.profile import load_profile
from specsim.profiling.heads import load_head
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import WEIGHT_BYTES, Layout, quantised_flops_per_token
from specsim.profiling.roofline import head_latency, matmul_s_per_token, read_shape
from specsim.profiling.specs import parse_drafter

H = 4096  # Llama-3.1-8B's hidden size; heads 32 x 128, 8 KV heads, MLP 14336
VOCAB, DRAFT_VOCAB = 128_256, 32_000
ATTENTION = H * H + 2 * H * 8 * 128 + H * H  # q, k, v, o of a plain layer
MLP = 3 * H * 14_336
# EAGLE-3: the first layer's q, k, v read [embedding; hidden] (2 h wide); three norms in the
# layer (input, hidden state, post-attention) and the final one; fc 3 h x h; own LM head.
EAGLE3_PARAMS = (ATTENTION + H * (H + 2 * 8 * 128)) + MLP + 3 * H + H + 3 * H * H + DRAFT_VOCAB * H
EAGLE3_MATMUL = ATTENTION + H * (H + 2 * 8 * 128) + MLP + 3 * H * H + DRAFT_VOCAB * H
# EAGLE: a plain layer without its input norm, no final norm, fc 2 h x h, the target's LM head.
EAGLE_PARAMS = ATTENTION + MLP + H + 2 * H * H
EAGLE_MATMUL = ATTENTION + MLP + 2 * H * H + VOCAB * H


@pytest.fixture
def target(repo):
    return load_shape(repo / "profiles/models/llama3.1-8b.json")


def test_eagle3_head_counts_match_hand_count(repo, target):
    head = load_head("eagle3", repo / "profiles/models/eagle3-llama3.1-8b.json", target)
    shape = head.shape
    assert head.taps == 3
    assert shape.param_count() == EAGLE3_PARAMS == 424_689_664
    assert shape.flops_per_token() == 2 * EAGLE3_MATMUL
    # One layer's K and V: 8 heads x 128 x 2 bytes each.
    assert shape.kv_bytes_per_token(2) == 2 * 8 * 128 * 2 == 4096
    assert shape.attention_flops_per_pair() == 4 * 32 * 128
    # A pass reads what the head holds (its own LM head included), not the target's embedding.
    assert read_shape(shape).weight_bytes(2) == 2 * EAGLE3_PARAMS


def test_a_speculators_config_sizes_the_same_head(repo, target, tmp_path):
    """RedHatAI's heads keep the layer under transformer_layer_config; norm_before_fc adds an
    RMSNorm over the fc's 3 h input."""
    flat = json.loads((repo / "profiles/models/eagle3-llama3.1-8b.json").read_text())
    nested = {
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_fc": True,
        "transformer_layer_config": {k: v for k, v in flat.items() if k != "draft_vocab_size"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(nested))
    head = load_head("eagle3", path, target)
    assert head.shape.param_count() == EAGLE3_PARAMS + 3 * H
    assert head.shape.flops_per_token() == 2 * EAGLE3_MATMUL


def test_eagle_head_reads_the_targets_lm_head(repo, target):
    head = load_head("eagle", repo / "profiles/models/eagle-llama3.1-8b.json", target)
    assert head.taps == 1
    assert head.shape.param_count() == EAGLE_PARAMS == 251_662_336
    assert head.shape.flops_per_token() == 2 * EAGLE_MATMUL
    assert read_shape(head.shape).weight_bytes(2) == 2 * (EAGLE_PARAMS + VOCAB * H)


def test_head_latency_prices_weights_taps_and_embedding_row(repo, target):
    hw = load_hardware(repo / "profiles/hardware/h100-sxm.yaml")
    head = load_head("eagle3", repo / "profiles/models/eagle3-llama3.1-8b.json", target)
    fit = head_latency(head, hw, Layout()).fit
    bandwidth = 3.35e12 * 0.8
    assert fit.fixed_s == pytest.approx(2 * EAGLE3_PARAMS / bandwidth + 1e-5, rel=1e-12)
    # the H100 file's MFU, 0.38 (fitted: docs/notes/2026-12-02-efficiency-priors.md)
    assert fit.per_batched_token_s == pytest.approx(2 * EAGLE3_MATMUL / (989.4e12 * 0.38))
    # Three taps of 4096 16-bit values, written by the target and read by the fc, and the
    # drafted token's embedding row.
    assert fit.per_sequence_s == pytest.approx((2 * 3 * H * 2 + H * 2) / bandwidth, rel=1e-12)
    assert fit.per_kv_token_s == pytest.approx(4096 / bandwidth, rel=1e-12)


def test_fp4_bytes_per_weight_follow_from_the_block_scales():
    # NVFP4: 16 E2M1 values (4 bits each) share one FP8 scale; MXFP4: 32 share one E8M0.
    assert WEIGHT_BYTES["nvfp4"] == (16 * 4 + 8) / 16 / 8 == 0.5625
    assert WEIGHT_BYTES["mxfp4"] == (32 * 4 + 8) / 32 / 8 == 0.53125


@pytest.mark.parametrize(
    "hardware, weights, fp4_peak",
    [
        ("b200", "nvfp4", 9.0e15),
        ("b200", "mxfp4", 9.0e15),
        ("gb300", "nvfp4", 15.0e15),
        ("mi355x", "mxfp4", 10.066e15),
        ("mi355x", "nvfp4", None),  # CDNA 4 runs MX formats only
        ("h100-sxm", "nvfp4", None),  # no FP4 tensor cores: weight-only
        ("b200", "int4", None),  # AWQ / GPTQ: dequantised to 16 bits everywhere
    ],
)
def test_fp4_matmuls_run_at_the_fp4_peak_only_where_the_device_has_one(
    repo, target, hardware, weights, fp4_peak
):
    hw = load_hardware(repo / f"profiles/hardware/{hardware}.yaml")
    seconds = matmul_s_per_token(target, hw, Layout(weights=weights))
    mfu = hw.efficiency.mfu  # the file's, whichever peak it applies to
    bf16 = hw.peak_flops * mfu
    if fp4_peak is None:
        assert seconds == pytest.approx(target.flops_per_token() / bf16, rel=1e-12)
        return
    quantised = quantised_flops_per_token(target)
    rest = target.flops_per_token() - quantised
    assert seconds == pytest.approx(quantised / (fp4_peak * mfu) + rest / bf16, rel=1e-12)


def test_drafter_argument_names_a_head_and_its_config():
    arg = parse_drafter("eagle3:profiles/models/eagle3-llama3.1-8b.json")
    assert (arg.name, arg.head, arg.spec) == (
        "eagle3-llama3.1-8b",
        "eagle3",
        "profiles/models/eagle3-llama3.1-8b.json",
    )
    assert not (arg.is_mtp or arg.is_ngram)


def _argv(repo, out, *extra, drafter=None):
    return [
        "profile",
        "roofline",
        "--hardware",
        str(repo / "profiles/hardware/b200.yaml"),
        "--target",
        str(repo / "profiles/models/llama3.1-8b.json"),
        "--drafter",
        drafter or f"e3=eagle3:{repo / 'profiles/models/eagle3-llama3.1-8b.json'}",
        "--out",
        str(out),
        *extra,
    ]


def test_cli_writes_a_heads_profile_the_cost_model_drafts_with(repo, tmp_path):
    out = tmp_path / "p.yaml"
    assert main(_argv(repo, out, "--weights-dtype", "nvfp4", "--kv-dtype", "fp8")) == 0
    loaded = load_profile(out)
    spec = loaded.drafter("e3")
    assert (spec.kind, spec.passes) == ("heads", "autoregressive")
    assert spec.weight_bytes == 2 * EAGLE3_PARAMS  # the head stays in 16 bits
    assert spec.kv_bytes_per_token == 2 * 8 * 128  # one layer in the fp8 KV cache
    assert (spec.precision.weights, spec.precision.kv_cache) == ("bfloat16", "fp8")
    assert loaded.profile.target.precision.weights == "nvfp4"
    cost = StepCosts(loaded, "e3")
    # One pass per drafted depth, none at k = 0 and none over prompts.
    assert [formula.pass_count(cost.terms, k) for k in (0, 1, 3)] == [0, 1, 3]
    assert cost.draft_prefill_s(4, 1000, 0, 5e5) == 0.0
    one_pass = loaded.latency_model("e3").seconds_from_totals(4, 4, 4096, 4100)
    # k = 1 is one pass over each row's drafted token.
    assert cost.draft_s(4, 1, 4096) == pytest.approx(one_pass, rel=1e-12)
    assert "eagle3 head" in loaded.profile.provenance.notes


def test_emit_writes_the_shipped_head_as_vllms_eagle3_with_its_checkpoint(repo, monkeypatch):
    from types import SimpleNamespace

    from specsim.planning.emit import emit
    from specsim.serving import sglang_config, vllm_config

    monkeypatch.setattr(emit, "unconditional_rates", lambda choice, k: (0.7,) * k)
    profile = load_profile(repo / "profiles/llama3.1-8b_eagle3_h100-roofline.yaml")
    scenario = SimpleNamespace(
        engine=SimpleNamespace(max_batch=8, max_batched_tokens=2048, block_size=None),
        workload=SimpleNamespace(prefix=None),
        speculation=SimpleNamespace(
            verifier="greedy",
            temperature=0.0,
            policy="fixed",
            acceptance_gate=None,
            max_concurrency=None,
        ),
    )
    choice = SimpleNamespace(
        profile=profile, drafter="eagle3", k=3, rows=[], static_k=None, tree=None,
        scenario=scenario, unexpressed=[], policy=None,
    )  # fmt: skip
    ours = emit.setting_for(choice, SimpleNamespace(models=()))
    assert ours.speculation.model.path == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    config = vllm_config.speculative_config(ours)
    assert (config["method"], config["model"]) == ("eagle3", ours.speculation.model.path)
    assert sglang_config.algorithm(ours.speculation) == "EAGLE3"


def _config(repo, tmp_path, **changes):
    config = json.loads((repo / "profiles/models/eagle3-llama3.1-8b.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    path = tmp_path / "head.json"
    path.write_text(json.dumps(config))
    return f"e3=eagle3:{path}"


@pytest.mark.parametrize(
    "extra, changes, words",
    [
        (("--weights-dtype", "fp3"), None, ["--weights-dtype", "invalid choice"]),
        ((), {"hidden_size": None}, ["hidden_size", "missing model dimension"]),
        ((), {"vocab_size": 32000}, ["vocab_size", "target"]),
        ((), {"draft_vocab_size": 0}, ["draft_vocab_size", "whole number"]),
        ((), {"num_aux_hidden_states": 99}, ["num_aux_hidden_states", "1 to 32"]),
        ((), {"model_type": "gpt2"}, ["model_type", "cannot be sized"]),
        ((), "e3=eagle3:", ["names no config"]),
    ],
)
def test_bad_head_or_format_is_one_line_exit_2(repo, tmp_path, capsys, extra, changes, words):
    drafter = changes if isinstance(changes, str) else None
    if isinstance(changes, dict):
        drafter = _config(repo, tmp_path, **changes)
    out = tmp_path / "out.yaml"
    try:
        code = main(_argv(repo, out, *extra, drafter=drafter))
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert not out.exists()


def test_hardware_file_refuses_an_unknown_fp4_format(repo, tmp_path, capsys):
    text = (repo / "profiles/hardware/b200.yaml").read_text()
    bad = tmp_path / "hw.yaml"
    bad.write_text(text.replace("  mxfp4: 9.0e+15", "  fp3: 9.0e+15"))
    argv = _argv(repo, tmp_path / "o.yaml")
    argv[argv.index("--hardware") + 1] = str(bad)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "peak_flops_fp4" in err


def test_profile_measure_refuses_a_head(repo, tmp_path, capsys):
    argv = ["profile", "measure", "--target", "tiny", "--drafter", "e3=eagle3:x.json"]
    assert main([*argv, "--out", str(tmp_path / "m.yaml")]) == 2
    assert "profile roofline" in capsys.readouterr().err


@pytest.mark.parametrize(
    "profile, drafter, tp",
    [
        ("llama3.1-8b_eagle3_h100", "eagle3", 1),
        ("llama3.3-70b_eagle3_4xh100-tp4", "eagle3", 4),
        ("deepseek-v3_mtp_2xgb300-nvfp4", "mtp", 2),
    ],
)
def test_shipped_eagle3_and_fp4_profiles_simulate(repo, tmp_path, profile, drafter, tp):
    sets = {
        "profile": str(repo / f"profiles/{profile}-roofline.yaml"),
        "speculation.drafter": drafter,
        "speculation.k": "3",
        "speculation.verifier": "greedy",
        "speculation.temperature": "0",
        "engine.tensor_parallel_size": str(tp),
        "workload.duration_s": "20",
    }
    argv = ["simulate", str(repo / "scenarios/poisson.yaml"), "--out", str(tmp_path / "run")]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["mean_acceptance_length"] > 1.5
