"""The engines' keys for the window policies they run (``specsim.serving``): TensorRT-LLM's
max_concurrency and acceptance off-switch, vLLM's per-batch ranges for a cut-off, SGLang's
--speculative-adaptive with its config file; and the notes where an engine has none.

Settings are built by hand (as ``test_serving_config``); ``test_engine_parsers`` holds the same
shapes to the engines' own parsers and schema.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.policy_settings import AdaptiveSteps
from specsim.serving import sglang_config, trtllm_config, vllm_config
from specsim.serving.setting import GIVEN, BatchRow, EngineSetting, ModelRef, Speculative

HEADER = ["specsim 9.9: test"]
TARGET = ModelRef("target", "org/target-8b", GIVEN)
EAGLE3 = ModelRef("head", "org/eagle3-head", GIVEN)
DRAFT = ModelRef("small", "org/draft-1b", GIVEN)
RATES = (0.8, 0.6, 0.45, 0.3)


def setting(k: int = 3, model: ModelRef = EAGLE3, **changes) -> EngineSetting:
    kind = "heads" if model is EAGLE3 else "draft_model"
    spec = Speculative("head", kind, k, model, RATES[:k], **changes)
    return EngineSetting(TARGET, 64, 2048, spec)


def trt(item: EngineSetting) -> tuple[dict, object]:
    rendered = trtllm_config.render(item, HEADER)
    return yaml.safe_load(rendered.files["trtllm.yaml"])["speculative_config"], rendered


def sglang_args(rendered) -> dict:
    argv = shlex.split(rendered.files["sglang.args"], comments=True)
    out, i = {}, 0
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if has_value else None
        i += 2 if has_value else 1
    return out


def test_a_cut_off_is_trtllms_max_concurrency_and_vllms_zero_range():
    item = setting(max_concurrency=16)
    config, _ = trt(item)
    assert config["max_concurrency"] == 16 and "draft_len_schedule" not in config
    spec = json.loads(vllm_config.render(item, HEADER).files["vllm.json"])
    # Past its last range vLLM carries K forward: the zero is written out to --max-num-seqs.
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 64, 0]]
    sglang = sglang_config.render(item, HEADER)
    assert "--speculative-num-steps" in sglang_args(sglang)
    assert any("max_concurrency 16: SGLang has no cut-off" in n for n in sglang.not_expressible)


def test_a_cut_off_at_the_batch_cap_cuts_nothing():
    spec = json.loads(vllm_config.render(setting(max_concurrency=64), HEADER).files["vllm.json"])
    assert "num_speculative_tokens_per_batch_size" not in spec


def test_the_acceptance_off_switch_is_trtllms_pair_of_keys():
    item = setting(acceptance_gate=(0.35, 100))
    config, _ = trt(item)
    assert config["acceptance_rate_threshold"] == 0.35
    assert config["acceptance_rate_window_size"] == 100
    table = setting(
        acceptance_gate=(0.35, 100), by_batch=(BatchRow(8, 3), BatchRow(64, 1)), static_k=2
    )
    config, _ = trt(table)
    assert config["draft_len_schedule"] == {8: 3, 64: 1}
    assert config["acceptance_rate_window_size"] == 100
    for writer in (vllm_config, sglang_config):
        missing = writer.render(item, HEADER).not_expressible
        assert any("acceptance off-switch" in note for note in missing), writer


def test_sglang_adaptive_steps_flags_and_config_file():
    config = AdaptiveSteps().engine_config()
    rendered = sglang_config.render(setting(adaptive_steps=config), HEADER)
    given = sglang_args(rendered)
    assert given["--speculative-adaptive"] is None
    assert given["--speculative-adaptive-config"] == "sglang-adaptive.json"
    assert (given["--speculative-algorithm"], given["--speculative-eagle-topk"]) == ("EAGLE3", "1")
    assert given["--speculative-num-steps"] == "3"  # the initial steps, one of the candidates
    assert json.loads(rendered.files["sglang-adaptive.json"]) == config
    for writer in (vllm_config, trtllm_config):
        missing = writer.render(setting(adaptive_steps=config), HEADER).not_expressible
        assert any("SGLang's adaptive steps" in note for note in missing), writer


def test_sglang_adaptive_steps_on_a_draft_model_are_noted_not_written():
    # SGLang runs adaptive steps for EAGLE/EAGLE3 only (a STANDALONE draft model warns).
    config = AdaptiveSteps().engine_config()
    rendered = sglang_config.render(setting(model=DRAFT, adaptive_steps=config), HEADER)
    assert "--speculative-adaptive" not in sglang_args(rendered)
    assert "sglang-adaptive.json" not in rendered.files
    assert any("EAGLE/EAGLE3 chains only" in n for n in rendered.not_expressible)


def test_sglang_refuses_initial_steps_outside_the_candidates():
    config = AdaptiveSteps().engine_config()
    with pytest.raises(SpecsimError, match="not among the adaptive candidate steps"):
        sglang_config.render(setting(k=4, adaptive_steps=config), HEADER)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"acceptance_rate_threshold": 1.5, "acceptance_rate_window_size": 5}, "in \\(0, 1\\]"),
        ({"acceptance_rate_threshold": 0.3}, "go together"),
        ({"acceptance_rate_threshold": 0.3, "acceptance_rate_window_size": 0}, ">= 1"),
        ({"max_concurrency": 0}, "must be >= 1"),
    ],
)
def test_trtllm_check_refuses_bad_switches(extra, message):
    config = {"decoding_type": "MTP", "max_draft_len": 2, **extra}
    with pytest.raises(SpecsimError, match=message):
        document = {"max_batch_size": 8, "max_num_tokens": 64, "tensor_parallel_size": 1}
        trtllm_config.check({**document, "speculative_config": config})


def test_a_recommended_table_ends_at_the_scenarios_max_concurrency():
    from types import SimpleNamespace

    from specsim.planning.emit.emit import cut_rows

    scenario = SimpleNamespace(engine=SimpleNamespace(max_batch=256))
    rows = [{"max_batch": 16, "k": 4}, {"max_batch": 64, "k": 2}, {"max_batch": 256, "k": 1}]
    assert cut_rows(rows, 32, scenario) == (BatchRow(16, 4), BatchRow(32, 2), BatchRow(256, 0))
    assert cut_rows(rows, 16, scenario) == (BatchRow(16, 4), BatchRow(256, 0))
    assert cut_rows(rows, 256, scenario) == (BatchRow(16, 4), BatchRow(64, 2), BatchRow(256, 1))
    assert cut_rows(rows, None, scenario) == (BatchRow(16, 4), BatchRow(64, 2), BatchRow(256, 1))


def test_adaptive_verification_is_vllms_switch_and_a_note_elsewhere():
    item = setting(k=4, adaptive_verification=True)
    rendered = vllm_config.render(item, HEADER)
    spec = json.loads(rendered.files["vllm.json"])
    assert spec["enable_adaptive_verification"] is True and spec["num_speculative_tokens"] == 4
    assert any("Model Runner V2" in note for note in rendered.notes)
    config, trt_rendered = trt(item)
    assert config["max_draft_len"] == 4 and "adaptive" not in json.dumps(config)
    assert any("adaptive verification" in n for n in trt_rendered.not_expressible)
    sglang = sglang_config.render(item, HEADER)
    assert sglang_args(sglang)["--speculative-num-steps"] == "4"
    assert any("ragged-verify budget" in n for n in sglang.not_expressible)


def test_adaptive_verification_without_draft_logits_is_written_as_fixed_k():
    spec = Speculative("ngram", "ngram", 4, None, RATES, ngram_size=3, adaptive_verification=True)
    rendered = vllm_config.render(EngineSetting(TARGET, 64, 2048, spec), HEADER)
    assert "enable_adaptive_verification" not in json.loads(rendered.files["vllm.json"])
    assert any("prompt lookup has none" in note for note in rendered.not_expressible)
