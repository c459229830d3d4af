"""End-to-end losslessness of tree steps, KV-cache path keeping included.

Greedy: the tree loop's output equals the target's own greedy output token for token (a
divergence counts as a numerical near-tie only when the target's top-two logit margin there is
below 1e-4, as for chains), and the cache audit (each cache holds exactly the accepted sequence,
its logits those of a fresh pass) finds nothing after every step.

Planted faults: not moving the accepted path's keys and values (``TreeFaults``) leaves the
tree's first breadth-first nodes in the cache instead of the path, and the chain's off-by-one in
the target's rollback keeps one node too many; both must change the output and fail the audit.
A chain-shaped tree has no node off the path, so it is also the chain step, token for token.
"""

from __future__ import annotations

import pytest
import torch
from test_e2e_lossless import NEAR_TIE, greedy_divergences, greedy_reference
from test_engine_common import model, prompt_bank

from specsim.engine.generate import generate
from specsim.engine.step import Faults, Sampling
from specsim.engine.tree_step import TreeFaults
from specsim.errors import SpecsimError
from specsim.tree import TreeShape

GREEDY = Sampling(temperature=0.0, verifier="greedy")
# A full tree, and a lopsided one whose rank-2 child has no children and whose deepest node
# hangs under rank 0 only.
SHAPES = ("2,2,1", "[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]]")
N_TOKENS = 20


def run(shape: TreeShape, faults=None, tree_faults=None):
    target = model("specsim-target")
    prompts = [prompt_bank().prompt(i, 12 + 3 * i) for i in range(6)]
    reference, margins = greedy_reference(target, prompts, N_TOKENS)
    drafter = model("specsim-draft-small")
    gen = generate(
        target, drafter, prompts, N_TOKENS, shape.depth, GREEDY, 0, faults, True, shape, tree_faults
    )
    return gen, greedy_divergences(gen.tokens, reference, margins)


@pytest.mark.parametrize("spec", SHAPES)
def test_greedy_tree_steps_equal_target_greedy_and_keep_exact_caches(spec):
    gen, divergences = run(TreeShape.parse(spec))
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


def test_a_tree_step_refuses_a_verifier_it_cannot_run():
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    sampled = Sampling(temperature=1.0, verifier="rejection")
    with pytest.raises(SpecsimError, match="tree steps run the greedy verifier"):
        generate(target, drafter, [[1, 2, 3]], 4, 2, sampled, 0, tree=TreeShape.parse("2,1"))
