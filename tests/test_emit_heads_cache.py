"""--emit for a heads drafter's stated passes (Medusa or EAGLE) and for the scenario's KV blocks
and cached prefixes: each engine writer on hand-built settings, and the plan's setting from a
profile and scenario."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from specsim.planning.emit import emit
from specsim.profile import load_profile
from specsim.serving import sglang_config, trtllm_config, vllm_config
from specsim.serving.setting import FROM_PROFILE, EngineSetting, ModelRef, Speculative

TARGET = ModelRef("target", "org/target", FROM_PROFILE)
HEADS = ModelRef("heads", "org/heads", FROM_PROFILE)
WRITERS = {"vllm": vllm_config, "sglang": sglang_config, "trtllm": trtllm_config}


def setting(passes: str | None = None, **engine) -> EngineSetting:
    spec = Speculative("heads", "heads", 2, HEADS, (0.6, 0.24), passes=passes)
    return EngineSetting(TARGET, 8, 2048, spec, **engine)


@pytest.mark.parametrize(
    "engine, says",
    [
        ("vllm", "vLLM 0.33 has no Medusa method (§3.2"),
        ("sglang", "SGLang has no Medusa method (§4.5"),
        ("trtllm", "TensorRT-LLM has no Medusa method (§5.2"),
    ],
)
def test_parallel_heads_are_medusa_which_no_engine_runs(engine, says):
    reason = WRITERS[engine].refuses(setting("parallel"))
    assert reason.startswith("the profile's heads drafter has passes: parallel (Medusa), and ")
    assert says in reason and "\n" not in reason


@pytest.mark.parametrize("passes", ["autoregressive", None])
def test_autoregressive_or_unstated_heads_stay_eagle(passes):
    ours = setting(passes)
    assert all(writer.refuses(ours) is None for writer in WRITERS.values())
    assert vllm_config.speculative_config(ours)["method"] == "eagle"
    assert sglang_config.algorithm(ours.speculation) == "EAGLE"
    assert trtllm_config.decoding_type(ours.speculation) == "Eagle"


def test_vllm_writes_the_block_size_and_prefix_caching():
    rendered = vllm_config.render(setting(block_size=16, prefix_caching=True), ["Head."])
    text = rendered.files["vllm.args"]
    words = shlex.split(text, comments=True)
    assert words[6:9] == ["--block-size", "16", "--enable-prefix-caching"]
    assert (rendered.written["block_size"], rendered.written["enable_prefix_caching"]) == (16, True)
    note = (
        "the scenario's workload.prefix assumes prefix caching on: vLLM V1 enables it by "
        "default, and --enable-prefix-caching states it"
    )
    assert note in rendered.notes
    assert "# Note: the scenario's workload.prefix assumes prefix caching on: vLLM V1" in text


def test_without_the_keys_vllm_writes_neither():
    rendered = vllm_config.render(setting(), ["Head."])
    text = rendered.files["vllm.args"]
    assert "--block-size" not in text and "prefix" not in text
    assert not {"block_size", "enable_prefix_caching"} & set(rendered.written)


def test_the_plans_setting_carries_passes_block_size_and_prefix(repo, monkeypatch):
    """setting_for reads passes from the profile's drafter and the cache keys from the
    scenario (the acceptance rates are stubbed: they are not what this checks)."""
    monkeypatch.setattr(emit, "unconditional_rates", lambda choice, k: (0.5,) * k)
    path = repo / "tests" / "data" / "sim_profile.yaml"
    for passes, block, prefix in [("parallel", 16, object()), (None, None, None)]:
        overrides = [] if passes is None else [f"drafters.heads.passes={passes}"]
        profile = load_profile(path, overrides)
        scenario = SimpleNamespace(
            engine=SimpleNamespace(max_batch=8, max_batched_tokens=2048, block_size=block),
            workload=SimpleNamespace(prefix=prefix),
            speculation=SimpleNamespace(
                verifier="rejection",
                temperature=1.0,
                policy="fixed",
                max_concurrency=None,
                acceptance_gate=None,
            ),
        )
        choice = SimpleNamespace(
            profile=profile, drafter="heads", k=2, rows=[], static_k=None, tree=None,
            scenario=scenario, unexpressed=[], policy=None,
        )  # fmt: skip
        ours = emit.setting_for(choice, SimpleNamespace(models=()))
        assert ours.speculation.passes == passes
        assert (ours.block_size, ours.prefix_caching) == (block, prefix is not None)


def test_sglang_writes_the_page_size_and_leaves_its_radix_cache_on():
    """SGLang's radix cache is on by default with no flag to enable it: a workload with cached
    prefixes gets a note, never --disable-radix-cache; the block size is --page-size."""
    rendered = sglang_config.render(setting(block_size=16, prefix_caching=True), ["Head."])
    text = rendered.files["sglang.args"]
    words = shlex.split(text, comments=True)
    assert words[words.index("--page-size") + 1] == "16"
    assert "--disable-radix-cache" not in words
    assert rendered.written["page_size"] == 16
    assert any("SGLang's radix cache is on by default" in note for note in rendered.notes)
    plain = sglang_config.render(setting(), ["Head."])
    assert "--page-size" not in plain.files["sglang.args"]
    assert not any("radix" in note for note in plain.notes)


def test_trtllm_writes_tokens_per_block_and_block_reuse():
    import yaml

    rendered = trtllm_config.render(setting(block_size=32, prefix_caching=True), ["Head."])
    document = yaml.safe_load(rendered.files["trtllm.yaml"])
    assert document["kv_cache_config"] == {"tokens_per_block": 32, "enable_block_reuse": True}
    assert any("enable_block_reuse states it" in note for note in rendered.notes)
    only_blocks = trtllm_config.render(setting(block_size=64), ["Head."]).written
    assert only_blocks["kv_cache_config"] == {"tokens_per_block": 64}
    assert "kv_cache_config" not in trtllm_config.render(setting(), ["Head."]).written


@pytest.mark.parametrize(
    "cache, key",
    [
        ({"tokens_per_block": 0}, "tokens_per_block"),
        ({"enable_block_reuse": "yes"}, "enable_block_reuse"),
        ({"block_size": 16}, "block_size"),
    ],
)
def test_trtllm_kv_cache_options_it_rejects_are_not_written(cache, key):
    from specsim.errors import SpecsimError

    document = {"max_batch_size": 8, "max_num_tokens": 64, "tensor_parallel_size": 1}
    with pytest.raises(SpecsimError, match=rf"kv_cache_config\.{key}"):
        trtllm_config.check({**document, "kv_cache_config": cache})


def test_sglang_refuses_a_page_size_below_one():
    from specsim.errors import SpecsimError

    with pytest.raises(SpecsimError, match="--page-size: '0' is not a whole number above 0"):
        sglang_config.check([("--max-running-requests", "8"), ("--page-size", "0")])
