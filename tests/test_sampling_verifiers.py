"""The verifiers on hand-built inputs: exact decisions, edge cases, ragged rows, batching."""

from __future__ import annotations

import pytest
import torch

from specsim.sampling import (
    CONTROLS,
    SamplingInputError,
    VerifierRandomness,
    draw_randomness,
    process_logits,
    sample_from_probs,
    verify_greedy,
    verify_rejection,
    verify_typical,
)

VERIFIERS = [verify_rejection, verify_greedy, verify_typical]


def uniforms(accept, sample):
    return VerifierRandomness(
        torch.tensor(accept, dtype=torch.float64), torch.tensor(sample, dtype=torch.float64)
    )


def one_row(p_rows, q_rows, drafts):
    """p [k+1, V], q [k, V] lists -> batched tensors of one row."""
    p = torch.tensor([p_rows], dtype=torch.float64)
    q = torch.tensor([q_rows], dtype=torch.float64)
    return p, q, torch.tensor([drafts])


def random_step(batch=16, k=4, vocab=11, seed=0, top_k=0):
    gen = torch.Generator().manual_seed(seed)
    p = process_logits(torch.randn(batch, k + 1, vocab, generator=gen, dtype=torch.float64))
    q = process_logits(
        torch.randn(batch, k, vocab, generator=gen, dtype=torch.float64), top_k=top_k
    )
    drafts = sample_from_probs(q, torch.rand(batch, k, generator=gen, dtype=torch.float64))
    n = torch.randint(0, k + 1, (batch,), generator=gen)
    return p, q, drafts, n, draw_randomness(gen, batch, k)


# ---- the accept test and the residual, decided by hand ----------------------------------------


def test_accepts_iff_u_below_p_over_q_then_samples_residual():
    # Position 0: p(x)/q(x) = 0.2/0.5 = 0.4, so u = 0.39 accepts and u = 0.41 rejects.
    p, q, d = one_row([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]], [[0.5, 0.2, 0.3]], [0])
    accepted = verify_rejection(p, q, d, None, uniforms([[0.39]], [0.99]))
    assert accepted.accepted.tolist() == [1]
    assert accepted.tokens.tolist() == [[0, 2]]  # bonus from p at position 1: u=.99 -> token 2
    rejected = verify_rejection(p, q, d, None, uniforms([[0.41]], [0.49]))
    assert rejected.accepted.tolist() == [0]
    assert rejected.accepted_mask.tolist() == [[False]]
    # Residual max(0, p - q) = [0, .3, 0]: token 1 whatever the uniform.
    assert rejected.tokens.tolist() == [[1, -1]]


def test_residual_is_sampled_by_inverse_cdf_of_the_normalised_residual():
    p = torch.tensor([[[0.4, 0.4, 0.2], [1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float64)
    q = torch.tensor([[[0.8, 0.1, 0.1]]], dtype=torch.float64)  # residual [0, .3, .1] / .4
    d = torch.tensor([[0]])
    for u, token in [(0.0, 1), (0.74, 1), (0.76, 2), (0.999, 2)]:
        result = verify_rejection(p, q, d, None, uniforms([[0.9]], [u]))
        assert result.tokens.tolist() == [[token, -1]]


def test_draft_with_zero_drafter_probability_is_accepted_iff_target_allows_it():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]] * 2, dtype=torch.float64)
    q = torch.tensor([[[0.0, 0.5, 0.5]]] * 2, dtype=torch.float64)
    d = torch.tensor([[0], [2]])  # q(0) = 0 with p(0) > 0; q(2) > 0 with p(2) = 0
    result = verify_rejection(p, q, d, None, uniforms([[0.999], [0.0]], [0.5, 0.5]))
    assert result.accepted.tolist() == [1, 0]
    assert result.tokens[1, 0].item() == 0  # residual max(0, p - q) = [.5, 0, 0]


def test_p_equal_q_always_accepts():
    p, _, d, _, r = random_step(batch=64, k=4, seed=2)
    q = p[:, :4].clone()
    worst = VerifierRandomness(torch.full_like(r.accept, 1 - 2**-53), r.sample)
    result = verify_rejection(p, q, d, None, worst)
    assert result.accepted.tolist() == [4] * 64
    assert bool(result.accepted_mask.all()) and bool((result.tokens >= 0).all())


def test_one_hot_p_forces_its_token():
    vocab = 5
    p = torch.zeros(3, 3, vocab, dtype=torch.float64)
    p[:, :, 3] = 1.0
    q = torch.full((3, 2, vocab), 1.0 / vocab, dtype=torch.float64)
    d = torch.tensor([[3, 3], [3, 1], [0, 3]])
    r = uniforms([[0.5, 0.5]] * 3, [0.1, 0.5, 0.9])
    result = verify_rejection(p, q, d, None, r)
    assert result.tokens.tolist() == [[3, 3, 3], [3, 3, -1], [3, -1, -1]]


def test_all_accepted_emits_the_bonus_token_from_the_last_position():
    p = torch.tensor([[[0.5, 0.5], [0.5, 0.5], [0.0, 1.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    result = verify_rejection(p, q, torch.tensor([[0, 1]]), None, uniforms([[0.2, 0.3]], [0.0]))
    assert result.accepted.tolist() == [2]
    assert result.tokens.tolist() == [[0, 1, 1]]
    assert result.accepted_mask.tolist() == [[True, True]]
    assert result.emitted.tolist() == [3]


def test_later_passing_drafts_after_a_rejection_are_not_accepted():
    p = torch.tensor([[[0.1, 0.9], [0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]], dtype=torch.float64)
    result = verify_rejection(p, q, torch.tensor([[0, 1]]), None, uniforms([[0.5, 0.0]], [0.3]))
    assert result.accepted.tolist() == [0]
    assert result.accepted_mask.tolist() == [[False, False]]
    assert result.tokens.tolist() == [[1, -1, -1]]  # residual [0, .8] -> token 1


def test_deterministic_drafter_accepts_with_p_and_removes_the_draft_from_the_residual():
    p = torch.tensor([[[0.3, 0.6, 0.1], [1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float64)
    d = torch.tensor([[1]])
    assert verify_rejection(p, None, d, None, uniforms([[0.59]], [0.0])).accepted.tolist() == [1]
    # Rejected: residual p without token 1 = [.3, 0, .1] / .4, so u = 0.8 -> token 2.
    result = verify_rejection(p, None, d, None, uniforms([[0.61]], [0.8]))
    assert result.tokens.tolist() == [[2, -1]]


def test_zero_residual_from_rounding_falls_back_to_p():
    # p and q differ only at token 0, by less than float64 can express elsewhere: after the
    # rejection p - q rounds to zeros, so the verifier must sample p rather than divide by 0.
    p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.5 + 2**-53, 0.5]]], dtype=torch.float64)
    result = verify_rejection(p, q, torch.tensor([[0]]), None, uniforms([[1 - 2**-53]], [0.75]))
    assert result.accepted.tolist() == [0]
    assert result.tokens.tolist() == [[1, -1]]  # inverse CDF of p at 0.75


# ---- greedy and typical ----------------------------------------------------------------------


def test_greedy_accepts_while_draft_is_argmax_and_corrects_with_argmax():
    p = torch.tensor([[[0.1, 0.9], [0.6, 0.4], [0.3, 0.7]]] * 2, dtype=torch.float64)
    d = torch.tensor([[1, 0], [1, 1]])
    result = verify_greedy(p, None, d)
    assert result.accepted.tolist() == [2, 1]
    assert result.tokens.tolist() == [[1, 0, 1], [1, 0, -1]]


def test_typical_threshold_and_argmax_on_failure():
    # Entropy of [.7, .2, .1] is 0.8018 nats: threshold min(0.09, 0.3 e^-0.8018) = 0.09.
    p = torch.tensor([[[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]], dtype=torch.float64)
    q = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    r = uniforms([[0.0, 0.0]], [0.95])
    result = verify_typical(p, q, torch.tensor([[1, 2]]), None, r)  # p(1)=.2 ok, p(2)=.1 ok
    assert result.tokens.tolist() == [[1, 2, 2]]  # bonus from p at u=.95 -> token 2
    p[0, 1] = torch.tensor([0.92, 0.0, 0.08], dtype=torch.float64)  # H=0.279: thr 0.09 > 0.08
    result = verify_typical(p, q, torch.tensor([[1, 2]]), None, r)
    assert result.tokens.tolist() == [[1, 0, -1]]


# ---- ragged windows --------------------------------------------------------------------------


@pytest.mark.parametrize("verify", VERIFIERS)
def test_rows_with_zero_drafts_emit_one_token_from_position_zero(verify):
    p = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[1.0, 0.0, 0.0]]], dtype=torch.float64)
    result = verify(p, q, torch.tensor([[-1]]), torch.tensor([0]), uniforms([[0.0]], [0.5]))
    assert result.accepted.tolist() == [0]
    assert result.tokens.tolist() == [[1, -1]]


def test_short_row_takes_its_bonus_from_position_n_drafts_and_ignores_padding():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [float("nan")] * 3]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.5, 0.0], [7.0, 7.0, 7.0]]], dtype=torch.float64)
    d = torch.tensor([[0, -1]])
    result = verify_rejection(p, q, d, torch.tensor([1]), uniforms([[0.3, 0.9]], [0.1]))
    assert result.accepted.tolist() == [1]
    assert result.tokens.tolist() == [[0, 2, -1]]


@pytest.mark.parametrize("verify", [*VERIFIERS, *(c.verifier for c in CONTROLS.values())])
def test_batched_equals_row_by_row(verify):
    p, q, d, n, r = random_step(batch=24, k=4, vocab=9, seed=5)
    d = torch.where(torch.arange(4) < n[:, None], d, torch.full_like(d, -1))
    batched = verify(p, q, d, n, r)
    for b in range(24):
        alone = verify(p[b : b + 1], q[b : b + 1], d[b : b + 1], n[b : b + 1], r.rows(b))
        assert torch.equal(alone.tokens[0], batched.tokens[b])
        assert alone.accepted.item() == batched.accepted[b].item()
        assert torch.equal(alone.accepted_mask[0], batched.accepted_mask[b])


@pytest.mark.parametrize("verify", VERIFIERS)
def test_same_seed_same_output(verify):
    def once(seed):
        p, q, d, n, r = random_step(batch=32, seed=seed)
        return verify(p, q, d, n, r).tokens

    assert torch.equal(once(11), once(11))
    assert not torch.equal(once(11), once(12)) or verify is verify_greedy


def test_result_invariants_on_random_inputs():
    p, q, d, n, r = random_step(batch=200, k=4, seed=9, top_k=4)
    result = verify_rejection(p.float(), q.float(), d, n, r)
    emitted = result.tokens >= 0
    assert torch.equal(emitted.sum(dim=1), result.accepted + 1)
    assert bool((result.accepted <= n).all())
    assert torch.equal(result.accepted_mask.sum(dim=1), result.accepted)
    prefix = result.accepted_mask
    assert torch.equal(result.tokens[:, :4][prefix], d[prefix])


# ---- bad input -------------------------------------------------------------------------------


def bad_cases():
    p, q, d, n, r = random_step(batch=4, k=2, vocab=5, seed=1)
    nan_p = p.clone()
    nan_p[1, 0, 2] = float("nan")
    unnormalised_q = q * 1.5
    logits_p = torch.log(p)
    return [
        ("nan in p", (nan_p, q, d, n, r), "p"),
        ("q not normalised", (p, unnormalised_q, d, torch.full((4,), 2), r), "q"),
        ("logits as p", (logits_p, q, d, n, r), "p"),
        ("token = V", (p, q, torch.full_like(d, 5), torch.full((4,), 2), r), "draft_tokens"),
        ("token = -3", (p, q, torch.full_like(d, -3), torch.full((4,), 1), r), "draft_tokens"),
        ("float tokens", (p, q, d.double(), n, r), "draft_tokens"),
        ("q shape", (p, q[:, :1], d, n, r), "q"),
        ("draft shape", (p, q, d[:, :1], n, r), "draft_tokens"),
        ("p 2-D", (p[:, 0], q, d, n, r), "p"),
        ("n > k", (p, q, d, torch.full((4,), 3), r), "n_drafts"),
        ("n < 0", (p, q, d, torch.full((4,), -1), r), "n_drafts"),
        ("n float", (p, q, d, n.double(), r), "n_drafts"),
        ("no randomness", (p, q, d, n, None), "randomness"),
        (
            "uniform of 1",
            (p, q, d, n, VerifierRandomness(torch.ones_like(r.accept), r.sample)),
            "randomness.accept",
        ),
        (
            "sample shape",
            (p, q, d, n, VerifierRandomness(r.accept, r.sample[:2])),
            "randomness.sample",
        ),
    ]


@pytest.mark.parametrize("case", bad_cases(), ids=lambda c: c[0])
def test_bad_input_raises_a_clear_error(case):
    _, args, key = case
    with pytest.raises(SamplingInputError) as info:
        verify_rejection(*args)
    assert info.value.key == key
    assert "\n" not in str(info.value) and info.value.fix


def test_negative_probability_at_a_read_position_is_caught():
    p = torch.tensor([[[0.6, -0.1, 0.5], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.2, 0.3, 0.5]]], dtype=torch.float64)
    with pytest.raises(SamplingInputError, match="negative"):
        verify_rejection(p, q, torch.tensor([[1]]), None, uniforms([[0.5]], [0.5]))


@pytest.mark.parametrize("verify", [verify_greedy, verify_typical])
def test_greedy_and_typical_validate_too(verify):
    p, q, d, n, r = random_step(batch=3, k=2, vocab=5)
    with pytest.raises(SamplingInputError):
        verify(p * 2, q, d, n, r)
    with pytest.raises(SamplingInputError):
        verify(p, q, torch.full_like(d, 99), torch.full((3,), 2), r)


def straightforward_rejection(p, q, draft, randomness):
    """Direct transcription: residual and its inverse-CDF sample at every position."""
    k = q.shape[1]
    p_x = p[:, :k].gather(-1, draft[..., None])[..., 0]
    q_x = q.gather(-1, draft[..., None])[..., 0]
    mask = torch.cumprod((randomness.accept * q_x < p_x).long(), dim=1).bool()
    accepted = mask.sum(dim=1)
    residual = torch.clamp(p[:, :k] - q, min=0)
    candidates = torch.cat([residual, p[:, k:]], dim=1)  # [B, k+1, V]
    cdf = candidates.cumsum(-1)
    u = randomness.sample[:, None, None] * cdf[..., -1:]
    picks = torch.searchsorted(cdf, u, right=True)[..., 0]
    final = picks.gather(1, accepted[:, None])[:, 0]
    tokens = torch.full((p.shape[0], k + 1), -1, dtype=torch.long)
    tokens[:, :k] = torch.where(mask, draft, tokens[:, :k])
    tokens.scatter_(1, accepted[:, None], final[:, None])
    return tokens


def test_large_vocabulary_matches_the_straightforward_transcription():
    # V = 5000 takes the two-level inverse CDF; float64 keeps both sides' sums equal to ~1e-16.
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(64, 4, 5000, generator=gen, dtype=torch.float64) * 3
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits[:, :3] + torch.randn(64, 3, 5000, generator=gen), dim=-1)
    d = sample_from_probs(q, torch.rand(64, 3, generator=gen, dtype=torch.float64))
    r = draw_randomness(gen, 64, 3)
    result = verify_rejection(p, q, d, None, r)
    assert torch.equal(result.tokens, straightforward_rejection(p, q, d, r))
    assert 0 < int(result.accepted.sum()) < 64 * 3  # both accepts and rejections occurred


@pytest.mark.parametrize("verify", VERIFIERS)
def test_window_zero_emits_one_token_sampled_from_p(verify):
    # k = 0 (speculation off): p [B, 1, V], q [B, 0, V]; the token comes from p by inverse CDF.
    p = torch.tensor([[[0.25, 0.0, 0.75]]] * 3, dtype=torch.float64)
    result = verify(
        p, torch.zeros(3, 0, 3), torch.zeros(3, 0, dtype=torch.long), None,
        uniforms([[], [], []], [0.1, 0.3, 0.9]),
    )  # fmt: skip
    expected = [[2], [2], [2]] if verify is verify_greedy else [[0], [2], [2]]
    assert result.tokens.tolist() == expected and result.accepted.tolist() == [0, 0, 0]


def test_half_precision_inputs_are_sampled_in_float32():
    p, q, d, n, r = random_step(batch=32, k=3, vocab=300, seed=8)
    full = verify_rejection(p.float(), q.float(), d, n, r)
    half = verify_rejection(p.bfloat16(), q.bfloat16(), d, n, r)
    assert bool((half.tokens[half.tokens >= 0] < 300).all())
    # bfloat16 rounding moves a few decisions, not most of them.
    assert float((half.tokens == full.tokens).float().mean()) > 0.8


def test_acceptance_probabilities_match_the_observed_acceptance_rate():
    # beta = sum min(p, q) at position 0 of 20000 identical rows: the share of accepted first
    # drafts over 20000 rows (seed 10) must lie within 4.5 binomial standard deviations.
    from specsim.sampling import acceptance_probabilities

    p_row = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    q_row = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    beta = acceptance_probabilities(p_row[None], q_row[None])
    assert beta.tolist() == [[pytest.approx(0.7)]]
    gen = torch.Generator().manual_seed(10)
    rows = 20_000
    p, q = p_row.expand(rows, 2, 3), q_row.expand(rows, 1, 3)
    drafts = sample_from_probs(q, torch.rand(rows, 1, generator=gen, dtype=torch.float64))
    randomness = draw_randomness(gen, rows, 1)
    rate = float(verify_rejection(p, q, drafts, None, randomness).accepted.float().mean())
    band = 4.5 * (0.7 * 0.3 / rows) ** 0.5
    assert abs(rate - 0.7) < band
    # Planted bug, same uniforms: accepting with probability p(x) (forgetting q) is caught.
    p_x = p_row[0].gather(0, drafts[:, 0])
    assert abs(float((randomness.accept[:, 0] < p_x).float().mean()) - 0.7) > band
    one_hot = acceptance_probabilities(p_row[None], None, torch.tensor([[1]]))
    assert one_hot.tolist() == [[pytest.approx(0.3)]]


@pytest.mark.gpu
@pytest.mark.parametrize("verify", VERIFIERS)
def test_cuda_gives_the_cpu_result(verify):
    # Same inputs and uniforms on the GPU; float64 keeps both sides' sums equal to ~1e-16.
    p, q, d, n, r = random_step(batch=64, k=4, vocab=5000, seed=12)
    cpu = verify(p, q, d, n, r)
    cuda = verify(
        p.cuda(), q.cuda(), d.cuda(), n.cuda(),
        VerifierRandomness(r.accept.cuda(), r.sample.cuda()),
    )  # fmt: skip
    assert torch.equal(cpu.tokens, cuda.tokens.cpu())
    logits = torch.randn(8, 5000, dtype=torch.float64)
    on_gpu = process_logits(logits.cuda(), 0.7, 50, 0.9).cpu()
    assert torch.allclose(process_logits(logits, 0.7, 50, 0.9), on_gpu, atol=1e-12)
    gen = torch.Generator(device="cuda").manual_seed(0)
    assert draw_randomness(gen, 4, 2, device="cuda").accept.is_cuda


def test_typical_accepts_a_low_probability_draft_when_p_is_flat():
    # Uniform p over 20 tokens: p(x) = 0.05 <= epsilon, but H = ln 20 gives a threshold of
    # 0.3 / 20 = 0.015, so the draft passes; a peaked p with the same p(x) = 0.05 fails.
    flat = torch.full((1, 2, 20), 1 / 20, dtype=torch.float64)
    q = torch.full((1, 1, 20), 1 / 20, dtype=torch.float64)
    r = uniforms([[0.0]], [0.0])
    assert verify_typical(flat, q, torch.tensor([[7]]), None, r).tokens.tolist() == [[7, 0]]
    peaked = flat.clone()
    peaked[0, 0] = torch.tensor([0.05, 0.0] + [0.0] * 17 + [0.95], dtype=torch.float64)
    result = verify_typical(peaked, q, torch.tensor([[0]]), None, r)
    assert result.tokens.tolist() == [[19, -1]]  # H = 0.199: threshold min(0.09, 0.246) = 0.09
