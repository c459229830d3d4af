"""``specsim plan window`` on the real simulator: the answer, the files, resume, bad input."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml
from test_plan_support import write_scenario

from specsim.cli import main


@pytest.fixture(scope="module")
def window_run(tmp_path_factory, repo):
    """One run shared by the tests below: k 0..3 at a low, a middle and an overloading load."""
    folder = tmp_path_factory.mktemp("window")
    scenario = write_scenario(folder, repo)
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
    assert summary["num_speculative_tokens_per_batch_size"] == ranges


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
