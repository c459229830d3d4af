"""The target's MTP layers as each engine's MTP setting (engine-formats.md §3.2, §4.5, §5.2-5.4).

Settings are built by hand; ``test_plan_emit_mtp`` runs one from the shipped DeepSeek profile.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.serving import sglang_config, trtllm_config, vllm_config, vllm_keys
from specsim.serving.setting import FROM_PROFILE, EngineSetting, ModelRef, Speculative

HEADER = ["specsim 9.9: `plan window` of scenario 'demo' (demo.yaml) with profile 'p' (p.yaml)."]
TARGET = ModelRef("target", "deepseek-ai/DeepSeek-V3", FROM_PROFILE)


def mtp_setting(k: int = 3) -> EngineSetting:
    spec = Speculative("mtp", "draft_model", k, None, (0.87, 0.64, 0.42)[:k], method="mtp")
    return EngineSetting(
        target=TARGET,
        max_batch=64,
        max_batched_tokens=8192,
        speculation=spec,
        tensor_parallel_size=8,
        weights_dtype="fp8",
    )


def test_vllm_writes_method_mtp_without_a_model():
    rendered = vllm_config.render(mtp_setting(3), HEADER)
    assert json.loads(rendered.files["vllm.json"]) == {"method": "mtp", "num_speculative_tokens": 3}
    args = shlex.split(rendered.files["vllm.args"], comments=True)
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert any("method mtp" in note for note in rendered.notes)


def test_sglang_writes_eagle_with_the_targets_checkpoint_as_draft():
    rendered = sglang_config.render(mtp_setting(3), HEADER)
    args = shlex.split(rendered.files["sglang.args"], comments=True)
    given = dict(zip(args[::2], args[1::2], strict=False))
    assert given["--speculative-algorithm"] == "EAGLE"
    assert given["--speculative-draft-model-path"] == "deepseek-ai/DeepSeek-V3"
    # A chain: topk 1, draft tokens = steps + 1 (SGLang's rule, §4.5).
    assert (given["--speculative-num-steps"], given["--speculative-eagle-topk"]) == ("3", "1")
    assert given["--speculative-num-draft-tokens"] == "4"
    assert any("NextN" in note for note in rendered.notes)


def test_trtllm_writes_decoding_type_mtp_with_max_draft_len():
    rendered = trtllm_config.render(mtp_setting(2), HEADER)
    document = yaml.safe_load(rendered.files["trtllm.yaml"])
    assert document["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 2}
    assert document["tensor_parallel_size"] == 8
    assert any("num_nextn_predict_layers" in note for note in rendered.notes)


@pytest.mark.parametrize(
    "check, document, key",
    [
        (
            vllm_keys.check,
            {"method": "mtp", "model": "org/x", "num_speculative_tokens": 2},
            "model",
        ),
        (
            trtllm_config.check,
            {
                "max_batch_size": 8,
                "max_num_tokens": 512,
                "tensor_parallel_size": 1,
                "speculative_config": {
                    "decoding_type": "MTP",
                    "max_draft_len": 2,
                    "speculative_model": "org/x",
                },
            },
            "speculative_config.speculative_model",
        ),
    ],
)
def test_an_mtp_setting_with_a_model_of_its_own_is_refused(check, document, key):
    with pytest.raises(SpecsimError) as caught:
        check(document, 8) if check is vllm_keys.check else check(document)
    assert caught.value.key == key
