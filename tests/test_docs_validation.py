"""The validation guide's table is generated from the saved validation benchmark runs
(``specsim.docs.validation``): it matches the committed results file, goes stale when they
change, and a saved run joins the runs of its own code only."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from specsim import docs
from specsim.docs import validation
from specsim.errors import SpecsimError

ROOT = Path(__file__).resolve().parent.parent


PAGE = ROOT / "docs" / "guide" / "validate.md"


def table_block(page: str) -> str:
    start = page.index(validation.BEGIN) + len(validation.BEGIN)
    return page[start : page.index(validation.END)]


def test_the_guide_table_states_the_committed_results():
    assert validation.PAGE == PAGE
    assert validation.page_is_current(), f"run `python -m specsim.docs` and commit {PAGE.name}"
    results = json.loads(validation.RESULTS.read_text(encoding="utf-8"))
    block = table_block(PAGE.read_text(encoding="utf-8"))
    rows = {
        m.group(1): m.group(2).split(" | ")
        for m in re.finditer(r"^\| `([^`]+)` \| (.+) \|$", block, flags=re.MULTILINE)
    }
    # Every shipped validation scenario that benchmarks/bench_validation.py runs (all but the
    # tree ones, run by name), no other.
    scenarios = sorted(
        p.stem for p in (ROOT / "scenarios").glob("validate-*.yaml") if "tree" not in p.stem
    )
    assert sorted(rows) == scenarios
    for name, cells in rows.items():
        assert len(cells) == len(results["runs"])
        for cell, run in zip(cells, results["runs"], strict=True):
            figures = run["figures"][name]
            error = figures["relative_error"]["e2e_s.mean"]
            assert cell == f"{error * 100:+.1f} % {'✓' if figures['passed'] else '✗'}"
    # Neither the page nor the README states figures of its own outside the generated block.
    section = PAGE.read_text(encoding="utf-8").split(validation.BEGIN)[0]
    section += (ROOT / "README.md").read_text(encoding="utf-8")
    assert validation.BEGIN not in section
    assert "Three runs gave" not in section and "x0.93" not in section


def copies(tmp_path: Path) -> tuple[Path, Path]:
    page, results = tmp_path / "validate.md", tmp_path / "validation.json"
    shutil.copy(PAGE, page)
    shutil.copy(validation.RESULTS, results)
    return page, results


def test_a_changed_result_makes_the_table_stale_and_the_docs_command_rewrites_it(tmp_path):
    page, results = copies(tmp_path)
    data = json.loads(results.read_text(encoding="utf-8"))
    data["runs"][0]["figures"]["validate-b8-k0"]["relative_error"]["e2e_s.mean"] = 0.0423
    results.write_text(json.dumps(data), encoding="utf-8")
    assert not validation.page_is_current(page, results)
    where = [
        "--out",
        str(docs.DEFAULT_FOLDER),
        "--table-page",
        str(page),
        "--results",
        str(results),
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert docs.main(["--check", *where]) == 1
    assert "validation table" in out.getvalue()
    before = page.read_text(encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        assert docs.main(where) == 0
        assert docs.main(["--check", *where]) == 0
    after = page.read_text(encoding="utf-8")
    assert "| `validate-b8-k0` | +4.2 % ✓ |" in after
    # Only the block between the markers changed.
    assert after.split(validation.BEGIN)[0] == before.split(validation.BEGIN)[0]
    assert after.split(validation.END)[1] == before.split(validation.END)[1]


def test_a_page_without_its_markers_or_a_broken_results_file_is_a_one_line_error(tmp_path, capsys):
    page, results = copies(tmp_path)
    page.write_text("# Validate\n", encoding="utf-8")
    where = ["--out", str(tmp_path / "ref"), "--table-page", str(page), "--results", str(results)]
    assert docs.main(where) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "validation table block" in err and "fix:" in err
    shutil.copy(PAGE, page)
    data = json.loads(validation.RESULTS.read_text(encoding="utf-8"))
    results.write_text(json.dumps({**data, "runs": []}), encoding="utf-8")
    with pytest.raises(SpecsimError, match="runs: List should have at least 1 item"):
        validation.load_results(results)
    results.write_text("{not json", encoding="utf-8")
    with pytest.raises(SpecsimError, match="invalid JSON"):
        validation.load_results(results)


def bench_output(e2e: float, acceptance: float, measured: float, predicted: float) -> dict:
    """A run as bench_validation.py prints it (the keys the table reads, and others)."""
    scenario = {
        "passed": abs(e2e) <= 0.05,
        "relative_error": {"e2e_s.mean": e2e, "mean_acceptance_length": acceptance},
        "runs": 2,
    }
    return {
        "name": "validation",
        "figures": {
            "profiling_s": 600.0,
            "validate-b1-small-k4": scenario,
            "speculation_speedup_b8": {"measured": measured, "predicted": predicted},
        },
        "ratio": 0.5,
    }


def test_a_saved_run_joins_the_runs_of_its_code_and_replaces_other_code(tmp_path, monkeypatch):
    path = tmp_path / "validation.json"
    monkeypatch.setattr(validation, "_code_version", lambda: "abc123")
    validation.save_run(path, bench_output(0.01, -0.004, 1.5, 1.53), "bench --repeat 2", "CPU")
    saved = validation.save_run(
        path, bench_output(-0.07, 0.011, 1.5, 1.5), "bench --repeat 2", "CPU"
    )
    assert len(saved.runs) == 2 and saved.code == "abc123"
    text = validation.validation_table(validation.load_results(path))
    assert "| `validate-b1-small-k4` | +1.0 % ✓ | -7.0 % ✗ |" in text
    assert "| every threshold met | 1 of 1 | 0 of 1 |" in text
    # Acceptance and speed-up come from the runs' own figures when they hold them.
    assert "-0.4 % to +1.1 %" in text and "within 2.0 %" in text
    monkeypatch.setattr(validation, "_code_version", lambda: "def456")
    fresh = validation.save_run(path, bench_output(0.02, 0.0, 1.0, 1.0), "bench --repeat 2", "CPU")
    assert len(fresh.runs) == 1 and fresh.code == "def456"
