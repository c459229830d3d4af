"""``report drafter-swap --tree-drafter NAME=SHAPE``: a chain drafter against a tree drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plan_trees import memory_bound_scenario

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.planning.trees import parse_tree_drafter

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--drafter", "small", "--tree-drafter", "small=2,2,1", "--tree-drafts", "iid"]
ARGS += ["--k", "0..3", "--no-progress", "--json"]


def swap(scenario: Path, out: Path, *extra: str) -> dict:
    code = main(["report", "drafter-swap", str(scenario), *ARGS, *extra, "--out", str(out)])
    assert code == 0
    return json.loads((out / "summary.json").read_text())


def mean_e2e(out: Path) -> dict[tuple[str, float, str], float]:
    """Every simulation's mean E2E by (drafter, load, config), from the sweep table."""
    import csv

    with open(out / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    load = next(c for c in rows[0] if c.startswith("arrival rate"))
    return {
        (r["drafter"], float(r[load]), r["k"] if r["k"].startswith("tree") else f"k={r['k']}"): (
            float(r["e2e mean (s)"])
        )
        for r in rows
    }


def test_a_chain_and_a_tree_of_one_drafter_are_compared_at_their_best(tmp_path, capsys):
    out = tmp_path / "swap"
    summary = swap(REPO / "scenarios/tree.yaml", out, "--loads", "4", "16")
    chain, tree = summary["drafters"]
    assert chain["drafter"] == tree["drafter"] == "small"
    assert tree["label"] == "small tree 2,2,1" and tree["tree"]["nodes"] == 10
    assert tree["tree"]["drafts"] == "iid" and 2.0 < tree["mean_acceptance_length_tree"] < 4.0
    e2e = mean_e2e(out)
    for item, chosen, k in zip(
        summary["winner_per_load"], tree["best"], chain["best_k"], strict=True
    ):
        load = item["load"]
        # The tree drafter's best is its tree or k = 0, whichever is faster (no SLO).
        options = {c: e2e[("small tree 2,2,1", load, c)] for c in ("k=0", "tree=2,2,1")}
        assert chosen["config"] == min(options, key=options.get)
        best_chain = e2e[("small", load, f"k={k['k']}")]
        expected = "small" if best_chain <= options[chosen["config"]] else "small tree 2,2,1"
        assert item["drafter"] == expected
    assert "small tree 2,2,1" in (out / "report.md").read_text()


def test_where_the_tree_wins_its_setting_is_what_is_emitted(tmp_path, capsys):
    scenario = memory_bound_scenario(tmp_path)
    summary = swap(scenario, tmp_path / "swap", "--loads", "4", "--emit", "trtllm")
    assert summary["recommendation"]["drafter"] == "small tree 2,2,1"
    block = summary["engine"]
    assert block["recommended"]["drafter"] == "small" and block["recommended"]["k"] == 3
    assert block["recommended"]["tree"]["config"] == "tree=2,2,1"
    assert block["trtllm"]["refused"].startswith("TensorRT-LLM's Draft_Target decoding")


@pytest.mark.parametrize("text", ["small", "=2,2,1", "small=", "small=1,1", "small=[[1]]"])
def test_bad_tree_drafters_are_refused_naming_the_option(text):
    with pytest.raises(SpecsimError) as info:
        parse_tree_drafter(text)
    assert info.value.key == "--tree-drafter"
