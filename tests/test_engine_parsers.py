"""Every emitted engine configuration, parsed by the engine's own argument code.

The writers' variants (each drafter kind an engine maps, chain and tree, k by batch, fp8, expert
parallel, KV block size and prefix caching, split-fleet pools, and vLLM's forced-acceptance
config) are rendered by ``serving.*_config`` and handed to:

- vLLM 0.33: ``FlexibleArgumentParser`` with ``EngineArgs.add_cli_args``, ``EngineArgs.
  from_cli_args``, then ``create_model_config`` and ``create_speculative_config``, which builds
  ``SpeculativeConfig`` and runs its validation (draft model configs included) against tiny local
  HF configs, on the CPU platform;
- SGLang 0.5.23: ``ServerArgs.add_cli_args``, ``ServerArgs.from_cli_args`` and its algorithm
  resolver ``SpeculativeAlgorithm.from_string``;
- TensorRT-LLM: the JSON schema ``tests/data/trtllm_llm_args_schema.json``, derived from its
  pydantic ``llm_args`` (the schema file names file and commit); TensorRT-LLM itself does not
  install without CUDA.

The engines are not project dependencies: each part skips cleanly when its engine is absent.
``benchmarks/engine_parsers.sh`` builds a virtual environment with them and runs this module.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.policy_settings import AdaptiveSteps
from specsim.serving import registry, vllm_config
from specsim.serving.setting import BatchRow, EngineSetting, ModelRef, Speculative
from specsim.tree import TreeShape

# vLLM picks its platform on import: without CUDA it must be told it runs on the CPU.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SCHEMA = Path(__file__).parent / "data" / "trtllm_llm_args_schema.json"
RATES = (0.8, 0.62, 0.45, 0.3)
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
# A DeepSeek-V3 shape with one MTP (NextN) layer: vLLM's mtp method drafts with it.
DEEPSEEK = {
    **LLAMA,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "num_nextn_predict_layers": 1,
    "n_group": 1,
    "topk_group": 1,
}
# Folder name -> config.json. EAGLE-1 heads keep the target's architecture (vLLM renames it);
# an EAGLE-3 head names its own, and its folder says eagle3 as real checkpoints' names do.
MODELS = {
    "target": LLAMA,
    "draft": LLAMA,
    "eagle-head": {**LLAMA, "num_hidden_layers": 1},
    "eagle3-head": {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1},
    "deepseek-mtp": DEEPSEEK,
    # A DFlash drafter as z-lab publishes them: Qwen3 layers over the target's hidden states.
    "dflash-draft": {
        **LLAMA,
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "head_dim": 16,
        "dflash_config": {"mask_token_id": 999, "target_layer_ids": [0, 1]},
    },
    # A DSpark drafter on a Qwen3 target (vLLM maps DSparkDraftModel + qwen3 to
    # Qwen3DSparkModel); its block is 3, the width it drafts.
    "dspark-draft": {
        **LLAMA,
        "architectures": ["DSparkDraftModel"],
        "model_type": "qwen3",
        "head_dim": 16,
        "block_size": 3,
        "dspark_target_layer_ids": [0, 1],
    },
}
DRAFTERS = {  # deployed kind -> (drafter folder, target folder, method)
    "draft_model": ("draft", "target", None),
    "ngram": (None, "target", None),
    "heads": ("eagle-head", "target", None),
    "heads-eagle3": ("eagle3-head", "target", None),
    "mtp": (None, "deepseek-mtp", "mtp"),
    # Parallel drafters (kind block): P-EAGLE is an EAGLE-3 head, PARD a draft model.
    "dflash": ("dflash-draft", "target", "dflash"),
    "dspark": ("dspark-draft", "target", "dspark"),
    "p_eagle": ("eagle3-head", "target", "p_eagle"),
    "pard": ("draft", "target", "pard"),
}
BLOCK = ("dflash", "dspark", "p_eagle", "pard")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for name, config in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def speculation(models: Path, kind: str, k: int = 3, **extra) -> tuple[ModelRef, Speculative]:
    draft, target, method = DRAFTERS[kind]
    model = None if draft is None else ModelRef("drafter", str(models / draft), "given")
    spec = Speculative(
        drafter=kind,
        kind="block" if kind in BLOCK else "heads" if kind in ("heads-eagle3", "mtp") else kind,
        k=k,
        model=model,
        unconditional_rates=RATES[:k],
        ngram_size=3 if kind == "ngram" else None,
        method=method,
        **extra,
    )
    return ModelRef("target", str(models / target), "given"), spec


def variants(models: Path) -> list[tuple[str, EngineSetting]]:
    """Every setting shape the writers render, by a readable id."""
    out = []
    target, _ = speculation(models, "draft_model")
    out.append(("off", EngineSetting(target, 64, 8192, None)))
    for kind in DRAFTERS:
        target, spec = speculation(models, kind)
        out.append((f"{kind}-chain", EngineSetting(target, 64, 8192, spec)))
        rows = (BatchRow(8, 3), BatchRow(32, 2), BatchRow(64, 1))
        target, table = speculation(models, kind, by_batch=rows, static_k=2)
        out.append((f"{kind}-by-batch", EngineSetting(target, 64, 8192, table)))
        if kind in BLOCK:
            continue  # a block drafter drafts a chain: specsim plans no tree for it
        tree = TreeShape.parse("2,1")
        target, branched = speculation(models, kind, k=tree.depth, tree=tree)
        out.append((f"{kind}-tree", EngineSetting(target, 64, 8192, branched)))
    target, spec = speculation(models, "draft_model")
    formats = dict(weights_dtype="fp8", kv_cache_dtype="fp8", block_size=16, prefix_caching=True)
    out.append(("draft-fp8-blocks", EngineSetting(target, 64, 8192, spec, **formats)))
    target, spec = speculation(models, "mtp")
    moe = dict(tensor_parallel_size=2, draft_tensor_parallel_size=1, expert_parallel=True)
    out.append(("mtp-tp2-ep", EngineSetting(target, 128, 16384, spec, **moe)))
    # Medusa heads (parallel passes): no engine version specsim follows has them.
    target, heads = speculation(models, "heads", passes="parallel")
    out.append(("medusa-chain", EngineSetting(target, 64, 8192, heads)))
    for role in ("prefill", "decode"):
        target, spec = speculation(models, "heads-eagle3")
        out.append((f"split-{role}", EngineSetting(target, 32, 8192, spec, role=role)))
    # The engines' switches: a static k's cut-off, the acceptance off-switch (on a chain and
    # on a table), SGLang's adaptive steps (k = 3, one of its default candidates).
    switches = {
        "cut-off": {"max_concurrency": 16},
        "gate": {"acceptance_gate": (0.3, 50)},
        "table-gate": {"acceptance_gate": (0.3, 50), "by_batch": rows, "static_k": 2},
        "adaptive": {"adaptive_steps": AdaptiveSteps().engine_config()},
        "adaptive-verification": {"adaptive_verification": True},
    }
    for name, extra in switches.items():
        target, spec = speculation(models, "heads-eagle3", **extra)
        out.append((name, EngineSetting(target, 64, 8192, spec)))
    return out


# Variants an engine's writer refuses (with a reason): Medusa heads everywhere; vLLM 0.33 takes
# no tree; TensorRT-LLM's trees are Eagle's only; SGLang's NGRAM builds its own.
# SGLang has no P-EAGLE or PARD, TensorRT-LLM no P-EAGLE.
LACKS = {"vllm": set(), "sglang": {"p_eagle", "pard"}, "trtllm": {"p_eagle"}}
CHAINS = [kind for kind in DRAFTERS if kind not in BLOCK]
REFUSED = {
    # DSpark drafts its whole block: vLLM drops a per-batch table for it.
    "vllm": {"medusa-chain", "dspark-by-batch", *(f"{kind}-tree" for kind in CHAINS)},
    "sglang": {"medusa-chain", "ngram-tree"},
    "trtllm": {"medusa-chain", "draft_model-tree", "ngram-tree", "mtp-tree"},
}
for _engine, _kinds in LACKS.items():
    REFUSED[_engine] |= {f"{kind}-{v}" for kind in _kinds for v in ("chain", "by-batch")}


def rendered(models: Path, engine: str):
    """(id, setting, files) for every variant the engine's writer does not refuse."""
    writer = registry.engine(engine).writer
    out, refused = [], set()
    for name, setting in variants(models):
        if writer.refuses(setting) is None:
            out.append((name, setting, writer.render(setting, ["test"]).files))
        else:
            refused.add(name)
    assert refused == REFUSED[engine]
    return out


def arguments(text: str) -> list[str]:
    return shlex.split(text, comments=True)


# --- vLLM -----------------------------------------------------------------------------------


def test_vllm_parses_every_emitted_config(models):
    pytest.importorskip("vllm.engine.arg_utils", exc_type=ImportError)
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    checked = set()
    for name, setting, files in rendered(models, "vllm"):
        args_name = next(f for f in files if f.endswith(".args"))
        argv = ["--model", setting.target.path, "--skip-tokenizer-init"]
        engine = EngineArgs.from_cli_args(parser.parse_args(argv + arguments(files[args_name])))
        assert engine.max_num_seqs == setting.max_batch, name
        assert engine.tensor_parallel_size == setting.tensor_parallel_size, name
        configs = [json.loads(text) for f, text in files.items() if f.endswith(".json")]
        assert engine.speculative_config == (configs[0] if configs else None), name
        if setting.speculation is not None:
            # The bench script's forced-acceptance run: the same config, synthetic sampler.
            configs.append(vllm_config.speculative_config(setting, synthetic=True))
        model_config = engine.create_model_config()
        parallel = ParallelConfig(tensor_parallel_size=setting.tensor_parallel_size)
        for config in configs:
            engine.speculative_config = dict(config)
            built = engine.create_speculative_config(model_config, parallel)
            assert built.method == config["method"], name
            assert built.num_speculative_tokens == config["num_speculative_tokens"], name
        checked.add(setting.speculation.deployed_kind if setting.speculation else "off")
    assert checked == {*DRAFTERS, "off"}


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (
            {"method": "ngram", "prompt_lookup_depth": 3},
            "Unexpected keyword",
        ),
        ({"method": "medusa", "model": "draft"}, "input_value='medusa'"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "must be <="),
    ],
)
def test_vllm_parser_rejects_what_vllm_rejects(models, extra, error):
    """The harness can fail: an unknown key, a method vLLM 0.33 lacks (medusa) and inverted
    prompt-lookup bounds are vLLM's errors, not passes."""
    pytest.importorskip("vllm.engine.arg_utils", exc_type=ImportError)
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    config = {"num_speculative_tokens": 3, **extra}
    if "model" in config:
        config["model"] = str(models / config["model"])
    engine = EngineArgs(model=str(models / "target"), skip_tokenizer_init=True)
    engine.speculative_config = config
    with pytest.raises(Exception, match=error):
        engine.create_speculative_config(
            engine.create_model_config(), ParallelConfig(tensor_parallel_size=1)
        )


# --- SGLang ---------------------------------------------------------------------------------


def sglang_server_args(target: str, text: str):
    """``ServerArgs`` from the flags, and the algorithm name through SGLang's own resolver. (Its
    resolution hooks import ``sglang.srt.configs``, which needs torchvision: not run here.)"""
    import argparse

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", target, *arguments(text)])
    server = ServerArgs.from_cli_args(args)
    SpeculativeAlgorithm.from_string(server.speculative_algorithm)
    return server


def test_sglang_parses_every_emitted_flag_set(models):
    pytest.importorskip("sglang.srt.server_args", exc_type=ImportError)
    checked = set()
    for name, setting, files in rendered(models, "sglang"):
        text = next(t for f, t in files.items() if f.endswith(".args"))
        server = sglang_server_args(setting.target.path, text)
        written = registry.SGLANG.writer.render(setting, []).written
        for key, value in written.items():
            assert getattr(server, key) == value, (name, key)
        checked.add(setting.speculation.deployed_kind if setting.speculation else "off")
    assert checked == {*DRAFTERS, "off"} - LACKS["sglang"]


@pytest.mark.parametrize(
    ("flags", "error"),
    [("--speculative-algorithm MEDUSA", ValueError), ("--speculative-depth 3", SystemExit)],
)
def test_sglang_parser_rejects_what_sglang_rejects(models, flags, error):
    pytest.importorskip("sglang.srt.server_args", exc_type=ImportError)
    with pytest.raises(error):
        sglang_server_args(str(models / "target"), flags)


def test_sglangs_own_adaptive_steps_agree_with_specsims(models, tmp_path):
    """The emitted config, read by SGLang's AdaptiveSpeculativeParams, and specsim's policy
    built from the same settings choose the same steps for the same batches and acceptance."""
    pytest.importorskip("sglang.srt.speculative.adaptive_spec_params", exc_type=ImportError)
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    from specsim.simulation.engine_policies import AdaptiveStepsWindow

    config = AdaptiveSteps(warmup_batches=2, update_interval=2, ema_alpha=0.3)
    path = tmp_path / "sglang-adaptive.json"
    path.write_text(json.dumps(config.engine_config()))
    theirs = AdaptiveSpeculativeParams(initial_steps=3, cfg_path=str(path))
    ours = AdaptiveStepsWindow(3, config)
    rng = np.random.default_rng(7)
    chosen = set()
    for i in range(400):
        rows = int(rng.integers(1, 80))
        k = ours.choose(rows, 0.0)
        assert k == theirs.get_steps_for_batch(rows), (i, rows)
        chosen.add(k)
        # All drafts accepted mostly at first (steps climb), then mostly few (they fall).
        full = rng.random(rows) < (0.95 if i < 200 else 0.2)
        accepted = np.where(full, k, rng.integers(0, k + 1, size=rows))
        theirs.on_verify_complete(accepted.tolist(), rows)
        ours.observe(np.full(rows, float(k)), accepted.astype(float), 0.0)
    assert chosen == {0, 1, 3, 5, 7}  # every default candidate was reached


# --- TensorRT-LLM ---------------------------------------------------------------------------


def trtllm_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_trtllm_yaml_matches_the_llm_args_schema(models):
    validator = trtllm_validator()
    checked = set()
    for name, setting, files in rendered(models, "trtllm"):
        (text,) = files.values()
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(text))]
        assert not errors, (name, errors)
        checked.add(setting.speculation.deployed_kind if setting.speculation else "off")
    assert checked == {*DRAFTERS, "off"} - LACKS["trtllm"]


@pytest.mark.parametrize(
    "document",
    [
        {"max_batch_size": 8, "speculative_config": {"decoding_type": "Medusa"}},
        {"max_batch_size": 8, "kv_cache_config": {"block_size": 16}},
        {
            "speculative_config": {
                "decoding_type": "Eagle3",
                "max_draft_len": 3,
                "speculative_model": "m",
                "topk": 2,
            }
        },
        {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 0}},
        {"cache_transceiver_config": {"backend": "default"}},
        {"speculative_config": {"decoding_type": "MTP", "acceptance_rate_threshold": 1.5}},
        {"speculative_config": {"decoding_type": "MTP", "acceptance_rate_window_size": -1}},
        {
            "speculative_config": {
                "decoding_type": "MTP",
                "max_concurrency": 8,
                "draft_len_schedule": {"8": 3},
            }
        },
    ],
)
def test_trtllm_schema_rejects_keys_llm_args_rejects(document):
    assert list(trtllm_validator().iter_errors(document))
