"""The Python API: results equal the CLI's files, overrides are the CLI's ``--set``, run
folders read back, and ``import specsim`` stays cheap."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import specsim
from specsim.api.overrides import override_texts, value_text
from specsim.api.results import read_table
from specsim.cli import main
from specsim.config import parse_override
from specsim.errors import SpecsimError
from specsim.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
POISSON = REPO / "scenarios" / "poisson.yaml"


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes (a sweep point's
    ``cpu_s`` left out: it is measured, the one value that differs between reruns)."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.parent.name == "points":
            record = json.loads(data)
            assert record.pop("cpu_s") >= 0.0
            data = json.dumps(record).encode()
        found[str(path.relative_to(folder))] = data
    return found


def cli(*args: str) -> None:
    assert main([*args]) == 0


# -- the lazy import -------------------------------------------------------------------------


def test_import_specsim_loads_no_heavy_library_until_the_api_is_used():
    code = (
        "import sys, specsim\n"
        "heavy = ('numpy', 'pandas', 'simpy', 'scipy', 'pydantic', 'yaml', 'matplotlib', 'torch')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "assert 'simulate' in dir(specsim) and callable(specsim.simulate)\n"
        "print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))\n"
        "from specsim.api.results import read_table\n"
        "read_table('a\\n1\\n')\n"
        "print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    # The API loads on first use, pandas only when a table is made (the commands make none),
    # and never torch.
    assert out == ["[]", "[]", "['pandas']"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        specsim.simulat  # noqa: B018


# -- simulate against specsim simulate ----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_simulate_holds_and_saves_what_the_cli_writes(scenario, tmp_path):
    cli("simulate", str(scenario), "--out", str(tmp_path / "cli"))
    result = specsim.simulate(scenario)
    result.save(tmp_path / "api")
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    written = tmp_path / "cli"
    assert result.summary == json.loads((written / "summary.json").read_text())
    pd.testing.assert_frame_equal(result.requests, pd.read_csv(written / "requests.csv"))


@pytest.mark.parametrize(
    "names", [["a,b", 'say "hi"', "x;y z"], ["1", "NA"]], ids=["quoted", "numeric"]
)
def test_pool_names_stay_names_and_are_saved_as_the_cli_writes_them(names, tmp_path):
    import shutil

    import yaml
    from test_records_csv import DATA, SCENARIO

    for name in ("sim_profile.yaml", "sim_sequences.txt"):
        shutil.copy(DATA / name, tmp_path / name)
    data = {**SCENARIO, "fleet": {"pools": [{"name": n, "replicas": 1} for n in names]}}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data), encoding="utf-8")
    cli("simulate", str(scenario), "--out", str(tmp_path / "cli"))
    result = specsim.simulate(scenario)
    assert sorted(result.requests["pool"].unique()) == sorted(names)  # not 1 and NaN
    result.save(tmp_path / "api")
    assert files(tmp_path / "api") == files(tmp_path / "cli")


@pytest.mark.parametrize(
    ("keywords", "sets", "flags"),
    [
        ({"speculation__k": 3, "workload__rate": 8}, ["speculation.k=3", "workload.rate=8"], []),
        ({"speculation.k": 2, "seed": 5}, ["speculation.k=2", "seed=5"], []),
        ({"speculation__verifier": "typical"}, ["speculation.verifier=typical"], []),
        ({"compare_baseline": True}, [], ["--compare-baseline"]),
    ],
    ids=["double-underscore", "dotted-key", "string", "baseline"],
)
def test_keyword_overrides_are_the_clis_set(keywords, sets, flags, tmp_path):
    sets = [arg for text in sets for arg in ("--set", text)]
    cli("simulate", str(POISSON), *sets, *flags, "--out", str(tmp_path / "cli"))
    specsim.simulate(POISSON, out=tmp_path / "api", **keywords)
    assert files(tmp_path / "api") == files(tmp_path / "cli")


def test_a_list_item_is_overridden_by_its_index(tmp_path):
    scenario = REPO / "scenarios" / "drafter_swap.yaml"
    cli("simulate", str(scenario), "--set", "fleet.pools.1.speculation.k=2", "--out", str(tmp_path))
    result = specsim.simulate(scenario, fleet__pools__1__speculation__k=2)
    assert result.summary == json.loads((tmp_path / "summary.json").read_text())
    assert [pool["k"] for pool in result.summary["pools"].values()][1] == 2


def test_a_loaded_scenario_runs_as_its_file_does():
    scenario = load_scenario(POISSON)
    by_object = specsim.simulate(scenario, speculation__k=1)
    assert by_object.summary == specsim.simulate(POISSON, speculation__k=1).summary
    assert scenario.speculation.k == 4  # the caller's object is left as it was


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_overriding_a_loaded_scenario_keeps_everything_else(scenario):
    from specsim.api.simulate import load

    loaded = load_scenario(scenario)
    again = load(loaded, ["seed=7"])
    assert again.source == loaded.source and again.seed == 7
    assert again.model_copy(update={"seed": loaded.seed}) == loaded


@pytest.mark.parametrize(
    ("keywords", "sets"),
    [
        ({"speculation__kk": 2}, ["speculation.kk=2"]),
        ({"speculation__k": "three"}, ["speculation.k=three"]),
        ({"workload__rate": -1}, ["workload.rate=-1"]),
        ({"fleet__pools__0__replicas": 2}, ["fleet.pools.0.replicas=2"]),
        ({"speculation__k__x": 1}, ["speculation.k.x=1"]),
    ],
    ids=["unknown-key", "wrong-type", "out-of-bounds", "no-such-item", "value-not-section"],
)
def test_a_bad_override_is_the_clis_one_line_error(keywords, sets, tmp_path, capsys):
    sets = [arg for text in sets for arg in ("--set", text)]
    assert main(["simulate", str(POISSON), *sets, "--out", str(tmp_path / "cli")]) == 2
    line = capsys.readouterr().err
    with pytest.raises(SpecsimError) as info:
        specsim.simulate(POISSON, **keywords)
    assert line == f"specsim simulate: error: {info.value.one_line()}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_value_yaml_cannot_hold_is_refused_by_its_key():
    with pytest.raises(SpecsimError, match=r"overrides: speculation.k: cannot pass a object"):
        specsim.simulate(POISSON, speculation__k=object())


@pytest.mark.parametrize(
    "value",
    [
        3,
        -2,
        0.5,
        1e-05,
        1e20,
        -0.0,
        True,
        None,
        "rejection",
        "3",
        "yes",
        "",
        "a #b",
        " padded ",
        "two\nlines",
        "x: y",
        "[1]",
        "naïve",
        [1, "a", None],
        (0.25, 2),
        {"dist": "fixed", "value": 100},
        np.int64(3),
        np.float64(0.25),
        np.arange(3),
        Path("profiles/x.yaml"),
    ],
)
def test_a_value_reads_back_as_itself_through_the_set_parser(value):
    path, back = parse_override(f"a.b={value_text(value)}")
    assert path == ["a", "b"]
    expected = value.tolist() if hasattr(value, "tolist") else value
    expected = str(expected) if isinstance(expected, Path) else expected
    expected = list(expected) if isinstance(expected, tuple) else expected
    assert back == expected and type(back) is type(expected)


def test_plain_values_are_written_as_a_command_line_writes_them():
    texts = override_texts({"speculation__k": 3, "speculation__verifier": "greedy", "x": 0.1})
    assert texts == ["speculation.k=3", "speculation.verifier=greedy", "x=0.1"]
    assert math.isnan(parse_override(f"x={value_text(float('nan'))}")[1])
    assert parse_override(f"x={value_text(float('-inf'))}")[1] == float("-inf")


# -- plans against specsim plan / report ----------------------------------------------------------

SHORT = ("--set", "workload.duration_s=20")


@pytest.mark.slow
def test_plan_window_writes_what_the_cli_writes_and_reads_back(tmp_path):
    cli("plan", "window", str(POISSON), "--k", "0..2", "--loads", "2", "8", *SHORT,
        "--workers", "1", "--no-progress", "--out", str(tmp_path / "cli"))  # fmt: skip
    kept = specsim.plan_window(
        POISSON, k="0..2", loads=[2, 8], workers=1, progress=False, out=tmp_path / "api",
        workload__duration_s=20,
    )  # fmt: skip
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    assert kept.simulations == {"computed": 10, "cached": 0}  # 2 loads x (3 k, adaptive, table)
    again = specsim.plan_window(
        POISSON, k="0..2", loads=[2, 8], workers=1, out=tmp_path / "api", workload__duration_s=20
    )
    assert again.simulations == {"computed": 0, "cached": 10}  # resumed from out/points
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    in_memory = specsim.plan_window(
        POISSON, k=[0, 1, 2], loads=(2.0, 8.0), workers=1, workload__duration_s=20
    )
    assert in_memory.out is None
    for result in (kept, in_memory, specsim.load_run(tmp_path / "cli")):
        assert result.summary == json.loads((tmp_path / "cli" / "summary.json").read_text())
        tables = {"sweep", "best_k", "policies", "k_by_batch", "k_by_batch_check"}
        assert set(result.tables) == tables
        for name, frame in [*result.tables.items(), *result.figures.items()]:
            csv = (tmp_path / "cli" / f"{name}.csv").read_text()
            pd.testing.assert_frame_equal(frame, read_table(csv))
        assert result.attachments == {
            "k_by_batch.yaml": (tmp_path / "cli" / "k_by_batch.yaml").read_text()
        }
    sweep = kept.tables["sweep"]
    assert len(sweep) == 10 and sweep["e2e mean (s)"].dtype == np.float64
    assert set(kept.figures) == {p.stem for p in (tmp_path / "cli").glob("*.png")}


@pytest.mark.slow
def test_plan_capacity_writes_what_the_cli_writes(tmp_path):
    options = ("--target-rps", "12", "--k", "2", "--tolerance", "0.2", "--workers", "1")
    cli("plan", "capacity", str(POISSON), *options, *SHORT, "--no-progress",
        "--out", str(tmp_path / "cli"))  # fmt: skip
    result = specsim.plan_capacity(
        POISSON, target_rps=12, k=2, tolerance=0.2, workers=1, progress=False,
        out=tmp_path / "api", workload__duration_s=20,
    )  # fmt: skip
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    assert result.command == "plan capacity" and not result.failed
    assert {"capacity", "fleet"} <= set(result.tables)


@pytest.mark.slow
def test_drafter_swap_writes_what_the_cli_writes(tmp_path):
    cli("report", "drafter-swap", str(POISSON), "--drafter", "llama3.2-1b", "--drafter",
        "ngram", "--k", "0,2", "--loads", "4", *SHORT, "--workers", "1", "--no-progress",
        "--out", str(tmp_path / "cli"))  # fmt: skip
    result = specsim.drafter_swap(
        POISSON, drafters=["llama3.2-1b", "ngram"], k="0,2", loads=4, workers=1,
        progress=False, out=tmp_path / "api", workload__duration_s=20,
    )  # fmt: skip
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    assert result.summary["recommendation"]["drafter"] in ("llama3.2-1b", "ngram")
    assert set(result.tables) == {"drafters", "acceptance_per_position", "per_load", "sweep"}


def test_plan_options_are_checked_as_the_clis_are(tmp_path):
    with pytest.raises(SpecsimError, match=r"^k: cannot read 'x' as k values"):
        specsim.plan_window(POISSON, k="0,x")
    with pytest.raises(SpecsimError, match=r"^loads: load -1 must be positive"):
        specsim.plan_window(POISSON, loads=[2, -1])
    with pytest.raises(SpecsimError, match=r"speculation.kk: Extra inputs are not permitted"):
        specsim.plan_window(POISSON, speculation__kk=1)
    with pytest.raises(TypeError, match="needs the scenario's file"):
        specsim.plan_window(load_scenario(POISSON))
    with pytest.raises(SpecsimError, match=r"out: output path exists and is not a folder"):
        (tmp_path / "file").write_text("x")
        specsim.plan_window(POISSON, out=tmp_path / "file")


@pytest.mark.parametrize("entry", ["plan_capacity", "plan_disaggregated"])
def test_both_capacity_entries_set_up_their_run_alike(tmp_path, entry):
    """The co-located and the disaggregated entry share their set-up: the same refusals of a
    scenario that is not a file and of an out that is not a folder, before anything runs."""
    plan = getattr(specsim, entry)
    with pytest.raises(TypeError) as error:
        plan(load_scenario(POISSON), target_rps=5)
    assert str(error.value) == (
        "a plan needs the scenario's file, which its simulations load (in worker processes "
        "too), not a Scenario: pass the path, and changes as overrides"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpecsimError) as error:
        plan(POISSON, target_rps=5, out=tmp_path / "file")
    assert str(error.value) == (
        f"{tmp_path / 'file'}: out: output path exists and is not a folder; fix: choose another "
        "out, or remove that file"
    )
    assert (tmp_path / "file").read_text() == "x"


# -- load_run -------------------------------------------------------------------------------------


def test_a_simulation_folder_reads_back_into_an_equal_result(tmp_path):
    result = specsim.simulate(POISSON, out=tmp_path / "run", workload__duration_s=30)
    back = specsim.load_run(tmp_path / "run")
    assert isinstance(back, specsim.Result)
    assert back.summary == result.summary
    pd.testing.assert_frame_equal(back.requests, result.requests)
    back.save(tmp_path / "again")
    assert files(tmp_path / "again") == files(tmp_path / "run")


def test_a_validation_folder_reads_back_with_both_runs(tmp_path):
    from bad_input_bases import engine_run

    folder = tmp_path / "validate"
    engine_run(folder / "engine", shift=0.0)
    (folder / "engine" / "summary.json").write_text('{"requests": 10}\n')
    (folder / "engine" / "iterations.csv").write_text("kind,window,batch\ndecode,2,1\n")
    specsim.simulate(POISSON, out=folder / "simulation", workload__duration_s=10)
    rows = [{"metric": "e2e_s.mean", "measured": 1.0, "predicted": 1.02, "ok": True}]
    (folder / "comparison.json").write_text(json.dumps({"passed": True, "rows": rows}))
    run = specsim.load_run(folder)
    assert isinstance(run, specsim.ValidationRun) and run.passed
    assert run.metrics.to_dict("records") == rows
    assert run.engine.requests["target_logprob_mean"].dtype == np.float64
    assert run.engine.requests["eos"].tolist() == [0, 1] * 5
    assert run.iterations["kind"].tolist() == ["decode"]
    assert run.simulation.summary["scenario"]["name"] == "poisson"
    run.engine.save(tmp_path / "engine-again")  # the engine's columns in the engine's format
    assert (tmp_path / "engine-again" / "requests.csv").read_bytes() == (
        folder / "engine" / "requests.csv"
    ).read_bytes()


@pytest.mark.parametrize("case", ["missing", "empty", "bad-json", "bad-csv"])
def test_a_folder_that_is_no_run_is_a_one_line_error(tmp_path, case):
    folder = tmp_path / "run"
    if case != "missing":
        folder.mkdir()
    if case == "bad-json":
        (folder / "summary.json").write_text("{not json")
    if case == "bad-csv":
        (folder / "summary.json").write_text("{}")
        (folder / "requests.csv").write_text('id,arrival_s\n1,"0.5\n2,1\n3,4,5\n')
    with pytest.raises(SpecsimError) as info:
        specsim.load_run(folder)
    assert "\n" not in info.value.one_line() and str(folder) in info.value.one_line()


# -- documentation ---------------------------------------------------------------------------------


def test_the_lazy_names_are_the_apis_and_the_reference_page_covers_them():
    from specsim.docs.api import api_page

    assert sorted(specsim.API) == sorted(specsim.api.__all__)
    page = api_page()
    assert all(f"### `specsim.{name}" in page for name in specsim.api.__all__)


def test_help_specsim_lists_the_api():
    import pydoc

    text = pydoc.render_doc(specsim, renderer=pydoc.plaintext)
    functions = text.split("\nFUNCTIONS\n", 1)[1]
    for name in specsim.API:
        section = functions if name[0].islower() else text.split("\nCLASSES\n", 1)[1]
        assert f"\n    {name}(" in section or f"class {name}(" in section, name
    assert "``.requests``: requests.csv as a pandas DataFrame" in text


def test_the_guide_example_runs(tmp_path, monkeypatch):
    page = (REPO / "docs" / "guide" / "python.md").read_text(encoding="utf-8")
    (example,) = page.split("```python\n")[1:]
    for name in ("scenarios", "profiles"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    exec(example.split("```")[0], {})
    assert specsim.load_run("runs/k3").summary["scenario"]["k"] == 3
