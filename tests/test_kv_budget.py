"""The engine's KV budget (vLLM's ``determine_available_memory``): the device's share less the
weights, the profiling pass's activation peak and the buffers outside torch; the numbers worked
out by hand from the constants in ``specsim/costs/kv_cache.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.costs.kv_cache import GIB, engine_reservation_bytes, kv_capacity_tokens
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.scenario import Engine

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
ONE = PROFILES / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"  # hidden 4,096, one device
FOUR = PROFILES / "llama3.1-70b_llama3.2-1b_4xh100-tp4-roofline.yaml"  # hidden 8,192, TP 4


def test_the_activation_peak_grows_with_the_pass_the_engine_profiles():
    """Llama-3.1-8B, 8,192 tokens: 19.5 x 8,192 x 4,096 x 2 B = 1.22 GiB, plus 0.3 GiB outside
    torch: vLLM's logs print 1.19-1.26 and 0.1-0.35 GiB."""
    profile = load_profile(ONE)
    reserved = engine_reservation_bytes(profile, Engine(max_batched_tokens=8192))
    assert reserved == pytest.approx((1.21875 + 0.3) * GIB, rel=1e-12)
    half = engine_reservation_bytes(profile, Engine(max_batched_tokens=4096))
    assert reserved - half == pytest.approx(0.609375 * GIB, rel=1e-12)


def test_tensor_parallelism_adds_the_collectives_buffers():
    """Llama-3.1-70B over four devices, 2,048 tokens: 19.5 x 2,048 x 8,192 x 2 B = 0.609 GiB,
    plus 0.3 GiB and the TP buffers' 1.79 GiB."""
    profile = load_profile(FOUR)
    reserved = engine_reservation_bytes(profile, Engine(max_batched_tokens=2048))
    assert reserved == pytest.approx((0.609375 + 0.3 + 1.79) * GIB, rel=1e-12)


def test_capacity_is_the_memory_left_after_weights_and_reservation():
    profile = load_profile(ONE)
    target = profile.profile.target
    engine = Engine(max_batched_tokens=8192)
    free = (
        profile.profile.hardware.memory_bytes
        - target.device_weight_bytes
        - engine_reservation_bytes(profile, engine)
    )
    expected = int(free // target.device_kv_bytes_per_token)
    assert kv_capacity_tokens(profile, None, False, engine) == expected
    # a pass twice as large holds back 1.22 GiB more: 9,984 tokens of 131,072 B fewer
    larger = kv_capacity_tokens(profile, None, False, Engine(max_batched_tokens=16384))
    assert expected - larger in (9984, 9985)


def test_a_reservation_that_leaves_no_cache_is_refused():
    """0.22 x 76.55 GB = 16.84 GB holds the 16.06 GB of weights, not the 1.63 GB reserved too."""
    profile = load_profile(ONE)
    engine = Engine(max_batched_tokens=8192, memory_utilisation=0.22)
    with pytest.raises(SpecsimError, match="activations and buffers"):
        kv_capacity_tokens(profile, None, False, engine)


def test_a_padded_engine_sizes_no_pool_and_reserves_nothing():
    """specsim's own engine and Hugging Face generate allocate each request's cache as it runs."""
    profile = load_profile(ONE)
    engine = Engine(max_batched_tokens=8192, padded_attention=True)
    assert engine_reservation_bytes(profile, engine) == 0.0
    target = profile.profile.target
    free = profile.profile.hardware.memory_bytes - target.device_weight_bytes
    assert kv_capacity_tokens(profile, None, False, engine) == int(
        free // target.device_kv_bytes_per_token
    )
