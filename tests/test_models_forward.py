"""The decoder and its per-row KV cache: incremental, batched, ragged and rolled-back passes all
give the logits of a plain causal pass, and the decoder matches an independent reference."""

from __future__ import annotations

import math

import pytest
import torch
from numerics import decoder_tolerance

from specsim.errors import SpecsimError
from specsim.models import DecoderModel, ModelConfig

# A real cache, mask or position bug moves the logits by more than BUG_EFFECT (pinned by
# test_the_rollback_check_is_sensitive_to_stale_tokens), far above the rounding bound.
BUG_EFFECT = 1e-2


def assert_rounding_close(got: torch.Tensor, expected: torch.Tensor, config: ModelConfig) -> None:
    """Equal up to the rounding that another summation order (or another CPU) may give: the
    decoder's bound holds for its logits and for the keys and values it caches on the way."""
    tolerance = decoder_tolerance(config, expected.detach(), got.dtype)
    assert tolerance < BUG_EFFECT / 10
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)


def small_config(model_type: str = "llama", **changes) -> ModelConfig:
    base = dict(
        vocab_size=61,
        num_layers=2,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        max_position=64,
        model_type=model_type,
        attention_bias=model_type == "qwen2",
        tie_embeddings=model_type != "llama",
    )
    base.update(changes)
    return ModelConfig(**base)


def make_model(config: ModelConfig, seed: int = 0) -> DecoderModel:
    model = DecoderModel(config)
    # A larger spread than the usual 0.02 so logits are far from uniform and bugs show.
    model.init_weights(torch.Generator().manual_seed(seed), std=0.3)
    return model.eval()


VARIANTS = {
    "llama-gqa-untied": small_config("llama"),
    "qwen2-bias-tied": small_config("qwen2"),
    "mistral-mha": small_config("mistral", num_kv_heads=4),
    "mistral-sliding-window": small_config("mistral", sliding_window=5),
    "llama3-rope-scaling": small_config(
        "llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 0.5,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 20,
        },
        rope_theta=500.0,
    ),
}


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def model(request) -> DecoderModel:
    return make_model(VARIANTS[request.param])


def tokens_for(batch: int, length: int, seed: int = 1, vocab: int = 61) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_incremental_decode_matches_prefill(model):
    tokens = tokens_for(3, 20)
    full = model(tokens)
    cache = model.new_cache(3, 32)
    one_by_one = torch.cat([model(tokens[:, i : i + 1], cache) for i in range(20)], dim=1)
    assert_rounding_close(one_by_one, full, model.config)
    cache = model.new_cache(3, 32)
    chunks = torch.cat([model(tokens[:, :7], cache), model(tokens[:, 7:], cache)], dim=1)
    assert_rounding_close(chunks, full, model.config)
    assert cache.lengths.tolist() == [20, 20, 20]


@torch.no_grad()
def test_batched_rows_of_different_lengths_match_single_rows(model):
    lengths = [13, 4, 9]
    tokens = tokens_for(3, 16, seed=2)
    cache = model.new_cache(3, 32)
    prefill = model(tokens[:, :13], cache, n_new=torch.tensor(lengths))
    next_tokens = tokens[:, 13:16]  # three decode steps, each row at its own position
    decoded = torch.cat([model(next_tokens[:, i : i + 1], cache) for i in range(3)], dim=1)
    for row, length in enumerate(lengths):
        single = model.new_cache(1, 32)
        ref_prefill = model(tokens[row : row + 1, :length], single)
        ref_decoded = model(next_tokens[row : row + 1], single)
        assert_rounding_close(prefill[row, :length], ref_prefill[0], model.config)
        assert_rounding_close(decoded[row], ref_decoded[0], model.config)
    assert cache.lengths.tolist() == [16, 7, 12]


@torch.no_grad()
def test_ragged_padding_is_neither_attended_nor_kept(model):
    tokens = tokens_for(3, 6, seed=3)
    n_new = torch.tensor([6, 2, 0])
    cache_a, cache_b = model.new_cache(3, 16), model.new_cache(3, 16)
    out_a = model(tokens, cache_a, n_new)
    junk = tokens.clone()
    junk[1, 2:] = tokens_for(1, 4, seed=9)[0]
    junk[2, :] = 60  # padding may hold any id, even the last one
    out_b = model(junk, cache_b, n_new)
    for row, n in enumerate(n_new.tolist()):
        assert_rounding_close(out_a[row, :n], out_b[row, :n], model.config)
    assert cache_a.lengths.tolist() == [6, 2, 0]
    follow = tokens_for(3, 1, seed=4)
    after_a, after_b = model(follow, cache_a), model(follow, cache_b)
    assert_rounding_close(after_a, after_b, model.config)
    # The row that received nothing behaves like a fresh cache.
    fresh = model(follow[2:3], model.new_cache(1, 16))
    assert_rounding_close(after_a[2], fresh[0], model.config)


@torch.no_grad()
def test_padding_never_overwrites_a_row_that_ends_at_max_len(model):
    """Row 1 holds 4 tokens and gets 2 more plus 4 padding columns in a cache of 6: the padding
    lies past max_len and must go to the spare slot, not onto the row's last real token."""
    tokens = tokens_for(2, 6, seed=12)
    cache = model.new_cache(2, 6)
    model(tokens[:, :4], cache, n_new=torch.tensor([0, 4]))
    model(torch.cat([tokens[:1], tokens[1:, 4:].repeat(1, 3)]), cache, torch.tensor([6, 2]))
    assert cache.lengths.tolist() == [6, 6]
    for row in (0, 1):
        single = model.new_cache(1, 6)
        model(tokens[row : row + 1], single)
        for layer in range(model.config.num_layers):
            assert_rounding_close(
                cache.keys[layer][row, :, :6], single.keys[layer][0, :, :6], model.config
            )
            assert_rounding_close(
                cache.values[layer][row, :, :6], single.values[layer][0, :, :6], model.config
            )


@torch.no_grad()
def test_rollback_forgets_rejected_tokens_per_row(model):
    prefix = tokens_for(3, 8, seed=5)
    clean = model.new_cache(3, 32)
    model(prefix, clean)
    dirty = model.new_cache(3, 32)
    model(prefix, dirty)
    junk = tokens_for(3, 4, seed=6)
    accepted = torch.tensor([1, 0, 4])  # a partial, a full rejection and a full acceptance
    model(junk, dirty)
    keys_before = dirty.keys[0].data_ptr()
    dirty.rollback(torch.tensor([8, 8, 8]) + accepted)
    assert dirty.keys[0].data_ptr() == keys_before  # lengths and masking only, no copy
    assert dirty.lengths.tolist() == [9, 8, 12]
    model(junk, clean, n_new=accepted)  # the clean cache only ever sees the accepted tokens
    follow = tokens_for(3, 2, seed=7)
    assert_rounding_close(model(follow, dirty), model(follow, clean), model.config)


@torch.no_grad()
def test_the_rollback_check_is_sensitive_to_stale_tokens(model):
    """Without the rollback the junk changes the next logits by more than BUG_EFFECT, far above
    the rounding tolerance, so the test above would catch a rollback that did not really forget."""
    prefix, junk, follow = tokens_for(1, 8, seed=5), tokens_for(1, 3, seed=6), tokens_for(1, 1)
    with_junk, without = model.new_cache(1, 32), model.new_cache(1, 32)
    model(torch.cat([prefix, junk], 1), with_junk)
    model(prefix, without)
    without.lengths += 3  # pretend length matches, but the slots hold other tokens' keys
    difference = (model(follow, with_junk) - model(follow, without)).abs().max().item()
    assert difference > BUG_EFFECT


def reference_forward(model: DecoderModel, tokens: list[int]) -> torch.Tensor:
    """A direct float64 transcription of the Llama equations, one position and head at a time."""
    c = model.config
    w = {k: v.double() for k, v in model.state_dict().items()}
    dims = torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim
    inv_freq = model._inv_freq[False].double() if c.rope_scaling else 1.0 / (c.rope_theta**dims)

    def rms(x, weight):
        return weight * x / torch.sqrt((x * x).mean() + c.norm_eps)

    def rope(vec, pos):
        out = vec.clone()
        half = c.head_dim // 2
        for i in range(half):
            angle = pos * inv_freq[i]
            a, b = vec[i], vec[i + half]
            out[i] = a * math.cos(angle) - b * math.sin(angle)
            out[i + half] = b * math.cos(angle) + a * math.sin(angle)
        return out

    def linear(name, x):
        y = w[name + ".weight"] @ x
        return y + w[name + ".bias"] if name + ".bias" in w else y

    xs = [w["model.embed_tokens.weight"][t] for t in tokens]
    group = c.num_heads // c.num_kv_heads
    for layer in range(c.num_layers):
        pre = f"model.layers.{layer}."
        normed = [rms(x, w[pre + "input_layernorm.weight"]) for x in xs]
        qs = [linear(pre + "self_attn.q_proj", x).view(c.num_heads, c.head_dim) for x in normed]
        ks = [linear(pre + "self_attn.k_proj", x).view(c.num_kv_heads, c.head_dim) for x in normed]
        vs = [linear(pre + "self_attn.v_proj", x).view(c.num_kv_heads, c.head_dim) for x in normed]
        new_xs = []
        for t, x in enumerate(xs):
            heads = []
            window = range(max(0, t - (c.sliding_window or t + 1) + 1), t + 1)
            for h in range(c.num_heads):
                kv = h // group
                q = rope(qs[t][h], t)
                scores = torch.stack(
                    [q @ rope(ks[s][kv], s) / math.sqrt(c.head_dim) for s in window]
                )
                weights = torch.softmax(scores, 0)
                heads.append(sum(w_s * vs[s][kv] for w_s, s in zip(weights, window, strict=True)))
            x = x + w[pre + "self_attn.o_proj.weight"] @ torch.cat(heads)
            m = rms(x, w[pre + "post_attention_layernorm.weight"])
            gate = w[pre + "mlp.gate_proj.weight"] @ m
            up = w[pre + "mlp.up_proj.weight"] @ m
            new_xs.append(
                x + w[pre + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(gate) * up)
            )
        xs = new_xs
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return torch.stack([head @ rms(x, w["model.norm.weight"]) for x in xs])


@torch.no_grad()
def test_decoder_matches_a_direct_transcription_of_the_equations(model):
    tokens = tokens_for(1, 9, seed=8)  # longer than the sliding window of 5
    expected = reference_forward(model, tokens[0].tolist())
    cache = model.new_cache(1, 16)
    got = torch.cat([model(tokens[:, :3], cache), model(tokens[:, 3:], cache)], 1)[0]
    assert_rounding_close(got, expected.float(), model.config)
    assert_rounding_close(model(tokens)[0], expected.float(), model.config)


def test_llama3_scaling_keeps_fast_divides_slow_and_blends_between():
    from specsim.models.transformer import rope_inverse_frequencies

    # head_dim 8, theta 500: wavelengths 6.3, 30, 140, 662 positions; with an original context of
    # 20, high/low frequency factors 2 and 0.5 put the cut-offs at 10 and 40 positions.
    scaled = rope_inverse_frequencies(VARIANTS["llama3-rope-scaling"])
    plain = rope_inverse_frequencies(small_config(rope_theta=500.0))
    assert scaled[0] == plain[0]
    assert plain[1] / 8 < scaled[1] < plain[1]
    torch.testing.assert_close(scaled[2:], plain[2:] / 8)


def test_sizes_follow_the_parameters(model):
    c = model.config
    assert c.param_count() == sum(p.numel() for p in model.parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    if c.tie_embeddings:
        matmul += model.model.embed_tokens.weight.numel()
    assert c.flops_per_token() == 2 * matmul
    assert c.weight_bytes(2) == 2 * c.param_count()
    cache = model.new_cache(3, 10)
    # float32, plus one spare slot per row that receives padding
    assert cache.nbytes() == 3 * (10 + 1) * c.kv_bytes_per_token(4)
    assert c.attention_flops_per_context_token() == 4 * c.num_layers * c.num_heads * c.head_dim
    # One new token after 9 cached ones attends to 10 positions.
    window = c.sliding_window or 10**9
    for n, context in ((1, 9), (3, 0), (4, 2), (2, 7)):
        attended = sum(min(context + i, window) for i in range(1, n + 1))
        expected = n * c.flops_per_token() + attended * c.attention_flops_per_context_token()
        assert c.forward_flops(n, context) == expected


@torch.no_grad()
def test_bad_calls_give_one_line_errors():
    model = make_model(small_config())
    cache = model.new_cache(2, 8)
    with pytest.raises(SpecsimError, match="outside the vocabulary of 61"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(SpecsimError, match="outside the vocabulary"):
        model(torch.tensor([[1, -1], [2, 3]]), cache)
    assert cache.lengths.tolist() == [0, 0]  # nothing appended by a refused call
    with pytest.raises(SpecsimError, match="past the cache's max_len 8"):
        model(torch.zeros(2, 9, dtype=torch.long), cache)
    model(torch.zeros(2, 6, dtype=torch.long), cache, n_new=torch.tensor([6, 1]))
    with pytest.raises(SpecsimError, match="max_len"):
        model(torch.zeros(2, 3, dtype=torch.long), cache)  # row 0 would reach 9
    model(torch.zeros(2, 3, dtype=torch.long), cache, n_new=torch.tensor([2, 3]))  # fits exactly
    with pytest.raises(SpecsimError, match="n_new"):
        model(torch.zeros(2, 1, dtype=torch.long), cache, n_new=torch.tensor([2, 0]))
    with pytest.raises(SpecsimError, match="cache has 2 rows"):
        model(torch.zeros(3, 1, dtype=torch.long), cache)
    with pytest.raises(SpecsimError, match="integer tensor"):
        model(torch.zeros(2, 1), cache)
    with pytest.raises(SpecsimError, match="rollback"):
        cache.rollback([9, 0])  # cannot grow a row
    with pytest.raises(SpecsimError, match="max_position 64"):
        model.new_cache(1, 65)
    with pytest.raises(SpecsimError) as err:
        model(torch.tensor([[70]]))
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


@torch.no_grad()
def test_cache_reset_reuses_a_row_for_a_new_sequence():
    model = make_model(small_config())
    tokens = tokens_for(2, 5, seed=11)
    cache = model.new_cache(2, 16)
    model(tokens, cache)
    cache.reset([1])
    assert cache.lengths.tolist() == [5, 0]
    out = model(tokens[:, :1], cache)
    assert_rounding_close(out[1], model(tokens[1:2, :1])[0], model.config)


@torch.no_grad()
def test_half_precision_cache_follows_the_model_dtype():
    model = make_model(small_config()).to(torch.bfloat16)
    cache = model.new_cache(1, 8)
    assert cache.keys[0].dtype == torch.bfloat16
    out = model(tokens_for(1, 4), cache)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@torch.no_grad()
def test_a_view_of_some_rows_shares_the_cache():
    model = make_model(small_config())
    tokens = tokens_for(4, 5, seed=13)
    cache = model.new_cache(4, 16)
    model(tokens[:, :3], cache)
    view = cache.view(1, 3)
    out = model(tokens[1:3, 3:], view)
    assert cache.lengths.tolist() == [3, 5, 5, 3]
    view.rollback([4, 5])
    assert cache.lengths.tolist() == [3, 4, 5, 3]
    reference = model.new_cache(2, 16)
    assert_rounding_close(out, model(tokens[1:3], reference)[:, 3:], model.config)
    assert_rounding_close(cache.keys[0][1:3, :, :5], reference.keys[0][:, :, :5], model.config)
