"""Tree pools on the compiled serving kernel: a tree step priced from the cost vector's tree
section (``formula.with_tree``: the drafter's passes per depth, ``TreeRows``' verified
positions and own pairs by each row's drafts, padded attention's own span, the widest row for
the range rule), as ``Replica._plan_mixed`` prices it per iteration.

Identity with the reference (every record, each replica's engine statistics, the summary and
requests.csv: ``test_sim_identity.assert_identical``) for a chain-shaped tree (which also gives
the chain's k = 3 exactly), the tree 2,2,1 with a draft model, autoregressive heads with a fit
and with a fixed pass, and parallel heads, lone and in a 2-replica fleet, saturated with
preemption, padded attention with prompts apart, short outputs (rows capped at the drafts
they have room for) and a split fleet's decode pool (its draft model's prompt pass owed); the
kernel runs most iterations in each. Planted faults in the kernel's tree totals and drafter
FLOPs fail them (docs/notes/2026-12-03-tree-kernel.md).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import yaml
from test_costs_tree import tree_profile_data
from test_sim_disagg import SPLIT
from test_sim_identity import assert_identical, observe

from specsim.costs import StepCosts, formula
from specsim.profile import load_profile
from specsim.scenario import Scenario
from specsim.simulation import compiled_serving, fleet_serving
from specsim.simulation.compiled_layout import ITERATIONS
from specsim.simulation.replica import Replica
from specsim.tree import TreeShape

# Heads' acceptance (the tree entries are derived from these rates).
HEADS_ACCEPTANCE = [
    {"drafter": name, "verifier": "rejection", "temperature": 1.0, "per_position": rates}
    for name, rates in (("eagle", [0.8, 0.65, 0.5]), ("medusa", [0.7, 0.5, 0.3]))
]
HEADS_ACCEPTANCE += [{**HEADS_ACCEPTANCE[0], "drafter": "eagle_fixed"}]
BASE = {
    "seed": 5,
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 150,
        "prompt": {"dist": "uniform", "low": 8, "high": 200},
        "output": {"dist": "uniform", "low": 1, "high": 120},
    },
    "engine": {"max_batch": 16},
    "speculation": {"drafter": "small", "tree": "2,2,1"},
}
CASES = {
    "chain-shaped tree": {"speculation": {"tree": "1,1,1"}},
    "2,2,1, draft model": {},
    "2,2,1, autoregressive heads": {"speculation": {"drafter": "eagle"}},
    "2,2,1, autoregressive heads, fixed pass": {"speculation": {"drafter": "eagle_fixed"}},
    "2,2,1, parallel heads": {"speculation": {"drafter": "medusa"}},
    "2,2,1, two replicas": {"fleet": {"replicas": 2, "router": "round_robin"}},
    "2,2,1, saturated, preemption": {
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1200},
        "workload": {"rate": 60.0},
    },
    "2,2,1, padded, prompts apart": {
        "engine": {"max_batch": 8, "padded_attention": True, "chunked_prefill": False},
    },
    "2,2,1, short outputs": {"workload": {"output": {"dist": "uniform", "low": 1, "high": 5}}},
    "2,2,1, split fleet's decode pool": {"fleet": {"disaggregation": SPLIT}},
}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    data = tree_profile_data()
    data["acceptance"] = data["acceptance"] + copy.deepcopy(HEADS_ACCEPTANCE)
    path = tmp_path_factory.mktemp("profile") / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def make(changes: dict, profile) -> Scenario:
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    data["profile"] = str(profile)
    return Scenario.model_validate(data).with_source(profile.parent / "s.yaml")


def kernel_share(scenario, tmp_path, monkeypatch) -> float:
    """The share of the run's engine iterations the kernel ran (lone or behind a router)."""
    counts = Counter()
    run, settle, mixed = (
        compiled_serving.ServingLoop.run,
        fleet_serving.FleetServing._settle,
        Replica._plan_mixed,
    )

    def counted_run(self, replica, now):
        end = run(self, replica, now)
        if end is not None:
            counts["kernel"] += int(self.ct[ITERATIONS])
        return end

    def counted_settle(self, replica):
        counts["kernel"] += int(self.ct[ITERATIONS])
        settle(self, replica)

    def counted_mixed(self):
        counts["python"] += 1
        return mixed(self)

    with monkeypatch.context() as patch:
        patch.setattr(compiled_serving.ServingLoop, "run", counted_run)
        patch.setattr(fleet_serving.FleetServing, "_settle", counted_settle)
        patch.setattr(Replica, "_plan_mixed", counted_mixed)
        observe(scenario, tmp_path / "count.csv", True, monkeypatch)
    return counts["kernel"] / (counts["kernel"] + counts["python"])


@pytest.mark.parametrize("name", list(CASES))
def test_a_tree_pool_on_the_kernel_is_the_reference(name, profile, tmp_path, monkeypatch):
    scenario = make(CASES[name], profile)
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    summary = fast["summary"]
    if "saturated" in name:
        assert summary["preemptions"] > 0
    if "chain-shaped" in name:  # and the chain's k = 3, record for record
        chain = make({"speculation": {"tree": None, "k": 3}}, profile)
        assert observe(chain, tmp_path / "chain.csv", True, monkeypatch)["csv"] == fast["csv"]


def test_the_cost_vector_carries_the_tree_the_reference_verifies(profile):
    """The tree section follows the chain's vector (the same slots before it), its tables are
    ``TreeRows``' (what the kernel indexes by each row's drafts + 1), and a chain has none."""
    loaded = load_profile(profile)
    tree = StepCosts(loaded, "small", TreeShape.parse("2,2,1"))
    chain = StepCosts(loaded, "small")
    at = int(tree.terms[formula.TREE_AT])
    assert chain.terms[formula.TREE_AT] == 0.0 and at == len(chain.terms)
    assert tree.terms[: formula.TREE_AT] == chain.terms[: formula.TREE_AT]
    assert tree.terms[formula.TREE_AT + 1 : at] == chain.terms[formula.TREE_AT + 1 :]
    tables = tree.terms[at + 3 : at + 3 + 2 * 5]  # depth 3: drafts -1 .. 3
    assert tables == [*tree.tree_rows.verified, *tree.tree_rows.own_pairs]
