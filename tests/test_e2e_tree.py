"""End-to-end losslessness of tree steps, KV-cache path keeping included.

Greedy: the tree loop's output equals the target's own greedy output token for token (a
divergence counts as a numerical near-tie only when the target's top-two logit margin there is
below 1e-4, as for chains), and the cache audit (each cache holds exactly the accepted sequence,
its logits those of a fresh pass) finds nothing after every step.

Planted faults: not moving the accepted path's keys and values (``TreeFaults``) leaves the
tree's first breadth-first nodes in the cache instead of the path, and the chain's off-by-one in
the target's rollback keeps one node too many; both must change the output and fail the audit.
A chain-shaped tree has no node off the path, so it is also the chain step, token for token.

Sampling (exact rejection, the sampling core's tree verifiers): the first four generated tokens
after a fixed prompt (prefill, then tree steps of the shape [[0], [1], [0, 0]], whose rank-1
child is a leaf, so a step that accepts it leaves a kept path of one node off the breadth-first
order and a later step reads it), for children drafted top-k, i.i.d. and without replacement,
compared with their exact distribution under the target alone (top-k 2 sampling: 16 cells, by
cache-free passes). A Cressie-Read test at alpha = 0.01 on N = 2000 rows (one batched run, seed 11)
detects a departure of total variation >= ``detectable_tv`` (reported; about 0.075) with 99 %
power. Both planted faults must be rejected. The path fault shows only where the token after a
wrongly kept node depends on it: on prompt 3, say, the rows that accept the rank-1 child there
go on almost surely with one token whatever the cache holds, so the test uses prompt 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_e2e_lossless import NEAR_TIE, exact_joint, greedy_divergences, greedy_reference
from test_engine_common import model, prompt_bank

from specsim.engine.generate import generate
from specsim.engine.step import Faults, Sampling
from specsim.engine.tree_step import TREE_DRAFTS, TreeFaults
from specsim.errors import SpecsimError
from specsim.sampling.stats import detectable_tv, goodness_of_fit
from specsim.tree import TreeShape

GREEDY = Sampling(temperature=0.0, verifier="greedy")
# A full tree, and a lopsided one whose rank-2 child has no children and whose deepest node
# hangs under rank 0 only.
SHAPES = ("2,2,1", "[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]]")
N_TOKENS = 20


# As for chains: the loop on the CPU and, where there is one, on a CUDA device.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def run(shape: TreeShape, faults=None, tree_faults=None, device: str = "cpu"):
    target = model("specsim-target", device)
    prompts = [prompt_bank().prompt(i, 12 + 3 * i) for i in range(6)]
    reference, margins = greedy_reference(target, prompts, N_TOKENS)
    drafter = model("specsim-draft-small", device)
    gen = generate(
        target, drafter, prompts, N_TOKENS, shape.depth, GREEDY, 0, faults, True, shape, tree_faults
    )
    return gen, greedy_divergences(gen.tokens, reference, margins)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SHAPES)
def test_greedy_tree_steps_equal_target_greedy_and_keep_exact_caches(spec, device):
    gen, divergences = run(TreeShape.parse(spec), device=device)
    print(f"{spec}: mean acceptance length {gen.mean_acceptance_length:.3f}")
    for row, position, margin in divergences:
        print(f"near-tie flip: row {row} position {position} logit margin {margin:.2e}")
    assert all(margin < NEAR_TIE for _, _, margin in divergences), divergences
    assert gen.audit == []
    assert gen.accepted > 0


@pytest.mark.parametrize(
    "faults, tree_faults",
    [(None, TreeFaults(skip_path_compaction=True)), (Faults(target_rollback_extra=1), None)],
    ids=["path-not-kept", "target-off-by-one"],
)
def test_planted_tree_rollback_faults_change_the_output_and_fail_the_audit(faults, tree_faults):
    gen, divergences = run(TreeShape.parse(SHAPES[0]), faults, tree_faults)
    assert any(margin >= NEAR_TIE for _, _, margin in divergences)
    assert any("target cache" in problem for problem in gen.audit)


def test_a_chain_shaped_tree_is_the_chain_step():
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    prompts = [prompt_bank().prompt(i, 16) for i in range(4)]
    chain = generate(target, drafter, prompts, 16, 3, GREEDY, 0)
    tree = generate(target, drafter, prompts, 16, 3, GREEDY, 0, tree=TreeShape.chain(3))
    assert torch.equal(chain.tokens, tree.tokens)
    assert (chain.steps, chain.accepted) == (tree.steps, tree.accepted)


ALPHA = 0.01
ROWS = 2000
SEED = 11
SAMPLED = Sampling(temperature=1.0, top_k=2, verifier="rejection")
SAMPLED_SHAPE = TreeShape.parse("[[0], [1], [0, 0]]")
SAMPLED_TOKENS = 4


def tree_fit_test(drafts: str, faults=None, tree_faults=None):
    target = model("specsim-target")
    prompt = prompt_bank().prompt(1, 12)
    joint = exact_joint(target, prompt, SAMPLED, SAMPLED_TOKENS)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    expected = np.array([joint[c] for c in cells])
    drafter = model("specsim-draft-tiny")
    gen = generate(
        target,
        drafter,
        [prompt] * ROWS,
        SAMPLED_TOKENS,
        SAMPLED_SHAPE.depth,
        SAMPLED,
        SEED,
        faults,
        tree=SAMPLED_SHAPE,
        tree_faults=tree_faults,
        tree_drafts=drafts,
    )
    counts = np.zeros(len(cells) + 1)  # the last cell: outcomes the target cannot produce
    for row in gen.tokens.tolist():
        counts[index.get(tuple(row), len(cells))] += 1
    return (
        goodness_of_fit(counts, np.append(expected, 0.0)),
        detectable_tv(expected, ROWS, ALPHA),
        gen,
    )


@pytest.mark.slow
@pytest.mark.parametrize("drafts", TREE_DRAFTS)
def test_sampled_tree_steps_match_the_target_distribution(drafts):
    result, tv, gen = tree_fit_test(drafts)
    print(f"{drafts}: p = {result.p_value:.3g}, cells {result.cells}, detectable TV {tv:.3f}")
    assert gen.accepted > 0 and gen.accepted < gen.steps * SAMPLED_SHAPE.depth
    assert tv < 0.1
    assert result.p_value > ALPHA


# One drafting each: the faults sit in the cache handling, which every drafting shares.
@pytest.mark.slow
@pytest.mark.parametrize(
    "drafts, faults, tree_faults",
    [
        ("top-k", None, TreeFaults(skip_path_compaction=True)),
        ("iid", Faults(target_rollback_extra=1), None),
    ],
    ids=["path-not-kept-top-k", "target-off-by-one-iid"],
)
def test_planted_tree_rollback_faults_are_rejected_when_sampling(drafts, faults, tree_faults):
    result, _, _ = tree_fit_test(drafts, faults, tree_faults)
    assert result.p_value < ALPHA


def test_tree_drafts_and_verifiers_are_checked_in_one_line():
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    shape = TreeShape.parse("2,1")
    with pytest.raises(SpecsimError, match="k = 3 with a tree of depth 2"):
        generate(target, drafter, [[1, 2, 3]], 4, 3, SAMPLED, 0, tree=shape)
    with pytest.raises(SpecsimError, match="unknown tree drafts 'beam'"):
        generate(target, drafter, [[1, 2, 3]], 4, 2, SAMPLED, 0, tree=shape, tree_drafts="beam")
    with pytest.raises(SpecsimError, match="a node has 3 children but the drafter's processed q"):
        wide = TreeShape.parse("3")
        generate(
            target,
            drafter,
            [[1, 2, 3]],
            4,
            1,
            SAMPLED,
            0,
            tree=wide,
            tree_drafts="without-replacement",
        )
