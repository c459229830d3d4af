"""The simulator chains rates that give every window k the profile's measured mean acceptance
length for k (``window_rates``), not the widest window's conditional rates."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sim_engine import BASE, per_position_agrees, run

from specsim.profile.acceptance import Acceptance
from specsim.simulation.acceptance import window_rates

DATA = Path(__file__).parent / "data"


def entry(per_position, lengths, proposal_rate=1.0) -> Acceptance:
    return Acceptance(
        drafter="d",
        verifier="rejection",
        temperature=1.0,
        per_position=per_position,
        mean_acceptance_length=lengths,
        proposal_rate=proposal_rate,
    )


def chain(rates, k) -> float:
    return 1.0 + float(np.cumprod(rates[:k]).sum())


def test_rates_reproduce_every_measured_window_length():
    # The widest window's rates (0.6 each) chain to 1.6 / 1.96 / 2.18: 6-19 % short.
    measured = {1: 1.7, 2: 2.3, 3: 2.7}
    rates = window_rates(entry([0.6, 0.6, 0.6, 0.5], measured))
    for k, length in measured.items():
        assert chain(rates, k) == pytest.approx(length, abs=1e-12)
    assert rates[:3] == pytest.approx([0.7, 0.6 / 0.7, 0.4 / 0.6])
    assert rates[3] == 0.5  # past the table: the profile's own rate for that position


def test_a_gain_larger_than_the_one_before_gives_rate_1_and_the_chain_recovers():
    rates = window_rates(entry([0.5, 0.5, 0.5], {1: 1.5, 2: 2.1, 3: 2.4}))
    assert rates == pytest.approx([0.5, 1.0, 0.6])
    assert chain(rates, 2) == pytest.approx(2.0)  # the closest a chain can come to 2.1
    assert chain(rates, 3) == pytest.approx(2.3)


def test_prompt_lookup_and_tables_without_k1_keep_the_profiles_rates():
    assert window_rates(entry([0.9, 0.8], {1: 1.2, 2: 1.3}, proposal_rate=0.25)) == [0.9, 0.8]
    assert window_rates(entry([0.9, 0.8], {3: 2.7})) == [0.9, 0.8]
    assert window_rates(entry([0.9, 0.8], {})) == [0.9, 0.8]


@pytest.fixture
def window_profile(tmp_path) -> Path:
    """The engine tests' profile, with drafter c05's exact entry measured per window: lengths
    1.9 / 2.7 / 3.3 (unconditional acceptance 0.9, 0.8, 0.6 by position) where its rates
    (0.8, 0.7, 0.6) chain to 0.8, 0.56, 0.336."""
    data = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    for item in data["acceptance"]:
        if item["drafter"] == "c05" and item["verifier"] == "rejection":
            item["mean_acceptance_length"] = {1: 1.9, 2: 2.7, 3: 3.3}
    path = tmp_path / "window_profile.yaml"
    path.write_text(yaml.safe_dump(data))
    shutil.copy(DATA / "sim_sequences.txt", tmp_path / "sim_sequences.txt")
    return path


def test_simulated_acceptance_follows_the_measured_window_lengths(tmp_path, window_profile):
    """Seed 3, 300 requests, k = 3 (about 6,000 steps with drafts): each position's unconditional
    acceptance within 4 binomial standard errors (0.03 or less) plus the end-of-request
    allowance (about 0.1) of 0.9 / 0.8 / 0.6. The widest window's chain (0.8 / 0.56 / 0.336),
    what the simulator used before, is 0.1-0.26 away: the same check rejects it."""
    from specsim.scenario import Scenario

    data = copy.deepcopy(BASE)
    data["profile"] = str(window_profile)
    scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    summary, rec = run(scenario, tmp_path)
    assert per_position_agrees(summary, rec, [0.9, 0.8 / 0.9, 0.6 / 0.8])
    assert not per_position_agrees(summary, rec, [0.8, 0.7, 0.6])


def test_a_length_table_with_a_gap_is_refused_at_load(tmp_path, window_profile, capsys):
    """With k = 1 and 3 but not 2, the chain would stop at the gap and go on with the widest
    window's rates (0.9, then 0.7, 0.6): 2.908 tokens per step at k = 3 against the 3.3 the
    profile states. The profile is refused when it loads instead, in one line with the fix."""
    from specsim.cli import main
    from specsim.errors import SpecsimError
    from specsim.profile import load_profile

    data = yaml.safe_load(window_profile.read_text())
    for index, item in enumerate(data["acceptance"]):
        if item["drafter"] == "c05" and item["verifier"] == "rejection":
            item["mean_acceptance_length"] = {1: 1.9, 3: 3.3}
            where = f"acceptance[{index}]"
    gapped = tmp_path / "gapped.yaml"
    gapped.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as info:
        load_profile(gapped)
    assert "k = 1, 3 but not k = 2" in info.value.message and "add k = 2" in info.value.fix
    assert info.value.key == where
    scenario = copy.deepcopy(BASE)
    scenario["profile"] = str(gapped)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert main(["simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "gapped.yaml" in err and "k = 2" in err
    assert not (tmp_path / "out").exists()
    # Tables without a gap stay valid: every k from 1, or one server's k (a calibration).
    assert entry([0.9, 0.8], {3: 2.7}).mean_acceptance_length == {3: 2.7}
    assert entry([0.9, 0.8], {1: 1.9, 2: 2.6}).mean_acceptance_length == {1: 1.9, 2: 2.6}
