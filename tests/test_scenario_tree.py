"""speculation.tree in the scenario: k is the tree's depth, pools take their own tree's depth,
and the speculation-off baseline turns a tree off."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from specsim.api.simulate import prepare
from specsim.scenario import Speculation, load_scenario
from specsim.tree import TreeShape

REPO = Path(__file__).resolve().parents[1]


def test_k_is_the_trees_depth():
    spec = Speculation.model_validate({"drafter": "small", "tree": "2,2,1"})
    assert spec.k == 3 and spec.tree_shape == TreeShape.parse("2,2,1")
    paths = Speculation.model_validate({"drafter": "small", "tree": [[1], [0], [0, 0]]})
    assert paths.k == 2 and paths.tree_shape.paths == ((0,), (1,), (0, 0))
    assert Speculation.model_validate({"drafter": "small", "tree": 3}).tree_shape.num_nodes == 3
    same = Speculation.model_validate({"drafter": "small", "tree": "2,2,1", "k": 3})
    assert same.k == 3
    with pytest.raises(ValidationError, match="k is 4 but the tree '2,2,1' has depth 3"):
        Speculation.model_validate({"drafter": "small", "tree": "2,2,1", "k": 4})


def test_a_pool_takes_its_own_trees_depth():
    scenario = load_scenario(REPO / "scenarios" / "tree.yaml")
    chain, tree, wide = (scenario.pool_speculation(p) for p in scenario.fleet.pools)
    assert (chain.k, chain.tree) == (3, None)
    assert (tree.k, tree.tree_shape.num_nodes, tree.tree_drafts) == (3, 10, "iid")
    assert (wide.k, wide.tree_shape.num_nodes) == (4, 30)


def test_the_baseline_turns_the_tree_off():
    main, baseline = prepare(REPO / "scenarios" / "tree.yaml", ["speculation.tree=3,1,1"], True)
    assert main.speculation.k == 3 and main.speculation.tree_shape.num_nodes == 9
    assert baseline.speculation.tree is None and baseline.speculation.k == 0
    for pool in baseline.fleet.pools:
        spec = baseline.pool_speculation(pool)
        assert spec.tree is None and not spec.enabled


def test_a_tree_needs_the_fixed_policy():
    data = {"drafter": "small", "tree": "2,1", "policy": "adaptive"}
    with pytest.raises(ValidationError, match="policy 'fixed' only"):
        Speculation.model_validate(data)


def test_a_pool_turns_the_scenarios_tree_off_with_null():
    scenario = load_scenario(
        REPO / "scenarios" / "tree.yaml",
        ["speculation.tree=2,2,1", "speculation.k=3", "fleet.pools.0.speculation.tree=null"],
    )
    first = scenario.pool_speculation(scenario.fleet.pools[0])
    assert first.tree is None and first.k == 3
    second = scenario.pool_speculation(scenario.fleet.pools[1])
    assert second.tree_shape.num_nodes == 10
