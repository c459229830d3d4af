"""An engine iteration's cost from its named parts: the decoding rows' totals and the prompt
chunks' totals (``PassTotals``) go to the passes they belong to (``StepCosts.iteration_parts``)."""

from __future__ import annotations

import pytest
from test_engine_common import hand_profile

from specsim.costs import NO_ROWS, IterationParts, PassTotals, StepCosts
from specsim.profile import load_profile

OVERHEAD = {
    "per_step_s": 1e-4,
    "per_sequence_s": 1e-5,
    "per_draft_step_s": 2e-5,
    "per_draft_token_s": 3e-6,
    "per_prefill_s": 4e-4,
    "per_prefill_token_s": 5e-7,
}
DECODE = PassTotals(rows=8, tokens=40.0, kv=8000.0, pairs=8000.0 * 5 + 8 * 15.0)
CHUNK = PassTotals(rows=1, tokens=512.0, kv=1024.0, pairs=512.0 * (1024 + 513 / 2))


@pytest.fixture(scope="module")
def costs(tmp_path_factory) -> StepCosts:
    path = hand_profile(tmp_path_factory.mktemp("profile") / "p.yaml", overhead=OVERHEAD)
    return StepCosts(load_profile(path), "small")


def test_the_parts_are_the_passes_they_name(costs):
    parts = costs.iteration_parts(4, DECODE, CHUNK)
    assert isinstance(parts, IterationParts)
    # One target pass over the decoding rows and the chunk together.
    assert parts.target == costs.target_pass_s(9, 552.0, 9024.0, DECODE.pairs + CHUNK.pairs)
    # k draft passes for the decoding rows only, and the draft model's pass over the chunk.
    assert parts.draft == costs.draft_s(8, 4, 8000.0) + costs.draft_prefill_s(
        1, 512.0, 1024.0, CHUNK.pairs
    )
    # The engine's own work: 9 sequences, 8 of them through 4 draft passes, and a prompt chunk.
    host = 1e-4 + 1e-5 * 9 + 4 * (2e-5 + 3e-6 * 8) + 4e-4 + 5e-7 * 512
    assert parts.host == pytest.approx(host, rel=1e-12)
    assert costs.iteration_s(4, DECODE, CHUNK) == parts.target + parts.draft + parts.host


def test_prompt_chunks_are_not_decoding_rows(costs):
    """The same totals as prompt chunks cost no draft passes but the draft model's prompt pass
    and the prefill terms: a cost model that mixed the two slots up would give equal seconds."""
    as_rows = costs.iteration_parts(4, CHUNK)
    as_chunk = costs.iteration_parts(4, NO_ROWS, CHUNK)
    assert as_rows.target == as_chunk.target
    assert as_chunk.draft == costs.draft_prefill_s(1, 512.0, 1024.0, CHUNK.pairs)
    assert as_rows.draft == costs.draft_s(1, 4, 1024.0)
    assert as_rows.draft != as_chunk.draft
    assert as_rows.host == pytest.approx(1e-4 + 1e-5 + 4 * (2e-5 + 3e-6), rel=1e-12)
    assert as_chunk.host == pytest.approx(1e-4 + 1e-5 + 4e-4 + 5e-7 * 512, rel=1e-12)
    # No decoding rows: no draft passes, whatever k.
    assert costs.iteration_parts(0, NO_ROWS, CHUNK) == costs.iteration_parts(4, NO_ROWS, CHUNK)
