"""The tree checker: every tree verifier passes it, every tree control fails it, the torch
verifiers match the closed form, and ``specsim check sampler --tree`` reports it.

Monte Carlo sizes (all seeded; the detectable TVs are those ``stats.window_tests`` reports for
the default problem, vocab 8 and tree 2,2,1, at 99% power and level alpha / 4 = 0.0025):
- control detection: 20,000 samples, seed 0: detects TV >= 0.023 on the first token and >=
  0.056 on all four; the controls' exact TVs there are 0.12-0.31;
- torch against the closed form: 20,000 samples, seed 1, the same detectable TVs, per subject.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.sampling import reference, stats, tree_reference
from specsim.sampling.kinds import TREE_DRAFTS, TREE_VERIFIER_KINDS, VERIFIER_KINDS
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.tree_checker import check_tree_sampler, tree_subject
from specsim.sampling.tree_controls import TREE_CONTROLS
from specsim.sampling.tree_montecarlo import run_tree_monte_carlo, tree_tables
from specsim.tree import TreeShape

IRREGULAR = "[[0], [1], [2], [0, 0], [0, 1], [2, 0]]"  # leaves at depths 1 and 2
EXACT = [
    ("rejection", "iid", "sample"),
    ("rejection", "without-replacement", "sample"),
    ("rejection", "iid", "greedy"),
    ("rejection", "without-replacement", "greedy"),
    ("greedy", "iid", "sample"),
    ("greedy", "without-replacement", "greedy"),
]


@pytest.mark.parametrize("tree", ["2,2,1", IRREGULAR, "3,1"])
@pytest.mark.parametrize("verifier, drafts, drafter", EXACT)
def test_every_tree_verifier_passes_the_exact_checker(tree, verifier, drafts, drafter):
    report = check_tree_sampler(verifier, tree=tree, drafts=drafts, drafter=drafter, samples=0)
    assert report.lossless and report.closed_form_max_abs_error <= 1e-12
    assert report.judged_tokens == TreeShape.parse(tree).depth + 1


def test_typical_is_flagged_lossy_by_design_with_its_distance():
    report = check_tree_sampler("typical", samples=0)
    assert not report.lossless and report.lossy_by_design and not report.negative_control
    assert report.tv_distance > 0.1


def test_each_exact_rule_is_lossy_under_the_other_drafts():
    """The rules are not interchangeable: SpecInfer's under without-replacement drafts is the
    tree-iid-proposal control; Sequoia's under i.i.d. drafts is wrong too."""
    models = ToyModels.make(8, 0)
    tables = models.tables(Processing())
    tree = TreeShape.parse("2,2,1")
    target = reference.target_distribution(tables.p, models.prompt, 4)
    for rule, drafts in ((tree_reference.TREE_WITHOUT_REPLACEMENT, "iid"),
                         (tree_reference.TREE_REJECTION, "without-replacement")):  # fmt: skip
        step = tree_reference.tree_step(tables, tree, rule, drafts, models.prompt)
        window = reference.first_step_window(step, tables.p, models.prompt)
        assert reference.total_variation(window, target) > 0.01


@pytest.mark.parametrize("rule, chain_rule", [
    (tree_reference.TREE_REJECTION, reference.REJECTION),
    (tree_reference.TREE_WITHOUT_REPLACEMENT, reference.REJECTION),
    (tree_reference.TREE_GREEDY, reference.GREEDY),
    (tree_reference.TREE_TYPICAL, reference.TYPICAL),
])  # fmt: skip
def test_the_tree_closed_form_on_a_chain_is_the_chain_closed_form(rule, chain_rule):
    """Window of 4 tokens after one step of k = 3 (typical's lossy distribution included)."""
    models = ToyModels.make(8, 0)
    tables = models.tables(Processing())
    greedy = rule is tree_reference.TREE_GREEDY
    step = tree_reference.tree_step(tables, TreeShape.chain(3), rule, "iid", models.prompt)
    ours = reference.first_step_window(step, tables.p, models.prompt, greedy)
    theirs = reference.rule_first_step_window(tables, models.prompt, (3,), chain_rule, 4, greedy)
    assert np.abs(ours - theirs).max() <= 1e-14


CONTROL_DRAFTER = {"tree-sibling-uniform": "greedy"}  # where its bug is largest


@pytest.mark.parametrize("name", sorted(TREE_CONTROLS))
def test_every_tree_control_fails_exactly_and_in_monte_carlo(name):
    drafter = CONTROL_DRAFTER.get(name, "sample")
    report = check_tree_sampler(name, drafter=drafter, samples=20_000, seed=0)
    assert report.negative_control and not report.lossless
    assert report.closed_form_max_abs_error > 1e-3 and report.tv_distance > 0.1
    assert report.p_value < report.alpha
    assert report.window_tests[0]["detectable_tv"] < 0.03


def test_sibling_uniform_control_is_flagged_by_the_exact_result_with_sampled_drafts():
    """With sampled children its distance (3e-4) is below what 200,000 samples detect (0.007),
    so the exact result is the one that flags it."""
    report = check_tree_sampler("tree-sibling-uniform", samples=0)
    assert not report.lossless and 1e-5 < report.tv_distance < 1e-2


@pytest.mark.parametrize("name", sorted(TREE_CONTROLS))
def test_tree_controls_coincide_with_the_exact_rule_on_a_chain(name):
    """On a chain every node has one child: no sibling to update, share a uniform with, or draw
    without replacement. The controls are tree bugs, and the checker passes them there."""
    report = check_tree_sampler(name, tree="1,1,1", samples=0)
    assert report.lossless


SUBJECTS = [
    ("rejection", "iid", "sample"),
    ("rejection", "without-replacement", "sample"),
    ("greedy", "iid", "greedy"),
    ("typical", "iid", "sample"),
    ("typical", "without-replacement", "greedy"),
    *((name, None, CONTROL_DRAFTER.get(name, "sample")) for name in sorted(TREE_CONTROLS)),
]


@pytest.mark.parametrize("verifier, drafts, drafter", SUBJECTS)
def test_torch_verifiers_match_their_closed_form(verifier, drafts, drafter):
    """The real batched verifier's output (Monte Carlo) against its own closed form, lossy ones
    included: 20,000 samples, seed 1, every window test at alpha 0.001 / 4."""
    tree = TreeShape.parse(IRREGULAR if drafter == "greedy" else "2,2,1")
    subject = tree_subject(verifier, drafts)
    models = ToyModels.make(8, 0)
    tables = models.tables(Processing())
    deterministic = drafter == "greedy"
    step = tree_reference.tree_step(
        tables, tree, subject.rule, subject.drafts, models.prompt, deterministic
    )
    expected = reference.first_step_window(step, tables.p, models.prompt, subject.greedy_reference)
    counts = run_tree_monte_carlo(
        subject.load(),
        tree_tables(models, Processing(), "float32", subject.greedy_reference),
        tree,
        subject.drafts,
        20_000,
        seed=1,
        deterministic=deterministic,
    )
    assert isinstance(counts, np.ndarray) and counts.sum() == 20_000
    _, family = stats.window_tests(counts, expected, alpha=0.001)
    assert family >= 0.001


def test_monte_carlo_power_at_the_default_sample_size():
    """200,000 samples (the default) on vocab 8, tree 2,2,1: the first token's test detects TV
    0.0072 and the whole window's 0.018 with 99% power."""
    models = ToyModels.make(8, 0)
    target = reference.target_distribution(models.tables(Processing()).p, models.prompt, 4)
    first = stats.detectable_tv(target.sum(axis=(1, 2, 3)), 200_000, 0.01 / 4)
    assert 0.005 < first < 0.01


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"tree": "9"}, "--tree"),  # 9 children, vocab 8
        ({"tree": "2,1,1,1,1,1"}, "--tree"),  # a window of 8^7 cells
        ({"tree": "2,,1"}, "--tree"),
        ({"temperature": 0.0}, "--temperature"),
        ({"verifier": "resample-p"}, "--verifier"),  # a chain control
        ({"verifier": "tree-stale-residual", "drafter": "greedy"}, "--drafter"),
        ({"verifier": "tree-iid-proposal", "drafts": "iid"}, "--drafts"),
        ({"drafts": "both"}, "--drafts"),
        ({"seed": -1}, "--seed"),
    ],
)
def test_bad_tree_checks_name_the_option(kwargs, key):
    with pytest.raises(SpecsimError) as info:
        check_tree_sampler(**{"verifier": "rejection", "samples": 0, **kwargs})
    assert info.value.key == key


def test_the_registry_and_the_cli_agree():
    from specsim.cli import check

    assert set(check.TREE_CONTROL_CHOICES) == set(TREE_CONTROLS)
    assert check.TREE_DRAFTS == TREE_DRAFTS == tree_reference.DRAFTS
    for kind in TREE_VERIFIER_KINDS.values():
        assert kind.verifier in VERIFIER_KINDS
        assert kind.load().__name__ == kind.function
        assert kind.closed_form().name == kind.name
    for name in VERIFIER_KINDS:
        for drafts in TREE_DRAFTS:
            tree_subject(name, drafts)  # every verifier has a tree twin for every drafts
    for name in TREE_VERIFIER_KINDS:  # a report's name can be checked again
        assert tree_subject(name, None).name == name


def test_cli_tree_check_reports_json_and_writes_its_file(capsys, tmp_path):
    out = tmp_path / "check"
    code = main(["check", "sampler", "--tree", "2,1", "--samples", "2000", "--json",
                 "--out", str(out), "--fail-on-lossy"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["lossless"] and summary["tree"] == [[0], [1], [0, 0], [1, 0]]
    assert summary["samples"] == 2000 and summary["judged_tokens"] == 3
    assert json.loads((out / "sampler_check.json").read_text()) == summary
    code = main(["check", "sampler", "--tree", "2", "--control", "tree-stale-residual",
                 "--samples", "0", "--fail-on-lossy"])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and "verdict: LOSSY" in text and "negative control" in text


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--k", "2"], "--k"),
        (["--ragged"], "--ragged"),
        (["--top-k", "3"], "--top-k"),
        (["--control", "resample-p"], "--control"),
        (["--verifier", "x.py:f"], "--verifier"),
    ],
)
def test_cli_refuses_chain_options_with_a_tree(capsys, extra, option):
    code = main(["check", "sampler", "--tree", "2", "--samples", "0", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and option in err[0]


def test_cli_refuses_tree_options_without_a_tree(capsys):
    for extra in (["--drafts", "iid"], ["--control", "tree-stale-residual"]):
        assert main(["check", "sampler", "--samples", "0", *extra]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
