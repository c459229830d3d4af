"""Logits processing, inverse-CDF sampling and the random inputs of a verifier."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numerics import rounding_tolerance

from specsim.errors import SpecsimError
from specsim.sampling import (
    SamplingInputError,
    draw_randomness,
    process_logits,
    sample_from_probs,
)
from specsim.sampling.reference import process_logits_np

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]], dtype=torch.float64)


def softmax(x):
    z = np.exp(x - x.max())
    return z / z.sum()


def test_temperature_scales_logits():
    probs = process_logits(LOGITS, temperature=0.5)
    assert torch.allclose(probs[0], torch.from_numpy(softmax(LOGITS[0].numpy() / 0.5)))


def test_temperature_zero_is_one_hot_argmax_with_lowest_index_on_ties():
    probs = process_logits(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=0)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_keeps_the_k_largest_and_renormalises():
    probs = process_logits(LOGITS, top_k=2)[0]
    expected = softmax(np.array([2.0, 3.0]))
    assert probs[[1, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert torch.allclose(probs[[0, 4]], torch.from_numpy(expected))


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = softmax(LOGITS[0].numpy())  # order of mass: token 4, 0, 1, 2, 3
    top_two = full[4] + full[0]
    # Just below the top-two mass: two tokens are needed; just above: a third joins.
    two = process_logits(LOGITS, top_p=top_two - 1e-9)[0]
    three = process_logits(LOGITS, top_p=top_two + 1e-9)[0]
    assert (two > 0).tolist() == [True, False, False, False, True]
    assert (three > 0).tolist() == [True, True, False, False, True]
    assert float(two.sum()) == pytest.approx(1.0)


def test_top_k_then_top_p_uses_the_top_k_renormalised_mass():
    # After top-k = 2 the kept pair has mass softmax([3, 2]) = (0.73, 0.27): top-p 0.7 keeps one.
    probs = process_logits(LOGITS, top_k=2, top_p=0.7)[0]
    assert probs.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_per_row_parameters_match_row_by_row_calls():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 9, generator=gen)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0])
    top_k = torch.tensor([0, 3, 5, 0])
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.3])
    batched = process_logits(logits, temperature, top_k, top_p)
    for row in range(4):
        alone = process_logits(
            logits[row : row + 1], float(temperature[row]), int(top_k[row]), float(top_p[row])
        )
        assert torch.equal(batched[row], alone[0])


@pytest.mark.parametrize(
    "params", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (0.5, 4, 0.6), (0.0, 0, 1.0)]
)
def test_numpy_twin_matches_torch(params):
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, size=(6, 6, 11))
    ours = process_logits(torch.from_numpy(logits), *params).numpy()
    # Probabilities <= 1 from an exp, a sum of 11 terms and a division, each side in float64.
    tolerance = rounding_tolerance(torch.float64, 1.0, logits.shape[-1], stages=3)
    np.testing.assert_allclose(ours, process_logits_np(logits, *params), atol=tolerance, rtol=0)


def test_masked_minus_inf_logits_are_allowed():
    probs = process_logits(torch.tensor([[0.0, float("-inf"), 0.0]]))
    assert probs.tolist() == [[0.5, 0.0, 0.5]]


@pytest.mark.parametrize(
    "logits, kwargs, key",
    [
        (torch.tensor([[0.0, float("nan")]]), {}, "logits"),
        (torch.tensor([[0.0, float("inf")]]), {}, "logits"),
        (torch.full((1, 3), float("-inf")), {}, "logits"),
        (torch.zeros(1, 3, dtype=torch.long), {}, "logits"),
        (torch.zeros(1, 3), {"temperature": -1.0}, "temperature"),
        (torch.zeros(1, 3), {"top_k": -2}, "top_k"),
        (torch.zeros(1, 3), {"top_k": 1.5}, "top_k"),
        (torch.zeros(1, 3), {"top_p": 0.0}, "top_p"),
        (torch.zeros(1, 3), {"top_p": 1.2}, "top_p"),
        (torch.zeros(2, 3), {"temperature": torch.ones(3)}, "temperature"),
    ],
)
def test_bad_processing_input_is_a_one_line_error(logits, kwargs, key):
    with pytest.raises(SamplingInputError) as info:
        process_logits(logits, **kwargs)
    assert isinstance(info.value, SpecsimError) and isinstance(info.value, ValueError)
    assert info.value.key == key and "\n" not in str(info.value)


def test_inverse_cdf_picks_the_token_whose_interval_holds_u():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 6)
    u = torch.tensor([0.0, 0.1999, 0.2, 0.69, 0.7, 0.9999999])
    assert sample_from_probs(probs, u).tolist() == [0, 0, 2, 2, 3, 3]


def test_inverse_cdf_accepts_unnormalised_rows_and_never_returns_zero_mass_tokens():
    probs = torch.tensor([[0.0, 2.0, 0.0, 2.0, 0.0]])
    u = torch.tensor([1.0 - 2.0**-53], dtype=torch.float64)  # largest uniform below 1
    assert sample_from_probs(probs, u.float().clamp(max=0.99999994)).tolist() == [3]
    assert sample_from_probs(probs.double(), u).tolist() == [3]
    assert sample_from_probs(probs, torch.tensor([0.0])).tolist() == [1]


def test_inverse_cdf_frequencies_follow_the_probabilities():
    # Evenly spaced uniforms hit each token exactly in proportion to its mass.
    probs = torch.tensor([0.125, 0.5, 0.0, 0.375]).expand(800, 4)
    u = (torch.arange(800, dtype=torch.float64) + 0.5) / 800
    counts = torch.bincount(sample_from_probs(probs, u), minlength=4)
    assert counts.tolist() == [100, 400, 0, 300]


@pytest.mark.parametrize(
    "probs, u, key",
    [
        (torch.tensor([[0.5, -0.1, 0.6]]), torch.tensor([0.5]), "probs"),
        (torch.tensor([[0.0, 0.0]]), torch.tensor([0.5]), "probs"),
        (torch.tensor([[float("nan"), 1.0]]), torch.tensor([0.5]), "probs"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([1.0]), "uniforms"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([0.1, 0.2]), "uniforms"),
    ],
)
def test_bad_sampling_input_raises(probs, u, key):
    with pytest.raises(SamplingInputError) as info:
        sample_from_probs(probs, u)
    assert info.value.key == key


def test_randomness_has_documented_shapes_and_is_reproducible():
    first = draw_randomness(torch.Generator().manual_seed(7), 5, 3)
    again = draw_randomness(torch.Generator().manual_seed(7), 5, 3)
    other = draw_randomness(torch.Generator().manual_seed(8), 5, 3)
    assert first.accept.shape == (5, 3) and first.sample.shape == (5,)
    assert torch.equal(first.accept, again.accept) and torch.equal(first.sample, again.sample)
    assert not torch.equal(first.accept, other.accept)
    assert bool(((first.accept >= 0) & (first.accept < 1)).all())
    assert torch.equal(first.rows(2).accept, first.accept[2:3])


# ---- the two-level inverse CDF used for large vocabularies -----------------------------------


def test_block_inverse_cdf_equals_one_cumsum():
    from specsim.sampling.logits import inverse_cdf

    gen = torch.Generator().manual_seed(2)
    weights = torch.rand(300, 1000, generator=gen, dtype=torch.float64) ** 4  # tail of 232
    weights[:, 500:700] = 0.0  # whole zero blocks
    weights[::7, -1] = 0.0
    u = torch.rand(300, generator=gen, dtype=torch.float64)
    u[:3] = torch.tensor([0.0, 1 - 2**-53, 0.5])
    blocked, mass = inverse_cdf(weights, u, block=64)
    plain, _ = inverse_cdf(weights, u, block=4096)  # one cumsum
    assert torch.equal(blocked, plain)
    assert torch.allclose(mass, weights.sum(dim=-1))
    assert bool((weights.gather(1, blocked[:, None]) > 0).all())


def test_block_inverse_cdf_frequencies_follow_the_weights():
    from specsim.sampling.logits import inverse_cdf

    weights = torch.tensor([1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 4.0])  # V = 11
    u = (torch.arange(1200, dtype=torch.float64) + 0.5) / 1200
    tokens, _ = inverse_cdf(weights.expand(1200, 11), u, block=2)
    counts = torch.bincount(tokens, minlength=11)
    assert counts.tolist() == [100, 0, 300, 0, 0, 0, 200, 200, 0, 0, 400]
