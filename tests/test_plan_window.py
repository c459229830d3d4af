"""``specsim plan window`` on the real simulator: the answer, the files, resume, bad input."""

from __future__ import annotations

import csv
import itertools
import json

import pytest
import yaml
from test_plan_support import PROFILE, write_scenario

from specsim.cli import main
from specsim.planning.window.window_table import E2E_TIE


@pytest.fixture(scope="module")
def window_run(tmp_path_factory, repo):
    """One run shared by the tests below: k 0..3 at a low, a middle and an overloading load.
    The shipped profile with a per-sequence cost of 10 us a step (the roofline's before its
    fitted 120 us, under which k = 2 still pays at 150 requests/s): the crossover then lies
    within these loads."""
    folder = tmp_path_factory.mktemp("window")
    data = yaml.safe_load((repo / PROFILE).read_text())
    data["overhead"]["per_sequence_s"] = 1e-5
    profile = folder / "profile.yaml"
    profile.write_text(yaml.safe_dump(data))
    scenario = write_scenario(folder, repo, profile=profile)
    out = folder / "out"
    args = [str(scenario), "--k", "0..3", "--loads", "2,60,150", "--workers", "2", "--no-progress"]
    code = main(["plan", "window", *args, "--out", str(out), "--json"])
    return {"code": code, "out": out, "args": args, "scenario": scenario}


@pytest.mark.slow
def test_speculation_wins_at_low_load_and_stops_paying_past_a_crossover(window_run):
    assert window_run["code"] == 0
    summary = json.loads((window_run["out"] / "summary.json").read_text())
    best = {item["load"]: item["best_k"] for item in summary["best_k"]}
    assert best[2.0] > 0
    assert best[150.0] == 0
    assert summary["crossover_load"] in (60.0, 150.0)
    assert summary["last_load_where_speculation_pays"] < summary["crossover_load"]
    first = summary["best_k"][0]
    assert first["e2e_speedup_vs_k0"] > 1.1  # speculation buys real latency at low load
    assert summary["chosen_by"] == "mean end-to-end latency"
    assert summary["failed"] == []


@pytest.mark.slow
def test_the_k_by_batch_table_is_pasteable_into_a_scenario_and_vllm(window_run):
    from specsim.scenario import load_scenario

    config = yaml.safe_load((window_run["out"] / "k_by_batch.yaml").read_text())
    rows = config["specsim"]["speculation"]["k_by_batch"]
    ranges = config["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 96
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    assert [r[2] for r in ranges] == [r["k"] for r in rows]
    table = json.dumps(rows).replace('"', "")
    scenario = load_scenario(
        window_run["scenario"], ["speculation.policy=by_batch", f"speculation.k_by_batch={table}"]
    )
    assert [r.k for r in scenario.speculation.k_by_batch] == [r["k"] for r in rows]
    summary = json.loads((window_run["out"] / "summary.json").read_text())
    assert summary["k_by_batch"]["num_speculative_tokens_per_batch_size"] == ranges
    assert summary["k_by_batch"]["rows"] == rows


def _sweep_e2e(out) -> dict[float, dict[str, float]]:
    """Mean E2E latency per load and config, from sweep.csv."""
    table: dict[float, dict[str, float]] = {}
    with open(out / "sweep.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            table.setdefault(float(row["arrival rate (req/s)"]), {})[row["config"]] = float(
                row["e2e mean (s)"]
            )
    return table


@pytest.mark.slow
def test_the_exported_table_never_loses_to_every_static_k(window_run):
    """Past the crossover (60 and 150 req/s, batches of 60-80) a table read off the best k per
    load has k = 0 rows at large batches with the drafter still deployed, and runs slower than
    every static k. Derived per batch size, it runs as fast as the best static k that keeps the
    drafter (within the verdict's tie band), at every load."""
    for load, runs in _sweep_e2e(window_run["out"]).items():
        static = {int(config[2:]): e2e for config, e2e in runs.items() if config.startswith("k=")}
        assert runs["by_batch"] < max(static.values()), load
        speculative = min(e2e for k, e2e in static.items() if k > 0)
        assert runs["by_batch"] <= speculative * (1 + E2E_TIE), load


@pytest.mark.slow
def test_the_summary_carries_the_verdict_with_the_comparison_at_every_load(window_run):
    from specsim.docs.outputs import K_BY_BATCH_KEYS, WINDOW_SUMMARY_KEYS

    summary = json.loads((window_run["out"] / "summary.json").read_text())
    # "screening" only when the grid was screened (tests/test_plan_screen.py).
    unscreened = [key for key in WINDOW_SUMMARY_KEYS if key not in ("simulations", "screening")]
    assert list(summary) == unscreened
    table = summary["k_by_batch"]
    assert list(table) == list(K_BY_BATCH_KEYS)
    assert table["verdict"] in ("recommended", "not recommended") and table["reason"]
    assert all(row["k"] > 0 for row in table["rows"])  # k = 0 is never a stand-in for "off"
    best = {item["load"]: item["best_k"] for item in summary["best_k"]}
    sweep = _sweep_e2e(window_run["out"])
    assert [item["load"] for item in table["per_load"]] == list(best)
    for item in table["per_load"]:
        load = item["load"]
        assert item["best_static"]["k"] == best[load]
        assert item["best_static"]["e2e_mean_s"] == sweep[load][f"k={best[load]}"]
        assert item["table"]["e2e_mean_s"] == sweep[load]["by_batch"]
        assert item["outcome"] in ("better", "equal", "worse")
        # Judged only below the crossover, where speculation still pays.
        assert item["judged"] == (load < summary["crossover_load"])
    judged = [item for item in table["per_load"] if item["judged"]]
    assert judged
    if table["verdict"] == "recommended":
        assert all(item["outcome"] in ("better", "equal") for item in judged)
    else:
        assert any(item["outcome"] == "worse" for item in judged)


@pytest.mark.slow
def test_past_the_crossover_the_report_says_turn_speculation_off(window_run, capsys):
    """k = 0 wins at 60 and 150 req/s and k = 3 at 2 req/s: the answer above 2 req/s is no
    drafter, which the report says in words instead of a table row with k = 0."""
    out = window_run["out"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["crossover_load"] == 60.0
    assert summary["k_by_batch"]["speculation_off_above_load"] == 2.0
    assert "above 2 req/s turn speculation off" in summary["k_by_batch"]["reason"]
    report = (out / "report.md").read_text()
    answer = report.split("## Answer", 1)[1].split("\n## ", 1)[0]
    assert "**Turn speculation off above 2 req/s**" in answer
    html = (out / "report.html").read_text()
    assert "Turn speculation off above 2 req/s" in html
    config = (out / "k_by_batch.yaml").read_text()
    assert config.startswith("# The k-by-batch table is ")
    assert "turn speculation off" in config.split("specsim:", 1)[0]
    capsys.readouterr()
    code = main(["plan", "window", *window_run["args"], "--out", str(out)])
    assert code == 0
    assert "turn speculation off above 2 req/s" in capsys.readouterr().out


@pytest.mark.slow
def test_what_the_best_k_makes_worse_than_speculation_off_is_stated(window_run, capsys):
    """Recomputed from the saved points: each metric the best k makes worse than k = 0 at a
    load where a k > 0 wins, in summary.json, the report's Answer and the terminal summary."""
    from specsim.comparison import compare, regressions

    out = window_run["out"]
    summary = json.loads((out / "summary.json").read_text())
    points = [json.loads(p.read_text()) for p in (out / "points").glob("*.json")]
    by = {(p["tags"]["load"], p["tags"]["config"]): p["summary"] for p in points}
    chosen = [item for item in summary["best_k"] if item["best_k"]]
    assert chosen  # k = 3 wins at 2 req/s
    expected = {}
    for item in chosen:
        best, off = by[(item["load"], f"k={item['best_k']}")], by[(item["load"], "k=0")]
        for change in regressions(compare(best, off)):
            expected.setdefault(change.metric, []).append(item["load"])
    stated = summary["regressions_vs_k0"]
    assert {e["metric"]: [b["load"] for b in e["by_load"]] for e in stated} == expected
    assert expected  # speculation's drafter prefill makes TTFT worse here
    assert all(e["loads_compared"] == len(chosen) for e in stated)
    report = (out / "report.md").read_text()
    answer = report.split("## Answer", 1)[1].split("\n## ", 1)[0]
    assert "Worse at the best k than with speculation off: " in answer
    first = stated[0]["label"]
    assert first in answer
    capsys.readouterr()
    assert main(["plan", "window", *window_run["args"], "--out", str(out)]) == 0
    assert f"Worse at the best k than with speculation off: {first}" in capsys.readouterr().out


@pytest.mark.slow
def test_report_files_and_every_plotted_number_as_csv(window_run):
    out = window_run["out"]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    assert "http://" not in html and "https://" not in html
    for name in ("e2e_vs_k", "tpot_vs_k", "ttft_vs_k", "throughput_vs_k", "best_k_vs_load"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert len((out / f"{name}.csv").read_text().splitlines()) > 3
    sweep = (out / "sweep.csv").read_text().splitlines()
    # 3 loads x (4 k + adaptive) + the k-by-batch check at each load (unless the table is all 0)
    assert len(sweep) - 1 in (15, 18)
    assert len(list((out / "points").glob("*.json"))) == len(sweep) - 1


@pytest.mark.slow
def test_rerun_resumes_everything_and_gives_identical_files(window_run, capsys):
    out = window_run["out"]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    code = main(["plan", "window", *window_run["args"], "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["simulations"]["computed"] == 0
    assert summary["simulations"]["cached"] > 0
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_an_output_folder_of_another_sweep_is_refused(window_run, capsys):
    scenario = str(window_run["scenario"])
    code = main(
        [
            "plan",
            "window",
            scenario,
            "--k",
            "0..3",
            "--loads",
            "2,60",
            "--no-progress",
            "--out",
            str(window_run["out"]),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different sweep" in err and "loads" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--loads", ","], "load list is empty"),
        (["--loads", "2", "-1"], "must be positive"),
        (["--k", "0..12"], "beyond what the profile can answer"),
        (["--set", "speculation.drafter=none_such"], "no drafter 'none_such'"),
        (["--cluster", "tcp://127.0.0.1:9"], "cannot reach a Dask scheduler"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, repo, capsys, extra, message):
    scenario = write_scenario(tmp_path, repo)
    out = tmp_path / "out"
    code = main(["plan", "window", str(scenario), "--no-progress", "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_scenario_without_a_drafter_has_no_k_to_choose(tmp_path, repo, capsys):
    scenario = write_scenario(tmp_path, repo, drafter=None)
    code = main(["plan", "window", str(scenario), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "speculation.drafter" in capsys.readouterr().err


@pytest.mark.slow
def test_the_same_plan_on_a_dask_cluster_writes_identical_files(window_run, tmp_path):
    from dask.distributed import LocalCluster

    out = tmp_path / "dask"
    args = [a for a in window_run["args"] if a not in ("--workers", "2")]
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        code = main(
            ["plan", "window", *args, "--cluster", cluster.scheduler_address, "--out", str(out)]
        )
    assert code == 0
    local = window_run["out"]
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    assert names == sorted(p.name for p in out.iterdir() if p.is_file())
    for name in names:
        assert (out / name).read_bytes() == (local / name).read_bytes(), name
