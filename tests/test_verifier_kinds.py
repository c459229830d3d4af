"""The verifier registry (``specsim.sampling.kinds``) is complete, and every part takes its
verifiers from it: an entry that lacks an implementation, a closed form or a profiler score fails
here, and the schema literals, CLI choices, checker, engine and profiler follow the registry."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import numpy as np
import pytest

from specsim.sampling.kinds import (
    DEFAULT_VERIFIER,
    LOSSY_VERIFIERS,
    VERIFIER_KINDS,
    VerifierKind,
)

NAMES = tuple(VERIFIER_KINDS)


def missing_parts(kind: VerifierKind) -> list[str]:
    """The parts of an entry that do not resolve: the torch function, its closed form, and the
    per-position scores the profiler reads (those ``specsim.profiling.scoring`` computes)."""
    from specsim.profiling.acceptance_measure import SCORES
    from specsim.sampling import reference, verifiers

    missing = []
    if not callable(getattr(verifiers, kind.function, None)):
        missing.append("function")
    rule = getattr(reference, kind.rule, None)
    if not isinstance(rule, reference.ClosedFormRule) or rule.name != kind.name:
        missing.append("rule")
    scoring = kind.scoring
    for part in ("score", "walk", "tv"):
        key = getattr(scoring, part)
        if (key is not None or part != "tv") and key not in SCORES:
            missing.append(f"scoring.{part}")
    if kind.lossy != (scoring.tv is not None):
        missing.append("scoring.tv")  # a lossy verifier's entry records its distance from p
    if not kind.description:
        missing.append("description")
    return missing


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_resolves_all_its_parts(name):
    kind = VERIFIER_KINDS[name]
    assert missing_parts(kind) == []
    assert kind.load().__name__ == kind.function
    assert kind.closed_form().name == name


@pytest.mark.parametrize(
    "change, missing",
    [
        ({"function": "verify_nothing"}, ["function"]),
        ({"rule": "NOTHING"}, ["rule"]),
        ({"rule": "GREEDY"}, ["rule"]),  # another verifier's closed form
        ({"lossy": True}, ["scoring.tv"]),
        ({"scoring": dataclasses.replace(VERIFIER_KINDS["rejection"].scoring, walk="x")},
         ["scoring.walk"]),
    ],
)  # fmt: skip
def test_an_incomplete_entry_is_found(change, missing):
    planted = dataclasses.replace(VERIFIER_KINDS["rejection"], **change)
    assert missing_parts(planted) == missing


@pytest.mark.parametrize("name", NAMES)
def test_the_lossy_flag_is_the_checkers_exact_verdict(name):
    # The exact closed form alone (samples=0): deterministic, so no sample size to state.
    from specsim.sampling.checker import check_sampler

    report = check_sampler(name, samples=0, vocab=5, k=2)
    assert report.lossless is not VERIFIER_KINDS[name].lossy
    assert report.lossy_by_design is VERIFIER_KINDS[name].lossy
    assert report.reference == (
        "target greedy decoding" if VERIFIER_KINDS[name].greedy_reference else "target sampling"
    )


def test_the_schemas_and_the_command_line_take_their_names_from_the_registry():
    from specsim.cli import check, profile
    from specsim.profile.acceptance import Acceptance
    from specsim.scenario import Speculation
    from specsim.speculation_settings import SpeculationOverride

    for model in (Acceptance, Speculation):
        assert typing.get_args(model.model_fields["verifier"].annotation) == NAMES
    override = typing.get_args(SpeculationOverride.model_fields["verifier"].annotation)
    assert typing.get_args(override[0]) == NAMES
    assert Speculation().verifier == DEFAULT_VERIFIER
    assert check.VERIFIER_CHOICES == NAMES
    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    (modes,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = [
        action
        for sub in modes.choices.values()
        for action in sub._actions
        if action.dest == "verifier"
    ]
    assert len(options) >= 2  # from-bench and calibrate
    assert all(tuple(option.choices) == NAMES for option in options)


def test_the_checker_and_the_engine_run_the_registrys_functions():
    from specsim.engine.step import VERIFIERS as ENGINE
    from specsim.sampling.subjects import VERIFIERS as SUBJECTS

    assert tuple(SUBJECTS) == tuple(ENGINE) == NAMES
    for name, kind in VERIFIER_KINDS.items():
        assert ENGINE[name] is kind.load() is SUBJECTS[name].load()
        assert SUBJECTS[name].rule is kind.closed_form()
        assert (SUBJECTS[name].lossy_by_design, SUBJECTS[name].greedy_reference) == (
            kind.lossy,
            kind.greedy_reference,
        )


def test_the_profiler_measures_a_new_entry_where_its_flags_say(monkeypatch):
    from specsim.profiling.acceptance_measure import _verifier_runs

    typical = VERIFIER_KINDS["typical"]
    monkeypatch.setitem(VERIFIER_KINDS, "typical2", dataclasses.replace(typical, name="typical2"))
    assert _verifier_runs([0.0, 1.0]) == [
        (0.0, ["greedy", "rejection"]),
        (1.0, ["rejection", "typical", "typical2"]),
    ]
    at_zero = dataclasses.replace(typical.scoring, at_zero=True)
    again = dataclasses.replace(typical, name="typical2", scoring=at_zero)
    monkeypatch.setitem(VERIFIER_KINDS, "typical2", again)
    assert _verifier_runs([0.0]) == [(0.0, ["greedy", "rejection", "typical2"])]


# Each per-position score held at its own constant, so an entry shows which one it read.
CONSTANT_SCORES = {"beta": 0.5, "text_accept": 1.0, "match": 0.25, "typical": 0.75}


@pytest.mark.parametrize(
    "name, walked, averaged, tv, sequences",
    [
        ("rejection", 1.0, 0.5, None, "beta"),
        ("greedy", 0.25, 0.25, None, "run_length"),
        ("typical", 0.75, 0.75, 0.125, None),
    ],
)
def test_the_profilers_entry_reads_the_scores_its_registry_entry_names(
    name, walked, averaged, tv, sequences
):
    from specsim.profiling.acceptance_measure import SCORES, AcceptanceResult, _add_entry
    from specsim.profiling.specs import DrafterArg

    rows = {key: [np.full(12, CONSTANT_SCORES.get(key, 0.125))] for key in SCORES}
    result = AcceptanceResult(entries=[])
    _add_entry(result, DrafterArg("d", "d.json"), name, 1.0, rows, "p")
    (entry,) = result.entries
    assert entry["per_position"][0] == pytest.approx(walked, abs=1e-12)
    assert entry["token_beta_mean"] == pytest.approx(averaged, abs=1e-12)
    assert entry.get("tv_distance") == tv
    assert entry.get("sequences", {}).get("kind") == sequences
    assert (name in LOSSY_VERIFIERS) is (tv is not None)
