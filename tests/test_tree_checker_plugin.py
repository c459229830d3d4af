"""Your own tree verifier in ``specsim check sampler --tree``: an exact enumeration of its step
and the Monte Carlo test, with processed probabilities or raw logits, and two public tree
verifiers (tests/data, written from their published algorithms) judged.

Monte Carlo sizes (seeded): 30,000 samples, seed 0, vocab 4, tree 2,1 (3 tokens judged), each
prefix test at level 0.01 / 3: the whole window's test detects TV >= 0.025 with 99% power.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.sampling import reference, tree_reference
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.tree_checker import check_tree_sampler
from specsim.sampling.tree_controls import TREE_CONTROLS
from specsim.sampling.tree_verifiers import (
    verify_tree_greedy,
    verify_tree_rejection,
    verify_tree_without_replacement,
)
from specsim.tree import TreeShape

DATA = Path(__file__).parent / "data"
EAGLE = f"{DATA / 'eagle_tree_verifier.py'}:verify"
SEQUOIA = f"{DATA / 'sequoia_tree_verifier.py'}:verify"
SMALL = dict(tree="2,1", vocab=4)


@pytest.mark.parametrize(
    "function, drafts, drafter",
    [
        (verify_tree_rejection, "iid", "sample"),
        (verify_tree_without_replacement, "without-replacement", "sample"),
        (verify_tree_rejection, "iid", "greedy"),
    ],
)
def test_an_exact_tree_verifier_passed_as_a_function_is_judged_exactly(function, drafts, drafter):
    report = check_tree_sampler(
        function, drafts=drafts, drafter=drafter, samples=20_000, dtype="float64", **SMALL
    )
    assert report.exact_method == "enumeration"
    assert report.closed_form_max_abs_error < 1e-12
    assert report.lossless and report.p_value >= 0.01
    assert report.enumeration_cases == (
        1 if drafter == "greedy" else 256 if drafts == "iid" else 192
    )


def test_the_enumeration_of_a_control_equals_its_closed_form():
    """The enumeration of a buggy function gives its exact (lossy) window: the closed form's."""
    control = TREE_CONTROLS["tree-sibling-uniform"]
    report = check_tree_sampler(
        control.verifier, drafter="greedy", samples=0, dtype="float64", **SMALL
    )
    models = ToyModels.make(4, 0)
    tables = models.tables(Processing())
    step = tree_reference.tree_step(
        tables, TreeShape.parse("2,1"), control.rule, "iid", models.prompt, True
    )
    produced = reference.first_step_window(step, tables.p, models.prompt)
    target = reference.target_distribution(tables.p, models.prompt, 3)
    assert not report.lossless and report.tv_distance > 0.05
    exact_tv = reference.total_variation(produced, target)
    assert report.tv_distance == pytest.approx(exact_tv, abs=1e-12)


def test_greedy_reference_for_a_greedy_tree_verifier():
    report = check_tree_sampler(
        verify_tree_greedy, greedy_reference=True, drafter="greedy", samples=2_000, **SMALL
    )
    assert report.lossless and report.reference == "target greedy decoding"
    sampled = check_tree_sampler(verify_tree_greedy, drafter="greedy", samples=0, **SMALL)
    assert not sampled.lossless  # greedy is not sampling from p


def test_eagle_evaluate_posterior_is_exact_at_temperature_1_and_lossy_otherwise():
    """EAGLE's bonus token at a leaf comes from softmax(raw logits): the logits processor
    (temperature) is skipped there, so the step is exact only at temperature 1."""
    kwargs = dict(drafts="without-replacement", inputs="logits", samples=20_000, **SMALL)
    at_one = check_tree_sampler(EAGLE, temperature=1.0, **kwargs)
    assert at_one.lossless and at_one.exact_method == "enumeration"
    cooled = check_tree_sampler(EAGLE, temperature=0.7, **kwargs)
    assert not cooled.lossless
    assert cooled.tv_distance > 0.05 and cooled.p_value < 1e-6


def test_sequoia_spectree_step_is_exact_for_its_without_replacement_drafts():
    report = check_tree_sampler(SEQUOIA, drafts="without-replacement", samples=20_000, **SMALL)
    assert report.lossless and report.closed_form_max_abs_error <= report.exact_tolerance


def test_a_large_tree_says_why_it_has_no_enumeration_and_keeps_the_monte_carlo_test():
    report = check_tree_sampler(verify_tree_rejection, tree="2,2,1", vocab=8, samples=5_000)
    assert report.closed_form_max_abs_error is None and "distinct trees" in report.exact_note
    assert report.lossless and report.p_value is not None


def test_a_verifier_that_raises_is_a_malformed_verdict():
    def broken(p, q, draft_tokens, tree, randomness):
        raise ValueError("no tree support")

    report = check_tree_sampler(broken, samples=1_000, **SMALL)
    assert not report.lossless and "ValueError" in report.malformed["reason"]


def test_cli_tree_with_your_own_verifier(capsys):
    argv = ["check", "sampler", "--tree", "2,1", "--vocab", "3", "--verifier", EAGLE]
    argv += ["--drafts", "without-replacement", "--inputs", "logits", "--samples", "2000"]
    assert main([*argv, "--temperature", "0.7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exact_method"] == "enumeration" and not out["lossless"]
    assert out["inputs"] == "logits"
    assert main([*argv, "--temperature", "0.7", "--fail-on-lossy"]) == 1
    assert "verdict: LOSSY" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, key",
    [
        (["--verifier", "rejection", "--inputs", "logits"], "--inputs"),
        (["--verifier", "rejection", "--lossy-by-design"], "--lossy-by-design"),
        (["--verifier", "nowhere.py:verify"], "--verifier"),
    ],
)
def test_cli_tree_bad_input_exits_2(capsys, args, key):
    assert main(["check", "sampler", "--tree", "2,1", "--vocab", "4", *args]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1


def _their_tree_verify(p, q, drafts, parents, accept, sample):
    """A one-row tree verifier with other conventions (SpecInfer's rule, top-k children):
    returns the accepted node list and the final token."""
    nodes, node = [], -1
    while True:
        target = p[node + 1].double().clone()
        for child in [c for c, parent in enumerate(parents) if parent == node]:
            x = int(drafts[child])
            if float(accept[child]) * float(target.sum()) < float(target[x]):
                nodes.append(child)
                node = child
                break
            target[x] = 0.0  # a point-mass proposal: the residual is p' without x
        else:
            cdf = target.cumsum(0)
            return nodes, int((cdf < sample * cdf[-1]).sum().clamp(max=len(cdf) - 1))


def test_the_example_adapter_in_the_help_runs_and_is_judged_exact():
    """The 15-line adapter printed by ``specsim check sampler --help``, run as written."""
    from specsim.cli.check_lines import SAMPLER_DESCRIPTION

    lines = SAMPLER_DESCRIPTION.split("(15 lines):\n\n", 1)[1].split("\n\n")
    code = "\n\n".join(lines[:2])
    assert code.count("\n") >= 14 and "def verify" in code
    namespace = {"their_tree_verify": _their_tree_verify}
    exec(compile("\n".join(line[2:] for line in code.splitlines()), "help", "exec"), namespace)
    report = check_tree_sampler(
        namespace["verify"], tree="2", vocab=4, drafter="greedy", samples=2_000, dtype="float64"
    )
    assert report.exact_method == "enumeration" and report.lossless
    assert report.closed_form_max_abs_error < 1e-12


def test_your_typical_tree_verifier_is_reported_lossy_by_design():
    from specsim.sampling.tree_verifiers import verify_tree_typical

    report = check_tree_sampler(verify_tree_typical, lossy_by_design=True, samples=0, **SMALL)
    assert not report.lossless and report.lossy_by_design and report.tv_distance > 0.01
