"""/metrics scrapes read as acceptance: vLLM's counters and SGLang's gauges (tests/data/bench/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.errors import SpecsimError
from specsim.serving.prometheus import read_scrape

DATA = Path(__file__).parent / "data" / "bench"


def test_vllm_counters_are_summed_over_engines_into_unconditional_rates():
    scrape = read_scrape(DATA / "vllm_metrics.txt")
    spec = scrape.speculation
    assert scrape.engine == "vllm"
    # engine 0 + engine 1: drafts 1200 + 800, draft tokens 3600 + 2400, accepted 2160 + 1440,
    # per position (1000 + 660, 700 + 470, 460 + 310) = (1660, 1170, 770).
    assert (spec.k, spec.num_drafts, spec.draft_tokens, spec.accepted_tokens) == (
        3,
        2000,
        6000,
        3600,
    )
    assert spec.per_position == pytest.approx((1660 / 2000, 1170 / 2000, 770 / 2000), rel=1e-12)
    assert spec.acceptance_length == pytest.approx(1 + 3600 / 2000, rel=1e-12)  # 2.8
    assert spec.acceptance_rate == pytest.approx(0.6, rel=1e-12)
    assert not spec.scalar_only
    assert "since the server started" in scrape.notes[0]


def test_sglang_gauges_are_a_scalar_with_k_from_the_steps_gauge():
    scrape = read_scrape(DATA / "sglang_metrics.txt")
    spec = scrape.speculation
    assert scrape.engine == "sglang"
    assert (spec.k, spec.acceptance_length, spec.acceptance_rate) == (4, 3.2, 0.55)
    assert spec.scalar_only and spec.per_position is None and spec.num_drafts is None
    assert "latest logging interval" in scrape.notes[0]


def _scrape(tmp_path, text: str) -> Path:
    path = tmp_path / "metrics.txt"
    path.write_text(text, encoding="utf-8")
    return path


TWO_SERIES = (
    'sglang:spec_accept_length{model_name="a"} 3.2\nsglang:spec_accept_length{model_name="b"} 2.1\n'
)


def test_sglang_series_with_different_values_are_refused_unless_one_is_picked(tmp_path):
    path = _scrape(tmp_path, TWO_SERIES)
    with pytest.raises(SpecsimError, match=r"2 series with different values.*--label"):
        read_scrape(path)
    assert read_scrape(path, {"model_name": "b"}).speculation.acceptance_length == 2.1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sglang:spec_accept_length 0\n", "no speculative steps"),
        ("sglang:spec_accept_length 6.5\nsglang:spec_num_steps 4\n", r"outside \[1, 5\]"),
        ("sglang:spec_accept_length NaN\n", "not a finite"),
        ("sglang:spec_accept_rate 1.5\n", "above 1"),
        ("sglang:spec_accept_length 2\nsglang:spec_num_steps 2.5\n", "whole number of steps"),
        ("vllm:num_requests_running 3\n", "no speculative-decoding series"),
    ],
)
def test_impossible_or_empty_scrapes_are_refused_in_one_line(tmp_path, text, message):
    with pytest.raises(SpecsimError, match=message) as caught:
        read_scrape(_scrape(tmp_path, text))
    assert "\n" not in str(caught.value) and "metrics.txt" in str(caught.value)
