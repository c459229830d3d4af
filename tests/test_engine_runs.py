"""The public engine runs bundled under tests/data/engine_runs/ and the hardware files: every
table parses with the project's own reader, every deployment names files that exist, and every
hardware file loads with datasheet numbers that hang together."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.hardware import load_hardware

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
