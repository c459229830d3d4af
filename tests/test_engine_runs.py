"""The public engine runs bundled under tests/data/engine_runs/ and the hardware files: every
table parses with the project's own reader, every deployment names files that exist, and every
hardware file loads with datasheet numbers that hang together."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specsim.hardware import load_hardware
from specsim.serving.detect import read_bench_files

REPO = Path(__file__).resolve().parent.parent
HARDWARE = sorted((REPO / "profiles" / "hardware").glob("*.yaml"))


@pytest.mark.parametrize("path", HARDWARE, ids=lambda p: p.stem)
def test_hardware_file_loads_with_consistent_datasheet_numbers(path):
    hw = load_hardware(path)
    assert hw.source, f"{path.name} names no source for its numbers"
    # every tensor core of these generations doubles its rate from BF16 to FP8
    if hw.peak_flops_fp8 is not None:
        assert hw.peak_flops_fp8 == pytest.approx(2 * hw.peak_flops, rel=0.03)
    # BF16 FLOP per byte of bandwidth: 37 on the compute-capped H20, 150-420 on the others; a
    # slip of a thousand in either figure lands far outside
    assert 30 < hw.peak_flops / hw.memory_bandwidth_bytes_per_s < 500
    link = hw.nvlink or hw.pcie
    assert link is not None and link.bandwidth_bytes_per_s < hw.memory_bandwidth_bytes_per_s


def test_the_devices_the_issue_names_have_files():
    names = {p.stem for p in HARDWARE}
    wanted = {"b200", "gb200", "gb300", "mi300x", "mi355x", "h20", "rtx-pro-6000", "l40s"}
    assert wanted <= names


RUNS = REPO / "tests" / "data" / "engine_runs"
DEPLOYMENTS = sorted(p.parent for p in RUNS.glob("*/deployment.yaml"))


def test_at_least_five_deployments_are_bundled_and_five_described():
    described = [
        d for d in DEPLOYMENTS if yaml.safe_load((d / "deployment.yaml").read_text())["describe"]
    ]
    assert len(DEPLOYMENTS) >= 5 and len(described) >= 5


@pytest.mark.parametrize("folder", DEPLOYMENTS, ids=lambda p: p.name)
def test_deployment_table_parses_and_its_description_resolves(folder):
    meta = yaml.safe_load((folder / "deployment.yaml").read_text())
    source = meta["source"]
    assert source["licence"] and len(source["commit"]) == 40
    assert source["url"].startswith("https://")
    table = folder / "runs.csv"
    runs = read_bench_files([table]) if table.exists() else []
    if not meta["describe"]:
        assert meta["not_described"].strip()
        return
    describe = meta["describe"]
    assert (REPO / describe["hardware"]).is_file() and (REPO / describe["model"]).is_file()
    labels = [run.label for run in runs]
    # some runs fitted, at least one held out, and every run one of this engine's
    assert set(describe["fit"]) < set(labels)
    name = meta["engine"]["name"]
    assert {run.engine for run in runs} == {name if name in ("vllm", "sglang") else "other"}
    assert all(run.engine_version == meta["engine"]["version"] for run in runs)
