"""Each model family the loader reads gives transformers' logits, prefill and incremental decode.

Every test writes a small random-weight folder with transformers' own ``save_pretrained`` (its
config.json and its checkpoint layout: Phi-3's fused matrices, Mixtral's expert names), loads it
with specsim and compares the logits with transformers' (eager attention, float32) within the
rounding bound of ``numerics.py``. The sizes are chosen so each family's difference shows: a
sliding window shorter than the sequence, soft-caps the scores reach, a query scale other than
the head size's, norms away from their neutral value, experts of which some are never chosen.
``test_each_family_flag_changes_the_logits`` shows the comparison is sensitive to every flag.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from numerics import decoder_tolerance

# The cache's guarantees (incremental, batched, ragged, rolled back: test_models_forward) hold
# for every family too: collected here, these run on this module's ``model`` fixture below.
from test_models_forward import (  # noqa: F401
    test_batched_rows_of_different_lengths_match_single_rows,
    test_incremental_decode_matches_prefill,
    test_padding_never_overwrites_a_row_that_ends_at_max_len,
    test_ragged_padding_is_neither_attended_nor_kept,
    test_rollback_forgets_rejected_tokens_per_row,
)

from specsim.models import DecoderModel, ModelConfig, load_model, save_model
from specsim.profiling.model_configs import load_shape, shape_from_object

COMMON = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
GEMMA_WINDOWS = dict(
    sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"]
)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"tie_word_embeddings": False}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            **GEMMA_WINDOWS,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            query_pre_attn_scalar=24,
            final_logit_softcapping=3.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            **GEMMA_WINDOWS,
        ),
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 5}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, sliding_window=5)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1]),
    ),
    # Latent attention with a query bottleneck, interleaved rotary pairs and YaRN whose mscale
    # terms differ (so both the rotary and the softmax scale move); 8 experts in 4 groups of
    # which 2 are searched; the first layer dense.
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            num_key_value_heads=4,
            head_dim=4,  # transformers' name for the rotary part's width
            q_lora_rank=12,
            kv_lora_rank=10,
            qk_nope_head_dim=6,
            qk_rope_head_dim=4,
            v_head_dim=5,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            first_k_dense_replace=1,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "mscale": 1.0,
                "mscale_all_dim": 0.707,
            },
        ),
    ),
}
LENGTH = 12  # longer than every sliding window above


def reference_model(model_type: str, seed: int = 0, **changes):
    """A transformers model of the family with seeded weights far from the initialiser's: N(0,
    0.3) matrices and norms away from neutral (Gemma's scale by 1 + weight), and DeepSeek's
    router score bias (a buffer there) N(0, 0.3) too."""
    config_class, model_class, extra = FAMILIES[model_type]
    config = getattr(transformers, config_class)(**{**COMMON, **extra, **changes})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                offset = 0.0 if model_type.startswith("gemma") else 1.0
                param.copy_(offset + torch.rand(param.shape, generator=generator) - 0.5)
            else:
                param.normal_(0.0, 0.3, generator=generator)
        for name, buffer in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.3, generator=generator)
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(specsim model, transformers model, model folder) of one family."""
    reference = reference_model(request.param)
    folder = tmp_path_factory.mktemp(request.param) / "model"
    reference.save_pretrained(folder)
    return load_model(folder), reference, folder


@pytest.fixture(scope="module")
def model(family):
    return family[0]


def tokens(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 61, (batch, LENGTH), generator=torch.Generator().manual_seed(seed))


def reference_logits(reference, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference(input_ids=ids, use_cache=False).logits.float()


def assert_matches(got: torch.Tensor, expected: torch.Tensor, config) -> float:
    """Equal within the rounding bound; returns the bound for callers that compare with it."""
    tolerance = decoder_tolerance(config, expected)
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)
    return tolerance


@torch.no_grad()
def test_prefill_matches_transformers(family):
    model, reference, _ = family
    ids = tokens()
    assert_matches(model(ids), reference_logits(reference, ids), model.config)


@torch.no_grad()
def test_incremental_decode_matches_transformers(family):
    """A prompt of 5 tokens, then one token per call through the cache: each call's logits are
    transformers' at that position (past every sliding window's edge)."""
    model, reference, _ = family
    ids = tokens()
    expected = reference_logits(reference, ids)
    cache = model.new_cache(2, 32)
    steps = [model(ids[:, :5], cache)] + [model(ids[:, i : i + 1], cache) for i in range(5, LENGTH)]
    assert_matches(torch.cat(steps, dim=1), expected, model.config)


@torch.no_grad()
def test_save_model_writes_the_familys_layout(family, tmp_path):
    """specsim's folder is the family's: transformers loads it to the same logits."""
    model, reference, _ = family
    save_model(model, tmp_path / "again", dtype=torch.float32)
    # pad_token_id is no key specsim keeps; Phi-3's default (32000) lies outside this vocabulary.
    again = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "again", attn_implementation="eager", pad_token_id=0
    )
    ids = tokens(seed=4)
    expected = reference_logits(reference, ids)
    assert_matches(reference_logits(again.eval(), ids), expected, model.config)


# Per family, config flags that change the computation but not the weights: switched off (or
# changed), each moves the logits far past the tolerance, so the tests above would catch it.
FLAG_CHANGES = [
    ("gemma", {"gemma_norms": False}),
    ("gemma", {"activation": "silu"}),
    ("gemma2", {"attn_softcap": None}),
    ("gemma2", {"final_softcap": None}),
    ("gemma2", {"query_pre_attn_scalar": None}),
    ("gemma2", {"layer_types": None}),
    ("gemma3_text", {"rope_local_theta": None}),
    ("gemma3_text", {"rope_scaling": None}),
    ("phi3", {"sliding_window": None}),
    ("mixtral", {"experts_per_token": 1}),
    ("mixtral", {"normalize_top_k": False}),
    ("qwen3_moe", {"normalize_top_k": True}),
    ("deepseek_v3", {"normalize_top_k": False}),
    ("deepseek_v3", {"routed_scaling_factor": 1.0}),
    ("deepseek_v3", {"groups_per_token": 4}),
    ("deepseek_v3", {"rope_interleave": False}),
    ("deepseek_v3", {"rope_scaling": None}),
]


@pytest.mark.parametrize(("model_type", "change"), FLAG_CHANGES)
@torch.no_grad()
def test_each_family_flag_changes_the_logits(tmp_path, model_type, change):
    reference = reference_model(model_type)
    reference.save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    ids = tokens()
    tolerance = assert_matches(model(ids), reference_logits(reference, ids), model.config)
    altered = DecoderModel(dataclasses.replace(model.config, **change))
    altered.load_state_dict(model.state_dict())
    difference = (altered.eval()(ids) - model(ids)).abs().max().item()
    assert difference > 100 * tolerance


def test_family_config_round_trips_through_hf_dict(family):
    model, _, _ = family
    again = ModelConfig.from_hf_dict(model.config.to_hf_dict(), "again.json", model.config.name)
    assert again == model.config


def test_sizes_follow_the_parameters(family):
    """Every expert is a stored parameter; a token's FLOPs count its experts_per_token experts,
    and each layer's attention its own window."""
    model, _, _ = family
    c = model.config
    assert c.param_count() == sum(p.numel() for p in model.parameters())
    dense = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".experts." not in name
    )
    experts = 0
    for layer in model.model.layers:
        if hasattr(layer.mlp, "experts"):
            one = sum(p.numel() for p in layer.mlp.experts[0].parameters())
            experts += c.experts_per_token * one
    if c.tie_embeddings:
        dense += model.model.embed_tokens.weight.numel()
    assert c.flops_per_token() == 2 * (dense + experts)
    assert (c.active_param_count() < c.param_count()) == (c.num_experts > 0)
    # Latent attention counts the engines' absorbed form: q against the latent and rotary key,
    # the weights on the latent.
    per_head = 4 * c.kv_lora_rank + 2 * c.qk_rope_head_dim if c.is_mla else 4 * c.head_dim
    per_layer = c.num_heads * per_head
    for n, context in ((1, 9), (3, 0), (6, 2)):
        attended = sum(
            min(context + i, c.layer_window(layer) or 10**9)
            for layer in range(c.num_layers)
            for i in range(1, n + 1)
        )
        assert c.forward_flops(n, context) == n * c.flops_per_token() + per_layer * attended


def test_roofline_sizes_the_folder_as_the_loader_does(family):
    """The roofline's sizing (no torch) reads transformers' config.json (its key names, e.g.
    Qwen3-MoE's num_local_experts) to the loader's numbers."""
    model, _, folder = family
    shape = load_shape(folder)
    assert shape == shape_from_object(model.config, shape.name)
    assert shape.param_count() == model.config.param_count()
    assert shape.flops_per_token() == model.config.flops_per_token()


@torch.no_grad()
def test_a_tree_call_on_layers_of_different_windows_is_refused(tmp_path):
    # One tree mask serves every layer, so Gemma 2's alternating windows cannot take one.
    from specsim.engine.tree_attention import verification_attention
    from specsim.errors import SpecsimError
    from specsim.tree import TreeShape

    reference = reference_model("gemma2")
    reference.save_pretrained(tmp_path / "model")
    model = load_model(tmp_path / "model")
    cache = model.new_cache(1, 32)
    model(tokens(1), cache)
    shape = TreeShape.parse("2,1")
    attention = verification_attention(cache.lengths.clone(), shape, model.config.sliding_window)
    with pytest.raises(SpecsimError, match="different sliding windows"):
        model(tokens(1)[:, : shape.num_nodes + 1], cache, tree=attention)
