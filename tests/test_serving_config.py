"""The engines' configuration writers (``specsim.serving``): keys and values for each kind of
setting, the files parse, and every documented constraint refuses a planted bad setting.

Settings are built by hand here; ``test_plan_emit`` runs them from real plans.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.serving import sglang_config, trtllm_config, vllm_config, vllm_keys
from specsim.serving.setting import (
    GIVEN,
    BatchRow,
    EngineSetting,
    ModelRef,
    Speculative,
    args_text,
    placeholder,
)

HEADER = ["specsim 9.9: `plan window` of scenario 'demo' (demo.yaml) with profile 'p' (p.yaml)."]
TARGET = ModelRef("target", "org/target-8b", GIVEN)
DRAFT = ModelRef("small", "org/draft-1b", GIVEN)
RATES = (0.8, 0.6, 0.45, 0.3)  # unconditional: non-increasing


def setting(spec: Speculative | None, **changes) -> EngineSetting:
    base = {"target": TARGET, "max_batch": 64, "max_batched_tokens": 2048, "speculation": spec}
    return EngineSetting(**{**base, **changes})


def chain(k: int = 3, **changes) -> Speculative:
    base = {"drafter": "small", "kind": "draft_model", "k": k, "model": DRAFT}
    return Speculative(**{**base, "unconditional_rates": RATES[:k], **changes})


def ngram(k: int = 4) -> Speculative:
    return Speculative("ngram", "ngram", k, None, RATES[:k], ngram_size=3)


def table(rows, static_k: int = 2) -> Speculative:
    top = max(k for _, k in rows)
    return chain(top, by_batch=tuple(BatchRow(b, k) for b, k in rows), static_k=static_k)


def arguments(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def render_all(item: EngineSetting):
    return (
        vllm_config.render(item, HEADER),
        sglang_config.render(item, HEADER),
        trtllm_config.render(item, HEADER),
    )


def trt(rendered) -> dict:
    return yaml.safe_load(rendered.files["trtllm.yaml"])


# -- what each kind of setting writes ----------------------------------------------------------


def test_a_chain_drafter_in_each_engines_keys():
    vllm, sglang, trtllm = render_all(setting(chain(3)))
    config = json.loads(vllm.files["vllm.json"])
    assert config == {
        "method": "draft_model",
        "model": "org/draft-1b",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1,
    }
    args = arguments(vllm.files["vllm.args"])
    assert args[:6] == ["--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
                        "--tensor-parallel-size", "1"]  # fmt: skip
    assert args[6] == "--speculative-config" and json.loads(args[7]) == config
    assert arguments(sglang.files["sglang.args"]) == [
        *("--speculative-algorithm", "STANDALONE"),
        *("--speculative-draft-model-path", "org/draft-1b"),
        *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
        *("--speculative-num-draft-tokens", "4"),  # a chain: steps + 1
        *("--max-running-requests", "64", "--tp-size", "1"),
    ]
    assert trt(trtllm) == {
        "max_batch_size": 64,
        "max_num_tokens": 2048,
        "tensor_parallel_size": 1,
        "speculative_config": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 3,
            "speculative_model": "org/draft-1b",
        },
    }
    for item in (vllm, sglang, trtllm):
        assert not item.not_expressible
        text = next(iter(item.files.values())) if item.engine != "vllm" else item.files["vllm.args"]
        assert text.startswith(f"# {HEADER[0]}")


def test_prompt_lookup_has_no_model_and_looks_up_n_tokens():
    vllm, sglang, trtllm = render_all(setting(ngram(4)))
    assert json.loads(vllm.files["vllm.json"]) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 3,
        "prompt_lookup_max": 3,
    }
    assert arguments(sglang.files["sglang.args"]) == [
        *("--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1"),
        *("--speculative-num-draft-tokens", "5", "--max-running-requests", "64", "--tp-size", "1"),
    ]
    assert any("trie" in note for note in sglang.notes)
    assert trt(trtllm)["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 3,
    }


def test_a_k_by_batch_table_as_vllm_ranges_and_a_trtllm_schedule():
    vllm, sglang, trtllm = render_all(setting(table([(8, 4), (32, 2), (64, 1)], static_k=2)))
    config = json.loads(vllm.files["vllm.json"])
    assert config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 32, 2], [33, 64, 1]]
    spec = trt(trtllm)["speculative_config"]
    assert spec["max_draft_len"] == 4
    assert spec["draft_len_schedule"] == {8: 4, 32: 2, 64: 1}  # YAML integer keys
    assert not vllm.not_expressible and not trtllm.not_expressible
    # SGLang has no schedule: the static k the plan found best stands in, and says so.
    args = arguments(sglang.files["sglang.args"])
    assert args[args.index("--speculative-num-steps") + 1] == "2"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "3"
    (note,) = sglang.not_expressible
    assert "k-by-batch table" in note and "k = 2" in note
    assert "Not expressible: the k-by-batch table" in sglang.files["sglang.args"]


def test_a_table_that_sglang_replaces_by_speculation_off():
    _, sglang, _ = render_all(setting(table([(8, 4), (64, 2)], static_k=0)))
    assert not any(a.startswith("--speculative") for a in arguments(sglang.files["sglang.args"]))
    assert "speculation off" in sglang.not_expressible[0]


def test_a_table_whose_first_row_is_not_its_largest_k_is_capped_for_trtllm():
    vllm, _, trtllm = render_all(setting(table([(48, 2), (64, 4)])))
    assert json.loads(vllm.files["vllm.json"])["num_speculative_tokens_per_batch_size"] == [
        [1, 48, 2],
        [49, 64, 4],
    ]
    spec = trt(trtllm)["speculative_config"]  # capping 16 batch sizes beats raising 48
    assert spec["max_draft_len"] == 2 and spec["draft_len_schedule"] == {48: 2, 64: 2}
    assert "capped at k = 2" in trtllm.not_expressible[0]


def test_or_raised_at_its_first_row_when_that_changes_fewer_batches():
    for rows in ([(8, 2), (64, 4)], [(8, 0), (16, 3), (64, 1)]):
        spec = trt(render_all(setting(table(rows)))[2])["speculative_config"]
        top = max(k for _, k in rows)
        assert spec["max_draft_len"] == top
        assert spec["draft_len_schedule"] == {rows[0][0]: top, **dict(rows[1:])}


def test_speculation_off_is_each_engines_plain_configuration():
    vllm, sglang, trtllm = render_all(setting(None))
    assert set(vllm.files) == {"vllm.args"}  # no --speculative-config at all
    assert arguments(vllm.files["vllm.args"]) == [
        *("--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--tensor-parallel-size"),
        "1",
    ]
    assert vllm.written["speculative_config"] is None
    assert arguments(sglang.files["sglang.args"]) == [
        *("--max-running-requests", "64", "--tp-size", "1")
    ]
    assert "speculative_config" not in trt(trtllm)


def test_what_no_engine_can_run_is_said_in_every_file():
    note = "the goodput-adaptive policy picks k every step; written instead: k = 2"
    for item in render_all(setting(chain(2), unexpressed=(note,))):
        assert note in item.not_expressible
        text = "".join(item.files.values())
        assert f"Not expressible: {note}." in " ".join(text.replace("#   ", "").split())


def test_a_lossy_verifier_is_not_expressible_anywhere():
    for item in render_all(setting(chain(2), verifier="typical")):
        assert any("typical" in note for note in item.not_expressible), item.engine


def test_heads_are_eagle_and_eagle3_when_the_path_says_so():
    heads = chain(2, kind="heads", model=ModelRef("h", "org/EAGLE3-target", GIVEN))
    vllm, sglang, trtllm = render_all(setting(heads))
    assert json.loads(vllm.files["vllm.json"])["method"] == "eagle3"
    assert "EAGLE3" in arguments(sglang.files["sglang.args"])
    assert trt(trtllm)["speculative_config"]["decoding_type"] == "Eagle3"
    plain = chain(2, kind="heads", model=ModelRef("h", "org/eagle-target", GIVEN))
    assert vllm_config.speculative_config(setting(plain))["method"] == "eagle"


def test_the_synthetic_acceptance_config_is_vllms_controlled_test():
    config = vllm_config.speculative_config(setting(chain(3)), synthetic=True)
    assert config["rejection_sample_method"] == "synthetic"
    assert config["synthetic_acceptance_rates"] == list(RATES[:3])
    vllm_keys.check(config, 64)


def test_a_placeholder_model_is_marked_in_the_header():
    item = setting(chain(2, model=placeholder("small")))
    assert item.speculation.model.path == "REPLACE-ME/small"
    assert "PLACEHOLDER" in item.speculation.model.describe()
    assert "--model small=" in item.speculation.model.describe()


# -- the files read back as a shell reads them -------------------------------------------------


def test_args_files_split_and_eval_alike(tmp_path):
    """The usage line in each header, ``eval "cmd $(grep -v '^#' FILE)"``, gives the same
    argument list as shlex.split: a fake engine on PATH prints what it received."""
    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n', encoding="utf-8")
    fake.chmod(0o755)
    item = setting(table([(8, 4), (64, 2)]), target=ModelRef("target", "my models/t", GIVEN))
    rendered = vllm_config.render(item, HEADER)
    (tmp_path / "vllm.args").write_text(rendered.files["vllm.args"], encoding="utf-8")
    run = subprocess.run(
        ["bash", "-c", rendered.start],
        cwd=tmp_path,
        env={"PATH": f"{fake.parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    expected = ["serve", "my models/t", *arguments(rendered.files["vllm.args"])]
    assert run.stdout.splitlines() == expected


def test_an_empty_argument_list_is_just_the_header():
    assert args_text("# h\n", []) == "# h\n"


# -- the documented constraints refuse planted bad settings -------------------------------------

GOOD_VLLM = {
    "method": "draft_model",
    "model": "org/d",
    "num_speculative_tokens": 4,
    "draft_tensor_parallel_size": 1,
    "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 2]],
}
BAD_VLLM = [
    ({"tensor_parallel_size": 1}, "tensor_parallel_size"),  # the trap field (§3.2)
    ({"method": "medusa"}, "method"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"model": None}, "model"),
    ({"draft_tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
    ({"num_speculative_tokens_per_batch_size": []}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[2, 64, 4]]}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[1, 8, 4], [8, 64, 2]]}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[1, 8, 5], [9, 64, 2]]}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 32, 2]]}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[1, 8], [9, 64, 2]]}, "per_batch_size"),
    ({"num_speculative_tokens_per_batch_size": [[1, 8, -1], [9, 64, 2]]}, "per_batch_size"),
    (
        {"method": "ngram", "model": None, "prompt_lookup_min": 4, "prompt_lookup_max": 3},
        "prompt_lookup_min",
    ),
    ({"rejection_sample_method": "strict"}, "rejection_sample_method"),
    ({"synthetic_acceptance_rates": [0.5] * 4}, "synthetic_acceptance_rates"),
    ({"rejection_sample_method": "synthetic"}, "synthetic_acceptance_rates"),
    (
        {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5] * 3},
        "synthetic_acceptance_rates",
    ),
    (
        {
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.5, 0.6, 0.4, 0.3],
        },
        "synthetic_acceptance_rates",
    ),
    (
        {
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.5] * 4,
            "synthetic_acceptance_length": 2.0,
        },
        "synthetic_acceptance_rates",
    ),
]


def test_the_vllm_reference_config_passes():
    vllm_keys.check(dict(GOOD_VLLM), 64)


@pytest.mark.parametrize(("change", "key"), BAD_VLLM, ids=[k for _, k in BAD_VLLM])
def test_vllm_constraints_refuse_a_planted_setting(change, key):
    config = {**GOOD_VLLM, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(SpecsimError, match=rf"^engine/vllm\.json: [a-z_]*{key}") as error:
        vllm_keys.check(config, 64)
    assert "not written" in str(error.value) and "§3." in str(error.value)


def test_vllm_refuses_no_sequences():
    with pytest.raises(SpecsimError, match="--max-num-seqs"):
        vllm_keys.check(None, 0)


GOOD_SGLANG = [
    ("--speculative-algorithm", "STANDALONE"),
    ("--speculative-draft-model-path", "org/d"),
    ("--speculative-num-steps", "3"),
    ("--speculative-eagle-topk", "1"),
    ("--speculative-num-draft-tokens", "4"),
    ("--max-running-requests", "64"),
    ("--tp-size", "1"),
]
BAD_SGLANG = [
    ({"--speculative-num-draft-tokens": "3"}, "--speculative-num-draft-tokens"),
    ({"--speculative-algorithm": "MEDUSA"}, "--speculative-algorithm"),
    ({"--speculative-draft-model-path": None}, "--speculative-draft-model-path"),
    ({"--max-running-requests": None}, "--max-running-requests"),
    ({"--speculative-num-steps": None}, "--speculative-num-steps"),
    ({"--speculative-algorithm": None}, "--speculative-draft-model-path"),
    ({"--speculative-use-rejection-sampling": "1"}, "--speculative-use-rejection-sampling"),
    ({"--speculative-algorithm": "NGRAM"}, "--speculative-draft-model-path"),
    (
        {"--speculative-algorithm": "NGRAM", "--speculative-draft-model-path": None},
        "--speculative-eagle-topk",
    ),
]


def _sglang(change: dict) -> list[tuple[str, str]]:
    merged = {**dict(GOOD_SGLANG), **change}
    return [(flag, value) for flag, value in merged.items() if value is not None]


def test_the_sglang_reference_arguments_pass():
    sglang_config.check(_sglang({}))


@pytest.mark.parametrize(("change", "key"), BAD_SGLANG, ids=[str(c) for c, _ in BAD_SGLANG])
def test_sglang_constraints_refuse_a_planted_setting(change, key):
    with pytest.raises(SpecsimError, match=rf"^engine/sglang\.args: {key}: .*§4\.5"):
        sglang_config.check(_sglang(change))


GOOD_TRT = {
    "max_batch_size": 64,
    "max_num_tokens": 2048,
    "tensor_parallel_size": 1,
    "speculative_config": {
        "decoding_type": "Draft_Target",
        "max_draft_len": 4,
        "speculative_model": "org/d",
        "draft_len_schedule": {8: 4, 64: 2},
    },
}
BAD_TRT = [
    ({"max_batch_size": 0}, {}, "max_batch_size"),
    ({"kv_cache_manager": {}}, {}, "kv_cache_manager"),
    # kv_cache_config holds the block size and reuse only (§5.7): another key is refused.
    ({"kv_cache_config": {"free_gpu_memory_fraction": 0.9}}, {}, "kv_cache_config"),
    ({}, {"decoding_type": "Medusa"}, "decoding_type"),
    ({}, {"max_draft_len": 0}, "max_draft_len"),
    ({}, {"speculative_model": None}, "speculative_model"),
    ({}, {"eagle_choices": [[0]]}, "eagle_choices"),
    ({}, {"draft_len_schedule": {8: 3, 64: 2}}, "draft_len_schedule"),
    ({}, {"draft_len_schedule": {8: 4, 64: 5}}, "draft_len_schedule"),
    ({}, {"draft_len_schedule": {0: 4, 64: 2}}, "draft_len_schedule"),
    ({}, {"draft_len_schedule": {}}, "draft_len_schedule"),
    ({}, {"max_concurrency": 8}, "draft_len_schedule"),
    ({}, {"decoding_type": "NGram", "max_matching_ngram_size": 0}, "max_matching_ngram_size"),
]


@pytest.mark.parametrize(("top", "spec", "key"), BAD_TRT, ids=[k for *_, k in BAD_TRT])
def test_trtllm_constraints_refuse_a_planted_setting(top, spec, key):
    config = {**GOOD_TRT["speculative_config"], **spec}
    config = {k: v for k, v in config.items() if v is not None}
    document = {**GOOD_TRT, **top, "speculative_config": config}
    trtllm_config.check(dict(GOOD_TRT))
    with pytest.raises(SpecsimError, match=rf"^engine/trtllm\.yaml: [a-z_.]*{key}.*§5\."):
        trtllm_config.check(document)


# -- tensor parallelism and number formats (issue 22) --------------------------------------------


def test_tensor_parallel_sizes_in_each_engines_keys():
    vllm, sglang, trtllm = render_all(setting(chain(), tensor_parallel_size=4))
    assert "--tensor-parallel-size 4" in vllm.files["vllm.args"]
    assert json.loads(vllm.files["vllm.json"])["draft_tensor_parallel_size"] == 4
    assert sglang.written["tp_size"] == 4
    assert trt(trtllm)["tensor_parallel_size"] == 4
    assert not any("draft tensor" in n for r in (vllm, sglang, trtllm) for n in r.not_expressible)


def test_a_draft_model_on_one_device_is_vllms_draft_tp_and_unexpressed_elsewhere():
    item = setting(chain(), tensor_parallel_size=4, draft_tensor_parallel_size=1)
    vllm, sglang, trtllm = render_all(item)
    assert json.loads(vllm.files["vllm.json"])["draft_tensor_parallel_size"] == 1
    assert vllm.not_expressible == []
    for rendered in (sglang, trtllm):
        assert any("draft tensor parallelism 1" in n for n in rendered.not_expressible)


def test_expert_parallelism_in_each_engines_keys():
    """vLLM's --enable-expert-parallel, SGLang's --ep-size and TensorRT-LLM's
    moe_expert_parallel_size, each over the replica's devices; nothing without it."""
    vllm, sglang, trtllm = render_all(
        setting(chain(), tensor_parallel_size=4, expert_parallel=True)
    )
    assert "--enable-expert-parallel" in arguments(vllm.files["vllm.args"])
    assert vllm.written["enable_expert_parallel"] is True
    args = arguments(sglang.files["sglang.args"])
    assert args[args.index("--ep-size") + 1] == "4"
    assert trt(trtllm)["moe_expert_parallel_size"] == 4
    vllm, sglang, trtllm = render_all(setting(chain(), tensor_parallel_size=4))
    assert "--enable-expert-parallel" not in arguments(vllm.files["vllm.args"])
    assert "--ep-size" not in arguments(sglang.files["sglang.args"])
    assert "moe_expert_parallel_size" not in trt(trtllm)


def test_fp8_is_vllms_quantization_and_kv_cache_dtype_and_a_note_elsewhere():
    item = setting(chain(), weights_dtype="fp8", kv_cache_dtype="fp8")
    vllm, sglang, trtllm = render_all(item)
    args = arguments(vllm.files["vllm.args"])
    assert args[args.index("--quantization") + 1] == "fp8"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert json.loads(vllm.files["vllm.json"])["quantization"] == "fp8"
    assert vllm.written["quantization"] == vllm.written["kv_cache_dtype"] == "fp8"
    for rendered in (sglang, trtllm):
        assert any("weights fp8 and KV cache fp8" in n for n in rendered.notes)
    assert "fp8" not in arguments(sglang.files["sglang.args"])  # no flag is guessed
    assert "fp8" not in json.dumps(trt(trtllm))


@pytest.mark.parametrize(
    "weights, method", [("int4", "AWQ, GPTQ"), ("nvfp4", "modelopt_fp4"), ("mxfp4", "mxfp4")]
)
def test_prequantised_weights_write_no_flag_but_say_why(weights, method):
    vllm, sglang, _ = render_all(setting(None, weights_dtype=weights))
    assert "--quantization" not in arguments(vllm.files["vllm.args"])
    assert any(f"{weights} weights" in n and f"({method})" in n for n in vllm.notes)
    assert any(f"weights {weights}" in n for n in sglang.notes)  # no SGLang flag is guessed


def test_sixteen_bit_formats_write_nothing_new():
    plain = render_all(setting(chain()))
    sixteen = render_all(setting(chain(), weights_dtype="bfloat16", kv_cache_dtype="bfloat16"))
    assert [r.files for r in plain] == [r.files for r in sixteen]


def test_deployment_reads_the_profiles_split_and_formats(repo):
    from specsim.profile import load_profile
    from specsim.serving.setting import deployment

    tp4 = load_profile(repo / "profiles" / "llama3.1-70b_llama3.2-1b_4xh100-tp4-roofline.yaml")
    assert deployment(tp4.profile, "llama3.2-1b") == {
        "tensor_parallel_size": 4,
        "draft_tensor_parallel_size": 4,
    }
    assert deployment(tp4.profile, "ngram") == {"tensor_parallel_size": 4}
    fp8 = load_profile(repo / "profiles" / "llama3.1-70b_llama3.2-1b_h200-fp8-roofline.yaml")
    assert deployment(fp8.profile, None) == {
        "tensor_parallel_size": 1,
        "weights_dtype": "fp8",
        "kv_cache_dtype": "fp8",
    }
    eight = load_profile(repo / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml")
    assert deployment(eight.profile, "llama3.2-1b") == {"tensor_parallel_size": 1}
