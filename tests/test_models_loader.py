"""Loading models and tokenizers from Hugging Face-style directories, config.json files and
built-in names, and the one-line errors for everything that can be wrong with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_models_forward import make_model, small_config, tokens_for

from specsim.errors import SpecsimError
from specsim.models import (
    BUILTIN_MODELS,
    ByteTokenizer,
    ModelConfig,
    load_config,
    load_model,
    load_tokenizer,
    save_model,
)


def write_hf_dir(directory: Path, model, shards: int = 1, extra: dict | None = None) -> Path:
    """What ``save_pretrained`` writes: config.json plus safetensors with HF key names, in one
    file or split into shards with an index."""
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf_dict()
    config.update({"transformers_version": "4.44.0", "use_cache": True, "initializer_range": 0.02})
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors.update(extra or {})
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        save_file(part, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def same_logits(a, b) -> None:
    tokens = tokens_for(2, 9, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(a(tokens), b(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_save_model_round_trip_is_exact(tmp_path, model_type):
    original = make_model(small_config(model_type))
    save_model(original, tmp_path / "m", dtype=torch.float32)
    loaded = load_model(tmp_path / "m")
    assert loaded.config == ModelConfig(**{**original.config.__dict__, "name": "m"})
    same_logits(original, loaded)
    assert not loaded.training


@pytest.mark.parametrize("shards", [1, 3])
def test_hugging_face_directory_loads(tmp_path, shards):
    original = make_model(small_config("llama"))
    inv_freq = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}
    write_hf_dir(tmp_path / "hf", original, shards=shards, extra=inv_freq)
    same_logits(original, load_model(tmp_path / "hf"))
    assert load_config(tmp_path / "hf").num_kv_heads == 2


def test_tied_checkpoint_that_also_stores_lm_head_loads(tmp_path):
    original = make_model(small_config("qwen2"))
    extra = {"lm_head.weight": original.model.embed_tokens.weight.detach().clone()}
    same_logits(original, load_model(write_hf_dir(tmp_path / "hf", original, extra=extra)))


def test_half_precision_files_load_as_requested_dtype(tmp_path):
    original = make_model(small_config("llama"))
    save_model(original, tmp_path / "m", dtype=torch.bfloat16)
    as_float = load_model(tmp_path / "m")
    as_bf16 = load_model(tmp_path / "m", dtype=torch.bfloat16)
    assert as_float.dtype == torch.float32 and as_bf16.dtype == torch.bfloat16
    assert json.loads((tmp_path / "m" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    rounded = original.model.embed_tokens.weight.to(torch.bfloat16).float()
    assert torch.equal(as_float.model.embed_tokens.weight, rounded)


def test_config_only_gives_seeded_random_weights(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config("mistral").to_hf_dict()))
    first, again, other = load_model(path), load_model(path), load_model(path, seed=1)
    same_logits(first, again)
    weight = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(first.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])
    std = first.state_dict()[weight].std().item()
    assert 0.017 < std < 0.023  # the usual initializer_range of 0.02
    assert load_model(path, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_published_architectures_have_their_published_sizes():
    llama31_8b = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    }
    config = ModelConfig.from_hf_dict(llama31_8b, "llama.json")
    assert config.param_count() == 8_030_261_248
    assert config.kv_bytes_per_token(2) == 128 * 1024  # 128 KiB per token in bf16
    assert config.eos_id == 128001
    qwen25_05b = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    config = ModelConfig.from_hf_dict(qwen25_05b, "qwen.json")
    assert config.attention_bias and config.param_count() == 494_032_768


def test_config_round_trips_through_hf_dict():
    config = small_config("llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    again = ModelConfig.from_hf_dict(config.to_hf_dict(), "x")
    assert again == config


# ---- errors -------------------------------------------------------------------------------------


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_unknown_spec_names_the_builtins(tmp_path):
    with pytest.raises(SpecsimError) as err:
        load_model(tmp_path / "nowhere")
    text = one_line(err)
    assert "model not found" in text and str(tmp_path / "nowhere") in text
    assert all(name in text for name in BUILTIN_MODELS)
    with pytest.raises(SpecsimError, match="model not found"):
        load_model("specsim-huge")


def test_directory_without_config_or_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecsimError, match=r"no config\.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(small_config().to_hf_dict()))
    with pytest.raises(SpecsimError, match=r"no model\.safetensors.*pass the config\.json"):
        load_model(tmp_path / "empty")


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"hidden_size": "abc"}, "hidden_size", "expected int"),
        ({"num_hidden_layers": True}, "num_hidden_layers", "expected int"),
        ({"vocab_size": None}, "vocab_size", "missing key"),
        ({"rope_theta": -1.0}, "rope_theta", "must be positive"),
        ({"model_type": "gpt2"}, "model_type", "not supported"),
        ({"hidden_act": "gelu"}, "hidden_act", "not supported"),
        ({"num_key_value_heads": 3}, "num_key_value_heads", "not a multiple"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope_scaling.rope_type", "yarn"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "low_freq_factor", "positive"),
        ({"specsim_tokenizer": "sentencepiece"}, "specsim_tokenizer", "unknown tokenizer"),
        ({"model_type": "mistral", "sliding_window": 0}, "sliding_window", "must be positive"),
        ({"mlp_bias": True}, "mlp_bias", "not supported"),
        ({"hidden_size": 10**30}, "hidden_size", "at most"),
        ({"rope_theta": 1e300}, "rope_theta", "at most"),
        ({"max_position_embeddings": 2**40}, "max_position_embeddings", "at most"),
    ],
)
def test_bad_config_keys(tmp_path, change, key, message):
    data = small_config().to_hf_dict()
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecsimError) as err:
        load_model(path)
    text = one_line(err)
    assert str(path) in text and key in text and message in text and "fix:" in text


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",')
    with pytest.raises(SpecsimError, match="invalid JSON"):
        load_model(path)


def test_weights_that_do_not_fit_the_config(tmp_path):
    model = make_model(small_config("llama"))
    wrong_shape = {"model.norm.weight": torch.ones(5)}
    write_hf_dir(tmp_path / "shape", model, extra=wrong_shape)
    with pytest.raises(SpecsimError, match=r"model\.norm\.weight.*shape \(5,\)"):
        load_model(tmp_path / "shape")
    write_hf_dir(
        tmp_path / "extra", model, extra={"model.layers.0.self_attn.q_proj.bias": torch.ones(32)}
    )
    with pytest.raises(SpecsimError, match=r"unexpected weight.*attention_bias"):
        load_model(tmp_path / "extra")
    directory = write_hf_dir(tmp_path / "missing", model)
    data = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in data.items()}, str(directory / "model.safetensors"))
    with pytest.raises(SpecsimError, match=r"lm_head\.weight: weight missing"):
        load_model(directory)


TARGET_REFUSALS = {
    # (tensors changed: None deletes, error with the folder written <dir>)
    "a tensor of the wrong shape": (
        {"model.norm.weight": torch.ones(5)},
        "<dir>/model.safetensors: model.norm.weight: shape (5,) does not match the config's "
        "(32,); fix: use the config.json that belongs to these weights",
    ),
    "an unexpected tensor": (
        {"model.layers.0.self_attn.q_proj.bias": torch.ones(32)},
        "<dir>/model.safetensors: model.layers.0.self_attn.q_proj.bias: unexpected weight for "
        "this architecture; fix: check model_type, tie_word_embeddings and attention_bias",
    ),
    "a missing tensor": (
        {"lm_head.weight": None, "model.norm.weight": None},
        "<dir>: lm_head.weight: weight missing (2 in all); fix: download the complete checkpoint",
    ),
    # Tensors are checked as they are read, the missing ones after: the misfit is named.
    "a missing tensor and a misfit one": (
        {"lm_head.weight": None, "model.norm.weight": torch.ones(5)},
        "<dir>/model.safetensors: model.norm.weight: shape (5,) does not match the config's "
        "(32,); fix: use the config.json that belongs to these weights",
    ),
}


@pytest.mark.parametrize("fault", TARGET_REFUSALS)
def test_a_checkpoint_that_does_not_fit_is_refused_word_for_word(tmp_path, fault):
    """The target's refusals exactly; the MTP layer's load shares their code with its own
    wording (``test_mtp_engine``)."""
    changes, expected = TARGET_REFUSALS[fault]
    model = make_model(small_config("llama"))
    directory = write_hf_dir(tmp_path / "m", model)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors.update(changes)
    tensors = {k: v for k, v in tensors.items() if v is not None}
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(SpecsimError) as error:
        load_model(directory)
    assert str(error.value).replace(str(directory), "<dir>") == expected


def test_missing_shard(tmp_path):
    directory = write_hf_dir(tmp_path / "hf", make_model(small_config()), shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SpecsimError, match=r"shard model-00002-of-00002\.safetensors is missing"):
        load_model(directory)


def test_corrupt_weights_file(tmp_path):
    directory = write_hf_dir(tmp_path / "hf", make_model(small_config()))
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{nonsense")
    with pytest.raises(SpecsimError, match="cannot read weights"):
        load_model(directory)


# ---- tokenizers ---------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    text = "def f(x):\n    return x ** 2  # ünïcödé ✓ 🐍"
    ids = tok.encode(text)
    assert max(ids) < 256 and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode("a", add_bos=True) == [tok.bos_id, 97]
    assert tok.decode([tok.bos_id, 104, 105, tok.eos_id]) == "hi"
    assert tok.decode(tok.encode("é")[:1]) == "\ufffd"  # a cut character is marked, not an error


def test_builtin_configs_declare_the_byte_tokenizer():
    for name in BUILTIN_MODELS:
        tok = load_tokenizer(name)
        assert isinstance(tok, ByteTokenizer)
        assert (tok.bos_id, tok.eos_id) == (256, 257)
        assert load_config(name).vocab_size == 258


def test_tokenizer_json_loads_through_tokenizers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "def": 3, "f": 4, "(": 5, ")": 6, ":": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    directory = write_hf_dir(tmp_path / "hf", make_model(small_config()))
    tokenizer.save(str(directory / "tokenizer.json"))
    assert load_model(directory) is not None  # the model never needed the tokenizer
    tok = load_tokenizer(directory)  # no ids in config.json: they come from tokenizer_config.json
    assert (tok.bos_id, tok.eos_id) == (None, None)
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}})
    )
    tok = load_tokenizer(directory)
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.encode("def f ( ) :") == [3, 4, 5, 6, 7]
    assert tok.encode("def", add_bos=True) == [1, 3]
    assert tok.decode([1, 3, 4, 2]) == "def f"


def test_missing_or_broken_tokenizer_fails_only_when_text_is_needed(tmp_path):
    directory = write_hf_dir(tmp_path / "hf", make_model(small_config()))
    load_model(directory)
    with pytest.raises(SpecsimError, match=r"no tokenizer\.json") as err:
        load_tokenizer(directory)
    assert "fix:" in one_line(err)
    (directory / "tokenizer.json").write_text("{not json")
    with pytest.raises(SpecsimError, match="cannot read tokenizer"):
        load_tokenizer(directory)
    with pytest.raises(SpecsimError, match="model not found"):
        load_tokenizer(tmp_path / "nowhere")


def test_transformers_5_rope_parameters_read_like_the_older_keys():
    older = small_config().to_hf_dict()
    older.update(rope_theta=500000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    newer = {k: v for k, v in older.items() if k not in ("rope_theta", "rope_scaling")}
    newer["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}
    parsed_old = ModelConfig.from_hf_dict(older, "old.json")
    parsed_new = ModelConfig.from_hf_dict(newer, "new.json")
    assert parsed_new == parsed_old
    assert parsed_new.rope_theta == 500000.0 and parsed_new.rope_scaling["factor"] == 4.0
    newer["rope_parameters"] = {"rope_type": "default", "rope_theta": "fast"}
    with pytest.raises(SpecsimError, match=r"rope_parameters\.rope_theta: expected float"):
        ModelConfig.from_hf_dict(newer, "new.json")


def test_llama_attention_bias_covers_all_four_projections():
    data = small_config("llama").to_hf_dict()
    data["attention_bias"] = True
    config = ModelConfig.from_hf_dict(data, "x")
    model = make_model(config)
    biases = sorted(n.split(".")[-2] for n, _ in model.named_parameters() if n.endswith("bias"))
    assert biases == sorted(["q_proj", "k_proj", "v_proj", "o_proj"] * 2)
    assert config.param_count() == sum(p.numel() for p in model.parameters())
    qwen = make_model(small_config("qwen2"))
    assert not any("o_proj.bias" in n for n, _ in qwen.named_parameters())


def test_sliding_window_is_read_for_mistral_and_refused_for_qwen2():
    data = small_config("mistral").to_hf_dict()
    data["sliding_window"] = 4096
    assert ModelConfig.from_hf_dict(data, "m.json").sliding_window == 4096
    data["sliding_window"] = None  # Mistral v0.2 and later
    assert ModelConfig.from_hf_dict(data, "m.json").sliding_window is None
    qwen = small_config("qwen2").to_hf_dict()
    qwen.update(use_sliding_window=False, sliding_window=4096)
    assert ModelConfig.from_hf_dict(qwen, "q.json").sliding_window is None
    qwen["use_sliding_window"] = True
    with pytest.raises(SpecsimError, match="use_sliding_window: Qwen2 sliding-window"):
        ModelConfig.from_hf_dict(qwen, "q.json")
