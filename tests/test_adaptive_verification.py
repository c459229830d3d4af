"""vLLM's adaptive verification (``policy: adaptive_verification``): the budget rule and the
admission by survival, worked by hand on small batches, and the policy in whole runs.

The rule (vLLM 0.33 ``v1/worker/gpu/spec_decode/adaptive_verification.py``): B* maximises
(rows sampling + the B highest survivals) / (step seconds with B drafts verified); the B*
highest survivals are admitted, each row keeping a prefix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from specsim.costs import NO_ROWS, PassTotals
from specsim.profile.latency import LatencyFit
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.engine_policies import AdaptiveVerification

REPO = Path(__file__).parent.parent


def policy(rates: list[list[float]], fit: LatencyFit, draft_s: float = 0.0) -> AdaptiveVerification:
    """The policy over acceptance levels with these conditional rates, on a target whose pass
    follows ``fit``; the drafter costs ``draft_s`` a step."""
    k = len(rates[0])
    av = AdaptiveVerification(k)
    costs = SimpleNamespace(
        target=SimpleNamespace(latency=SimpleNamespace(fit=fit)),
        iteration_parts=lambda k, decode, prefill: (None, draft_s, 0.0),
    )
    acceptance = SimpleNamespace(survival=np.cumprod(np.array(rates), axis=1), proposal_rate=1.0)
    av.attach(costs, acceptance)
    return av


def admit(av, drafts, levels, sampling=None, prefill=NO_ROWS) -> list[int]:
    drafts = np.array(drafts, dtype=np.float64)
    rows = int((drafts >= 0).sum())
    decode = PassTotals(rows, float(rows), 0.0, float(rows))
    sampling = float(rows) if sampling is None else sampling
    av.admit(drafts, np.array(levels), decode, prefill, sampling)
    return drafts.astype(int).tolist()


# A pass is 10 ms up to 3 tokens, and 1 s more per token past them.
KNEE = {"fixed_s": 0.010, "per_batched_token_s": 1.0}
STEEP = LatencyFit(**KNEE, knee_tokens=3.0)


def test_the_budget_stops_where_a_draft_stops_paying_for_itself():
    # Two rows at 2 drafts: survivals 0.9, 0.81 (level 1) and 0.1, 0.01 (level 0). Expected
    # tokens 2, 2.9, 3.71, ... over 10, 10, 1010 ms: B* = 1, and it goes to the likelier draft.
    av = policy([[0.1, 0.1], [0.9, 0.9]], STEEP)
    assert admit(av, [2, 2], [0, 1]) == [0, 1]
    assert (av.scheduled, av.verified) == (4, 1)


def test_cheap_verification_verifies_every_draft():
    flat = LatencyFit(fixed_s=0.010, per_batched_token_s=1e-6, knee_tokens=0.0)
    av = policy([[0.1, 0.1], [0.9, 0.9]], flat)
    assert admit(av, [2, 2, -1], [0, 1, 0]) == [2, 2, -1]  # the empty slot stays empty


@pytest.mark.parametrize("prefill_pair_s", [None, 0.0, 4e-3])
def test_the_budget_prices_prompt_chunks_pairs_at_their_own_cost(prefill_pair_s):
    # 5,000 query-key pairs of a prompt chunk beside two decoding rows: the budget's seconds
    # carry them at the fit's prefill cost (absent: the decode cost, 1 ms a pair), as the
    # step-cost formula prices the iteration.
    fit = LatencyFit(fixed_s=0.010, per_attention_pair_s=1e-3, per_prefill_pair_s=prefill_pair_s)
    av = policy([[0.5, 0.5]], fit)
    decode = PassTotals(2, 2.0, 10.0, 2.0)
    with_pairs, without = PassTotals(1, 100.0, 0.0, 5000.0), PassTotals(1, 100.0, 0.0, 0.0)
    added = av._seconds(2, decode, with_pairs) - av._seconds(2, decode, without)
    cost = 1e-3 if prefill_pair_s is None else prefill_pair_s
    assert added == pytest.approx([5000.0 * cost] * 3, rel=1e-12, abs=1e-12)


def test_survival_decides_whose_drafts_are_verified_and_rows_keep_prefixes():
    # Level 0 survives 0.9, 0.81, 0.729; level 1 0.5, 0.25, 0.125. With the knee at 6 tokens
    # three rows leave room for three drafts: all three of the level-0 row's.
    av = policy([[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]], LatencyFit(**KNEE, knee_tokens=6.0))
    assert admit(av, [3, 3, 3], [0, 1, 1]) == [3, 0, 0]
    # A fourth slot goes to a level-1 row's first draft: the earlier of the two.
    av = policy([[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]], LatencyFit(**KNEE, knee_tokens=7.0))
    assert admit(av, [3, 3, 3], [0, 1, 1]) == [3, 1, 0]


def test_ties_go_to_the_shallower_step_then_the_earlier_row():
    # Every row survives 0.9, 0.81: budget 2 (knee 4 with 2 rows) takes both first drafts.
    knee4 = LatencyFit(**KNEE, knee_tokens=4.0)
    av = policy([[0.9, 0.9]], knee4)
    assert admit(av, [2, 2], [0, 0]) == [1, 1]
    # With one slot, the earlier row has it.
    av = policy([[0.9, 0.9]], STEEP)
    assert admit(av, [2, 2], [0, 0]) == [1, 0]


def test_a_row_near_its_end_offers_only_the_drafts_it_scheduled():
    knee6 = LatencyFit(**KNEE, knee_tokens=6.0)
    av = policy([[0.9, 0.9, 0.9]], knee6)
    # Row 0 has one token left to draft for; 4 slots go to row 1's three and row 0's one.
    assert admit(av, [1, 3], [0, 0]) == [1, 3]
    assert admit(av, [0, 3, 3], [0, 0, 0]) == [0, 2, 1]


def test_a_drafter_that_costs_more_than_it_returns_still_verifies_what_pays():
    # The drafter's cost is paid whatever the budget; it shifts the ratio, not the order.
    av = policy([[0.9, 0.9], [0.1, 0.1]], STEEP, draft_s=0.050)
    assert admit(av, [2, 2], [0, 1]) == [1, 0]


def test_replayed_sequences_are_refused():
    data = closed_loop("adaptive_verification", 1).model_dump(mode="json")
    data["speculation"]["acceptance"] = "sequences"
    with pytest.raises(ValueError, match="expected survival"):
        Scenario.model_validate(data)


def closed_loop(policy_name: str, concurrency: int) -> Scenario:
    data = yaml.safe_load((REPO / "scenarios" / "closed_loop.yaml").read_text())
    data["workload"].update(concurrency=concurrency, requests=48)
    data["speculation"].update(k=4, policy=policy_name)
    return Scenario.model_validate(data).with_source(REPO / "scenarios" / "closed_loop.yaml")


def test_alone_in_the_batch_every_draft_pays_and_it_runs_as_fixed_k():
    # One client on an H100: a 5-token pass costs what a 1-token pass does, so every draft is
    # verified and the run is fixed k's, request for request (the fixed run takes the fast path).
    fixed = run_simulation(closed_loop("fixed", 1))
    adaptive = run_simulation(closed_loop("adaptive_verification", 1))
    report = adaptive.summary.pop("window_policy")[0]["adaptive_verification"]
    assert report["verified_share"] == 1.0 and report["drafts_proposed"] > 0
    for run, name in ((adaptive, "adaptive_verification"), (fixed, "fixed")):
        assert run.summary["scenario"].pop("policy") == name
        assert run.summary["pools"]["main"].pop("policy") == name
    assert adaptive.summary == fixed.summary


def shape_benchmark():
    """``benchmarks/adaptive_verification_shape.py``: the published arms and its scenarios."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import adaptive_verification_shape
    finally:
        sys.path.pop(0)
    return adaptive_verification_shape


@pytest.fixture(scope="module")
def arms_at_256() -> dict[str, float]:
    bench = shape_benchmark()
    profile = REPO / "tests" / "data" / "adaptive_verification" / "profile.yaml"
    return {arm: bench.throughput(profile, 256, arm) for arm in bench.ARMS}


def test_published_shape_fixed_k_falls_below_no_speculation_and_adaptive_does_not(arms_at_256):
    # vLLM PR #52362 at concurrency 256: no speculation 8,879 tok/s, fixed K = 7 7,852,
    # adaptive 13,325. The profile's target terms were fitted to the no-speculation arm only
    # (docs/notes/2026-12-02-adaptive-verification.md); both speculative arms are predictions.
    published = {r["concurrency"]: r for r in shape_benchmark().published()}[256]
    arms = arms_at_256
    assert arms["no_spec"] == pytest.approx(published["no_spec"], rel=0.05)
    assert arms["fixed_k7"] < arms["no_spec"] < arms["adaptive"]
    assert arms["adaptive"] > 1.1 * arms["fixed_k7"]


def test_plan_window_emits_adaptive_verification_where_it_is_the_best_an_engine_runs(
    tmp_path, capsys
):
    # The published deployment at 256 clients: specsim's goodput policy is ahead, but no
    # engine runs it; of the policies an engine runs, adaptive verification wins and beats
    # speculation off, so vLLM's config carries it (and SGLang's says it cannot).
    from specsim.cli import main

    data = yaml.safe_load((REPO / "scenarios" / "closed_loop.yaml").read_text())
    data["profile"] = str(REPO / "tests" / "data" / "adaptive_verification" / "profile.yaml")
    fixed = {"dist": "fixed"}
    data["workload"].update(
        concurrency=256,
        requests=1024,
        prompt={**fixed, "value": 256},
        output={**fixed, "value": 512},
    )
    data["engine"] = {"max_batch": 256, "max_batched_tokens": 8192}
    data["speculation"] = {"drafter": "dspark", "k": 7, "temperature": 1.0}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    args = ["--k", "0,7", "--loads", "256", "--policies", "adaptive_verification", "--no-progress"]
    assert (
        main(["plan", "window", str(path), *args, "--emit", "vllm,sglang", "--out", str(out)]) == 0
    )
    assert "of what an engine runs: vLLM adaptive verification" in capsys.readouterr().out
    config = json.loads((out / "engine" / "vllm.json").read_text())
    assert config["enable_adaptive_verification"] is True and config["num_speculative_tokens"] == 7
    sglang = (out / "engine" / "sglang.args").read_text()
    assert "Not expressible: vLLM's adaptive verification" in sglang


def test_drafter_swap_emits_the_recommended_drafters_best_engine_policy():
    # By hand: mean E2E (lower is better) of the recommended drafter's policies at the load;
    # the goodput policy is best but no engine runs it; adaptive verification is next and
    # beats speculation off (k = 0: 14.7 s).
    from specsim.planning.emit.emit_choice import _engine_policy, _verdict_row

    summaries = {"k=0": 14.7, "adaptive_verification": 12.5}
    chosen = SimpleNamespace(
        load=256.0, summary=lambda c: {"e2e_s": {"mean": summaries[c]}} if c in summaries else None
    )
    figures = {"static": 15.0, "adaptive": 12.1, "adaptive_verification": 12.5}
    outcome = {"policies": [{"load": 256.0, "figures": {"dspark": figures}}]}

    def engine_policy(outcome, name):
        row = _verdict_row(outcome, chosen.load)
        return _engine_policy(row and row["figures"].get(name), chosen, False)

    assert engine_policy(outcome, "dspark") == "adaptive_verification"
    # Slower than speculation off: the static rule stands.
    summaries["adaptive_verification"] = 15.5
    figures["adaptive_verification"] = 15.5
    assert engine_policy(outcome, "dspark") is None
    # Another drafter's row, or no --policies: nothing changes.
    assert engine_policy(outcome, "other") is None
    assert engine_policy({}, "dspark") is None
