"""``specsim report drafter-swap`` on the simulator: side by side, recommendation, lossy notes."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser

import pytest
import yaml
from test_plan_support import PROFILE, write_scenario

from specsim.cli import main

DRAFTERS = ["--drafter", "llama3.2-1b", "--drafter", "ngram"]


@pytest.fixture(scope="module")
def swap_run(tmp_path_factory, repo):
    folder = tmp_path_factory.mktemp("swap")
    scenario = write_scenario(folder, repo, requests=300)
    out = folder / "out"
    code = main(
        [
            "report",
            "drafter-swap",
            str(scenario),
            *DRAFTERS,
            "--k",
            "0..3",
            "--loads",
            "2,20",
            "--workers",
            "2",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    return {"code": code, "out": out, "summary": json.loads((out / "summary.json").read_text())}


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.external = []
        self.images = 0

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("data:"):
                self.external.append(value)
            if name == "src" and value and value.startswith("data:image/png;base64,"):
                self.images += 1


@pytest.mark.slow
def test_side_by_side_report_with_a_reasoned_recommendation(swap_run):
    assert swap_run["code"] == 0
    summary = swap_run["summary"]
    names = [d["drafter"] for d in summary["drafters"]]
    assert names == ["llama3.2-1b", "ngram"]
    rec = summary["recommendation"]
    assert rec["drafter"] in names
    assert rec["reasons"][0].startswith(f"{rec['drafter']} is best at ")
    winners = [w["drafter"] for w in summary["winner_per_load"]]
    assert len(winners) == 2 and winners.count(rec["drafter"]) >= winners.count(
        next(n for n in names if n != rec["drafter"])
    )
    for drafter in summary["drafters"]:
        assert [b["load"] for b in drafter["best_k"]] == [2.0, 20.0]
        assert drafter["lossy"] is False
        lengths = drafter["mean_acceptance_length_by_k"]
        assert 1.0 < lengths["1"] < lengths["3"] <= 4.0
    # The 1B drafter accepts far more than prompt lookup on open-ended chat (profile: 0.74 vs
    # 0.45 at position 1, with lookup proposing on a minority of steps).
    by_name = {d["drafter"]: d for d in summary["drafters"]}
    assert (
        by_name["llama3.2-1b"]["mean_acceptance_length_by_k"]["3"]
        > by_name["ngram"]["mean_acceptance_length_by_k"]["3"]
    )


@pytest.mark.slow
def test_the_recommendation_states_what_is_worse_with_it(swap_run):
    """The recommended drafter's TTFT p99 against the other drafter's and speculation off's,
    load by load, recomputed from sweep.csv: every load where it is worse is in the
    recommendation's regressions, and its reasons say so in words."""
    summary = swap_run["summary"]
    rec = summary["recommendation"]
    best = rec["drafter"]
    other = next(d["drafter"] for d in summary["drafters"] if d["drafter"] != best)
    with open(swap_run["out"] / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    load_column = next(c for c in rows[0] if c not in ("drafter", "k") and "req/s" in c)
    ttft = {
        (r["drafter"], float(r[load_column]), int(r["k"])): float(r["TTFT p99 (s)"]) for r in rows
    }
    best_k = {d["drafter"]: {b["load"]: b["k"] for b in d["best_k"]} for d in summary["drafters"]}
    by_against = {item["against"]: item["metrics"] for item in rec["regressions"]}
    assert set(by_against) == {other, "speculation off"}
    found = 0
    for against in (other, "speculation off"):
        expected = {}
        for load in summary["loads"]:
            mine = ttft[(best, load, best_k[best][load])]
            theirs = (
                ttft[(other, load, best_k[other][load])]
                if against == other
                else ttft[(best, load, 0)]
            )
            if (mine - theirs) / theirs >= 0.005:
                expected[load] = (mine - theirs) / theirs
        entry = next((m for m in by_against[against] if m["metric"] == "ttft_s.p99"), None)
        if not expected:
            assert entry is None
            continue
        found += 1
        # sweep.csv rounds each figure to 6 significant digits (5e-6 relative), which moves a
        # ratio of two of them by at most ~1e-5 x (1 + worse_by).
        got = {x["load"]: x["worse_by"] for x in entry["by_load"]}
        assert got.keys() == expected.keys()
        assert all(got[x] == pytest.approx(expected[x], abs=2e-5) for x in got)
        than = "speculation off" if against == "speculation off" else other
        sentence = next(r for r in rec["reasons"] if r.startswith("Worse with") and than in r)
        assert "TTFT p99" in sentence and f"{entry['worse_by']['max']:.0%} higher" in sentence
    assert found  # the drafter's prompt pass makes TTFT worse somewhere in this sweep


@pytest.mark.slow
def test_report_is_self_contained_and_every_figure_has_its_numbers(swap_run):
    out = swap_run["out"]
    parser = _Links()
    parser.feed((out / "report.html").read_text())
    assert parser.external == [] and parser.images == 3
    for name in ("acceptance", "latency_vs_load", "throughput_waste_cost"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        rows = (out / f"{name}.csv").read_text().splitlines()
        assert rows[0] == "panel,series,x,y,x_unit,y_unit" and len(rows) > 4
    markdown = (out / "report.md").read_text()
    assert "## Recommendation" in markdown and "## Side by side" in markdown
    sweep = (out / "sweep.csv").read_text().splitlines()
    assert len(sweep) - 1 == 2 * 2 * 4  # drafters x loads x k


def _lossy_profile(tmp_path, repo, tv: float | None):
    data = yaml.safe_load((repo / PROFILE).read_text())
    for entry in data["acceptance"]:
        if entry["verifier"] == "typical" and tv is not None:
            entry["tv_distance"] = tv
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_lossy_verifier_is_flagged_next_to_its_speed_gain(tmp_path, repo):
    tv, expected = 0.031, "TV distance from p = 0.031"
    profile = _lossy_profile(tmp_path, repo, tv)
    scenario = write_scenario(tmp_path, repo, requests=150, verifier="typical")
    out = tmp_path / "out"
    code = main(
        [
            "report",
            "drafter-swap",
            str(scenario),
            *DRAFTERS,
            "--profile",
            str(profile),
            "--k",
            "0,2",
            "--loads",
            "2",
            "--workers",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert all(d["lossy"] for d in summary["drafters"])
    assert [d["tv_distance"] for d in summary["drafters"]] == [tv, tv]
    html = (out / "report.html").read_text()
    assert "LOSSY" in html and expected in html
    assert "median speed-up over k = 0" in html and "not the target" in html


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drafter", "llama3.2-1b"], "at least two different drafters"),
        (["--drafter", "ngram", "--drafter", "ngram"], "at least two different drafters"),
        (
            [*DRAFTERS, "--profile", "a.yaml", "--profile", "b.yaml", "--profile", "c.yaml"],
            "3 --profile options for 2 drafters",
        ),
        ([*DRAFTERS, "--profile", "missing.yaml"], "profile not found"),
        (["--drafter", "llama3.2-1b", "--drafter", "eagle"], "no drafter 'eagle'"),
        ([*DRAFTERS, "--loads", "0"], "must be positive"),
        ([*DRAFTERS, "--k", "0"], "nothing to compare"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, repo, capsys, extra, message):
    scenario = write_scenario(tmp_path, repo)
    code = main(["report", "drafter-swap", str(scenario), *extra, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_without_a_measured_distance_the_report_says_not_measured(tmp_path, repo):
    from specsim.planning.common import lossy_note
    from specsim.profile import load_profile
    from specsim.scenario import Speculation

    profile = load_profile(_lossy_profile(tmp_path, repo, None))
    typical = Speculation(drafter="llama3.2-1b", verifier="typical", temperature=1.0)
    note = lossy_note(profile, typical)
    assert "lossy" in note and "not measured" in note
    measured = load_profile(_lossy_profile(tmp_path, repo, 0.05))
    assert "TV distance from p = 0.05" in lossy_note(measured, typical)
    exact = Speculation(drafter="llama3.2-1b", verifier="rejection", temperature=1.0)
    assert lossy_note(profile, exact) is None
