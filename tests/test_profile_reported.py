"""Acceptance as engines report it: each form's stated rule, against hand-worked numbers."""

from __future__ import annotations

import pytest

from specsim.profile import Acceptance, load_profile
from specsim.profile.reported import (
    constant_rate,
    histogram_concentration,
    histogram_rates,
    table_rates,
)
from specsim.simulation.acceptance import build_acceptance, window_rates

EXACT = {"rel": 1e-12, "abs": 1e-15}


def entry(**fields) -> Acceptance:
    return Acceptance(drafter="d", verifier="rejection", temperature=1.0, **fields)


def test_a_scalar_length_at_k_is_one_constant_rate_solved_exactly():
    # 1 + a + a^2 = 1.75 at a = 0.5; 1 + a + a^2 + a^3 = 1.875 at a = 0.5; k = 1: a = L - 1.
    assert constant_rate(1.75, 2) == pytest.approx(0.5, **EXACT)
    assert constant_rate(1.875, 3) == pytest.approx(0.5, **EXACT)
    assert constant_rate(1.3, 1) == pytest.approx(0.3, **EXACT)
    # 1 + a + a^2 = 2.11 at a = 0.7 (0.7 + 0.49 = 1.19), and the bounds: all or nothing.
    assert constant_rate(2.19, 2) == pytest.approx(0.7, **EXACT)
    assert constant_rate(1.0, 4) == 0.0 and constant_rate(5.0, 4) == 1.0
    accepted = entry(mean_acceptance_length={3: 1.875})
    assert accepted.per_position == pytest.approx([0.5, 0.5, 0.5], **EXACT)


def test_a_table_starts_with_the_constant_rate_and_chains_its_gains():
    # k0 = 2: a = 0.5 (1.75); k = 3 gains 0.2 over a reach of 0.25: rate 0.8; k = 4 gains
    # 0.1 over 0.2: rate 0.5.
    rates = table_rates({2: 1.75, 3: 1.95, 4: 2.05})
    assert rates == pytest.approx([0.5, 0.5, 0.8, 0.5], **EXACT)
    # From k = 1 it is the simulator's window chain: 0.8, then 0.4 / 0.8, then 0.2 / 0.4.
    assert table_rates({1: 1.8, 2: 2.2, 3: 2.4}) == pytest.approx([0.8, 0.5, 0.5], **EXACT)


def test_a_table_that_falls_with_k_stops_the_chain_there():
    # DSpark-like: k >= 2 only, length falls at k = 3 and rises again at k = 4.
    rates = table_rates({2: 1.75, 3: 1.7, 4: 1.9})
    assert rates == pytest.approx([0.5, 0.5, 0.0, 0.0], **EXACT)


def test_a_drafter_that_does_not_always_propose_is_taken_per_proposal():
    # r = 0.5: L = 1.375 per step is 1 + 0.375 / 0.5 = 1.75 per proposal: a = 0.5 at k = 2.
    accepted = entry(mean_acceptance_length={2: 1.375}, proposal_rate=0.5)
    assert accepted.per_position == pytest.approx([0.5, 0.5], **EXACT)
    with pytest.raises(ValueError, match="tokens per proposal"):
        entry(mean_acceptance_length={1: 1.8}, proposal_rate=0.5)  # 1 + 0.8 / 0.5 > 2


def test_histogram_rates_are_the_conditional_shares_of_steps():
    # vLLM's example: [39, 1, 0, 3] over 43 steps: u = 4/43, 3/43, 3/43; mean length
    # 1 + (1 + 0 + 9) / 43 = 1.2325581395...
    assert histogram_rates([39, 1, 0, 3]) == pytest.approx([4 / 43, 3 / 4, 1.0], **EXACT)
    accepted = entry(acceptance_histograms=[{"k": 3, "counts": [39, 1, 0, 3]}])
    assert accepted.mean_acceptance_length == {3: pytest.approx(1 + 10 / 43, **EXACT)}
    assert accepted.request_concentration is None
    # A drafter proposing in half the steps: the histogram counts those, the length all steps.
    lookup = entry(acceptance_histograms=[{"k": 3, "counts": [39, 1, 0, 3]}], proposal_rate=0.5)
    assert lookup.mean_acceptance_length == {3: pytest.approx(1 + 5 / 43, **EXACT)}
    assert lookup.per_position == pytest.approx([4 / 43, 3 / 4, 1.0], **EXACT)
    # No step got past draft 1: later positions are 0, not undefined.
    assert histogram_rates([2, 2, 0, 0]) == [0.5, 0.0, 0.0]


def test_per_request_counts_give_their_spread():
    # Two requests of 10 steps, first draft accepted in 8 and 2: a = 0.5, S^2 = 0.09,
    # h = 0.1; rho = (0.09 / 0.25 - 0.1) / 0.9 = 13 / 45, c = 45 / 13 - 1 = 32 / 13.
    assert histogram_concentration([[2, 8], [8, 2]]) == pytest.approx(32 / 13, **EXACT)
    accepted = entry(acceptance_histograms=[{"k": 1, "requests": [[2, 8], [8, 2]]}])
    assert accepted.request_concentration == pytest.approx(32 / 13, **EXACT)
    assert accepted.per_position == pytest.approx([0.5], **EXACT)
    # Alike requests (spread within binomial noise) and a single request: no concentration.
    assert histogram_concentration([[5, 5], [5, 5]]) is None
    assert histogram_concentration([[2, 8], [0, 0]]) is None
    # A shorter list (SGLang's grows with the most accepted) counts the rest as 0.
    short = entry(acceptance_histograms=[{"k": 3, "requests": [[1, 1], [0, 0, 2]]}])
    assert short.acceptance_histograms[0].pooled() == [1, 1, 2, 0]


def test_histograms_per_k_give_the_lengths_and_the_widest_gives_the_rates():
    # k = 1: [2, 8], length 1.8; k = 2: [2, 4, 4], length 1 + 12 / 10 = 2.2 and rates
    # u = 0.8, 0.4: [0.8, 0.5], which is also what the simulator chains from the two lengths.
    both = entry(acceptance_histograms=[{"k": 2, "counts": [2, 4, 4]}, {"k": 1, "counts": [2, 8]}])
    assert both.mean_acceptance_length == {
        1: pytest.approx(1.8, **EXACT),
        2: pytest.approx(2.2, **EXACT),
    }
    assert both.per_position == pytest.approx([0.8, 0.5], **EXACT)
    assert window_rates(both) == pytest.approx([0.8, 0.5], **EXACT)
    with pytest.raises(ValueError, match="not k = 2"):
        entry(acceptance_histograms=[{"k": 1, "counts": [2, 8]}, {"k": 3, "counts": [1]}])
    with pytest.raises(ValueError, match="two at one k"):
        entry(acceptance_histograms=[{"k": 1, "counts": [2, 8]}, {"k": 1, "counts": [1]}])


def test_given_fields_are_kept_and_bad_histograms_refused():
    kept = entry(
        per_position=[0.9],
        request_concentration=3.0,
        acceptance_histograms=[{"k": 1, "requests": [[2, 8], [8, 2]]}],
    )
    assert kept.per_position == [0.9] and kept.request_concentration == 3.0
    with pytest.raises(ValueError, match="no per_position"):
        entry()
    with pytest.raises(ValueError, match="longer than k"):
        entry(acceptance_histograms=[{"k": 1, "counts": [1, 1, 1]}])
    with pytest.raises(ValueError, match="not the sum"):
        entry(acceptance_histograms=[{"k": 1, "counts": [1, 1], "requests": [[1, 2]]}])
    with pytest.raises(ValueError, match="counts no step"):
        entry(acceptance_histograms=[{"k": 2, "counts": [0, 0]}])


def test_a_profile_with_reported_forms_loads_and_simulates_its_rates(repo, tmp_path):
    text = (repo / "tests" / "data" / "sim_profile.yaml").read_text()
    text = text.replace(
        "  - {drafter: c05, verifier: greedy, temperature: 0.0, per_position: [0.85]}",
        "  - {drafter: c05, verifier: greedy, temperature: 0.0,\n"
        "     mean_acceptance_length: {2: 1.75, 3: 1.95}}",
    )
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    loaded = load_profile(path)
    found = loaded.acceptance("c05", "greedy", 0.0)
    assert found.per_position == pytest.approx([0.5, 0.5, 0.8], **EXACT)
    model = build_acceptance(loaded, found, "per_position", 3)
    assert model.expected_emitted(2) == pytest.approx(1.75, **EXACT)
    assert model.expected_emitted(3) == pytest.approx(1.95, **EXACT)


def test_the_reference_page_states_the_rules(repo):
    page = (repo / "docs" / "reference" / "profile.md").read_text()
    assert "acceptance_histograms" in page and "1 + a + ... + a^k0 = L_k0" in page


def test_an_acceptance_file_may_publish_an_al_table_from_the_block_size_up():
    # A block drafter measured at k >= 2 only; the roofline profile copies it with its rates.
    from specsim.profiling.writer import acceptance_entries

    table = {"drafter": "d", "verifier": "greedy", "temperature": 0.0, "source": "published"}
    entries = acceptance_entries(
        {"acceptance": [{**table, "mean_acceptance_length": {2: 1.75, 3: 1.95, 4: 2.05}}]}, "f"
    )
    assert entries[0]["per_position"] == pytest.approx([0.5, 0.5, 0.8, 0.5], **EXACT)
    assert entries[0]["mean_acceptance_length"] == {"2": 1.75, "3": 1.95, "4": 2.05}
