"""specsim validate on a tree scenario: the engine's tree steps against the simulated tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_engine_common import hand_profile
from test_validate import validate_argv, write_scenario

from specsim.cli import main
from specsim.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "scenarios" / "validate-b8-small-tree221.yaml"


def tree_scenario(tmp_path, tree="2,2,1"):
    path = write_scenario(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["speculation"] = {"drafter": "small", "tree": tree, "tree_drafts": "iid"}
    path.write_text(yaml.safe_dump(data))
    return path


def test_tree_iterations_are_priced_as_the_simulator_prices_the_tree(tmp_path):
    from specsim.engine.engine import IterationLog
    from specsim.profile import load_profile
    from specsim.tree import TreeShape
    from specsim.validation.residuals import iteration_residuals

    profile = load_profile(hand_profile(tmp_path / "p.yaml"))
    # Two rows verifying the root and 10 nodes each (the engine's log of a 2,2,1 tree step).
    log = IterationLog(
        dt=[0.03], batch=[2], kind=["decode"], window=[3], new_tokens=[22], context=[100]
    )
    log.pairs = [22 * 50 + 2 * 33.0]
    shape = TreeShape.parse("2,2,1")
    row = iteration_residuals(log, profile, "small", tree=shape)[0]
    # target 0.01 + 22 x 1e-4; the drafter's three passes feed the root, then the 2 depth-1
    # nodes, then the 4 depth-2 nodes of both rows (0.001 + 1e-5 a token each); overhead 1e-4.
    drafter = 3 * 0.001 + (2 + 4 + 8) * 1e-5
    assert row["predicted_mean_ms"] == pytest.approx((0.01 + 22e-4 + drafter + 1e-4) * 1e3)
    # Priced as a chain of depth 3 the drafter would feed one token a row per pass.
    chain = iteration_residuals(log, profile, "small")[0]
    assert chain["predicted_mean_ms"] < row["predicted_mean_ms"]


def test_the_profiling_grid_covers_a_trees_verification_widths(tmp_path):
    from specsim.validation.validate import scenario_grid

    scenario = load_scenario(tree_scenario(tmp_path))
    grid = dict(part.split("=") for part in scenario_grid(scenario, 256))
    assert grid["new"] == "1,2,6,11"  # 1, 2, nodes // 2 + 1, nodes + 1
    chain = load_scenario(write_scenario(tmp_path))
    assert dict(p.split("=") for p in scenario_grid(chain, 256))["new"] == "1,2,3"


def test_the_shipped_tree_validation_scenario_runs_on_the_engine_and_its_tree_is_measured():
    from specsim.engine.run import check_supported
    from specsim.profile import load_profile

    scenario = load_scenario(SHIPPED)
    check_supported(scenario)
    spec = scenario.speculation
    profile = load_profile(REPO / "profiles" / "builtin-cpu.yaml").profile
    entry = profile.tree_acceptance_for(
        spec.drafter, spec.verifier, spec.temperature, spec.tree_shape, spec.tree_drafts
    )
    assert entry.source == "measured"


@pytest.mark.slow
def test_validate_runs_the_engines_tree_steps_against_the_simulated_tree(tmp_path, capsys):
    scenario = tree_scenario(tmp_path)
    out = tmp_path / "out"
    code = main(validate_argv(scenario, hand_profile(tmp_path / "p.yaml"), out))
    result = json.loads((out / "comparison.json").read_text())
    assert code == (0 if result["passed"] else 1)
    engine = json.loads((out / "engine" / "summary.json").read_text())
    simulated = json.loads((out / "simulation" / "summary.json").read_text())
    assert engine["scenario"]["tree"]["nodes"] == simulated["scenario"]["tree"]["nodes"] == 10
    decodes = [r for r in result["iteration_residuals"] if r["kind"] == "decode"]
    assert decodes and {r["k"] for r in decodes} == {3}
    assert "tree 2,2,1 (10 nodes, depth 3, iid children)" in (out / "comparison.md").read_text()
