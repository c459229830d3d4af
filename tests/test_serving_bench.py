"""``bench.sh`` (``specsim.serving.bench_commands``): the load testers' length semantics, the
commands at each load, and the script as bash runs it (fake ``vllm`` and ``python`` on PATH)."""

from __future__ import annotations

import itertools
import json
import math
import shlex
import shutil
import subprocess

import pytest

from specsim.serving import bench_commands as bench
from specsim.serving.bench_commands import BenchLoad, BenchPlan, LengthRange
from specsim.serving.setting import GIVEN, EngineSetting, ModelRef, Speculative

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")

SPANS = [(1, 1), (1, 2), (4, 64), (10, 30), (10, 31), (16, 8192), (999, 1001), (7, 7), (2, 3)]


@pytest.mark.parametrize(("low", "high"), SPANS)
def test_vllm_draws_the_planned_range(low, high):
    """vLLM 0.33's range is [floor(L(1-r)), ceil(L(1+r))] (engine-formats.md §1.7): the
    planned bounds, one token narrower at the top when the width is odd."""
    length, ratio = bench.vllm_lengths(LengthRange(low, high))
    assert 0 <= ratio < 1  # vLLM refuses a ratio outside [0, 1)
    top = high - (high - low) % 2
    assert bench.vllm_range(length, ratio) == (low, top)


def test_sglang_draws_both_planned_ranges_when_one_ratio_can():
    """SGLang's range is [max(int(L r), 1), L] with one ratio for both lengths (§4.3)."""
    for prompt, output in [((100, 100), (8, 8)), ((2, 16), (4, 32)), ((30, 300), (5, 50))]:
        p, o = LengthRange(*prompt), LengthRange(*output)
        in_len, out_len, ratio, exact = bench.sglang_lengths(p, o)
        assert exact
        assert bench.sglang_range(in_len, ratio) == prompt
        assert bench.sglang_range(out_len, ratio) == output


def test_sglang_keeps_each_mean_when_one_ratio_cannot_give_both_ranges():
    for prompt, output in [((16, 2717), (4, 377)), ((100, 100), (2, 16)), ((4, 64), (2, 16))]:
        p, o = LengthRange(*prompt), LengthRange(*output)
        in_len, out_len, ratio, exact = bench.sglang_lengths(p, o)
        assert not exact
        for span, length in ((prompt, in_len), (output, out_len)):
            low, high = bench.sglang_range(length, ratio)
            # Within a token of the planned mean (rounding L, and int(L r)).
            assert abs((low + high) / 2 - sum(span) / 2) <= 1.0, (span, low, high)


PLAN = BenchPlan(
    prompt=LengthRange(16, 2716),
    output=LengthRange(4, 376),
    burstiness=0.25,
    loads=(BenchLoad("rate-2", 2.0, None, 60), BenchLoad("rate-0.5", 0.5, None, 15)),
    seed=7,
)
CLOSED = BenchPlan(
    LengthRange(8, 8), LengthRange(4, 4), 1.0, (BenchLoad("concurrency-4", math.inf, 4, 40),)
)


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_vllm_command_saves_what_validate_compares():
    argv = bench.vllm_command(PLAN, PLAN.loads[0])
    assert argv[:3] == ["vllm", "bench", "serve"]
    assert option(argv, "--dataset-name") == "random"
    assert option(argv, "--num-prompts") == "60"
    assert option(argv, "--request-rate") == "2" and option(argv, "--burstiness") == "0.25"
    assert option(argv, "--percentile-metrics") == "ttft,tpot,itl,e2el"
    assert option(argv, "--metric-percentiles") == "50,90,99"
    assert {"--save-result", "--save-detailed", "--ignore-eos"} <= set(argv)
    assert option(argv, "--result-dir") == "bench/vllm"
    assert option(argv, "--result-filename") == "rate-2.json"
    ratios = json.loads(option(argv, "--random-range-ratio"))  # one ratio per column (V33)
    assert set(ratios) == {"input", "output"}
    length = int(option(argv, "--random-input-len"))
    assert bench.vllm_range(length, ratios["input"]) == (16, 2716)


def test_a_closed_loop_is_that_many_clients_sending_at_once():
    vllm = bench.vllm_command(CLOSED, CLOSED.loads[0])
    assert option(vllm, "--max-concurrency") == "4" and option(vllm, "--request-rate") == "inf"
    assert "--burstiness" not in vllm
    assert option(vllm, "--random-range-ratio") == "0"  # fixed lengths
    sglang = bench.sglang_command(CLOSED, CLOSED.loads[0])
    assert option(sglang, "--max-concurrency") == "4"
    assert option(sglang, "--random-range-ratio") == "1"  # SGLang: 1 is a fixed length


def test_the_sglang_command_writes_one_jsonl_per_load():
    argv = bench.sglang_command(PLAN, PLAN.loads[1])
    assert argv[:3] == ["python", "-m", "sglang.bench_serving"]
    assert option(argv, "--output-file") == "bench/sglang/rate-0.5.jsonl"
    assert {"--output-details", "--flush-cache"} <= set(argv)
    assert option(argv, "--request-rate") == "0.5" and option(argv, "--seed") == "7"
    assert "--burstiness" not in argv  # SGLang has none
    notes = bench.client_notes(PLAN, ("vllm", "sglang"))
    assert any("Poisson only" in note for note in notes)


def test_labels_are_plain_file_stems():
    assert bench.label("rate 4/s") == "rate-4-s"
    assert bench.label("concurrency-16") == "concurrency-16"


def test_the_controlled_test_forces_the_profiles_acceptance():
    rates = (0.8, 0.6, 0.45)
    spec = Speculative("small", "draft_model", 3, ModelRef("small", "org/d", GIVEN), rates)
    setting = EngineSetting(ModelRef("target", "org/t", GIVEN), 32, 1024, spec)
    vllm, sglang = bench.controlled_servers(setting, ("vllm", "sglang"))
    words = shlex.split(vllm)
    config = json.loads(option(words, "--speculative-config"))
    assert config["rejection_sample_method"] == "synthetic"
    assert config["synthetic_acceptance_rates"] == [0.8, 0.6, 0.45]
    assert sglang.strip().startswith("SGLANG_SIMULATE_ACC_LEN=2.8500 ")  # 1 + 0.8 + 0.6 + 0.45
    assert bench.controlled_servers(setting, ("trtllm",)) == []
    lookup = Speculative("ngram", "ngram", 3, None, rates, ngram_size=3)
    ngram = EngineSetting(ModelRef("target", "org/t", GIVEN), 32, 1024, lookup)
    (only,) = bench.controlled_servers(ngram, ("vllm", "sglang"))  # SGLang: EAGLE path only
    assert only.strip().startswith("vllm serve")
    off = EngineSetting(ModelRef("target", "org/t", GIVEN), 32, 1024, None)
    assert bench.controlled_servers(off, ("vllm", "sglang")) == []


def test_tensorrt_llm_forces_accepted_drafts_on_its_one_model_paths():
    """TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS counts drafts: the acceptance length less the
    bonus token (1.85 = 0.8 + 0.6 + 0.45), on MTP and EAGLE-3; a draft model gets a note."""
    rates = (0.8, 0.6, 0.45)
    head = ModelRef("h3", "org/EAGLE3-x", GIVEN)
    eagle3 = Speculative("h3", "heads", 3, head, rates, passes="autoregressive")
    setting = EngineSetting(ModelRef("target", "org/t", GIVEN), 32, 1024, eagle3)
    (line,) = bench.controlled_servers(setting, ("trtllm",))
    assert line.strip() == (
        "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=1.8500 trtllm-serve org/t "
        "--extra_llm_api_options trtllm.yaml"
    )
    assert bench.uncontrolled(setting, "trtllm") is None
    model = Speculative("small", "draft_model", 3, ModelRef("small", "org/d", GIVEN), rates)
    drafted = EngineSetting(ModelRef("target", "org/t", GIVEN), 32, 1024, model)
    assert bench.controlled_servers(drafted, ("trtllm",)) == []
    assert "no controlled test for Draft_Target" in bench.uncontrolled(drafted, "trtllm")


@needs_bash
def test_the_script_is_valid_bash_and_runs_each_load(tmp_path):
    script = tmp_path / "engine" / "bench.sh"
    script.parent.mkdir()
    script.write_text(bench.script(PLAN, ["header line"], ("vllm", "sglang")), encoding="utf-8")
    subprocess.run(["bash", "-n", str(script)], check=True)
    fakes = tmp_path / "bin"
    fakes.mkdir()
    log = tmp_path / "calls.jsonl"
    for name in ("vllm", "python"):
        fake = fakes / name
        # Each call appends its argv as one JSON line (through the real python3).
        fake.write_text(
            "#!/usr/bin/env bash\n"
            f"{shutil.which('python3')} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "
            f'{name} "$@" >> {shlex.quote(str(log))}\n',
            encoding="utf-8",
        )
        fake.chmod(0o755)
    env = {"PATH": f"{fakes}:/usr/bin:/bin"}
    for client in ("vllm", "sglang"):
        subprocess.run(["bash", str(script), client], cwd=tmp_path, env=env, check=True)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    expected = [bench.vllm_command(PLAN, load) for load in PLAN.loads]
    expected += [bench.sglang_command(PLAN, load) for load in PLAN.loads]
    assert calls == expected
    assert (script.parent / "bench" / "vllm").is_dir()  # made beside the script, not in cwd
    assert (script.parent / "bench" / "sglang").is_dir()
    refused = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "usage: bash bench.sh vllm|sglang" in refused.stderr


@needs_bash
def test_a_vllm_only_script_has_no_sglang_client(tmp_path):
    text = bench.script(PLAN, ["h"], ("vllm",))
    assert "sglang" not in text.split("set -euo pipefail", 1)[1]
    (tmp_path / "bench.sh").write_text(text, encoding="utf-8")
    subprocess.run(["bash", "-n", str(tmp_path / "bench.sh")], check=True)


def test_every_planned_range_survives_the_vllm_mapping():
    """Exhaustively over small ranges: the narrowing is at most one token, at the top."""
    for low, high in itertools.combinations_with_replacement(range(1, 60), 2):
        length, ratio = bench.vllm_lengths(LengthRange(low, high))
        drawn = bench.vllm_range(length, ratio)
        assert drawn[0] == low and high - 1 <= drawn[1] <= high, (low, high, drawn)
