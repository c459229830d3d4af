"""``plan window --trees`` / ``--tree-*``: the shapes searched, and chain or tree per load."""

from __future__ import annotations

import glob
import itertools
import json
import shutil
from pathlib import Path

import pytest
import yaml

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.planning.common import parse_counts
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.screen import Figures, screen_grid
from specsim.planning.trees import (
    SglangSpace,
    acceptance_rates,
    given_trees,
    merge,
    sglang_candidates,
    sglang_tree,
)
from specsim.profile import load_profile
from specsim.profile.acceptance import TREE_DRAFTS, derive_tree_acceptance
from specsim.scenario import load_scenario
from specsim.tree import TreeShape

REPO = Path(__file__).resolve().parents[1]
RATES = [[0.8, 0.5], [0.6, 0.4]]


def paths(shape: TreeShape) -> list[list[int]]:
    return shape.to_paths()


def test_sglang_tree_keeps_the_best_nodes_by_their_chance_of_acceptance():
    # Scores by hand: (0,) .8, (1,) .2 x .5 = .1; under (0,): (0,0) .8 x .6 = .48, (0,1)
    # .8 x .4 x .4 = .128; under (1,): (1,0) .06, (1,1) .016.
    assert paths(sglang_tree(2, 2, 4, RATES)) == [[0], [0, 0], [0, 1]]
    assert paths(sglang_tree(2, 2, 5, RATES)) == [[0], [1], [0, 0], [0, 1]]
    # Depth 3 (rates past the table take its deepest row): (0,0,0) .288, then (0,1) .128 and
    # (1,) .1; (0,0,1) and (0,1,0) (.0768 each) are left out.
    assert paths(sglang_tree(3, 2, 6, RATES)) == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]


def test_sglang_tree_grows_only_under_the_beams_of_the_depth_above():
    # Depth 2: (0,0) .25, (1,0) .45 x .5 = .225, (0,1) .5 x .5 x .8 = .2, (1,1) .18. The two
    # beams are (0,0) and (1,0), so (0,1)'s child (.198) is no candidate and (1,1) (.18) is
    # taken instead, though lower.
    rates = [[0.5, 0.9], [0.5, 0.8], [0.99, 0.99]]
    shape = paths(sglang_tree(3, 2, 9, rates))
    assert shape == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [1, 0, 0]]


def test_a_chain_only_profile_gives_chains_and_they_are_skipped_with_the_reason():
    space = SglangSpace.parse("3", "1,2", "4,8")
    candidates, skipped = sglang_candidates(space, [[0.8], [0.7], [0.6]])
    assert candidates == []
    assert "sglang=3,1,4: topk 1 is the chain k = 3 (--k)" in skipped
    assert "sglang=3,2,4: its tree is the chain k = 3 (--k)" in skipped
    assert "sglang=3,2,8: more draft tokens than steps x topk + 1" in skipped


def test_search_space_defaults_are_bench_speculatives_and_options_are_checked():
    space = SglangSpace.parse(None, "2", None)
    assert space.steps == (1, 3, 5, 7) and space.topk == (2,)
    assert space.tokens == (2, 4, 8, 16, 32)
    assert SglangSpace.parse(None, None, None) is None
    assert parse_counts("1..3,5", "--tree-steps", 1, 8) == [1, 2, 3, 5]
    for text in ("", "0", "4..1", "x", "99"):
        with pytest.raises(SpecsimError) as info:
            parse_counts(text, "--tree-steps", 1, 32)
        assert info.value.key == "--tree-steps"


def test_the_command_line_offers_the_profiles_tree_draftings():
    from specsim.cli import plan_options

    assert tuple(TREE_DRAFTS) == plan_options.TREE_DRAFTS


def test_given_trees_are_named_by_their_widths_and_chains_or_repeats_are_refused():
    [full, listed] = given_trees(["2,2,1", "[[0],[1],[0,0]]"])
    assert full.config == "tree=2,2,1" and full.shape.num_nodes == 10
    assert listed.config == "tree=[[0], [1], [0, 0]]"
    for texts in (["1,1,1"], ["2,1", "[[0],[1],[0,0],[1,0]]"]):
        with pytest.raises(SpecsimError) as info:
            merge(given_trees(texts), [])
        assert info.value.key == "--trees"


def test_search_rates_are_those_the_profile_derives_unmeasured_trees_from():
    # acceptance_rates mirrors Profile.tree_acceptance_for's choice: derive from them and the
    # profile's own derived entry must agree, for a shape the profile did not measure.
    profile = load_profile(REPO / "profiles/builtin-cpu.yaml")
    scenario = load_scenario(REPO / "scenarios/tree.yaml", ["fleet.pools=[]"])
    spec = scenario.speculation
    shape = TreeShape.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    for drafts in TREE_DRAFTS:
        entry = profile.profile.tree_acceptance_for(
            spec.drafter, spec.verifier, spec.temperature, shape, drafts
        )
        assert entry.source == "derived"
        ours = derive_tree_acceptance(acceptance_rates(profile, spec, drafts)[0], shape)
        assert ours == pytest.approx(entry.accepted_length, abs=1e-12)


# -- plan window with trees ------------------------------------------------------------------


def memory_bound_scenario(folder: Path) -> Path:
    """The tree scenario on a copy of the built-in profile whose target pass costs little per
    verified token (as a memory-bound GPU's does), so that trees can pay."""
    data = yaml.safe_load((REPO / "profiles/builtin-cpu.yaml").read_text())
    fit = data["target"]["latency"]["fit"]
    fit["per_batched_token_s"], fit["per_attention_pair_s"] = 1e-7, 1e-9
    (folder / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for name in glob.glob(str(REPO / "profiles/builtin-cpu.*.txt")):
        shutil.copy(name, folder)
    scenario = yaml.safe_load((REPO / "scenarios/tree.yaml").read_text())
    scenario.update(profile="profile.yaml", fleet={"replicas": 1})
    scenario["workload"]["requests"] = 60
    (folder / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    return folder / "scenario.yaml"


TREE_ARGS = ["--k", "0..3", "--trees", "2,2,1", "--tree-steps", "3", "--tree-topk", "2"]
TREE_ARGS += ["--tree-tokens", "6", "--tree-drafts", "iid", "--no-progress", "--json"]


@pytest.fixture(scope="module")
def memory_bound(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory-bound")
    scenario = memory_bound_scenario(folder)
    out = folder / "plan"
    args = ["plan", "window", str(scenario), "--loads", "1", "8", *TREE_ARGS]
    code = main([*args, "--emit", "vllm,sglang,trtllm", "--out", str(out)])
    return code, json.loads((out / "summary.json").read_text()), out


def test_a_tree_wins_where_verification_is_cheap_and_says_what_it_gained(memory_bound):
    code, summary, out = memory_bound
    assert code == 0
    trees = summary["trees"]
    configs = [c["config"] for c in trees["candidates"]]
    assert configs == ["tree=2,2,1", "sglang=3,2,6"]
    assert trees["trees_win_at"] == [1.0, 8.0]
    for item in trees["per_load"]:
        assert item["winner"] == "tree" and item["best"] == item["best_tree"]
        tree, chain = item["figures"]["tree"], item["figures"]["chain"]
        assert tree["mean_acceptance_length"] > chain["mean_acceptance_length"]
        assert tree["e2e_mean_s"] < chain["e2e_mean_s"]  # chosen by mean E2E (no SLO)
        assert tree["verified_per_step"] == {"tree=2,2,1": 11, "sglang=3,2,6": 6}[item["best"]]
        assert item["reason"].startswith(f"tree {item['best']} wins: it accepts +")
    report = (out / "report.md").read_text()
    assert "## Chain or tree" in report and "a tree wins at 1 req/s, 8 req/s" in report


def test_the_batch_size_view_covers_every_batch_once(memory_bound):
    _, summary, _ = memory_bound
    rows = summary["trees"]["by_batch_size"]["rows"]
    assert rows[0]["min_batch"] == 1 and rows[-1]["max_batch"] == 16
    for before, after in itertools.pairwise(rows):
        assert after["min_batch"] == before["max_batch"] + 1 and after["best"] != before["best"]
    for row in rows:
        speeds = row["tokens_per_s"]
        best = {"off": speeds["off"], "chain": speeds["best_chain"], "tree": speeds["best_tree"]}
        assert best[row["winner"]] == max(best.values())


def test_on_the_shipped_cpu_profile_a_chain_wins_and_trees_are_in_the_sweep(tmp_path, capsys):
    out = tmp_path / "plan"
    args = ["plan", "window", str(REPO / "scenarios/tree.yaml"), "--loads", "4"]
    code = main([*args, *TREE_ARGS, "--set", "workload.requests=60", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    [item] = summary["trees"]["per_load"]
    assert item["winner"] == "chain" and item["best"] == item["best_chain"]
    assert "does not pay for its verification width" in item["reason"]
    swept = (out / "sweep.csv").read_text()
    assert "tree=2,2,1" in swept and "sglang=3,2,6" in swept


def test_without_tree_options_the_plan_has_no_tree_point_or_key(tmp_path):
    from specsim.planning.window import window

    plan = window.prepare(str(REPO / "scenarios/poisson.yaml"), [], [0, 1], [2.0], None)
    assert [p.tags["config"] for p in plan.grid()] == ["k=0", "k=1", "adaptive"]
    assert "trees" not in plan.identity()


def test_trees_refused_for_prompt_lookup_in_one_line(tmp_path, capsys):
    args = ["plan", "window", str(REPO / "scenarios/tree.yaml"), "--trees", "2,2,1"]
    code = main([*args, "--set", "speculation.drafter=ngram", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trees" in err[0] and "ngram" in err[0]
    assert not (tmp_path / "o").exists()


class _Sweeper:
    """Estimates from a table, simulations from another (screen_grid's two calls)."""

    def __init__(self, estimates, simulated):
        self.estimates, self.simulated, self.priced = estimates, simulated, []

    def map_local(self, function, points):
        self.priced += [p.tags["config"] for p in points]
        return [self.estimates[p.tags["config"]] for p in points]

    def run(self, points, desc=""):
        from specsim.planning.sweep.sweeper import PointResult

        return [
            PointResult(p, p.tags["config"], True, self.simulated[p.tags["config"]]) for p in points
        ]


def test_the_screen_neither_prices_nor_prunes_a_tree():
    def figures(e2e):
        return Figures(e2e, None, None, trusted=True)

    def summary(e2e):
        return {"e2e_s": {"mean": e2e}}

    points = [SweepPoint.make("s.yaml", [c], load=1.0, config=c) for c in ("k=0", "k=1", "t")]
    # The chain estimate would price the tree far slower than k = 1: it must not prune it.
    sweeper = _Sweeper(
        {"k=0": figures(2.0), "k=1": figures(1.0), "t": figures(9.0)},
        {"k=0": summary(2.0), "k=1": summary(1.0), "t": summary(0.5)},
    )
    outcome = screen_grid(
        points,
        group=lambda p: p.tags["load"],
        label=lambda p: p.tags["config"],
        use_slo=False,
        sweeper=sweeper,
        always=lambda p: p.tags["config"] == "k=0",
        competes=lambda p: p.tags["config"] != "t",
        estimable=lambda p: p.tags["config"] != "t",
    )
    assert sweeper.priced == ["k=0", "k=1"]
    assert outcome.pruned == [] and all(r is not None for r in outcome.results)
    assert outcome.estimate_failures == 0


# -- --emit with a tree ----------------------------------------------------------------------


def test_emit_refuses_per_engine_in_one_line_and_writes_the_rest(memory_bound, capsys):
    _, summary, out = memory_bound
    block = summary["engine"]
    assert block["recommended"]["tree"]["config"] == "tree=2,2,1"
    assert block["recommended"]["k"] == 3  # the tree's depth
    for engine in ("vllm", "sglang", "trtllm"):
        assert block[engine]["files"] == [] and "\n" not in block[engine]["refused"]
    assert "expands only its topk = 2" in block["sglang"]["refused"]
    assert sorted(p.name for p in (out / "engine").iterdir()) == ["bench.sh"]


def test_emit_writes_sglangs_knobs_for_the_searched_tree_that_wins(tmp_path, capsys):
    scenario = memory_bound_scenario(tmp_path)
    out = tmp_path / "plan"
    args = ["plan", "window", str(scenario), "--loads", "1", "--k", "0..3", "--tree-steps", "3"]
    args += ["--tree-topk", "4", "--tree-tokens", "12", "--tree-drafts", "iid", "--no-progress"]
    assert main([*args, "--emit", "sglang,vllm", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "engine: vllm refused: vLLM 0.33's speculative_config has no" in printed
    text = (out / "engine/sglang.args").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[:5] == [
        "--speculative-algorithm STANDALONE",
        "--speculative-draft-model-path REPLACE-ME/small",
        "--speculative-num-steps 3",
        "--speculative-eagle-topk 4",
        "--speculative-num-draft-tokens 12",
    ]
    assert "--disable-overlap-schedule" in lines
    assert "drafts its children iid" in text  # SGLang's tree takes the top-k: said so
    assert not (out / "engine/vllm.json").exists()


def test_trees_derived_from_the_chain_alone_are_never_chosen_and_that_is_said(tmp_path, capsys):
    # Greedy verification with i.i.d. children: the profile measured no such tree, so every
    # tree's acceptance comes from the chain's rates (siblings accept nothing).
    scenario = memory_bound_scenario(tmp_path)
    out = tmp_path / "plan"
    args = ["plan", "window", str(scenario), "--loads", "1", "8", *TREE_ARGS]
    args += ["--set", "speculation.verifier=greedy", "--set", "speculation.temperature=0"]
    assert main([*args, "--out", str(out)]) == 0
    trees = json.loads((out / "summary.json").read_text())["trees"]
    assert trees["trees_derived_from_chain"] is True
    assert {c["acceptance_source"] for c in trees["candidates"]} == {"derived"}
    assert trees["trees_win_at"] == []
    for item in trees["per_load"]:
        assert item["winner"] in ("chain", "off") and item["best_tree"] is not None
        assert "bookkeeping" in item["reason"] and "never accepts" in item["reason"]


def test_a_faster_simulated_tree_derived_from_the_chain_still_does_not_win():
    # The roofline profile of chat.yaml has no tree table: its trees are derived from the
    # chain's rates. Planted results where the tree is the fastest must still choose the chain.
    from specsim.planning.sweep.sweeper import PointResult
    from specsim.planning.window import window

    plan = window.prepare(
        str(REPO / "scenarios/chat.yaml"), [], [0, 3], [1.0], None, False, given_trees(["2,2,1"])
    )
    assert plan.trees_from_chain
    e2e = {"k=0": 2.0, "k=3": 1.2, "tree=2,2,1": 1.1, "adaptive": 1.3}
    results = [
        PointResult(p, p.tags["config"], True, {"e2e_s": {"mean": e2e[p.tags["config"]]}})
        for p in plan.grid()
    ]
    [entry] = window.analyse(plan, results)
    assert entry.best_config == "k=3"


@pytest.mark.parametrize(("tree_e2e", "best"), [(1.19, "k=3"), (1.15, "tree=2,2,1")])
def test_a_tree_must_beat_the_best_chain_beyond_the_tie_band(tree_e2e, best):
    # Planted results on the tree scenario (measured trees): 1.19 s is within 2 % of the
    # chain's 1.2 s (kept), 1.15 s beyond it (the tree wins).
    from specsim.planning.sweep.sweeper import PointResult
    from specsim.planning.window import window
    from specsim.planning.window.window_trees import reason

    plan = window.prepare(
        str(REPO / "scenarios/tree.yaml"), [], [0, 3], [1.0], None, False, given_trees(["2,2,1"])
    )
    assert not plan.trees_from_chain
    e2e = {"k=0": 2.0, "k=3": 1.2, "tree=2,2,1": tree_e2e, "adaptive": 1.3}
    results = [
        PointResult(p, p.tags["config"], True, {"e2e_s": {"mean": e2e[p.tags["config"]]}})
        for p in plan.grid()
    ]
    [entry] = window.analyse(plan, results)
    assert entry.best_config == best
    text = reason(plan, entry, entry.best_config, "k=3", "tree=2,2,1")
    assert ("within the tie bands" in text) == (best == "k=3")
