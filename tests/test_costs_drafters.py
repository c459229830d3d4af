"""What each kind of drafter costs per step, worked by hand from its passes (``DraftPasses``):
the cost formula (``costs.formula``) on the drafter's terms.

A linear fit with whole coefficients (seconds = 1 + 2 B + 3 N + 5 KV + 7 P, knee 0) makes every
expected value an exact sum of small integers, so each comparison is ``==``. The rows hold 4
sequences with 100 context tokens in all; a pass over r rows of q query tokens each reads the
rows' context and has q x KV + r x q (q + 1) / 2 query-key pairs.
"""

from __future__ import annotations

import pytest

from specsim.costs import formula
from specsim.costs.drafters import DrafterCost, check_window
from specsim.errors import SpecsimError
from specsim.profile import LatencyModel, ModelSpec
from specsim.profile.latency import Latency, LatencyFit

FIT = LatencyFit(
    fixed_s=1.0,
    per_sequence_s=2.0,
    per_batched_token_s=3.0,
    knee_tokens=0,
    per_kv_token_s=5.0,
    per_attention_pair_s=7.0,
)
ROWS, KV = 4, 100.0


def fit(batch, tokens, kv, pairs):
    return 1 + 2 * batch + 3 * tokens + 5 * kv + 7 * pairs


class Priced:
    """A drafter's terms in the cost vector (the target's and the overhead's left at 0), and
    the formula's functions on them."""

    def __init__(self, cost: DrafterCost):
        target = LatencyModel(Latency(fit=FIT), "target")
        self.c = formula.cost_vector(target, (0.0,) * 6, cost, (0.0, 0.0), (0.0, 0.0))

    def draft_s(self, rows, k, kv):
        return formula.draft_s(self.c, rows, k, kv)

    def draft_flops(self, rows, k, kv):
        return formula.draft_flops(self.c, rows, k, kv)

    def prefill_s(self, rows, tokens, kv, pairs):
        return formula.draft_prefill_s(self.c, rows, tokens, kv, pairs)

    def wasted_flops_per_position(self, mean_context):
        return formula.wasted_per_position(self.c, mean_context)  # the target's FLOPs are 0


def drafter(kind: str, **keys) -> Priced:
    spec = ModelSpec(
        kind=kind,
        latency=Latency(fit=FIT),
        flops_per_token=10.0,
        attention_flops_per_context_token=1.0,
        **keys,
    )
    return Priced(DrafterCost(spec, LatencyModel(spec.latency, kind)))


def test_a_block_drafter_runs_one_pass_of_k_plus_one_queries_per_row():
    """DFlash at k = 3: one pass of 4 queries per row over the rows' context, whatever k; a
    draft model's k passes of one query each, the context one longer per row each time."""
    block = drafter("block", method="dflash", max_k=15)
    pairs = 4 * KV + ROWS * 4 * 5 / 2  # 4 queries per row, each seeing the context and the block
    assert block.draft_s(ROWS, 3, KV) == fit(ROWS, 16, KV, pairs)
    assert block.draft_flops(ROWS, 3, KV) == 10.0 * 16 + 1.0 * pairs
    # At k = 0 its cache is kept in step by one pass of one query per row, as a draft model's.
    assert block.draft_s(ROWS, 0, KV) == fit(ROWS, 4, KV, KV + 4)
    assert block.prefill_s(1, 512.0, 0.0, 1000.0) == fit(1, 512.0, 0.0, 1000.0)
    model = drafter("draft_model")
    means = [KV, KV + 4, KV + 8]  # pass j reads j more tokens per row
    assert model.draft_s(ROWS, 3, KV) == 3 * fit(ROWS, 4, KV + 4, KV + 4 + 4)
    assert model.draft_s(ROWS, 3, KV) == sum(fit(ROWS, 4, m, m + 4) for m in means)


def test_heads_and_prompt_lookup_follow_their_passes():
    # EAGLE-style heads: k one-query passes, no pass at k = 0 and none over prompts.
    eagle = drafter("heads", passes="autoregressive")
    assert eagle.draft_s(ROWS, 2, KV) == 2 * fit(ROWS, 4, KV + 2, KV + 2 + 4)
    assert eagle.draft_s(ROWS, 0, KV) == 0.0
    assert eagle.prefill_s(1, 512.0, 0.0, 1000.0) == 0.0
    # A wasted position costs what the head's pass over it does: its FLOPs and its attention.
    assert eagle.wasted_flops_per_position(50.0) == 10.0 + 50.0
    # Medusa: one pass for all depths, k MLP heads' FLOPs per row and no attention.
    medusa = drafter("heads", passes="parallel")
    assert medusa.draft_s(ROWS, 5, KV) == fit(ROWS, 4, KV, KV + 4)
    assert medusa.draft_flops(ROWS, 5, KV) == 10.0 * ROWS * 5
    assert medusa.wasted_flops_per_position(50.0) == 10.0
    # Prompt lookup: a CPU search per step with no FLOPs.
    lookup = Priced(DrafterCost(ModelSpec(kind="ngram", draft_step_s=0.25), None))
    assert lookup.draft_s(ROWS, 4, KV) == 0.25
    assert lookup.draft_s(ROWS, 0, KV) == 0.0
    assert lookup.draft_flops(ROWS, 4, KV) == 0.0


def test_a_block_drafters_window_is_bounded_by_its_block():
    dflash = ModelSpec(kind="block", method="dflash", max_k=7, latency=Latency(fit=FIT))
    check_window(dflash, "d", 7, "fixed", None)
    with pytest.raises(SpecsimError, match="at most 7") as raised:
        check_window(dflash, "d", 8, "adaptive", "s.yaml")
    assert raised.value.key == "speculation.k"
    dspark = ModelSpec(kind="block", method="dspark", max_k=7, latency=Latency(fit=FIT))
    check_window(dspark, "d", 7, "fixed", None)
    check_window(dspark, "d", 4, "adaptive", None)  # a policy may verify fewer per step
    with pytest.raises(SpecsimError, match="exactly 7"):
        check_window(dspark, "d", 4, "fixed", None)


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"kind": "block", "max_k": 7}, "needs 'method'"),
        ({"kind": "block", "method": "dflash"}, "max_k"),
        ({"kind": "draft_model", "method": "dflash"}, "is a block's"),
        ({"kind": "block", "method": "mtp", "max_k": 7}, "is a draft_model's"),
        ({"kind": "draft_model", "max_k": 7}, "max_k"),
    ],
)
def test_block_keys_belong_to_block_drafters(keys, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(latency=Latency(fit=FIT), **keys)
