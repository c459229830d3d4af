"""DeepSeek-V3 beyond the family tests (``test_models_families``, which compare its logits with
transformers' in prefill and incremental decode): a variant without the query bottleneck, the
router's score bias, the latent cache's size, the stored multi-token-prediction layers, and
greedy speculative decoding through the built-in engine.

The models are transformers' ``DeepseekV3ForCausalLM`` with seeded random weights
(``test_models_families.reference_model``), written with its own ``save_pretrained``.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_e2e_lossless import greedy_divergences, greedy_reference
from test_models_families import assert_matches, reference_logits, reference_model, tokens

from specsim.engine.generate import generate
from specsim.engine.step import Sampling
from specsim.errors import SpecsimError
from specsim.models import load_model
from specsim.tree import TreeShape

# DeepSeek-V2-Lite's layout: no query bottleneck, plain rotary pairs, every layer MoE, the
# chosen experts' weights not renormalised.
LITE = dict(
    q_lora_rank=None,
    rope_interleave=False,
    first_k_dense_replace=0,
    norm_topk_prob=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


NOISE = 0.005  # against weights of N(0, 0.3): mean acceptance length 2.4 of at most 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek") / "model"
    reference_model("deepseek_v3").save_pretrained(path)
    return path


@torch.no_grad()
def test_the_lite_layout_matches_transformers(tmp_path):
    reference = reference_model("deepseek_v3", **LITE)
    reference.save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    assert model.config.q_lora_rank is None and model.config.dense_layers == ()
    ids = tokens()
    expected = reference_logits(reference, ids)
    assert_matches(model(ids), expected, model.config)
    cache = model.new_cache(2, 32)
    steps = [model(ids[:, :4], cache)] + [model(ids[:, i : i + 1], cache) for i in range(4, 12)]
    assert_matches(torch.cat(steps, dim=1), expected, model.config)


@torch.no_grad()
def test_the_routers_score_bias_changes_which_experts_run(folder):
    # The bias ranks experts but does not weigh them: zeroing it must move the logits (the
    # family test's match then shows it is applied where transformers applies it).
    model = load_model(folder)
    ids = tokens()
    before = model(ids)
    for layer in model.model.layers[1:]:
        layer.mlp.gate.e_score_correction_bias.zero_()
    tolerance = assert_matches(
        before, reference_logits(reference_model("deepseek_v3"), ids), model.config
    )
    assert (model(ids) - before).abs().max().item() > 100 * tolerance


def test_the_cache_holds_the_latent_and_the_rotary_key(folder):
    model = load_model(folder)
    c = model.config
    assert c.kv_bytes_per_token(4) == 3 * (10 + 4) * 4  # layers x (kv_lora_rank + rope) x fp32
    cache = model.new_cache(2, 16)
    assert cache.nbytes() == 2 * (16 + 1) * c.kv_bytes_per_token(4)  # one spare slot per row
    # One head each: the latent (kv_lora_rank 10) and the rotary key (4), not 4 heads' keys
    # (6 + 4 wide) and values (5 wide), which would take 180 bytes a layer in fp32, not 56.
    assert cache.keys[0].shape == (2, 1, 17, 10) and cache.values[0].shape == (2, 1, 17, 4)


@torch.no_grad()
def test_stored_multi_token_prediction_layers_are_skipped(folder, tmp_path):
    """A DeepSeek-V3 checkpoint stores its MTP module as layer num_hidden_layers; the decoder
    does not run it, so it is skipped, while any other stray weight is still refused."""
    weights = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["num_nextn_predict_layers"] == 1
    mtp = {
        "model.layers.3.eh_proj.weight": torch.zeros(32, 64),
        "model.layers.3.self_attn.kv_b_proj.weight": torch.zeros(44, 10),
    }
    (tmp_path / "with-mtp").mkdir()
    (tmp_path / "with-mtp" / "config.json").write_text(json.dumps(config))
    save_file({**weights, **mtp}, str(tmp_path / "with-mtp" / "model.safetensors"))
    ids = tokens()
    assert torch.equal(load_model(tmp_path / "with-mtp")(ids), load_model(folder)(ids))
    config["num_nextn_predict_layers"] = 0
    (tmp_path / "with-mtp" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecsimError, match="unexpected weight"):
        load_model(tmp_path / "with-mtp")


@torch.no_grad()
@pytest.mark.parametrize("tree", [None, "2,1"])
def test_greedy_speculative_decoding_gives_the_targets_own_tokens(folder, tree):
    """A DeepSeek target with a drafter of the same weights plus seeded noise (so drafts are
    partly accepted, partly rejected, and both latent caches roll back), in chains of 3 and in
    trees 2,1 (whose accepted path is moved within the cache): the speculative tokens are the
    target's greedy ones, and the caches hold exactly the accepted sequence."""
    target, drafter = load_model(folder), load_model(folder)
    generator = torch.Generator().manual_seed(5)
    for param in drafter.parameters():
        param.add_(torch.randn(param.shape, generator=generator) * NOISE)
    prompts = [tokens(1, seed=s)[0, :6].tolist() for s in range(4)]
    greedy = Sampling(temperature=0.0, verifier="greedy")
    shape = None if tree is None else TreeShape.parse(tree)
    k = 3 if shape is None else shape.depth
    run = generate(target, drafter, prompts, 10, k, greedy, 0, audit=True, tree=shape)
    expected, margins = greedy_reference(target, prompts, 10)
    near_ties = greedy_divergences(run.tokens, expected, margins)
    assert all(margin < 1e-4 for _, _, margin in near_ties), near_ties
    assert not run.audit
    assert 1.0 < run.mean_acceptance_length < k + 1  # some drafts accepted, some rejected
