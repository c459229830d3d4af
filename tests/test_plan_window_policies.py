"""``plan window --policies``: each window policy per load, and the one that wins there."""

from __future__ import annotations

import csv
import json

import pytest
from test_plan_support import write_scenario

from specsim.cli import main
from specsim.planning.window.window_policies import choices, initial_steps, parse_policies


@pytest.fixture(scope="module")
def run(tmp_path_factory, repo):
    folder = tmp_path_factory.mktemp("policies")
    scenario = write_scenario(folder, repo, requests=300)
    out = folder / "out"
    args = ["--k", "0..8", "--loads", "2,60", "--policies", "adaptive_steps,adaptive_verification"]
    args.append("--no-progress")
    code = main(["plan", "window", str(scenario), *args, "--out", str(out), "--json"])
    return {"code": code, "out": out, "scenario": scenario}


def test_every_policy_is_judged_at_every_load(run):
    assert run["code"] == 0
    summary = json.loads((run["out"] / "summary.json").read_text())
    with (run["out"] / "sweep.csv").open() as f:
        configs = {(float(row[0]), row[1]) for row in list(csv.reader(f))[1:]}
    extra = ("adaptive_steps", "adaptive_verification")
    assert {(load, name) for load in (2.0, 60.0) for name in extra} <= configs
    order = ["static", "by_batch", "adaptive", *extra]
    for choice in summary["policies"]:
        figures = choice["figures"]
        assert set(figures) == set(order)
        # No SLO: mean E2E; those within 2 % of the lowest tie, and the first of them wins.
        best = min(figures.values())
        tied = [n for n in order if figures[n] <= best * 1.02]
        assert [choice["winner"], *choice["tied_with"]] == tied
        others = min(v for n, v in figures.items() if n != choice["winner"])
        lead = (others - figures[choice["winner"]]) / others
        assert choice["margin"] == pytest.approx(lead, rel=1e-12)
    with (run["out"] / "policies.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["winner"] for row in rows] == [
        {"static": "best static k", "by_batch": "k-by-batch table", "adaptive": "goodput policy",
         "adaptive_steps": "SGLang adaptive steps",
         "adaptive_verification": "vLLM adaptive verification"}[c["winner"]]
        for c in summary["policies"]
    ]  # fmt: skip


def test_ties_go_to_the_simpler_policy_and_missing_runs_are_left_out():
    class Entry:
        load, best_k = 1.0, 2

        def __init__(self, table_e2e):
            self.table_e2e = table_e2e

        @property
        def best(self):
            return {"e2e_s": {"mean": 1.0}}

        def summary(self, config):
            runs = {"by_batch": {"e2e_s": {"mean": self.table_e2e}}, "k=0": {"e2e_s": {"mean": 2}}}
            return runs.get(config)

    # 1 % faster is inside the 2 % band: the static k still wins, and its margin says it trails.
    within, beyond = choices([Entry(0.99), Entry(0.97)], use_slo=False)
    assert (within["winner"], within["tied_with"]) == ("static", ["by_batch"])
    assert within["margin"] == pytest.approx(-0.01 / 0.99)
    assert set(within["figures"]) == {"static", "by_batch"}  # no adaptive runs: left out
    assert within["winner_beats_off"] is True
    assert (beyond["winner"], beyond["tied_with"]) == ("by_batch", [])
    assert beyond["margin"] == pytest.approx(0.03)


def test_sglangs_first_steps_are_a_candidate_within_the_sweep():
    assert initial_steps([0, 1, 3, 5, 7], 4) == 3
    assert initial_steps([0, 1, 3, 5, 7], 8) == 7
    assert parse_policies("adaptive_steps, adaptive_steps") == ("adaptive_steps",)
    assert parse_policies(None) == ()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "fastest"], "'fastest' is not a policy plan window adds"),
        # The profile's acceptance answers k up to 8; SGLang's default tiers reach 7, so a
        # tier of 9 steps is more than it can answer.
        (
            ["--policies", "adaptive_steps", "--set", "speculation.policy=adaptive_steps",
             "--set", "speculation.k=3", "--set",
             "speculation.adaptive_steps={tiers: [{min_batch: 1, candidate_steps: [3, 9]}]}"],
            "may choose 9 steps",
        ),
    ],
)  # fmt: skip
def test_bad_policies_are_refused_in_one_line(run, args, message, capsys, tmp_path):
    code = main(["plan", "window", str(run["scenario"]), *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "--policies" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
