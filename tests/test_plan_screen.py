"""Screen, then confirm (``specsim.planning.sweep.screen``): the pruning rule, and a screened
``plan window`` that finds the exhaustive sweep's winners while simulating less."""

from __future__ import annotations

import json
import math

import pytest
from test_plan_support import write_scenario

from specsim.cli import main
from specsim.planning.sweep.screen import (
    MARGIN,
    SCREEN_FROM,
    Figures,
    Margin,
    cannot_win,
    ranking_errors,
)
from specsim.planning.sweep.sweeper import Sweeper
from specsim.planning.window import window

BEST = Figures(e2e=1.0, goodput=10.0, served=10.0, met=True, trusted=True, ceiling=10.02)


def figures(e2e=1.0, goodput=10.0, met=True, trusted=True, ceiling=10.02) -> Figures:
    return Figures(e2e, goodput, 10.0, met, trusted, ceiling)


def test_without_an_slo_a_config_slower_by_more_than_the_margin_is_pruned():
    slower = math.exp(MARGIN.e2e) * 1.01
    assert cannot_win(figures(e2e=slower), BEST, BEST, use_slo=False, margin=MARGIN)
    within = math.exp(MARGIN.e2e) * 0.999
    assert cannot_win(figures(e2e=within), BEST, BEST, use_slo=False, margin=MARGIN) is None
    faster = 0.5
    assert cannot_win(figures(e2e=faster), BEST, BEST, use_slo=False, margin=MARGIN) is None


def test_an_estimate_outside_the_trusted_regime_never_prunes_nor_is_pruned():
    slow = figures(e2e=10.0)
    assert cannot_win(figures(e2e=10.0, trusted=False), BEST, BEST, False, MARGIN) is None
    untrusted_best = figures(trusted=False)
    assert cannot_win(slow, untrusted_best, BEST, False, MARGIN) is None


def test_with_an_slo_slower_is_pruned_only_when_its_goodput_cannot_rise_above_the_band():
    slow = figures(e2e=2.0)
    # Ceiling 10.02 req/s is inside the best's 1 % band (10 + 0.1): it cannot win on goodput.
    assert "cannot rise" in cannot_win(slow, BEST, BEST, True, MARGIN)
    # A closed loop has no ceiling and the goodput ratio's margin spans the band: kept.
    assert cannot_win(figures(e2e=2.0, ceiling=None), BEST, BEST, True, MARGIN) is None
    # Estimated to miss the SLO for some requests: no goodput margin is trusted, only the ceiling.
    missing = figures(e2e=2.0, goodput=9.0, met=False, ceiling=20.0)
    assert cannot_win(missing, BEST, BEST, True, MARGIN) is None


def test_with_an_slo_a_goodput_below_the_tie_band_is_pruned_even_when_faster():
    low = figures(e2e=0.5, goodput=8.0)
    reason = cannot_win(low, BEST, BEST, True, MARGIN)
    assert reason is not None and "below its tie band" in reason


def test_ranking_errors_measure_the_worst_pair_and_the_widest_reversed_gap():
    def row(config, est, sim, peak=0.1):
        return {
            "scenario": "s",
            "load": 1.0,
            "config": config,
            "use_slo": False,
            "estimate": {"e2e_mean_s": est, "peak_utilisation": peak},
            "simulated": {"e2e_mean_s": sim},
        }

    # b is estimated 1 % slower than a but simulates faster; c is past the trusted utilisation.
    rows = [row("a", 1.0, 1.0), row("b", 1.01, 0.99), row("d", 2.0, 1.5), row("c", 9.0, 1.0, 0.95)]
    errors = ranking_errors(rows)
    assert errors["pairs"] == 6 and errors["pairs_not_trusted"] == 6
    e2e = errors["e2e"]
    assert e2e["worst_log_ratio_error"] == pytest.approx(math.log(2.0 / 1.5))  # d against a
    assert e2e["pairs_ordered_wrongly"] == 1
    assert e2e["widest_reversed_log_gap"] == pytest.approx(math.log(1.01))
    assert e2e["widest_reversed_at"]["configs"] == ["b", "a"]


def test_the_cli_states_the_same_screening_threshold():
    from specsim.cli import plan

    assert plan.SCREEN_FROM == SCREEN_FROM


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, repo):
    """k 0..8 at two loads below saturation (300 requests each, seed 11), with and without an
    SLO, screened and exhaustive: 4 x 20 simulations of a fraction of a second each."""
    folder = tmp_path_factory.mktemp("screen")
    outcome = {}
    for use_slo in (False, True):
        slo = {"ttft_s": 2.0, "tpot_s": 0.05} if use_slo else None
        (folder / f"slo{use_slo}").mkdir()
        scenario = write_scenario(folder / f"slo{use_slo}", repo, slo=slo, requests=300)
        for screen in (False, True):
            plan = window.prepare(str(scenario), [], list(range(9)), [1.0, 4.0], None, screen)
            out = folder / f"out-{use_slo}-{screen}"
            with Sweeper(out, plan.identity(), progress=False, workers=2) as sweeper:
                run = window.run(plan, sweeper)
                outcome[use_slo, screen] = (window.json_summary(plan, run, sweeper), out)
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("use_slo", [False, True])
def test_the_screened_sweep_finds_the_exhaustive_winners_and_says_what_it_pruned(sweeps, use_slo):
    exhaustive, _ = sweeps[use_slo, False]
    screened, out = sweeps[use_slo, True]
    assert [b["best_k"] for b in screened["best_k"]] == [b["best_k"] for b in exhaustive["best_k"]]
    assert screened["best_k"] == exhaustive["best_k"]
    assert screened["k_by_batch"] == exhaustive["k_by_batch"]
    assert "screening" not in exhaustive
    from specsim.docs.outputs import WINDOW_SUMMARY_KEYS

    assert list(screened) == list(WINDOW_SUMMARY_KEYS)  # every key documented, in order
    report = screened["screening"]
    assert report["configurations"] == 2 * 10  # k 0..8 and the adaptive policy at 2 loads
    assert report["pruned"] == len(report["pruned_configurations"]) > 0
    assert report["simulated"] + report["pruned"] == report["configurations"]
    assert screened["simulations"]["computed"] < exhaustive["simulations"]["computed"]
    assert report["margin"] == MARGIN.json()
    # Only what was simulated is on disk: the grid's points and the k-by-batch check's.
    stored = [p for p in (out / "points").glob("*.json") if not p.name.endswith("failed.json")]
    assert len(stored) == screened["simulations"]["computed"]
    for item in report["pruned_configurations"]:
        assert item["config"] not in ("k=0", "adaptive")  # always simulated
        best = next(b for b in exhaustive["best_k"] if b["load"] == item["group"])
        assert item["config"] != f"k={best['best_k']}"
        assert item["beaten_by"].startswith("k=") and item["reason"]


def test_default_grids_are_not_screened(repo, tmp_path):
    scenario = write_scenario(tmp_path, repo)
    plan = window.prepare(str(scenario), [], None, None, None)
    assert len(plan.grid()) <= SCREEN_FROM and not plan.screen
    many = window.prepare(str(scenario), [], None, [float(r) for r in range(1, 30)], None)
    assert len(many.grid()) > SCREEN_FROM and many.screen
    forced = window.prepare(str(scenario), [], None, [float(r) for r in range(1, 30)], None, False)
    assert not forced.screen


@pytest.mark.slow
def test_the_cli_screens_on_request_and_states_it(repo, tmp_path, capsys):
    scenario = write_scenario(tmp_path, repo, requests=200)
    out = tmp_path / "out"
    args = ["plan", "window", str(scenario), "--k", "0..8", "--loads", "2", "--workers", "1"]
    code = main([*args, "--screen", "--no-progress", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert f"screened: {summary['screening']['pruned']} of 10 points pruned" in printed
    assert "Screened:" in (out / "report.md").read_text()


def test_screen_and_exhaustive_exclude_each_other(repo, tmp_path, capsys):
    scenario = write_scenario(tmp_path, repo)
    args = ["plan", "window", str(scenario), "--screen", "--exhaustive", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_without_a_margin_more_is_pruned():
    """The margin is what keeps pruning safe: with none, a config estimated 0.5 % slower goes."""
    slower = figures(e2e=1.005)
    assert cannot_win(slower, BEST, BEST, False, Margin(e2e=0.0, goodput_met=0.0))
    assert cannot_win(slower, BEST, BEST, False, MARGIN) is None
