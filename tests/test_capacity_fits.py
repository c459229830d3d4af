"""A deployment x speculation candidate whose KV cache cannot hold the workload's longest
request is reported as not fitting before any run (the admission's rule), pinned against the
70B's hand-worked TP2 KV cache."""

from __future__ import annotations

import pytest
import yaml
from test_plan_support import write_scenario

from specsim.planning import capacity
from specsim.planning.capacity_deploy import Precision, RooflineRecipe, roofline_deployments
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
    request needs 1800 tokens + the lookahead. TP2 bf16 with the 1B drafter holds 1167 tokens
    (72e9 - 71,789,520,896 bytes of weights, over 180,224 KV bytes a token): at k = 2 it needs
    1800 + 3 = 1803, and the adaptive policy (k up to 2) the same, so neither fits. Without the
    drafter TP2 holds (72e9 - 70,553,706,496) // 163,840 = 8827 tokens, and TP4 is larger still:
    those are searched."""
    scenario = write_scenario(tmp_path, repo, slo={"ttft_s": 1.0, "tpot_s": 0.05})
    plan = capacity.prepare(str(scenario), [], 4.0, ["llama3.2-1b"], [2], 0.05, 0.99, None, tp2_tp4)
    unfit = dict(plan.unfit)
    assert sorted(unfit) == ["TP2 bf16, llama3.2-1b adaptive", "TP2 bf16, llama3.2-1b k=2"]
    assert unfit["TP2 bf16, llama3.2-1b k=2"] == (
        "the workload's longest request needs 1803 KV-cache tokens (prompt 1500 + output 300 "
        "+ lookahead) but a replica holds 1167"
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
