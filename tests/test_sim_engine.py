"""The replica engine: determinism, conservation of tokens, KV cache, preemption, prefill modes,
drafter kinds, acceptance models, window policies, fleets and pools."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from specsim.choices import ROUTERS
from specsim.costs import kv_capacity_tokens
from specsim.costs.kv_cache import engine_reservation_bytes
from specsim.profile import load_profile
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data"

BASE = {
    "seed": 3,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 300,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 20, "high": 120},
    },
    "engine": {"max_batch": 32},
    "speculation": {"drafter": "c05", "k": 3},
}


def make(**changes) -> Scenario:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def run(scenario: Scenario, tmp_path: Path, name: str = "r"):
    path = tmp_path / f"{name}.csv"
    result = run_simulation(scenario, records_path=path)
    return result.summary, read_records(path)


def test_same_seed_gives_byte_identical_records_and_summary(tmp_path):
    a = run_simulation(make(), records_path=tmp_path / "a.csv")
    b = run_simulation(make(), records_path=tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert a.summary == b.summary
    run_simulation(make(seed=4), records_path=tmp_path / "c.csv")
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()


def test_changing_k_leaves_arrivals_and_lengths_unchanged(tmp_path):
    _, r3 = run(make(), tmp_path, "k3")
    _, r1 = run(make(speculation__k=1), tmp_path, "k1")
    _, r0 = run(make(speculation__k=0), tmp_path, "k0")
    for other in (r1, r0):
        order_a, order_b = np.argsort(r3["id"]), np.argsort(other["id"])
        for column in ("arrival_s", "prompt_tokens", "output_tokens"):
            np.testing.assert_array_equal(r3[column][order_a], other[column][order_b])
    # ... while the timing does change.
    assert not np.array_equal(np.sort(r3["finish_s"]), np.sort(r1["finish_s"]))


def test_tokens_are_conserved_per_request(tmp_path):
    summary, rec = run(make(), tmp_path)
    assert summary["requests"] == 300 == rec["id"].shape[0]
    assert sorted(rec["id"].tolist()) == list(range(300))
    # The prefill emits the first token; every decode step emits its accepted drafts + 1.
    np.testing.assert_array_equal(rec["output_tokens"] - 1, rec["steps"] + rec["accepted"])
    assert np.all(rec["accepted"] <= rec["drafted"])
    assert np.all(rec["drafted"] <= 3 * rec["steps"])
    assert np.all(rec["arrival_s"] <= rec["scheduled_s"])
    assert np.all(rec["scheduled_s"] <= rec["first_token_s"])
    assert np.all(rec["first_token_s"] <= rec["finish_s"])
    assert summary["output_tokens"] == rec["output_tokens"].sum()


def per_position_agrees(summary, rec, conditional, z: float = 4.0, steps=None) -> bool:
    """Unconditional per-position acceptance within z binomial standard errors of the chain
    of ``conditional`` rates over ``steps`` steps with drafts (default: all the run's steps);
    plus 2 x requests / steps for the windows capped at a request's end (they cannot reach the
    last positions)."""
    steps = int(rec["steps"].sum()) if steps is None else int(steps)
    allowance = 2 * rec["id"].shape[0] / steps
    expected = np.cumprod(conditional)
    observed = np.asarray(summary["per_position_acceptance"])
    se = np.sqrt(expected * (1 - expected) / steps)
    return observed.shape == expected.shape and bool(
        np.all(np.abs(observed - expected) <= z * se + allowance)
    )


def _closed_loop(**changes) -> Scenario:
    workload = {
        "kind": "closed_loop",
        "concurrency": 8,
        "requests": 200,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 20, "high": 120},
        **changes,
    }
    return make(workload=workload)


def test_closed_loop_steady_throughput_counts_the_window_with_every_client_active(tmp_path):
    """The window opens when the last client's first request finishes and closes when the first
    client is refused a new one (here the finish that comes after the 200th request went out:
    finish number 200 - 8 + 1 in time order). The fleet emits a request's tokens between its
    first token and its finish, so the tokens of requests wholly inside the window bound the
    count from below, and those of requests overlapping it from above."""
    summary, rec = run(_closed_loop(), tmp_path)
    # Summary figures carry 6 significant digits (5e-6 relative), records 1e-6 s.
    start, end = summary["steady_window_s"]
    assert start == pytest.approx(rec["finish_s"][rec["id"] < 8].max(), rel=1e-5)
    assert end == pytest.approx(np.sort(rec["finish_s"])[200 - 8], rel=1e-5)
    steady = summary["throughput_tokens_per_s_steady"]
    inside = (rec["first_token_s"] >= start) & (rec["finish_s"] <= end)
    overlapping = (rec["finish_s"] > start) & (rec["first_token_s"] <= end)
    low, high = (rec["output_tokens"][m].sum() / (end - start) for m in (inside, overlapping))
    assert low <= steady * (1 + 1e-5) and steady <= high * (1 + 1e-5)
    assert low < high  # the bounds are not the same number: the check has room to fail
    # The whole-run figure is unchanged: every output token over the time to the last finish.
    assert summary["throughput_tokens_per_s"] == pytest.approx(
        rec["output_tokens"].sum() / rec["finish_s"].max(), rel=1e-5
    )
    assert summary["throughput_tokens_per_s"] < steady  # ramp-up and drain run below capacity


def test_steady_throughput_is_null_without_a_steady_window(tmp_path):
    # As many requests as clients: the first refusal comes before every client has finished.
    summary, _ = run(_closed_loop(requests=8), tmp_path, "short")
    assert summary["throughput_tokens_per_s_steady"] is None
    assert summary["steady_window_s"] is None
    summary, _ = run(make(), tmp_path, "open")  # an open loop has no clients to wait for
    assert summary["throughput_tokens_per_s_steady"] is None


def test_summary_acceptance_matches_records(tmp_path):
    """Seed 3, 300 requests (~8,000 steps): per-position shares to within ~0.03."""
    summary, rec = run(make(), tmp_path)
    assert summary["draft_acceptance_rate"] == pytest.approx(
        rec["accepted"].sum() / rec["drafted"].sum(), rel=1e-5
    )
    # Every step drafts (c05 always proposes) except those capped to 0 drafts at the very end.
    assert summary["mean_acceptance_length"] >= 1 + rec["accepted"].sum() / rec["steps"].sum()
    # Per-position conditional rates (0.8, 0.7, 0.6) chain to 0.8, 0.56, 0.336 unconditional.
    assert per_position_agrees(summary, rec, [0.8, 0.7, 0.6])


def test_the_per_position_check_catches_a_planted_bug(tmp_path):
    """A model that flattens the per-position rates into one mean rate (0.7 for every position,
    a plausible slip) is off by 0.1 at position 1; the same check rejects it."""
    summary, rec = run(
        make(speculation__acceptance="iid", speculation__acceptance_rate=0.7), tmp_path
    )
    assert not per_position_agrees(summary, rec, [0.8, 0.7, 0.6])


def test_k0_is_the_plain_decoding_baseline(tmp_path):
    summary, rec = run(make(speculation__k=0), tmp_path)
    assert rec["drafted"].sum() == 0 and rec["accepted"].sum() == 0
    np.testing.assert_array_equal(rec["steps"], rec["output_tokens"] - 1)
    assert summary["flops_drafter"] == 0 and summary["flops_wasted"] == 0
    assert summary["mean_acceptance_length"] == 1.0
    assert summary["scenario"]["drafter"] is None


def test_kv_capacity_formula_counts_target_and_drafter():
    profile = load_profile(DATA / "sim_profile.yaml")
    engine = make().engine
    # the engine also holds its profiling pass's activations and non-torch buffers
    reserved = engine_reservation_bytes(profile, engine)
    assert reserved > 0
    with_draft = kv_capacity_tokens(profile, "c05", True, engine)
    assert with_draft == int((80e9 - 16e9 - 2e9 - reserved) // (131072 + 32768))
    alone = kv_capacity_tokens(profile, "c05", False, engine)
    assert alone == int((80e9 - 16e9 - reserved) // 131072)
    half = make(engine__memory_utilisation=0.5).engine
    expected = int((40e9 - 18e9 - reserved) // 163840)
    assert kv_capacity_tokens(profile, "c05", True, half) == expected


def test_preemption_when_the_cache_runs_out(tmp_path):
    tight = make(
        engine__kv_capacity_tokens=3000,
        workload__rate=200.0,
        workload__prompt={"dist": "fixed", "value": 200},
        workload__output={"dist": "fixed", "value": 400},
        workload__requests=60,
    )
    summary, rec = run(tight, tmp_path)
    assert summary["preemptions"] > 0
    assert summary["preemptions"] == rec["preemptions"].sum()
    assert summary["requests"] == 60
    # Recomputation still conserves tokens: each recompute prefill emits one token too.
    np.testing.assert_array_equal(
        rec["output_tokens"] - 1 - rec["preemptions"], rec["steps"] + rec["accepted"]
    )
    assert summary["kv_cache_utilisation"]["max"] <= 1.0
    roomy, _ = run(
        make(
            workload__rate=200.0,
            workload__prompt={"dist": "fixed", "value": 200},
            workload__output={"dist": "fixed", "value": 400},
            workload__requests=60,
        ),
        tmp_path,
        "roomy",
    )
    assert roomy["preemptions"] == 0


def test_a_request_larger_than_the_cache_is_an_error():
    from specsim.errors import SpecsimError

    with pytest.raises(SpecsimError, match="KV-cache tokens"):
        run_simulation(make(engine__kv_capacity_tokens=100))


@pytest.mark.parametrize("chunked", [True, False])
def test_prefill_modes_both_complete_and_differ(tmp_path, chunked):
    summary, rec = run(make(engine__chunked_prefill=chunked), tmp_path)
    assert summary["requests"] == 300
    assert np.all(rec["first_token_s"] > rec["arrival_s"])


def test_separate_prefill_iterations_stall_decoding(tmp_path):
    busy = {"workload__rate": 60.0, "workload__requests": 400}
    chunked, _ = run(make(engine__chunked_prefill=True, **busy), tmp_path, "a")
    separate, _ = run(make(engine__chunked_prefill=False, **busy), tmp_path, "b")
    # Separate prefill iterations interrupt decoding, so inter-token gaps grow at the tail.
    assert separate["itl_s"]["p99"] > chunked["itl_s"]["p99"]


def test_small_token_budget_chunks_long_prompts(tmp_path):
    long_prompts = {"workload__prompt": {"dist": "fixed", "value": 3000}, "workload__requests": 40}
    small, _ = run(make(engine__max_batched_tokens=256, **long_prompts), tmp_path, "s")
    large, _ = run(make(engine__max_batched_tokens=8192, **long_prompts), tmp_path, "l")
    # With memory-bound passes, a 256-token budget needs ~12 iterations per prompt.
    assert small["ttft_s"]["mean"] > 5 * large["ttft_s"]["mean"]


def test_ngram_drafts_are_ragged_and_follow_the_proposal_rate(tmp_path):
    """Seed 3, 300 requests, ~18,000 steps: the share of steps with a proposal is within 4
    binomial standard errors (~0.013) of proposal_rate 0.25, resolving a 0.02 error."""
    summary, rec = run(make(speculation__drafter="ngram", speculation__k=4), tmp_path)
    steps = int(rec["steps"].sum())
    proposing = rec["drafted"].sum() / 4  # a proposing row drafts 4 (bar end-of-request caps)
    se = np.sqrt(0.25 * 0.75 / steps)
    assert abs(proposing / steps - 0.25) <= 4 * se + rec["id"].shape[0] / steps
    assert not abs(proposing / steps - 0.28) <= 4 * se  # a 0.03 error would be caught
    # Conditional on proposing, rate 0.9 at every position (the profile lists one rate).
    assert per_position_agrees(summary, rec, [0.9] * 4, steps=proposing)
    assert summary["flops_drafter"] == 0


def test_typical_acceptance_is_flagged_lossy(tmp_path):
    summary, _ = run(make(speculation__verifier="typical"), tmp_path)
    assert summary["lossy"] is True and "lossy" in summary["lossy_note"]
    exact, _ = run(make(), tmp_path, "exact")
    assert exact["lossy"] is False and exact["lossy_note"] is None


def test_heterogeneity_spreads_acceptance_across_requests(tmp_path):
    """Seed 3, 200 requests x 200 tokens: the homogeneous run is the negative control."""
    common = {
        "speculation__drafter": "c20",
        "workload__output": {"dist": "fixed", "value": 200},
        "workload__requests": 200,
    }
    _, hetero = run(make(**common), tmp_path, "h")
    _, homo = run(make(speculation__heterogeneity=False, **common), tmp_path, "o")

    def spread(rec):
        return np.std(rec["accepted"] / rec["drafted"])

    # Concentration 4 makes per-request rates vary far more than sampling noise alone.
    assert spread(hetero) > 2 * spread(homo)


def test_sequence_replay_uses_profiled_run_lengths(tmp_path):
    scenario = make(
        speculation__drafter="c20",
        speculation__temperature=0.0,
        speculation__acceptance="sequences",
        speculation__k=5,
        workload__requests=200,
    )
    summary, rec = run(scenario, tmp_path)
    # Sequences: all-ones (accept nothing), all-sixes (accept 5 of 5), and 3 1 2.
    rates = rec["accepted"] / np.maximum(rec["drafted"], 1)
    assert np.any(rates == 0) and np.any(rates > 0.95)
    assert 0 < summary["draft_acceptance_rate"] < 1


def test_iid_rate_override(tmp_path):
    summary, rec = run(
        make(speculation__acceptance="iid", speculation__acceptance_rate=0.5), tmp_path
    )
    assert per_position_agrees(summary, rec, [0.5, 0.5, 0.5])


def test_by_batch_policy_uses_the_table(tmp_path):
    table = [{"max_batch": 2, "k": 3}, {"max_batch": 1000, "k": 1}]
    low, _ = run(
        make(
            speculation__policy="by_batch",
            speculation__k_by_batch=table,
            workload__rate=0.5,
            workload__requests=30,
        ),
        tmp_path,
        "low",
    )
    high, _ = run(
        make(speculation__policy="by_batch", speculation__k_by_batch=table, workload__rate=200.0),
        tmp_path,
        "high",
    )
    assert low["mean_window"] > 2.5
    assert high["mean_window"] < 1.5


def test_fleet_spreads_requests_and_reports_pools(tmp_path):
    pools = [
        {"name": "a", "replicas": 2, "speculation": {"k": 1}},
        {"name": "b", "replicas": 1, "speculation": {"drafter": "c20", "k": 3}},
    ]
    summary, rec = run(make(fleet__pools=pools, fleet__router="round_robin"), tmp_path)
    assert set(summary["pools"]) == {"a", "b"}
    assert summary["pools"]["a"]["requests"] == 200 and summary["pools"]["b"]["requests"] == 100
    assert summary["pools"]["b"]["drafter"] == "c20" and summary["pools"]["b"]["k"] == 3
    assert sorted(set(rec["replica"].tolist())) == [0, 1, 2]
    assert set(rec["pool"].tolist()) == {"a", "b"}
    assert summary["scenario"]["replicas"] == 3


@pytest.mark.parametrize("router", list(ROUTERS))
def test_routers_use_every_replica(tmp_path, router):
    summary, rec = run(make(fleet__replicas=3, fleet__router=router), tmp_path)
    counts = np.bincount(rec["replica"], minlength=3)
    assert summary["requests"] == 300 and np.all(counts > 60)


def test_heads_cost_a_fixed_draft_step(tmp_path):
    """Heads draft all k tokens for draft_step_s (2 ms) per step: at batch 1 a token costs
    (10 ms + 2 ms) / E[tokens per step], with E = 1 + 0.6 + 0.6 x 0.4 = 1.84 (~2,000 steps)."""
    scenario = make(
        speculation__drafter="heads",
        speculation__k=2,
        speculation__heterogeneity=False,
        workload={
            "kind": "closed_loop",
            "concurrency": 1,
            "requests": 5,
            "prompt": {"dist": "fixed", "value": 16},
            "output": {"dist": "fixed", "value": 800},
        },
    )
    summary, rec = run(scenario, tmp_path)
    # ~2,170 steps, tokens per step sd ~0.8: 4 standard errors = 3.7 % of TPOT.
    assert summary["tpot_s"]["mean"] == pytest.approx(0.012 / 1.84, rel=0.04)
    # Charging heads like a draft model (k passes of 2 ms) would be 17 % slower: caught.
    assert summary["tpot_s"]["mean"] != pytest.approx(0.014 / 1.84, rel=0.04)
    # Heads FLOPs: k = 2 draft tokens per step at 1e8 FLOPs each (one row per step here).
    assert summary["flops_drafter"] == pytest.approx(2e8 * rec["steps"].sum(), rel=1e-5)


# One 100-token prompt and 20 output tokens drafted by a draft model at acceptance 1 (k = 3):
# deterministic, so every pass can be replayed by hand (here and in the split-fleet tests).
LONE_REQUEST = {
    "profile": "sim_profile_compute.yaml",
    "workload": {
        "kind": "closed_loop",
        "concurrency": 1,
        "requests": 1,
        "prompt": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 20},
    },
    "speculation": {"drafter": "small", "k": 3, "acceptance": "iid", "acceptance_rate": 1.0},
}


def test_step_times_and_flops_match_the_profile_pass_by_pass(tmp_path):
    """Acceptance rate 1 makes a lone request deterministic; replaying it by hand with the
    profile's own LatencyModel.pass_seconds gives the same first-token and finish times and the
    same verification FLOPs (prompt 100, output 20, k = 3: windows of 3, 3, 3, 3 and 2 drafts)."""
    profile = load_profile(DATA / "sim_profile_compute.yaml")
    target, draft = profile.latency_model("target"), profile.latency_model("small")
    overhead = profile.profile.overhead.per_step_s
    scenario = Scenario.model_validate(LONE_REQUEST).with_source(DATA / "scenario.yaml")
    summary, rec = run(scenario, tmp_path)
    # Prefill: both models read the 100-token prompt; the pass samples the first token.
    clock = target.pass_seconds([0], [100]) + draft.pass_seconds([0], [100]) + overhead
    assert rec["first_token_s"][0] == pytest.approx(clock, abs=1e-6)  # CSV keeps microseconds
    context, remaining, flops = 100, 19, 0.0
    while remaining:
        drafts = min(3, remaining - 1)
        new = drafts + 1
        clock += target.pass_seconds([context], [new]) + overhead
        clock += sum(draft.pass_seconds([context + j], [1]) for j in range(3))
        flops += 16e9 * new + 524288 * new * (context + (new + 1) / 2)
        context += new
        remaining -= new
    assert rec["finish_s"][0] == pytest.approx(clock, abs=1e-6)
    assert summary["flops_verification"] == pytest.approx(flops, rel=1e-5)
    assert rec["steps"][0] == 5 and rec["accepted"][0] == 14 and rec["drafted"][0] == 14


LENGTHS = {
    "prompt": {"dist": "uniform", "low": 20, "high": 200},
    "output": {"dist": "uniform", "low": 5, "high": 60},
}


@pytest.mark.parametrize(
    "workload",
    [
        {"kind": "fixed_rate", "rate": 4.0, "requests": 50, **LENGTHS},
        {"kind": "bursty", "rate": 4.0, "cv": 3.0, "duration_s": 20.0, **LENGTHS},
        {"kind": "closed_loop", "concurrency": 3, "requests": 40, "think_time_s": 0.5, **LENGTHS},
        {"kind": "trace", "trace": "vidur_small.csv", "time_scale": 2.0},
    ],
    ids=["fixed_rate", "bursty", "closed_loop_think", "trace"],
)
def test_every_workload_kind_runs_end_to_end(tmp_path, workload):
    summary, rec = run(make(workload=workload), tmp_path)
    arrivals = np.sort(rec["arrival_s"])
    kind = workload["kind"]
    if kind == "fixed_rate":
        assert summary["requests"] == 50
        np.testing.assert_allclose(np.diff(arrivals), 0.25, atol=2e-6)
    elif kind == "bursty":
        assert np.all(arrivals < 20.0) and summary["requests"] > 20
    elif kind == "closed_loop":
        assert summary["requests"] == 40
        # A client's next request arrives after its previous one finished (plus think time).
        order = np.argsort(rec["arrival_s"], kind="stable")
        in_flight = np.searchsorted(np.sort(rec["finish_s"]), rec["arrival_s"][order])
        assert np.all(np.arange(40) - in_flight < 3)  # never more than 3 outstanding
    else:
        assert arrivals.tolist() == [0.0, 1.0, 3.0]  # 0, 0.5, 1.5 s scaled by 2
        assert rec["prompt_tokens"][np.argsort(rec["arrival_s"])].tolist() == [100, 200, 50]


def padded_run(tmp_path, prompts: tuple[int, int], padded: bool):
    """Two requests arriving together, 5 tokens each, k = 0, whole-prompt prefill, on the
    compute fixture with attention costs scaled up (1e-5 s per cached token read, 1e-6 s per
    query-key pair) so that the padding shows."""
    import yaml

    profile = yaml.safe_load((DATA / "sim_profile_compute.yaml").read_text())
    profile["target"]["latency"]["fit"].update(per_kv_token_s=1e-5, per_attention_pair_s=1e-6)
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    rows = "".join(f"0.0,{p},5\n" for p in prompts)
    (tmp_path / "trace.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    data = {
        "profile": "profile.yaml",
        "workload": {"kind": "trace", "trace": "trace.csv"},
        "engine": {"chunked_prefill": False, "padded_attention": padded},
        "speculation": {"drafter": None, "k": 0},
    }
    scenario = Scenario.model_validate(data).with_source(tmp_path / "scenario.yaml")
    return run(scenario, tmp_path, f"{prompts[1]}-{padded}")[1]


def test_padded_attention_charges_every_row_the_longest_rows_context(tmp_path):
    # Prompts of 100 and 40 tokens. The prefill pays 2 x 100 x 101 / 2 query-key pairs
    # instead of 5050 + 820 (4230 more; both prompts stay below the fixture's 256-token knee,
    # so the padded tokens cost nothing by themselves). Each of the 4 decode steps reads
    # 2 x the longer row's context instead of the two contexts (60 tokens more) and pairs its
    # two new tokens with as many (60 more). 4230e-6 + 4 x 60 x (1e-5 + 1e-6) s in all.
    paged = padded_run(tmp_path, (100, 40), padded=False)
    padded = padded_run(tmp_path, (100, 40), padded=True)
    extra = padded["finish_s"] - paged["finish_s"]
    assert extra == pytest.approx([4230e-6 + 4 * 60 * 1.1e-5] * 2, abs=2e-6)
    # Rows of one length pad nothing.
    same = padded_run(tmp_path, (100, 100), padded=False)
    assert list(padded_run(tmp_path, (100, 100), padded=True)["finish_s"]) == list(same["finish_s"])
