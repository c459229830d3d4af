"""Parallel drafters in the roofline (``--drafter NAME=dflash:CONFIG`` / ``p_eagle:CONFIG:K``):
sized from their configs against hand counts, written as kind block, and simulated."""

from __future__ import annotations

import json

import pytest
import yaml

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profiling.heads import load_head
from specsim.profiling.model_configs import load_shape
from specsim.profiling.specs import parse_drafter

H = 4096  # Llama-3.1-8B's hidden size; heads 32 x 128, 8 KV heads, MLP 14336
LAYER = (H * H + 2 * H * 8 * 128 + H * H) + 3 * H * 14_336 + 2 * H  # attention, MLP, 2 norms
# A DFlash drafter for Llama-3.1-8B with two Llama layers over three taps of the target's
# hidden states and a 16-token block (the last verified token and 15 mask slots).
DFLASH = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": 14_336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 128_256,
    "block_size": 16,
    "dflash_config": {"mask_token_id": 128_002, "target_layer_ids": [1, 15, 29]},
}


@pytest.fixture
def target(repo):
    return load_shape(repo / "profiles/models/llama3.1-8b.json")


@pytest.fixture
def dflash(tmp_path):
    path = tmp_path / "dflash" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(DFLASH))
    return path


def test_a_dflash_drafter_is_its_layers_and_fc_with_the_targets_embedding(target, dflash):
    head = load_head("dflash", dflash, target)
    assert head.is_block and head.taps == 3 and head.max_k == 15
    # Two layers, the final norm and the 3 h x h fc: the embedding and LM head are the target's.
    assert head.shape.param_count() == 2 * LAYER + H + 3 * H * H
    assert head.shape.kv_bytes_per_token(2) == 2 * 2 * 8 * 128 * 2
    # The block given after the config wins over the config's.
    assert load_head("dflash", dflash, target, 7).max_k == 7


def test_a_p_eagle_head_needs_its_parallel_width(repo, target):
    config = repo / "profiles/models/eagle3-llama3.1-8b.json"
    assert parse_drafter(f"pe=p_eagle:{config}:8").max_k == 8
    assert parse_drafter(f"pe=p_eagle:{config}").max_k is None
    with pytest.raises(SpecsimError, match="NAME=p_eagle:CONFIG:K"):
        load_head("p_eagle", config, target)
    head = load_head("p_eagle", config, target, 8)
    eagle3 = load_head("eagle3", config, target)
    assert head.shape == eagle3.shape and head.max_k == 8


def test_profile_roofline_writes_a_block_drafter_that_simulates(repo, dflash, tmp_path):
    out = tmp_path / "p.yaml"
    argv = [
        "profile",
        "roofline",
        "--hardware",
        str(repo / "profiles/hardware/h100-sxm.yaml"),
        "--target",
        str(repo / "profiles/models/llama3.1-8b.json"),
        "--drafter",
        f"dflash=dflash:{dflash}",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    spec = load_profile(out).drafter("dflash")
    assert (spec.kind, spec.method, spec.max_k) == ("block", "dflash", 15)
    assert spec.latency is not None and spec.weight_bytes > 0
    # With an assumed acceptance it simulates, and refuses a window beyond its block.
    profile = yaml.safe_load(out.read_text())
    profile["acceptance"] = [
        {"drafter": "dflash", "verifier": "rejection", "temperature": 1.0,
         "per_position": [0.8] * 16, "source": "assumed"}
    ]  # fmt: skip
    out.write_text(yaml.safe_dump(profile))
    scenario = yaml.safe_load((repo / "scenarios/poisson.yaml").read_text())
    scenario.update(profile=str(out))
    scenario["workload"].update(duration_s=20)
    for k, code in ((7, 0), (16, 2)):
        scenario["speculation"].update(drafter="dflash", k=k)
        path = tmp_path / f"s{k}.yaml"
        path.write_text(yaml.safe_dump(scenario))
        assert main(["simulate", str(path), "--out", str(tmp_path / f"run{k}")]) == code
