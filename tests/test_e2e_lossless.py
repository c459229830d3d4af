"""End-to-end losslessness of the whole generation loop, KV-cache rollback included.

Sampling: the first three generated tokens after a fixed prompt, from the speculative loop
(prefill, then steps with k = 1 so that token 3 comes from a second step whenever the first one
rejected), are compared with their exact distribution under the target alone. The exact joint
comes from cache-free target passes over every prefix (top-k 3 sampling keeps it to 27 cells).
A Cressie-Read test at alpha = 0.01 on N = 2000 rows (one batched run, seed 11) detects any
departure of total variation >= ``detectable_tv`` (reported; about 0.08) with 99 % power.

Planted faults (``Faults``): an off-by-one in the target's rollback changes the context of every
token after a rejection, and the same test rejects it. Not rolling back the drafter's cache
cannot change the output distribution of an exact verifier (the verifier is given the very q the
draft was sampled from, whatever that q was conditioned on); it can only cost acceptance. The
cache audit (the caches must hold exactly the accepted sequence) catches both faults
deterministically, and the drafter fault's loss of acceptance is shown too.

Greedy: speculative greedy output equals the target's own greedy output token for token; a
divergence counts as a numerical near-tie only when the target's top-two logit margin at that
position is below 1e-4 (batched and cached numerics can flip such a tie), and is reported.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine_common import model, prompt_bank

from specsim.engine.generate import generate
from specsim.engine.step import Faults, Sampling
from specsim.sampling.stats import detectable_tv, goodness_of_fit

ALPHA = 0.01
# The whole loop on the CPU, and (where there is one) on a CUDA device: models, caches, rollback
# and verifier all on the GPU, checked against the same exact distribution.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
ROWS = 2000
SEED = 11
NEAR_TIE = 1e-4
TOP_K = Sampling(temperature=1.0, top_k=3)


def exact_joint(target, prompt: list[int], sampling: Sampling, depth: int) -> dict:
    """P(first ``depth`` tokens) under target-only sampling, by cache-free passes."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.inference_mode():
        for _ in range(depth):
            prefixes = list(probs)
            x = torch.tensor([prompt + list(p) for p in prefixes], device=target.device)
            p = sampling.probs(target(x)[:, -1]).double().cpu()
            probs = {
                (*prefix, v): probs[prefix] * float(p[i, v])
                for i, prefix in enumerate(prefixes)
                for v in torch.nonzero(p[i]).flatten().tolist()
            }
    return probs


def speculative_fit_test(faults: Faults, device: str, drafter: str = "specsim-draft-tiny"):
    target = model("specsim-target", device)
    prompt = prompt_bank().prompt(3, 12)
    joint = exact_joint(target, prompt, TOP_K, 3)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    expected = np.array([joint[c] for c in cells])
    gen = generate(target, model(drafter, device), [prompt] * ROWS, 3, 1, TOP_K, SEED, faults)
    counts = np.zeros(len(cells) + 1)  # the last cell: outcomes the target cannot produce
    for row in gen.tokens.tolist():
        counts[index.get(tuple(row), len(cells))] += 1
    result = goodness_of_fit(counts, np.append(expected, 0.0))
    return result, detectable_tv(expected, ROWS, ALPHA), gen


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_speculative_sampling_matches_the_target_distribution(device):
    result, tv, gen = speculative_fit_test(Faults(), device)
    print(f"p = {result.p_value:.3g}, cells {result.cells}, detectable TV {tv:.3f}")
    assert gen.steps > 0 and gen.accepted < gen.drafted  # both branches of the verifier ran
    assert tv < 0.1
    assert result.p_value > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_off_by_one_in_the_target_rollback_is_rejected(device):
    result, _, _ = speculative_fit_test(Faults(target_rollback_extra=1), device)
    assert result.p_value < ALPHA


def test_cache_audit_passes_and_catches_both_rollback_faults():
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    prompts = [prompt_bank().prompt(i, 10 + i) for i in range(4)]
    args = (target, drafter, prompts, 12, 3, Sampling(temperature=1.0), 3)
    assert generate(*args, audit=True).audit == []
    target_fault = generate(*args, faults=Faults(target_rollback_extra=1), audit=True)
    assert any("target cache" in p for p in target_fault.audit)
    draft_fault = generate(*args, faults=Faults(skip_draft_rollback=True), audit=True)
    assert any("drafter cache" in p for p in draft_fault.audit)


def test_drafter_rollback_fault_keeps_the_output_and_only_the_audit_sees_it():
    # An exact verifier is given the q each draft was sampled from, whatever context q saw, so
    # a stale drafter cache cannot change the output: greedy output stays the target's. What
    # it changes is q itself, so acceptance drops, and the audit catches a drafter cache that
    # holds tokens the sequence does not.
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    prompts = [prompt_bank().prompt(i, 16) for i in range(8)]
    greedy = Sampling(temperature=0.0, verifier="greedy")
    good = generate(target, drafter, prompts, 24, 4, greedy, 0)
    bad = generate(
        target, drafter, prompts, 24, 4, greedy, 0, Faults(skip_draft_rollback=True), audit=True
    )
    print(
        f"mean acceptance length {good.mean_acceptance_length:.3f} -> "
        f"{bad.mean_acceptance_length:.3f} with the drafter fault"
    )
    assert torch.equal(good.tokens, bad.tokens)
    assert any("drafter cache" in p for p in bad.audit)
    # With the committed weights the stale cache costs about a quarter of the acceptance
    # (greedy and seeded, so this comparison is deterministic).
    assert bad.mean_acceptance_length < good.mean_acceptance_length


def greedy_reference(target, prompts: list[list[int]], n: int):
    """Target-only greedy tokens and the top-two logit margin at each step (cache-free)."""
    tokens, margins = [], []
    with torch.inference_mode():
        for prompt in prompts:
            seq, row_margins = list(prompt), []
            for _ in range(n):
                logits = target(torch.tensor([seq], device=target.device))[0, -1].float().cpu()
                top = torch.topk(logits, 2).values
                row_margins.append(float(top[0] - top[1]))
                seq.append(int(logits.argmax()))
            tokens.append(seq[len(prompt) :])
            margins.append(row_margins)
    return torch.tensor(tokens), margins


def greedy_divergences(candidate: torch.Tensor, reference: torch.Tensor, margins) -> list[tuple]:
    """(row, position, margin) of the first divergence of each row that diverges."""
    out = []
    for b in range(candidate.shape[0]):
        diff = (candidate[b] != reference[b]).nonzero()
        if diff.numel():
            i = int(diff[0])
            out.append((b, i, margins[b][i]))
    return out


def check_greedy(faults: Faults, device: str = "cpu") -> list[tuple]:
    target = model("specsim-target", device)
    prompts = [prompt_bank().prompt(i, 12 + 3 * i) for i in range(6)]
    reference, margins = greedy_reference(target, prompts, 20)
    greedy = Sampling(temperature=0.0, verifier="greedy")
    gen = generate(target, model("specsim-draft-small", device), prompts, 20, 3, greedy, 0, faults)
    return greedy_divergences(gen.tokens, reference, margins)


@pytest.mark.parametrize("device", DEVICES)
def test_speculative_greedy_equals_target_greedy(device):
    divergences = check_greedy(Faults(), device)
    for row, position, margin in divergences:
        print(f"near-tie flip: row {row} position {position} logit margin {margin:.2e}")
    assert all(margin < NEAR_TIE for _, _, margin in divergences), divergences


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_check_flags_the_target_off_by_one(device):
    divergences = check_greedy(Faults(target_rollback_extra=1), device)
    assert any(margin >= NEAR_TIE for _, _, margin in divergences)
