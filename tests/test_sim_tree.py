"""Tree pools in the simulator: a step worked by hand (seconds, FLOPs wasted, KV slots), a
chain-shaped tree giving the chain's results exactly, the fast path (the serving kernel:
``test_tree_kernel.py``) matching the reference, and the simulated acceptance length matching
the profile's table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import chisquare
from test_costs_tree import tree_profile_data

from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.tree_acceptance import TreeLengthAcceptance, tree_rates

REPO = Path(__file__).resolve().parents[1]
ALWAYS_TWO = {  # tree 2,1 (4 nodes, depth 2) whose steps always accept 2 nodes
    "drafter": "small",
    "verifier": "rejection",
    "temperature": 1.0,
    "tree": [[0], [1], [0, 0], [1, 0]],
    "drafts": "top-k",
    "accepted_length": [0.0, 0.0, 1.0],
    "mean_acceptance_length": 3.0,
}


def _scenario(tmp_path, speculation: dict, workload: dict | None = None, extra=None, **more):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump(tree_profile_data(extra)))
    data = {
        "profile": str(profile),
        "seed": 5,
        "workload": workload
        or {
            "kind": "poisson",
            "rate": 20.0,
            "requests": 200,
            "prompt": {"dist": "uniform", "low": 8, "high": 200},
            "output": {"dist": "uniform", "low": 1, "high": 120},
        },
        "speculation": {"drafter": "small", **speculation},
        **more,
    }
    return Scenario.model_validate(data).with_source(tmp_path / "s.yaml")


ONE_REQUEST = {
    "kind": "fixed_rate",
    "rate": 1.0,
    "requests": 1,
    "prompt": {"dist": "fixed", "value": 10},
    "output": {"dist": "fixed", "value": 7},
}


def test_a_tree_step_by_hand(tmp_path):
    """One request, prompt 10, output 7: the prefill emits token 1, then two steps of the full
    tree (5 positions each) accept 2 nodes and emit 3 tokens, at contexts 10 and 13."""
    scenario = _scenario(tmp_path, {"tree": "2,1"}, ONE_REQUEST, {"tree_acceptance": [ALWAYS_TWO]})
    out = tmp_path / "requests.csv"
    summary = run_simulation(scenario, records_path=out).summary
    row = dict(zip(*[line.split(",") for line in out.read_text().splitlines()[:2]], strict=True))
    assert (row["steps"], row["drafted"], row["accepted"]) == ("2", "4", "4")

    def step(c):  # target pass + the draft model's two passes + overhead (test_costs_tree)
        target = 0.01 + 1e-3 + 5 * 1e-4 + c * 1e-6 + (5 * c + 11) * 1e-7
        pass0 = 2e-3 + 1e-4 + 1e-5 + c * 1e-7 + (c + 1) * 1e-8
        pass1 = 2e-3 + 1e-4 + 2e-5 + (c + 1) * 1e-7 + (2 * c + 4) * 1e-8
        return target + pass0 + pass1 + 1e-4

    decode_s = float(row["finish_s"]) - float(row["first_token_s"])
    assert decode_s == pytest.approx(step(10) + step(13), abs=2e-6)  # records hold 6 decimals
    # Wasted: 2 of the 4 nodes per step, each a target position and a draft position.
    per_node = [1e9 + 1e6 * c + 1e8 + 1e5 * c for c in (10, 13)]
    wasted = summary["flops_wasted_fraction"] * summary["flops_total"]
    assert wasted == pytest.approx(2 * sum(per_node), rel=1e-5)  # summaries round to 6 digits
    assert summary["scenario"]["tree"]["source"] == "measured"
    assert summary["scenario"]["k"] == 2


def test_a_tree_row_holds_a_kv_slot_per_node(tmp_path):
    """prompt + output + (4 nodes + the root) slots: 22 fit, 21 do not (a chain of k = 2
    would need only 3 lookahead slots)."""
    extra = {"tree_acceptance": [ALWAYS_TWO]}
    fits = _scenario(
        tmp_path, {"tree": "2,1"}, ONE_REQUEST, extra, engine={"kv_capacity_tokens": 22}
    )
    run_simulation(fits)
    short = _scenario(
        tmp_path, {"tree": "2,1"}, ONE_REQUEST, extra, engine={"kv_capacity_tokens": 21}
    )
    with pytest.raises(SpecsimError, match="lookahead"):
        run_simulation(short)
    chain = _scenario(tmp_path, {"k": 2}, ONE_REQUEST, engine={"kv_capacity_tokens": 20})
    run_simulation(chain)


def _without_tree_echo(summary: dict) -> dict:
    summary = json.loads(json.dumps(summary))
    summary["scenario"].pop("tree")
    for pool in summary["pools"].values():
        pool.pop("tree")
    return summary


@pytest.mark.parametrize("fast", [True, False])
def test_a_chain_shaped_tree_gives_the_chain(tmp_path, fast):
    """Tree 1,1,1 (derived from the chain's rates: no tree table) against k = 3: every summary
    figure and every record the same."""
    tree_out, chain_out = tmp_path / "tree.csv", tmp_path / "chain.csv"
    tree = run_simulation(_scenario(tmp_path, {"tree": "1,1,1"}), tree_out, fast_path=fast)
    chain = run_simulation(_scenario(tmp_path, {"k": 3}), chain_out, fast_path=fast)
    assert tree.summary["scenario"]["tree"]["source"] == "derived"
    assert _without_tree_echo(tree.summary) == chain.summary
    assert tree_out.read_bytes() == chain_out.read_bytes()


def test_fast_path_matches_the_reference_for_a_tree(tmp_path):
    """The serving kernel prices tree steps as the per-iteration reference does: the two
    agree byte for byte."""
    scenario = _scenario(tmp_path, {"tree": "2,2,1"})
    fast, slow = tmp_path / "fast.csv", tmp_path / "slow.csv"
    a = run_simulation(scenario, fast, fast_path=True).summary
    b = run_simulation(scenario, slow, fast_path=False).summary
    assert a == b
    assert fast.read_bytes() == slow.read_bytes()


def test_tree_rates_reproduce_the_distribution():
    dist = [0.1, 0.2, 0.0, 0.7]
    rates = tree_rates(dist)
    survival = np.cumprod(rates)
    assert survival == pytest.approx([0.9, 0.7, 0.7], abs=1e-15)
    assert tree_rates([0.0, 0.0, 1.0]).tolist() == [1.0, 1.0]
    assert tree_rates([1.0, 0.0, 0.0]).tolist() == [0.0, 0.0]  # nothing reached: rate 0


def test_draws_follow_the_table():
    """200,000 steps (seed 11) of a measured-looking 5-way table: a chi-square test at level
    0.001 rejects a draw whose probabilities are off by 0.005 in one cell with power > 0.99."""
    profile = load_profile(REPO / "profiles" / "builtin-cpu.yaml").profile
    entry = next(t for t in profile.tree_acceptance if t.shape.num_nodes == 30)
    model = TreeLengthAcceptance(entry)
    n = 200_000
    rng = np.random.default_rng(11)
    accepted, proposed = model.draw_slots(rng, entry.shape.depth, np.zeros(n), n)
    assert proposed is None
    counts = np.bincount(accepted.astype(int), minlength=entry.shape.depth + 1)
    expected = np.asarray(entry.accepted_length) / sum(entry.accepted_length) * n
    assert chisquare(counts, expected).pvalue > 1e-3


def test_simulated_acceptance_length_matches_the_table(tmp_path):
    """Long outputs (340 tokens, 120 requests: about 11,000 steps; the per-step standard
    deviation is about 1.2, so the standard error is about 0.012, and each request's last step,
    capped at the tokens it needs, shaves at most about 0.02): the simulated mean acceptance
    length is the table's within 0.06 (a table read one row off, 3.195 or 3.916 instead of
    3.605, misses by 0.3)."""
    workload = {
        "kind": "poisson",
        "rate": 2.0,
        "requests": 120,
        "prompt": {"dist": "fixed", "value": 32},
        "output": {"dist": "fixed", "value": 340},
    }
    profile_path = str(REPO / "profiles" / "builtin-cpu.yaml")
    data = {
        "profile": profile_path,
        "seed": 2,
        "workload": workload,
        "speculation": {
            "drafter": "small",
            "verifier": "rejection",
            "temperature": 1.0,
            "tree": "2,2,2,2",
            "tree_drafts": "iid",
        },
    }
    summary = run_simulation(Scenario.model_validate(data)).summary
    table = summary["scenario"]["tree"]["table_mean_acceptance_length"]
    assert summary["scenario"]["tree"]["source"] == "measured"
    assert summary["mean_acceptance_length"] == pytest.approx(table, abs=0.06)


def test_the_shipped_tree_scenario_runs_its_measured_trees():
    from specsim.scenario import load_scenario

    summary = run_simulation(load_scenario(REPO / "scenarios" / "tree.yaml")).summary
    pools = summary["pools"]
    assert "tree" not in pools["chain"] and pools["chain"]["k"] == 3
    for name, nodes, depth in (("tree", 10, 3), ("wide", 30, 4)):
        tree = pools[name]["tree"]
        assert (tree["nodes"], tree["depth"], tree["source"]) == (nodes, depth, "measured")
        assert pools[name]["k"] == depth
