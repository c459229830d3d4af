"""Calibration from vLLM's Prometheus counters, against the hand-summed example dump."""

from __future__ import annotations

import json

import pytest

from specsim.calibration.prometheus import parse_prometheus, read_counters
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.profile import load_profile

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def dump(repo):
    return repo / "profiles" / "examples" / "vllm-spec-decode-metrics.txt"


@pytest.fixture
def into(repo):
    return repo / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


def test_counters_are_summed_over_engines_and_filtered_by_label(dump):
    counters = read_counters(dump, {"model_name": MODEL})
    # Engines 0 and 1: drafts 1000 + 500, drafted 3000 + 1500, accepted 1800 + 750,
    # per position (800 + 350, 600 + 250, 400 + 150).
    assert counters.drafts == 1500
    assert counters.draft_tokens == 4500
    assert counters.accepted == 2550
    assert counters.per_position == [1150, 850, 550]
    assert counters.series == 2
    assert counters.k == 3
    assert counters.mean_acceptance_length == pytest.approx(1 + 2550 / 1500)
    assert counters.draft_acceptance_rate == pytest.approx(2550 / 4500)
    assert counters.unconditional_rates() == pytest.approx([1150 / 1500, 850 / 1500, 550 / 1500])
    assert counters.conditional_rates() == pytest.approx([1150 / 1500, 850 / 1150, 550 / 850])


def test_counters_of_different_deployments_are_not_mixed(dump):
    # Without --label the dump's second model would be added in: drafts 10500 and a draft
    # acceptance rate of 3450 / 31500 = 0.11 that describes neither deployment.
    with pytest.raises(SpecsimError) as err:
        read_counters(dump)
    assert err.value.key == "model_name"
    assert "--label model_name=" in str(err.value)
    assert MODEL in str(err.value) and "other" in str(err.value)


def test_parser_reads_labels_with_escapes_and_skips_comments():
    text = '# HELP x\nm{a="x\\"y",b="p\\\\q"} 3.5 1700000000\nn 2\n'
    samples = parse_prometheus(text, "t")
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("m", {"a": 'x"y', "b": "p\\q"}, 3.5),
        ("n", {}, 2.0),
    ]


def test_calibrate_cli_replaces_the_entry_and_keeps_the_rest(dump, into, tmp_path, capsys):
    out = tmp_path / "calibrated.yaml"
    argv = [
        "profile",
        "calibrate",
        str(dump),
        "--into",
        str(into),
        "--drafter",
        "llama3.2-1b",
        "--verifier",
        "rejection",
        "--temperature",
        "1.0",
        "--label",
        f"model_name={MODEL}",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mean_acceptance_length"] == pytest.approx(2.7)
    loaded = load_profile(out)
    entry = loaded.acceptance("llama3.2-1b", "rejection", 1.0)
    assert entry.source == "calibrated"
    assert entry.per_position == pytest.approx([0.766667, 0.73913, 0.647059], rel=1e-5)
    assert entry.mean_acceptance_length == {3: pytest.approx(2.7)}
    before = load_profile(into).profile.acceptance
    after = loaded.profile.acceptance
    assert len(after) == len(before)  # replaced, not added
    assert loaded.acceptance("llama3.2-1b", "greedy", 0.0).source == "assumed"
    assert "calibrated from vllm-spec-decode-metrics.txt" in loaded.profile.provenance.notes


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ["no speculative steps"]),
        ("vllm:spec_decode_num_drafts_total 10\n", ["per-position"]),
        ("vllm:spec_decode_num_drafts_total{engine=0} 10\n", ["malformed labels"]),
        ("vllm:spec_decode_num_drafts_total ten\n", ["not a number"]),
        (
            "vllm:spec_decode_num_drafts_total 10\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 3\n',
            ["position"],
        ),
    ],
)
def test_bad_dumps_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "m.txt"
    path.write_text(text)
    with pytest.raises(SpecsimError) as err:
        read_counters(path)
    for word in words:
        assert word in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "change, words",
    [
        (["--drafter", "eagle"], ["eagle", "drafters"]),
        (["--label", "model_name=nobody"], ["no speculative steps", "nobody"]),
        (["--into", "missing.yaml"], ["missing.yaml", "not found"]),
    ],
)
def test_calibrate_cli_bad_input_exit_2(dump, into, tmp_path, capsys, change, words):
    args = {"--into": str(into), "--drafter": "llama3.2-1b"}
    extra = []
    for i in range(0, len(change), 2):
        if change[i] in args:
            args[change[i]] = change[i + 1]
        else:
            extra += change[i : i + 2]
    out = tmp_path / "c.yaml"
    argv = [
        "profile",
        "calibrate",
        str(dump),
        "--verifier",
        "rejection",
        "--temperature",
        "1",
        "--out",
        str(out),
        *extra,
    ]
    for key, value in args.items():
        argv += [key, value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    for word in words:
        assert word in err
    assert not out.exists()


@pytest.mark.parametrize(
    "edit, words",
    [
        (("  per_step_s:", "  per_step_seconds:"), ["overhead.per_step_seconds", "remove the key"]),
        (("  price_per_hour_usd: 3.0", "  price_per_hour_usd: cheap"), ["price_per_hour_usd"]),
        (("version: 1\n", ""), ["version", "add the key"]),
    ],
)
def test_a_profile_with_missing_or_mistyped_keys_is_refused(
    dump, into, tmp_path, capsys, edit, words
):
    broken = tmp_path / "broken.yaml"
    text = into.read_text()
    assert edit[0] in text
    broken.write_text(text.replace(edit[0], edit[1], 1))
    out = tmp_path / "c.yaml"
    argv = [
        "profile",
        "calibrate",
        str(dump),
        "--into",
        str(broken),
        "--drafter",
        "ngram",
        "--verifier",
        "greedy",
        "--temperature",
        "0",
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(broken) in err
    for word in words:
        assert word in err
    assert not out.exists()
