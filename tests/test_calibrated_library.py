"""The library of profiles calibrated on published engine runs (``profiles/calibrated/``,
written by ``profiles/regenerate-calibrated.sh``).

Every shipped profile states where its runs come from, the engine and version, the fitted terms
and the error on the runs its fit never saw; its split runs are the deployment's published
table, its prior reproduces from its command. Reproducing a calibration means rerunning the fit
(a minute or more a deployment on 2 cores), so one deployment is rerun end to end: Qwen3-8B on
one H100, whose two closed-loop fit runs are the cheapest; the code path is the same for all.
"""

from __future__ import annotations

import csv
import hashlib
import shlex
from pathlib import Path

import pytest
import yaml

from specsim.cli import main
from specsim.profile import load_profile

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "profiles" / "calibrated"
RUNS = REPO / "tests" / "data" / "engine_runs"
# Described, but its roofline prior refuses the 32k-token run (the KV cache does not hold it:
# docs/notes/2026-12-02-fidelity-baseline.md), so nothing calibrates.
NOT_CALIBRATED: set[str] = set()
END_TO_END = "qwen3-8b_h100_vllm"


def deployments() -> dict[str, dict]:
    metas = {p.parent.name: yaml.safe_load(p.read_text()) for p in RUNS.glob("*/deployment.yaml")}
    return {name: meta for name, meta in sorted(metas.items()) if meta.get("describe")}


def shipped() -> list[Path]:
    return sorted(LIBRARY.glob("*.yaml"))


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def comparable(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    for key in ("date", "command"):
        data["provenance"].pop(key)
    for key in ("python", "numpy"):
        data["provenance"]["software"].pop(key)
    return data


def test_every_described_deployment_that_calibrates_is_shipped():
    assert {p.stem for p in shipped()} == set(deployments()) - NOT_CALIBRATED


@pytest.mark.parametrize("name", sorted(set(deployments()) - NOT_CALIBRATED))
def test_a_shipped_profile_states_its_runs_engine_terms_and_unseen_error(name):
    meta = deployments()[name]
    profile = load_profile(LIBRARY / f"{name}.yaml").profile
    assert profile.provenance.source == "calibrated"
    calibration = profile.provenance.calibration
    engine = f"{meta['engine']['name']} {meta['engine']['version']}"
    for stated in (engine, meta["source"]["url"], f"published {meta['source']['published']}"):
        assert stated in calibration.runs_source
    # The split is the published table: the fit runs as deployment.yaml names them, the rest
    # checked; the files are the ones the provenance hashed.
    folder = LIBRARY / "runs" / name
    fit, held = rows(folder / "fit" / "runs.csv"), rows(folder / "held-out" / "runs.csv")
    assert [r["label"] for r in fit] == [
        r["label"] for r in rows(RUNS / name / "runs.csv") if r["label"] in meta["describe"]["fit"]
    ]
    assert sorted(map(str, fit + held)) == sorted(map(str, rows(RUNS / name / "runs.csv")))
    (fit_file,) = calibration.files
    (held_file,) = calibration.checked.files
    for stated, path in ((fit_file, folder / "fit"), (held_file, folder / "held-out")):
        assert stated.path == str((path / "runs.csv").relative_to(REPO))
        assert stated.sha256 == hashlib.sha256((path / "runs.csv").read_bytes()).hexdigest()
    assert fit_file.engine_version == str(meta["engine"]["version"])
    assert calibration.checked.runs == [r["label"] for r in held]
    assert {"throughput_tokens_per_s", "tpot_s.mean"} <= set(calibration.checked.figures)
    assert {t.name for t in calibration.terms} >= {
        "target.decode",
        "target.prefill",
        "overhead.per_request_s",
    }
    # The command: the prior, the fit runs, the caps the deployment states, the check runs.
    argv = shlex.split(profile.provenance.command)
    assert argv[:3] == ["specsim", "profile", "from-bench"]
    assert argv[argv.index("--into") + 1] == calibration.prior
    assert argv[argv.index("--max-batch") + 1] == str(meta["describe"]["max_batch"])
    tokens = str(meta["describe"]["max_batched_tokens"])
    assert argv[argv.index("--max-batched-tokens") + 1] == tokens
    assert argv[argv.index("--check-runs") + 1] == held_file.path


def test_each_prior_reproduces_from_its_command(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    for path in sorted((LIBRARY / "priors").glob("*-roofline.yaml")):
        argv = shlex.split(yaml.safe_load(path.read_text())["provenance"]["command"])[1:]
        out = tmp_path / path.name
        argv[argv.index("--out") + 1] = str(out)
        assert main(argv) == 0
        assert comparable(out) == comparable(path), path.name


def test_one_calibration_reproduces_end_to_end_from_its_command(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = LIBRARY / f"{END_TO_END}.yaml"
    argv = shlex.split(yaml.safe_load(path.read_text())["provenance"]["command"])[1:]
    out = tmp_path / path.name
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv) == 0
    assert comparable(out) == comparable(path)


def test_the_readme_states_each_profiles_unseen_error():
    readme = (REPO / "profiles" / "README.md").read_text()
    for path in shipped():
        figures = load_profile(path).profile.provenance.calibration.checked.figures
        (row,) = [line for line in readme.splitlines() if f"`calibrated/{path.name}`" in line]
        for figure in ("throughput_tokens_per_s", "tpot_s.mean"):
            assert f"{figures[figure].median_abs_error:.0%}" in row, (path.name, figure)
