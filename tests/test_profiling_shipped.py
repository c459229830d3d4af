"""The shipped measured profile of the built-in models: it loads, answers, and is consistent."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specsim.profile import load_profile


@pytest.fixture(scope="module")
def builtin(repo):
    return load_profile(repo / "profiles" / "builtin-cpu.yaml")


def test_builtin_profile_is_a_measurement_with_its_method_stated(builtin):
    prov = builtin.profile.provenance
    assert prov.source == "measured"
    assert prov.profiling_seconds > 0
    assert "torch" in prov.software
    assert prov.command.startswith("specsim profile --target specsim-target")
    assert "process's CPU time" in prov.notes and "lossy" in prov.notes
    assert builtin.profile.overhead.source == "measured"


@pytest.mark.parametrize("model", ["target", "small", "tiny"])
def test_builtin_latency_fits_record_samples_range_and_held_out_error(builtin, model):
    latency = builtin.latency_model(model).latency
    assert len(latency.samples) == 56  # the full default CPU grid was measured
    assert latency.valid_range.batch == (1, 8) and latency.valid_range.context == (0, 384)
    held = latency.fit.held_out
    assert held.points == 56 and held.median_rel_error < 0.15
    # The fit reproduces its own samples' median closely (the held-out error covers the rest).
    got = [
        builtin.latency_model(model).pass_seconds(np.full(s.batch, s.context), s.new_tokens)
        for s in latency.samples
    ]
    rel = np.abs(np.array(got) / np.array([s.seconds for s in latency.samples]) - 1)
    assert np.median(rel) < 0.1


def test_builtin_costs_are_ordered_by_model_size(builtin):
    decode = {
        m: builtin.latency_model(m).pass_seconds(np.full(4, 128), 1)
        for m in ("target", "small", "tiny")
    }
    assert decode["target"] > decode["small"] > decode["tiny"]
    spec = builtin.profile
    assert spec.target.params > spec.drafters["small"].params > spec.drafters["tiny"].params


def test_builtin_acceptance_entries_and_sequences(builtin):
    for drafter in ("small", "tiny", "ngram"):
        assert builtin.acceptance(drafter, "greedy", 0.0).source == "measured"
        for t in (0.7, 1.0):
            entry = builtin.acceptance(drafter, "rejection", t)
            assert sorted(entry.mean_acceptance_length) == list(range(1, 9))
            lengths = [entry.mean_acceptance_length[k] for k in range(1, 9)]
            assert all(b >= a for a, b in itertools.pairwise(lengths))
    # The bigger drafter is accepted more often under exact sampling (the built-ins' design).
    small, tiny = (builtin.acceptance(d, "rejection", 1.0) for d in ("small", "tiny"))
    assert small.token_beta_mean > tiny.token_beta_mean
    assert small.mean_acceptance_length[4] > tiny.mean_acceptance_length[4]
    # Typical acceptance is lossy and says by how much.
    assert 0 < builtin.acceptance("small", "typical", 1.0).tv_distance < 1
    # Prompt lookup only sometimes proposes.
    assert builtin.acceptance("ngram", "rejection", 1.0).proposal_rate < 1.0
    for entry in builtin.profile.acceptance:
        if entry.sequences is None:
            continue
        rows = builtin.sequences_path(entry).read_text().splitlines()
        assert len(rows) == entry.sequences.requests == 64
        values = np.array([float(v) for row in rows for v in row.split()])
        if entry.sequences.kind == "run_length":
            assert values.min() >= 1 and np.all(values == np.round(values))
        else:
            assert values.min() >= 0 and values.max() <= 1
            # Each value is min(1, q(t) / p(t)) at the text's own token t: exactly 1 wherever
            # the drafter gave t at least the target's probability (19-30 % of the positions
            # here; beta = sum min(p, q) is 1 only where q equals p). Over tokens t ~ p its
            # mean is beta's: over 8,192 positions the two agree to sampling noise (standard
            # error about 0.004; they differ by 0.001 to 0.0035).
            assert np.mean(values == 1.0) > 0.1
            assert values.mean() == pytest.approx(entry.token_beta_mean, abs=0.015)
