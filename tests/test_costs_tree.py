"""A tree step's cost, worked by hand for small shapes (a draft model; autoregressive decoding
heads with a fixed pass and with a fit, one pass per depth; parallel heads, one pass), a chain
of autoregressive heads (k passes), and a chain-shaped tree costing what the chain costs, bit
for bit, for every drafter kind (``specsim.costs.tree``)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from specsim.costs import StepCosts
from specsim.costs.tree import TreeRows
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.tree import TreeShape

# Round coefficients: fixed, per sequence, per token (knee 0), per KV token, per pair.
TARGET_FIT = [0.01, 1e-3, 1e-4, 1e-6, 1e-7]
DRAFT_FIT = [2e-3, 1e-4, 1e-5, 1e-7, 1e-8]
HEADS_FIT = [5e-4, 2e-5, 3e-6, 1e-8, 1e-9]


def _fit(c):
    keys = ["fixed_s", "per_sequence_s", "per_batched_token_s", "per_kv_token_s"]
    fit = dict(zip(keys, c[:4], strict=True))
    return {"fit": {**fit, "knee_tokens": 0.0, "per_attention_pair_s": c[4]}}


def _spec(kind, fit, flops, attn):
    return {
        "kind": kind,
        "kv_bytes_per_token": 4096,
        "weight_bytes": 10_000_000,
        "flops_per_token": flops,
        "attention_flops_per_context_token": attn,
        **({"latency": _fit(fit)} if fit else {}),
    }


def tree_profile_data(extra: dict | None = None) -> dict:
    """The hand profile: round latency and FLOPs, a draft model, heads and prompt lookup."""
    data = {
        "version": 1,
        "name": "hand-tree",
        "provenance": {"source": "measured", "device": "test", "date": "2026-01-01"},
        "hardware": {"name": "cpu", "memory_bytes": 8e9, "price_per_hour_usd": 0.0},
        "target": _spec("target", TARGET_FIT, 1e9, 1e6),
        "drafters": {
            "small": _spec("draft_model", DRAFT_FIT, 1e8, 1e5),
            # Parallel heads (Medusa; passes absent = parallel), fixed pass and with a fit.
            "heads": {**_spec("heads", None, 5e7, 0.0), "draft_step_s": 3e-4},
            "medusa": {**_spec("heads", HEADS_FIT, 4e7, 0.0), "passes": "parallel"},
            # Autoregressive heads (EAGLE), fixed pass and with a fit.
            "eagle_fixed": {
                **_spec("heads", None, 5e7, 0.0),
                "draft_step_s": 3e-4,
                "passes": "autoregressive",
            },
            "eagle": {**_spec("heads", HEADS_FIT, 4e7, 2e4), "passes": "autoregressive"},
            "ngram": {"kind": "ngram", "draft_step_s": 1e-4},
        },
        "overhead": {"per_step_s": 1e-4},
        "acceptance": [
            {
                "drafter": "small",
                "verifier": "rejection",
                "temperature": 1.0,
                "per_position": [0.8, 0.7, 0.6],
            }
        ],
    }
    return {**data, **(extra or {})}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "p.yaml"
    path.write_text(yaml.safe_dump(tree_profile_data()))
    return load_profile(path)


TREE = TreeShape.parse("2,1")  # (0), (1), (0,0), (1,0): 4 nodes, depth 2


def test_tree_rows_by_hand():
    rows = TreeRows(TREE)
    # Root + nodes of depth <= d; pairs among themselves: root 1, depth-1 nodes 2 each, depth-2
    # nodes 3 each. An empty slot (drafts -1) feeds nothing.
    assert rows.verified.tolist() == [0.0, 1.0, 3.0, 5.0]
    assert rows.own_pairs.tolist() == [0.0, 1.0, 5.0, 11.0]
    # Rows with 100 and 50 cached tokens, the full tree; a row cut at depth 1; an empty slot.
    assert rows.totals(np.array([2.0, 2.0]), np.array([100.0, 50.0])) == (10.0, 772.0)
    assert rows.totals(np.array([2.0, 1.0, -1.0]), np.array([100.0, 50.0, 0.0])) == (
        8.0,
        5 * 100 + 11 + 3 * 50 + 5,
    )


def test_tree_step_seconds_and_flops_by_hand(profile):
    costs = StepCosts(profile, "small", TREE)
    # Target: batch 2, 10 positions, 150 KV tokens, 772 pairs.
    target = 0.01 + 2e-3 + 10 * 1e-4 + 150 * 1e-6 + 772 * 1e-7
    # Draft model: the root (2 tokens, reads 150, pairs 152), then the two depth-1 nodes per row
    # (4 tokens, reads 150 + 2 fed, pairs 2 x (150 + 2 x 2) = 308).
    pass0 = 2e-3 + 2e-4 + 2 * 1e-5 + 150 * 1e-7 + 152 * 1e-8
    pass1 = 2e-3 + 2e-4 + 4 * 1e-5 + 152 * 1e-7 + 308 * 1e-8
    assert costs.draft_s(2, 2, 150.0) == pytest.approx(pass0 + pass1, rel=1e-12)
    seconds = costs.decode_iteration_s(2, 2, 10.0, 150.0, 772.0)
    assert seconds == pytest.approx(target + pass0 + pass1 + 1e-4, rel=1e-12)
    assert seconds == pytest.approx(0.017822, rel=1e-12)
    assert costs.target_flops(10.0, 772.0) == pytest.approx(1e9 * 10 + 1e6 * 772, rel=1e-12)
    draft_flops = 1e8 * 2 + 1e5 * 152 + 1e8 * 4 + 1e5 * 308
    assert costs.draft_flops(2, 2, 150.0) == pytest.approx(draft_flops, rel=1e-12)


def test_autoregressive_heads_run_one_pass_per_depth_in_a_tree_by_hand(profile):
    # Heads with only draft_step_s: one fixed pass per depth (2), FLOPs per fed token: the
    # root (2 rows) then the two depth-1 nodes per row (4 tokens); no attention FLOPs given.
    heads = StepCosts(profile, "eagle_fixed", TREE)
    assert heads.draft_s(2, 2, 150.0) == pytest.approx(2 * 3e-4, rel=1e-12)
    assert heads.draft_flops(2, 2, 150.0) == pytest.approx(5e7 * (2 + 4), rel=1e-12)
    # Heads with a fit: each depth's pass priced by it, as the draft model's passes above.
    eagle = StepCosts(profile, "eagle", TREE)
    pass0 = 5e-4 + 2 * 2e-5 + 2 * 3e-6 + 150 * 1e-8 + 152 * 1e-9
    pass1 = 5e-4 + 2 * 2e-5 + 4 * 3e-6 + 152 * 1e-8 + 308 * 1e-9
    assert eagle.draft_s(2, 2, 150.0) == pytest.approx(pass0 + pass1, rel=1e-12)
    flops = 4e7 * 2 + 2e4 * 152 + 4e7 * 4 + 2e4 * 308
    assert eagle.draft_flops(2, 2, 150.0) == pytest.approx(flops, rel=1e-12)
    # Three depths of 1, 3 and 9 nodes (3,3,1): passes over the root, then 3 and 9 nodes per
    # row; one row with 40 cached tokens. Pass 2 reads 40 + 4 fed tokens; its 9 nodes attend
    # to the context, two ancestors, the root and themselves: 9 x 40 + 9 x 3 pairs.
    wide = StepCosts(profile, "eagle", TreeShape.parse("3,3,1"))
    passes = [(1, 40, 40 + 1), (3, 41, 3 * 40 + 3 * 2), (9, 44, 9 * 40 + 9 * 3)]
    seconds = sum(5e-4 + 2e-5 + t * 3e-6 + kv * 1e-8 + pairs * 1e-9 for t, kv, pairs in passes)
    assert wide.draft_s(1, 3, 40.0) == pytest.approx(seconds, rel=1e-12)


def test_autoregressive_heads_run_k_passes_in_a_chain_by_hand(profile):
    # k = 3, 2 rows, 150 cached tokens: passes of 2 tokens reading 150, 152, 154 (each pass
    # adds a token per row), each token attending to its context and itself (kv + 2 pairs).
    eagle = StepCosts(profile, "eagle")
    passes = [150, 152, 154]
    seconds = sum(5e-4 + 2 * 2e-5 + 2 * 3e-6 + kv * 1e-8 + (kv + 2) * 1e-9 for kv in passes)
    assert eagle.draft_s(2, 3, 150.0) == pytest.approx(seconds, rel=1e-12)
    flops = sum(4e7 * 2 + 2e4 * (kv + 2) for kv in passes)
    assert eagle.draft_flops(2, 3, 150.0) == pytest.approx(flops, rel=1e-12)
    # The compiled cost model charges the same (the kernels' seconds and FLOPs).
    from specsim.simulation.compiled import kernel_module

    vector, out = np.array(eagle.terms), np.empty(3)
    kernel_module("compiled_step_kernel").cost_parts(vector, 3, 2.0, 8.0, 150.0, 700.0, out)
    assert out[1] == pytest.approx(flops, rel=1e-12)
    for kv, pairs in ((150.0, 700.0), (40.0, 200.0)):
        kernel_module("compiled_step_kernel").cost_parts(vector, 0, 2.0, 8.0, kv, pairs, out)
        assert out[0] == eagle.decode_iteration_s(0, 2, 8.0, kv, pairs)
    # With only draft_step_s: its fixed pass k times; per-token FLOPs for each of the k tokens.
    fixed = StepCosts(profile, "eagle_fixed")
    assert fixed.draft_s(2, 3, 150.0) == pytest.approx(3 * 3e-4, rel=1e-12)
    assert fixed.draft_flops(2, 3, 150.0) == pytest.approx(5e7 * 2 * 3, rel=1e-12)
    assert fixed.draft_s(2, 0, 150.0) == 0.0
    assert fixed.draft_flops(2, 0, 150.0) == 0.0


def test_parallel_heads_run_one_pass_per_step_in_a_tree_by_hand(profile):
    # Medusa: every depth's head reads the root's hidden state in one pass, its top-k giving
    # that depth's children, so the 2,1 tree (depth 2) costs one pass whatever its width.
    heads = StepCosts(profile, "heads", TREE)
    assert heads.draft_s(2, 2, 150.0) == pytest.approx(3e-4, rel=1e-12)
    # Per-token FLOPs for each row's two heads (one per depth), as the chain of 2 counts them.
    assert heads.draft_flops(2, 2, 150.0) == pytest.approx(5e7 * 2 * 2, rel=1e-12)
    medusa = StepCosts(profile, "medusa", TreeShape.parse("3,3,1"))
    # One pass of the fit: 2 rows, one token each, 150 cached tokens, 152 pairs.
    one_pass = 5e-4 + 2 * 2e-5 + 2 * 3e-6 + 150 * 1e-8 + 152 * 1e-9
    assert medusa.draft_s(2, 3, 150.0) == pytest.approx(one_pass, rel=1e-12)
    assert medusa.draft_flops(2, 3, 150.0) == pytest.approx(4e7 * 2 * 3, rel=1e-12)


def test_only_the_nodes_that_have_children_are_fed_to_the_drafter(profile):
    # (0), (1), (2), (0,0), (1,0), (0,0,0), (0,0,1): at depth 1 nodes (0) and (1) expand, (2)
    # does not; at depth 2 only (0,0). One row, 100 cached tokens: passes of 1, 2, 1 tokens.
    lopsided = TreeShape.parse("[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]]")
    costs = StepCosts(profile, "small", lopsided)
    passes = [(1, 100, 101), (2, 101, 2 * 100 + 2 * 2), (1, 103, 100 + 3)]
    seconds = sum(2e-3 + 1e-4 + t * 1e-5 + kv * 1e-7 + pairs * 1e-8 for t, kv, pairs in passes)
    assert costs.draft_s(1, 3, 100.0) == pytest.approx(seconds, rel=1e-12)


# Every drafter kind: a draft model, parallel heads (fixed pass, fit), autoregressive heads
# (fixed pass, fit) and prompt lookup.
@pytest.mark.parametrize("drafter", ["small", "heads", "medusa", "eagle_fixed", "eagle", "ngram"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_a_chain_shaped_tree_costs_the_chain_bit_for_bit(profile, drafter, k):
    chain = StepCosts(profile, drafter)
    tree = StepCosts(profile, drafter, TreeShape.chain(k))
    rows = TreeRows(TreeShape.chain(k))
    rng = np.random.default_rng(3)
    for batch in (1, 5, 64):
        kv = float(rng.integers(1, 4000, size=batch).sum())
        # Whole numbers and halves below 2**53: the two forms' sums are exact, hence equal.
        assert tree.draft_s(batch, k, kv) == chain.draft_s(batch, k, kv)
        assert tree.draft_flops(batch, k, kv) == chain.draft_flops(batch, k, kv)
        # The chain's verification totals (see Replica._plan_mixed): d + 1 positions per row,
        # (d + 1) (d + 2) / 2 pairs of their own.
        drafts = rng.integers(-1, k + 1, size=batch).astype(float)
        context = np.where(drafts < 0, 0.0, rng.integers(1, 4000, size=batch).astype(float))
        new = float((drafts + 1).sum())
        pairs = float((drafts + 1).dot(context) + ((drafts + 1) * (drafts + 2) / 2).sum())
        assert rows.totals(drafts, context) == (new, pairs)


def test_prompt_lookup_trees_are_refused(profile):
    # A branching tree: prompt lookup has one continuation (its chain-shaped tree is above).
    with pytest.raises(SpecsimError, match="draft models and decoding heads") as err:
        StepCosts(profile, "ngram", TREE)
    assert err.value.key == "speculation.tree"
