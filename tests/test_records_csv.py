"""requests.csv through the csv module (names quoted), rows by request id, and names that would
break a CSV or run as a spreadsheet formula refused at load time."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.cli import main
from specsim.engine.records import ENGINE_COLUMNS, format_csv, read_engine_records
from specsim.errors import SpecsimError
from specsim.metrics import RECORD_COLUMNS
from specsim.profile import load_profile
from specsim.scenario import load_scenario
from specsim.simulation import records as sim_records
from specsim.simulation.records import RecordSink, read_records

DATA = Path(__file__).parent / "data"
TRICKY = ["a,b", 'say "hi"', "x;y z"]

SCENARIO = {
    "name": "csv-test",
    "seed": 3,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 40,
        "requests": 150,
        "prompt": {"dist": "uniform", "low": 20, "high": 200},
        "output": {"dist": "uniform", "low": 5, "high": 120},
    },
    "engine": {"max_batch": 8},
    "speculation": {"drafter": "c05", "k": 3},
    "fleet": {"pools": [{"name": name, "replicas": 1} for name in TRICKY]},
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name in ("sim_profile.yaml", "sim_sequences.txt"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_pool_names_with_commas_and_quotes_stay_one_cell_and_rows_go_by_id(workdir):
    out = workdir / "run"
    assert main(["simulate", str(_write(workdir / "s.yaml", SCENARIO)), "--out", str(out)]) == 0
    text = (out / "requests.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(text.splitlines()))
    assert tuple(rows[0]) == RECORD_COLUMNS
    assert {len(row) for row in rows} == {len(RECORD_COLUMNS)}
    assert {row[-1] for row in rows[1:]} == set(TRICKY)
    assert '"a,b"' in text and '"say ""hi"""' in text  # quoted as the csv module does
    ids = [int(row[0]) for row in rows[1:]]
    assert ids == list(range(150))
    finish = np.array([float(row[4]) for row in rows[1:]])
    assert np.any(np.diff(finish) < 0)  # in id order, which here is not the finish order
    back = read_records(out / "requests.csv")
    assert back["id"].tolist() == ids and set(back["pool"].tolist()) == set(TRICKY)


def test_the_sink_holds_only_rows_overtaken_by_later_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(sim_records, "FLUSH_ROWS", 4)
    sink = RecordSink(["p,q"], {}, tmp_path / "r.csv")
    held = []
    order = [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10]  # each pair finishes the wrong way round
    for rid in order:
        sink.add((rid, 0.0, 0.0, 0.5, 1.0 + rid, 10, 5, 2, 4, 2, 0, 0, 0))
        if not sink.rows:  # just flushed
            held.append(len(sink._waiting))
    sink.close()
    assert held == [0, 0, 0]
    ids = read_records(tmp_path / "r.csv")["id"].tolist()
    assert ids == sorted(order)


def test_engine_records_are_quoted_and_by_id(tmp_path):
    n = 5
    # Counts from 1 and EOS flags of 0/1, within what a real run's request holds.
    records = {name: np.arange(1, n + 1)[::-1].astype(np.int64) for name in ENGINE_COLUMNS}
    records["id"] = np.arange(n)[::-1].astype(np.int64)
    records["eos"] = np.arange(n)[::-1] % 2
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s"):
        records[name] = np.linspace(0.0, 1.0, n)
    records["target_logprob_mean"] = -np.linspace(0.0, 1.0, n)
    records["pool"] = np.asarray(["a,b"] * n)
    path = tmp_path / "requests.csv"
    path.write_text(format_csv(records), encoding="utf-8")
    back = read_engine_records(path)
    assert back["id"].tolist() == list(range(n))
    assert back["pool"].tolist() == ["a,b"] * n
    assert back["finish_s"].tolist() == pytest.approx(np.linspace(0.0, 1.0, n)[::-1].tolist())


BAD_NAMES = {
    "newline": ("a\nb", "control character"),
    "carriage return": ("a\rb", "control character"),
    "tab": ("a\tb", "control character"),
    "NUL": ("a\x00b", "control character"),
    "line separator": ("a\u2028b", "control character"),
    "formula": ('=HYPERLINK("http://x")', "formula"),
    "plus": ("+1", "formula"),
    "at": ("@SUM(A1)", "formula"),
}


@pytest.mark.parametrize("case", list(BAD_NAMES))
@pytest.mark.parametrize("where", ["pool", "scenario", "drafter"])
def test_names_that_break_a_csv_are_refused_at_load(workdir, where, case):
    name, expected = BAD_NAMES[case]
    data = yaml.safe_load(yaml.safe_dump(SCENARIO))
    if where == "pool":
        data["fleet"]["pools"][1]["name"] = name
        key = "fleet.pools[1].name"
    elif where == "scenario":
        data["name"] = name
        key = "name"
    else:
        data["speculation"]["drafter"] = name
        key = "speculation.drafter"
    with pytest.raises(SpecsimError) as info:
        load_scenario(_write(workdir / "s.yaml", data))
    line = info.value.one_line()
    assert "\n" not in line and f": {key}: " in line and expected in line and "fix:" in line


@pytest.mark.parametrize("where", ["profile name", "drafter key", "hardware name"])
def test_profile_names_that_break_a_csv_are_refused_at_load(workdir, where):
    data = yaml.safe_load((DATA / "sim_profile.yaml").read_text(encoding="utf-8"))
    if where == "profile name":
        data["name"] = "x\ny"
    elif where == "hardware name":
        data["hardware"]["name"] = "=cmd"
    else:
        data["drafters"]["=c99"] = data["drafters"]["c05"]
    with pytest.raises(SpecsimError, match=r"control character|formula") as info:
        load_profile(_write(workdir / "p.yaml", data))
    assert "\n" not in info.value.one_line()


def test_ordinary_names_still_load(workdir):
    data = yaml.safe_load(yaml.safe_dump(SCENARIO))
    data["name"] = "chat k-3 (v2), 8 × H100"
    scenario = load_scenario(_write(workdir / "s.yaml", data))
    assert scenario.name == data["name"]
    assert [p.name for p in scenario.fleet.pools] == TRICKY


@pytest.mark.parametrize(
    ("args", "option"),
    [(["--name", "a\tb"], "--name"), (["--name", "a/b"], "--name"), ([], "--out")],
)
def test_a_profile_name_that_reaches_a_file_name_is_checked_first(tmp_path, capsys, args, option):
    out = tmp_path / ("=p.yaml" if option == "--out" else "profiles")
    argv = ["profile", "roofline", "--hardware", "missing.yaml", "--target", "missing.json"]
    assert main([*argv, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{option}: name " in err and "fix:" in err
    assert list(tmp_path.iterdir()) == []
