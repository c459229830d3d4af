"""The shipped DeepSeek-V3 MTP profile end to end: it simulates, plans and emits MTP settings."""

from __future__ import annotations

import json

import pytest
import yaml

from specsim.cli import main

PROFILE = "deepseek-v3_mtp_8xh200-fp8-roofline.yaml"


@pytest.fixture
def scenario(repo, tmp_path):
    """20 s of Poisson chat traffic on one 8 x H200 replica drafting with the MTP module."""
    data = {
        "name": "ds-mtp",
        "seed": 0,
        "profile": str(repo / "profiles" / PROFILE),
        "workload": {
            "kind": "poisson",
            "rate": 2.0,
            "duration_s": 20,
            "prompt": {"dist": "lognormal", "median": 1000, "sigma": 0.8, "low": 16, "high": 8192},
            "output": {"dist": "lognormal", "median": 130, "sigma": 0.9, "low": 4, "high": 1024},
        },
        "engine": {"max_batch": 64, "max_batched_tokens": 8192, "tensor_parallel_size": 8},
        "speculation": {"drafter": "mtp", "k": 2, "verifier": "rejection", "temperature": 1.0},
        "fleet": {"replicas": 1},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    }
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_mtp_profile_simulates_with_its_drafter_accepting(repo, scenario, tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(scenario), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 0
    assert 1.0 < summary["mean_acceptance_length"] <= 3.0  # k = 2
    assert summary["flops_drafter"] > 0
    # A device's KV cache: what the target's and the module's weight shards and the engine's
    # reservation leave (8,192 tokens x hidden 7,168: 19.5 x 8,192 x 7,168 x 2 B of
    # activations; 0.3 + 1.79 GiB outside torch at TP 8), over both caches' bytes per token
    # (the module's one latent layer included).
    profile = yaml.safe_load((repo / "profiles" / PROFILE).read_text())
    target, mtp = profile["target"]["sharding"], profile["drafters"]["mtp"]["sharding"]
    free = profile["hardware"]["memory_bytes"] - target["weight_bytes_per_device"]
    free -= mtp["weight_bytes_per_device"] + 19.5 * 8192 * 7168 * 2 + 2.09 * 2**30
    per_token = target["kv_bytes_per_token_per_device"] + mtp["kv_bytes_per_token_per_device"]
    assert summary["kv_capacity_tokens"] == int(free // per_token)


def test_plan_window_emits_each_engines_mtp_setting(scenario, tmp_path):
    out = tmp_path / "plan"
    argv = ["plan", "window", str(scenario), "--k", "1..2", "--loads", "1", "--no-progress"]
    assert main([*argv, "--emit", "vllm,sglang,trtllm", "--out", str(out)]) == 0
    engine = out / "engine"
    config = json.loads((engine / "vllm.json").read_text())
    assert config["method"] == "mtp" and "model" not in config
    sglang = (engine / "sglang.args").read_text()
    assert "--speculative-algorithm EAGLE\n" in sglang
    assert "--speculative-draft-model-path deepseek-ai/DeepSeek-V3\n" in sglang
    trtllm = yaml.safe_load((engine / "trtllm.yaml").read_text())["speculative_config"]
    assert trtllm["decoding_type"] == "MTP" and set(trtllm) == {"decoding_type", "max_draft_len"}
    assert config["num_speculative_tokens"] == trtllm["max_draft_len"]


def test_a_model_path_for_the_mtp_drafter_is_refused(scenario, tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["plan", "window", str(scenario), "--k", "1", "--loads", "1", "--emit", "vllm"]
    assert main([*argv, "--model", "mtp=org/x", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--model" in err and "MTP" in err and len(err.splitlines()) == 1
