"""A deployment x speculation candidate whose KV cache cannot hold the workload's longest
request is reported as not fitting before any run (the admission's rule), pinned against the
70B's hand-worked TP2 KV cache."""

from __future__ import annotations

import json

import pytest
import yaml
from test_plan_support import write_scenario

from specsim.cli import main
from specsim.planning.capacity import capacity
from specsim.planning.capacity.capacity_deploy import (
    Precision,
    RooflineRecipe,
    roofline_deployments,
)
from specsim.scenario import load_scenario
from specsim.simulation.fits import longest_request

H100 = "profiles/hardware/h100-sxm.yaml"
LLAMA_70B = "profiles/models/llama3.1-70b.json"
DRAFT = "llama3.2-1b=profiles/models/llama3.2-1b.json"
ACCEPTANCE = "profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml"
BF16 = Precision("bfloat16", "bfloat16")


@pytest.fixture(scope="module")
def tp2_tp4(tmp_path_factory, repo):
    recipe = RooflineRecipe(
        str(repo / H100),
        str(repo / LLAMA_70B),
        [DRAFT.replace("=", f"={repo}/"), "ngram"],
        str(repo / ACCEPTANCE),
    )
    out = tmp_path_factory.mktemp("deployments")
    return roofline_deployments(recipe, [2, 4], [BF16], out)


def test_tp2_with_the_drafter_cannot_hold_the_longest_request(tmp_path, repo, tp2_tp4):
    """The workload's bounds: prompts up to 1500 tokens, outputs up to 300, so the longest
    request needs 1800 tokens + the lookahead. TP2 bf16 with the 1B drafter holds no cache at
    all: 71,789,520,896 bytes of weights and the engine's 4.86e9 (19.5 x 8,192 x 8,192 x 2 B of
    activations, 0.3 + 1.79 GiB outside torch) exceed the 0.9 x 85.06e9 = 76.554e9 a device
    gives, at k = 2 and adaptive alike. Without the drafter TP2 holds (76.554e9 - 70,553,706,496
    - 4.86e9) // 163,840 = 6951 tokens, and TP4 is larger still: those are searched."""
    scenario = write_scenario(tmp_path, repo, slo={"ttft_s": 1.0, "tpot_s": 0.05})
    plan = capacity.prepare(str(scenario), [], 4.0, ["llama3.2-1b"], [2], 0.05, 0.99, None, tp2_tp4)
    unfit = dict(plan.unfit)
    assert sorted(unfit) == ["TP2 bf16, llama3.2-1b adaptive", "TP2 bf16, llama3.2-1b k=2"]
    assert unfit["TP2 bf16, llama3.2-1b k=2"].startswith(
        "the weights (71.8 GB) and the engine's activations and buffers (4.9 GB) leave no room "
        "for a KV cache in 76.6 GB"
    )
    assert [c.label for c in plan.candidates] == [
        "TP2 bf16, speculation off",
        "TP4 bf16, speculation off",
        "TP4 bf16, llama3.2-1b k=2",
        "TP4 bf16, llama3.2-1b adaptive",
    ]


def test_the_longest_request_of_a_trace_and_of_bounded_distributions(tmp_path, repo):
    """A trace's longest row by prompt + output (not each column's maximum), among the first
    ``workload.requests`` rows; fixed and uniform lengths by their bounds; an unbounded
    lognormal has none."""
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,900\n"
        "2023-11-16 18:15:47.6805900,950,10\n"
        "2023-11-16 18:15:48.6805900,2000,2000\n",
        encoding="utf-8",
    )
    path = write_scenario(tmp_path, repo, slo={"ttft_s": 1.0})
    data = yaml.safe_load(path.read_text())
    data["workload"] = {"kind": "trace", "trace": str(trace), "requests": 2}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert longest_request(load_scenario(path)) == (100, 900)
    assert longest_request(load_scenario(path, ["workload.requests=3"])) == (2000, 2000)
    data["workload"] = {
        "kind": "poisson",
        "rate": 1.0,
        "requests": 10,
        "prompt": {"dist": "fixed", "value": 40},
        "output": {"dist": "uniform", "low": 5, "high": 70},
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert longest_request(load_scenario(path)) == (40, 70)
    data["workload"]["output"] = {"dist": "lognormal", "median": 30}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert longest_request(load_scenario(path)) is None


def test_a_plain_plan_leaves_out_a_drafter_whose_cache_cannot_hold_the_longest_request(
    tmp_path, repo, capsys
):
    """No deployment search: the scenario's own 8B H100 profile at memory_utilisation 0.266,
    0.266 x 76.554e9 = 20,363,364,000 bytes. With the 1B drafter the weights take
    16,060,522,496 + 2,471,628,800 bytes and the engine 1,630,745,395 (19.5 x 8,192 x 4,096 x
    2 B of activations, 0.3 GiB outside torch), leaving 200,467,309 // (131,072 + 32,768) = 1223
    tokens, short of the 1800 + 3 that the longest request (prompt 1500 + output 300) needs at
    k = 2 (the adaptive policy likewise). Without the drafter 20,386 tokens hold it, so
    speculation off is searched and the plan succeeds (exit 0), naming the misfits in
    summary.json and the printed report."""
    scenario = write_scenario(tmp_path, repo, requests=100, rate=2.0, slo={"ttft_s": 1.0})
    fits = ["engine.memory_utilisation=0.266"]
    plan = capacity.prepare(str(scenario), fits, 4.0, None, [2], 0.1, 0.99, None)
    assert [c.label for c in plan.candidates] == [capacity.OFF]
    assert dict(plan.unfit) == {
        "llama3.2-1b k=2": "the workload's longest request needs 1803 KV-cache tokens (prompt "
        "1500 + output 300 + lookahead) but a replica holds 1223",
        "llama3.2-1b adaptive": "the workload's longest request needs 1803 KV-cache tokens "
        "(prompt 1500 + output 300 + lookahead) but a replica holds 1223",
    }
    out = tmp_path / "out"
    args = ["plan", "capacity", str(scenario), "--set", fits[0], "--target-rps", "4"]
    code = main([*args, "--k", "2", "--tolerance", "0.1", "--no-progress", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [c["label"] for c in summary["candidates"]] == [capacity.OFF]
    assert summary["failed"] == []
    assert summary["not_fitting"] == [
        {"candidate": label, "reason": why} for label, why in plan.unfit
    ]
    assert "  llama3.2-1b k=2          does not fit: the workload's longest request needs 1803" in (
        capsys.readouterr().out
    )


def test_a_plain_plan_where_nothing_fits_is_refused_before_any_run(tmp_path, repo):
    """At kv_capacity_tokens 1000 even speculation off (1800 tokens) cannot hold the longest
    request: one clear error, exit 2, nothing written."""
    scenario = write_scenario(tmp_path, repo, requests=100, rate=2.0, slo={"ttft_s": 1.0})
    out = tmp_path / "out"
    args = ["plan", "capacity", str(scenario), "--set", "engine.kv_capacity_tokens=1000"]
    assert main([*args, "--target-rps", "4", "--k", "2", "--out", str(out)]) == 2
    assert not out.exists()
