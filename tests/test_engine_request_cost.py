"""The engine's own cost per admitted request (``overhead.per_request_engine_s``: scheduling a
request, allocating its blocks, adding it to the input and sampling batches in the engine's
loop): the iteration that admits a request takes that much longer, so every request in the
batch waits for it.

- by hand: an iteration timeline with the term, on the per-iteration reference and on the
  fast path (which falls back to the reference while the term is > 0: the kernels lack it);
- a profile without the term writes no key for it (every profile keeps its bytes);
- recovery: ``profile from-bench`` fits a known term back from runs that send many short
  requests at once, and leaves it undetermined where one request at a time cannot tell it
  from the prefill.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from test_engine_common import hand_profile

from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profiling.writer import profile_yaml
from specsim.scenario import Scenario
from specsim.simulation.run import run_simulation

ADMIT_S = 0.005
# hand_profile's target: 10 ms + 0.1 ms a token; 0.1 ms a step of overhead
PREFILL_2X100 = 0.010 + 200 * 1e-4 + 1e-4  # two 100-token prompts in one iteration
PREFILL_100 = 0.010 + 100 * 1e-4 + 1e-4
DECODE_2 = 0.010 + 2 * 1e-4 + 1e-4  # two sequences' decode iteration
DECODE_1 = 0.010 + 1e-4 + 1e-4


def profile_with(folder: Path, admit_s: float) -> Path:
    return hand_profile(
        folder / "p.yaml", overhead={"per_step_s": 1e-4, "per_request_engine_s": admit_s}
    )


def simulate(profile: Path, tmp_path: Path, fast: bool, workload=None, max_batch=2):
    fixed = {"dist": "fixed"}
    workload = workload or {
        "kind": "closed_loop",
        "concurrency": 3,
        "requests": 3,
        "prompt": {**fixed, "value": 100},
        "output": {**fixed, "value": 2},
    }
    scenario = Scenario.model_validate(
        {
            "name": "engine-request-cost",
            "seed": 3,
            "profile": str(profile),
            "workload": workload,
            "engine": {"max_batch": max_batch, "max_batched_tokens": 4096, "jitter": False},
        }
    )
    out = tmp_path / f"requests-{fast}.csv"
    result = run_simulation(scenario, out, fast_path=fast)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    return result.summary, rows


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast-path"])
def test_an_iteration_pays_for_each_request_it_admits(fast, tmp_path):
    """Three requests of 100 prompt and 2 output tokens sent at 0 to an engine of two rows,
    5 ms a request admitted: iteration 1 admits two (their prefills, 30.1 ms, + 10 ms), iteration
    2 decodes them (10.3 ms, none admitted) and they finish; iteration 3 admits the third
    (20.1 ms + 5 ms), iteration 4 decodes it (10.2 ms)."""
    _, rows = simulate(profile_with(tmp_path, ADMIT_S), tmp_path, fast)
    first = PREFILL_2X100 + 2 * ADMIT_S
    second = first + DECODE_2
    third = second + PREFILL_100 + ADMIT_S
    rows.sort(key=lambda r: float(r["finish_s"]))
    for row in rows[:2]:
        assert float(row["first_token_s"]) == pytest.approx(first, abs=1e-9)
        assert float(row["finish_s"]) == pytest.approx(second, abs=1e-9)
    assert float(rows[2]["scheduled_s"]) == pytest.approx(second, abs=1e-9)
    assert float(rows[2]["first_token_s"]) == pytest.approx(third, abs=1e-9)
    assert float(rows[2]["finish_s"]) == pytest.approx(third + DECODE_1, abs=1e-9)


def test_the_fast_path_equals_the_reference_with_the_term(tmp_path):
    """Poisson traffic that queues: the fast path (which steps the reference while the term is
    > 0) gives the reference's records, and the term slows every request down."""
    workload = {
        "kind": "poisson",
        "rate": 60.0,
        "requests": 80,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 1, "high": 20},
    }
    profile = profile_with(tmp_path, ADMIT_S)
    fast = simulate(profile, tmp_path, True, workload, max_batch=8)
    assert fast == simulate(profile, tmp_path, False, workload, max_batch=8)
    plain, _ = simulate(profile_with(tmp_path, 0.0), tmp_path, True, workload, max_batch=8)
    assert fast[0]["ttft_s"]["mean"] > plain["ttft_s"]["mean"] + ADMIT_S


def test_the_term_is_written_only_when_stated_and_refused_when_negative(tmp_path):
    plain = load_profile(profile_with(tmp_path, 0.0)).profile
    assert "per_request_engine_s" not in profile_yaml(plain)
    stated = load_profile(profile_with(tmp_path, ADMIT_S)).profile
    assert "per_request_engine_s: 0.005" in profile_yaml(stated)
    path = profile_with(tmp_path, 0.0)
    data = yaml.safe_load(path.read_text())
    data["overhead"]["per_request_engine_s"] = -0.01
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as refused:
        load_profile(path)
    message = str(refused.value)
    assert "per_request_engine_s" in message and "\n" not in message
