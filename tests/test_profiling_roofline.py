"""Roofline estimates and the shapes behind them, against hand calculations."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from specsim.cli import main
from specsim.hardware import Efficiency, HardwareSpec
from specsim.profile import LatencyModel, load_profile
from specsim.profiling.flops import ModelShape, pass_cost
from specsim.profiling.model_configs import load_shape
from specsim.profiling.roofline import roofline_fit

# A shape small enough to count by hand.
TOY = ModelShape(
    name="toy",
    vocab_size=100,
    num_layers=2,
    hidden_size=8,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    tie_word_embeddings=False,
)
# q 8x8=64, k and v 8x4=32 each, o 64 -> 192 attention; MLP 3x8x16=384; 2 norms of 8.
TOY_PER_LAYER = 192 + 384 + 16
TOY_PARAMS = 2 * TOY_PER_LAYER + 100 * 8 * 2 + 8  # layers + embedding + LM head + final norm


def test_toy_shape_counts_match_hand_count():
    assert TOY.param_count() == TOY_PARAMS == 2792
    # Matmul params: layers' matrices plus the LM head, no embedding gather, no norms.
    assert TOY.flops_per_token() == 2 * (2 * (192 + 384) + 800)
    # K and V of 2 layers, 1 KV head of size 4, 2 bytes each.
    assert TOY.kv_bytes_per_token(2) == 2 * 2 * 1 * 4 * 2
    # QK^T and AV: 2 products x 2 FLOPs x 2 heads x 4 dims x 2 layers.
    assert TOY.attention_flops_per_pair() == 64


@pytest.mark.parametrize(
    "name, params",
    # Exact parameter counts published with the models' weights.
    [
        ("llama3.1-8b", 8_030_261_248),
        ("llama3.2-1b", 1_235_814_400),
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen2.5-0.5b", 494_032_768),
    ],
)
def test_shipped_model_configs_give_published_parameter_counts(repo, name, params):
    assert load_shape(repo / "profiles" / "models" / f"{name}.json").param_count() == params


def test_pass_cost_counts_causal_pairs():
    cost = pass_cost(TOY, batch=3, context=10, new_tokens=4, dtype_bytes=2)
    # Each sequence's 4 new tokens see 11, 12, 13, 14 keys = 50 pairs = 4 x (10 + 5/2).
    pairs = 3 * 50
    assert cost.flops == 12 * TOY.flops_per_token() + pairs * 64
    assert cost.kv_read_bytes == 3 * 10 * 32
    assert cost.kv_write_bytes == 12 * 32
    assert cost.weight_bytes == 2 * TOY_PARAMS


HW = HardwareSpec(
    name="hand",
    memory_bytes=1e9,
    peak_flops=1e12,
    memory_bandwidth_bytes_per_s=1e9,
    price_per_hour_usd=1.0,
    efficiency=Efficiency(mfu=0.5, bandwidth=0.8, launch_s_per_layer=1e-6),
)


def test_roofline_fit_matches_hand_calculation():
    fit = roofline_fit(TOY, HW)
    memory_s = 2 * TOY_PARAMS / 0.8e9  # weights over effective bandwidth
    token_s = TOY.flops_per_token() / 0.5e12
    assert fit.fixed_s == pytest.approx(memory_s + 2e-6, rel=1e-12)
    assert fit.per_batched_token_s == pytest.approx(token_s, rel=1e-12)
    assert fit.knee_tokens == pytest.approx(memory_s / token_s, rel=1e-12)
    assert fit.per_kv_token_s == pytest.approx(32 / 0.8e9, rel=1e-12)
    assert fit.per_attention_pair_s == pytest.approx(64 / 0.5e12, rel=1e-12)


@pytest.mark.parametrize(
    "batch, context, new", [(1, 0, 1), (4, 100, 5), (64, 3000, 9), (1, 0, 4096)]
)
def test_roofline_latency_is_max_of_memory_and_compute_plus_attention(batch, context, new):
    fit = roofline_fit(TOY, HW)
    from specsim.profile.latency import Latency

    seconds = LatencyModel(Latency(fit=fit), "toy").pass_seconds([context] * batch, new)
    cost = pass_cost(TOY, batch, context, new, 2)
    weights_s = cost.weight_bytes / 0.8e9
    matmul_s = batch * new * TOY.flops_per_token() / 0.5e12
    attention_s = cost.kv_read_bytes / 0.8e9 + (
        cost.flops - batch * new * TOY.flops_per_token()
    ) / (0.5e12)
    expected = max(weights_s, matmul_s) + 2e-6 + attention_s
    assert seconds == pytest.approx(expected, rel=1e-9)


def _shipped_roofline_profiles(repo):
    return sorted((repo / "profiles").glob("*-roofline.yaml"))


def test_shipped_roofline_profiles_load_and_answer(repo):
    paths = _shipped_roofline_profiles(repo)
    assert len(paths) >= 3
    for path in paths:
        loaded = load_profile(path)
        assert loaded.profile.provenance.source == "roofline"
        assert "not a measurement" in loaded.profile.provenance.notes
        decode = loaded.latency_model("target").pass_seconds([1024] * 8, 1)
        verify = loaded.latency_model("target").pass_seconds([1024] * 8, 5)
        assert 1e-3 < decode <= verify < 0.1
        kinds = {spec.kind for spec in loaded.profile.drafters.values()}
        assert "ngram" in kinds and kinds - {"ngram"} in ({"draft_model"}, {"heads"})
        for drafter in loaded.profile.drafters:
            verifiers = {a.verifier for a in loaded.profile.acceptance if a.drafter == drafter}
            # EAGLE-3 has no published typical-acceptance figure, so no entry for it.
            assert {"rejection", "greedy"} <= verifiers <= {"rejection", "greedy", "typical"}
            entry = loaded.acceptance(drafter, "rejection", 1.0)
            assert entry.source == "assumed"
            assert sorted(entry.mean_acceptance_length) == list(range(1, 9))


def test_shipped_roofline_profiles_are_reproducible_from_their_command(repo, tmp_path, monkeypatch):
    """Regenerating each shipped profile from its recorded command gives the same file (so the
    shipped files cannot drift from the code), apart from the date."""
    monkeypatch.chdir(repo)
    for path in _shipped_roofline_profiles(repo):
        shipped = yaml.safe_load(path.read_text())
        argv = shlex.split(shipped["provenance"]["command"])[1:]
        out = tmp_path / path.name
        argv[argv.index("--out") + 1] = str(out)
        assert main(argv) == 0
        fresh = yaml.safe_load(out.read_text())
        for data in (shipped, fresh):
            data["provenance"].pop("date")
            data["provenance"].pop("command")
            data["provenance"]["software"].pop("python")
            data["provenance"]["software"].pop("numpy")
        assert fresh == shipped, path.name


def _roofline_argv(repo, out, **changes):
    args = {
        "--hardware": str(repo / "profiles/hardware/h100-sxm.yaml"),
        "--target": str(repo / "profiles/models/llama3.1-8b.json"),
        "--acceptance-from": str(repo / "profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml"),
    }
    args.update(changes)
    argv = ["profile", "roofline", "--out", str(out)]
    for key, value in args.items():
        if value is not None:
            argv += [key, value]
    argv += ["--drafter", f"llama3.2-1b={repo / 'profiles/models/llama3.2-1b.json'}"]
    argv += ["--drafter", "ngram"]
    return argv


def test_roofline_cli_json_summary(repo, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main([*_roofline_argv(repo, out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["drafters"]["ngram"] == {"kind": "ngram", "step_s": 1e-4}
    assert summary["target_decode_s"] == pytest.approx(
        load_profile(out).latency_model("target").pass_seconds([1024], 1)
    )


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"--hardware": "missing.yaml"}, ["missing.yaml", "not found"]),
        ({"--target": "missing.json"}, ["missing.json", "not found"]),
        ({"--hardware": None}, ["--hardware"]),
        ({"bad_hw": "name: x\nmemory_bytes: 1e9\npeak_flops: 1e12\n"}, ["memory_bandwidth"]),
        (
            {
                "bad_hw": "name: x\nmemory_bytes: 8e10\npeak_flops: 1e15\n"
                "memory_bandwidth_bytes_per_s: 3e12\nprice_per_hour_usd: 1\nspeed: 3\n"
            },
            ["speed", "remove the key"],
        ),
        ({"small_hw": True}, ["do not fit", "memory_bytes"]),
        (
            {"bad_cfg": '{"model_type": "llama", "hidden_size": 64}'},
            ["num_attention_heads", "missing"],
        ),
        ({"bad_cfg": '{"hidden_size": 64}'}, ["model_type", "no model_type", "mixtral"]),
        ({"bad_cfg": '{"model_type": "gpt2"}'}, ["model_type", "'gpt2' cannot be sized"]),
        ({"bad_cfg": '{"model_type": "gemma3"}'}, ["model_type", "its text_config"]),
        (
            {
                "bad_acc": "acceptance:\n- drafter: eagle\n  verifier: greedy\n  temperature: 0\n"
                "  per_position: [0.5]\n"
            },
            ["eagle", "acceptance[0].drafter"],
        ),
        (
            {
                "bad_acc": "acceptance:\n- drafter: ngram\n  verifier: greedy\n  temperature: 0\n"
                "  per_position: [1.5]\n"
            },
            ["per_position", "smaller"],
        ),
    ],
)
def test_roofline_bad_input_is_one_line_exit_2_and_writes_nothing(
    repo, tmp_path, capsys, change, words
):
    change = dict(change)
    if "bad_hw" in change:
        change = {"--hardware": _write(tmp_path / "hw.yaml", change["bad_hw"])}
    if change.pop("small_hw", False):
        text = (repo / "profiles/hardware/h100-sxm.yaml").read_text()
        change["--hardware"] = _write(tmp_path / "hw.yaml", text.replace("85.06e+9", "16.0e+9"))
    if "bad_cfg" in change:
        change = {"--target": _write(tmp_path / "config.json", change["bad_cfg"])}
    if "bad_acc" in change:
        change = {"--acceptance-from": _write(tmp_path / "acc.yaml", change["bad_acc"])}
    out = tmp_path / "out" / "p.yaml"
    try:
        code = main(_roofline_argv(repo, out, **change))
    except SystemExit as exc:  # a usage error: a required option missing
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert not out.exists()


def test_roofline_output_is_byte_identical_for_the_same_inputs(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # pins the provenance date
    first, second = tmp_path / "a" / "p.yaml", tmp_path / "b" / "p.yaml"
    assert main(_roofline_argv(repo, first)) == 0
    assert main(_roofline_argv(repo, second)) == 0
    text = first.read_text()
    assert "date: '2026-01-01'" in text
    assert text.replace(str(first), "") == second.read_text().replace(str(second), "")


def test_out_may_be_a_folder(repo, tmp_path):
    folder = tmp_path / "runs"
    assert main([*_roofline_argv(repo, folder), "--name", "h100"]) == 0
    assert load_profile(folder / "h100.yaml").name == "h100"


def test_mean_acceptance_lengths_follow_from_chain_rates():
    from specsim.profiling.writer import chain_mean_acceptance_lengths, complete_acceptance

    lengths = chain_mean_acceptance_lengths([0.5, 0.4], proposal_rate=1.0, max_k=3)
    # 1 + 0.5; + 0.5 x 0.4; + 0.5 x 0.4 x 0.4 (the last rate repeats)
    assert lengths == pytest.approx({1: 1.5, 2: 1.7, 3: 1.78})
    sparse = chain_mean_acceptance_lengths([0.5], proposal_rate=0.2, max_k=2)
    assert sparse == pytest.approx({1: 1.1, 2: 1.15})
    measured = {"per_position": [0.5], "mean_acceptance_length": {4: 2.0}}
    assert complete_acceptance(measured)["mean_acceptance_length"] == {4: 2.0}


def test_roofline_and_calibration_work_without_torch(repo, tmp_path):
    """Estimating and calibrating need no torch (the base install has none)."""
    import subprocess
    import sys

    out = tmp_path / "p.yaml"
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from specsim.cli import main\n"
        f"argv = {_roofline_argv(repo, out)!r}\n"
        "assert main(argv) == 0\n"
        "assert main(['profile', 'calibrate', "
        f"{str(repo / 'profiles/examples/vllm-spec-decode-metrics.txt')!r}, '--into', "
        f"{str(out)!r}, '--drafter', 'ngram', '--verifier', 'greedy', '--temperature', '0', "
        "'--label', 'model_name=meta-llama/Llama-3.1-8B-Instruct', "
        f"'--out', {str(tmp_path / 'c.yaml')!r}]) == 0\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.yaml").exists()
