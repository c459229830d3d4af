"""Per-request acceptance from the engines' responses (vLLM metrics.speculative_decoding, SGLang
meta_info), read from small hand-made files and calibrated into a profile."""

from __future__ import annotations

import json

import pytest

from specsim.calibration.requests import requests_counters
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profile.reported import constant_rate
from specsim.serving.request_metrics import read_request_acceptance

EXACT = {"rel": 1e-12}


@pytest.fixture
def data(repo):
    return repo / "tests" / "data" / "requests"


def test_vllm_responses_give_each_requests_histogram(data):
    read = read_request_acceptance(data / "vllm_responses.jsonl")
    # Two requests speculated (the third ran no verify step and is left out).
    assert (read.engine, read.k) == ("vllm", 3)
    assert read.steps == [43, 20] and read.accepted == [10, 30]
    assert read.histograms == [[39, 1, 0, 3], [5, 5, 5, 5]]
    assert read.mean_acceptance_length == pytest.approx(1 + 40 / 63, **EXACT)
    # Pooled [44, 6, 5, 8]: steps with at least 1, 2, 3 drafts accepted are 19, 13, 8.
    counters = requests_counters(read)
    assert counters.per_position == [19, 13, 8] and counters.series == 2
    assert counters.conditional_rates() == pytest.approx([19 / 63, 13 / 19, 8 / 13], **EXACT)


def test_sglang_meta_info_histograms_are_padded_to_the_window(data):
    read = read_request_acceptance(data / "sglang_responses.json")
    # k = 30 proposed / 10 verify steps; the second request's list stops at 1 accepted.
    assert (read.engine, read.k) == ("sglang", 3)
    assert read.histograms == [[3, 3, 3, 1], [2, 2, 0, 0]]
    assert read.mean_acceptance_length == pytest.approx(1 + 14 / 14, **EXACT)


def test_sglang_without_histograms_gives_the_pooled_length(data):
    read = read_request_acceptance(data / "sglang_lengths.jsonl")
    # Request 1 has only its length: 3.1 x 10 = 31 tokens = 20 accepted + 10 steps + the
    # prompt pass's token. Request 2 says 8 accepted. Pooled: 1 + 28 / 20 = 2.4 at k = 3.
    assert read.histograms is None and read.accepted == [20, 8]
    assert read.mean_acceptance_length == pytest.approx(2.4, **EXACT)
    a = constant_rate(2.4, 3)
    assert 1 + a + a * a + a**3 == pytest.approx(2.4, **EXACT)
    assert requests_counters(read).conditional_rates() == pytest.approx([a, a, a], **EXACT)


def calibrate(repo, tmp_path, responses, *extra) -> list[str]:
    into = repo / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
    out = tmp_path / "calibrated.yaml"
    return [
        "profile",
        "calibrate",
        str(responses),
        "--into",
        str(into),
        "--drafter",
        "llama3.2-1b",
        "--verifier",
        "rejection",
        "--temperature",
        "1.0",
        "--out",
        str(out),
        *extra,
    ]


def test_calibrate_keeps_the_requests_and_derives_rates_and_spread(repo, data, tmp_path, capsys):
    argv = calibrate(repo, tmp_path, data / "vllm_responses.jsonl", "--json")
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 2 and summary["k"] == 3
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 40 / 63, **EXACT)
    entry = load_profile(tmp_path / "calibrated.yaml").acceptance("llama3.2-1b", "rejection", 1.0)
    assert entry.source == "calibrated"
    assert [h.requests for h in entry.acceptance_histograms] == [[[39, 1, 0, 3], [5, 5, 5, 5]]]
    assert entry.per_position == pytest.approx([19 / 63, 13 / 19, 8 / 13], rel=1e-5)
    assert entry.mean_acceptance_length == {3: pytest.approx(1 + 40 / 63, rel=1e-5)}
    # First-draft acceptance 4/43 and 15/20 around a = 19/63: S^2 = 0.122286...,
    # h = (1/43 + 1/20) / 2, rho = (S^2 / (a (1 - a)) - h) / (1 - h) = 0.564621..., c = 1/rho - 1.
    assert entry.request_concentration == pytest.approx(0.771099, rel=1e-5)


def test_calibrate_from_lengths_alone_writes_the_scalar_length(repo, data, tmp_path, capsys):
    assert main(calibrate(repo, tmp_path, data / "sglang_lengths.jsonl")) == 0
    assert "from 20 steps (2 requests), k=3" in capsys.readouterr().out
    entry = load_profile(tmp_path / "calibrated.yaml").acceptance("llama3.2-1b", "rejection", 1.0)
    assert entry.acceptance_histograms == [] and entry.request_concentration is None
    assert entry.mean_acceptance_length == {3: 2.4}
    assert entry.per_position == pytest.approx([constant_rate(2.4, 3)] * 3, rel=1e-5)


def test_per_request_files_take_no_label(repo, data, tmp_path, capsys):
    argv = calibrate(repo, tmp_path, data / "vllm_responses.jsonl", "--label", "model_name=x")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--label" in err
    assert not (tmp_path / "calibrated.yaml").exists()


VLLM = {"num_spec_tokens": 2, "num_spec_steps": 3, "num_accepted_draft_tokens": 2}
SGLANG = {"spec_verify_ct": 4, "spec_num_proposed_drafts": 8, "spec_num_correct_drafts": 2}


@pytest.mark.parametrize(
    "document, key, words",
    [
        ({"x": 1}, "speculative_decoding", ["no per-request acceptance"]),
        (
            [{"metrics": {"speculative_decoding": VLLM}}, {"meta_info": SGLANG}],
            "meta_info",
            ["mixes vLLM and SGLang"],
        ),
        (
            [{"speculative_decoding": {**VLLM, "acceptance_histogram": [1, 1, 0]}}],
            "acceptance_histogram",
            ["disagrees"],
        ),
        (
            [
                {"speculative_decoding": VLLM},
                {"speculative_decoding": {**VLLM, "num_spec_tokens": 3}},
            ],
            "num_spec_tokens",
            ["k = 2, 3"],
        ),
        (
            [{"meta_info": {"spec_verify_ct": 4, "spec_accept_length": 2.0}}],
            "spec_num_proposed_drafts",
            ["k is unknown"],
        ),
        (
            [{"meta_info": {**SGLANG, "spec_num_proposed_drafts": 9}}],
            "spec_num_proposed_drafts",
            ["not a whole k"],
        ),
        ([{"meta_info": {**SGLANG, "spec_verify_ct": -1}}], "spec_verify_ct", ["not a count"]),
    ],
)
def test_bad_responses_are_one_line_errors(tmp_path, document, key, words):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(document))
    with pytest.raises(SpecsimError) as err:
        read_request_acceptance(path)
    assert err.value.key == key and str(path) in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_a_file_that_is_not_json_lines_names_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"meta_info": {}}\nnot json\n')
    with pytest.raises(SpecsimError) as err:
        read_request_acceptance(path)
    assert err.value.key == "line 2"
