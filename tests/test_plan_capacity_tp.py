"""``plan capacity`` over deployments (TP x precision): memory fit per TP, price, the cheapest
fleet and the Pareto frontier, pinned against hand-worked numbers."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_plan_support import write_scenario

from specsim.cli import build_parser, main
from specsim.errors import SpecsimError
from specsim.planning.capacity import capacity
from specsim.planning.capacity.capacity_deploy import (
    Deployment,
    Precision,
    RooflineRecipe,
    deployment_request,
    parse_precision,
    parse_tp_values,
    roofline_deployments,
)
from specsim.planning.capacity.capacity_pareto import frontier_flags

H100 = "profiles/hardware/h100-sxm.yaml"
LLAMA_70B = "profiles/models/llama3.1-70b.json"
LLAMA_8B = "profiles/models/llama3.1-8b.json"
DRAFT = "llama3.2-1b=profiles/models/llama3.2-1b.json"
ACCEPTANCE = "profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml"
BF16, FP8 = Precision("bfloat16", "bfloat16"), Precision("fp8", "fp8")


def test_frontier_of_a_tiny_table():
    """(5, 5) beats (4, 4) on both; (10, 1) beats (10, 0.5) on one and ties the other; equal
    points are both kept; (1, 10) is the fastest per user, so it stays."""
    points = [(10, 1), (5, 5), (1, 10), (4, 4), (5, 5), (10, 0.5)]
    assert frontier_flags(points) == [True, True, True, False, True, False]
    assert frontier_flags([]) == []


@pytest.mark.parametrize(
    ("text", "weights", "kv", "label"),
    [
        ("bf16", "bfloat16", "bfloat16", "bf16"),
        ("fp8", "fp8", "fp8", "fp8"),
        ("int4", "int4", "bfloat16", "int4"),
        ("int4/fp8", "int4", "fp8", "int4/fp8"),
        ("fp8/bf16", "fp8", "bfloat16", "fp8/bf16"),
        ("nvfp4", "nvfp4", "bfloat16", "nvfp4"),
        ("mxfp4/fp8", "mxfp4", "fp8", "mxfp4/fp8"),
    ],
)
def test_precision_text(text, weights, kv, label):
    p = parse_precision(text)
    assert (p.weights, p.kv_cache, p.label) == (weights, kv, label)


@pytest.mark.parametrize("text", ["", "bf16/", "fp8/int4", "fp9", "/fp8"])
def test_bad_precision_is_refused(text):
    with pytest.raises(SpecsimError, match="--precision"):
        parse_precision(text)


def test_tp_values_and_what_needs_a_roofline():
    assert parse_tp_values("8,2,4,2") == (2, 4, 8)
    for bad in ("", "0", "65", "2,,4", "x"):
        with pytest.raises(SpecsimError, match="--tp"):
            parse_tp_values(bad)
    with pytest.raises(SpecsimError, match="need --hardware"):
        deployment_request(None, "4,8", None, None, None, None, None, None)
    with pytest.raises(SpecsimError, match="--target-model"):
        deployment_request(None, None, None, H100, None, None, None, None)
    assert deployment_request(None, None, None, None, None, None, None, None) is None


@pytest.fixture(scope="module")
def built_70b(tmp_path_factory, repo):
    recipe = RooflineRecipe(
        str(repo / H100), str(repo / LLAMA_70B), [DRAFT.replace("=", f"={repo}/")]
    )
    out = tmp_path_factory.mktemp("deployments")
    deployments = roofline_deployments(recipe, [1, 2, 3, 4, 8], [BF16, FP8], out)
    return {d.label: d for d in deployments}


def test_memory_fit_per_tp_of_a_70b_on_h100(built_70b):
    """Llama 3.1 70B: 70,553,706,496 parameters, 141.1 GB in bf16; the 1B drafter 2.47 GB.
    An H100's usable 76.55 GB (0.9 x the 85.06e9 bytes it reports) does not hold the bf16
    weights whole (TP1: 143.6 GB) but holds them in fp8 (68.45 B matrix parameters at 1 byte +
    2.10 B embedding and head at 2 bytes, plus the drafter's 1.50 GB = 74.2 GB; the engine's
    reservation is the KV cache's check, not this one); 64 heads do not split over 3 devices;
    TP2, 4, 8 fit."""
    fits = {label: d.fits for label, d in built_70b.items()}
    assert fits == {
        "TP1 bf16": False,
        "TP1 fp8": True,
        "TP2 bf16": True,
        "TP2 fp8": True,
        "TP3 bf16": False,
        "TP3 fp8": False,
        "TP4 bf16": True,
        "TP4 fp8": True,
        "TP8 bf16": True,
        "TP8 fp8": True,
    }
    assert "143.6 GB per device" in built_70b["TP1 bf16"].reason
    assert "cannot be split over 3 devices" in built_70b["TP3 bf16"].reason
    # Shards: the weights over the devices; 8 KV heads x 128 x K and V x 80 layers x 2 bytes
    # = 327,680 bytes a token, a quarter (two heads) per device at TP4, one head at TP8.
    tp4 = built_70b["TP4 bf16"].profile.profile.target.sharding
    assert tp4.weight_bytes_per_device == 141_107_412_992 // 4
    assert tp4.kv_bytes_per_token_per_device == 327_680 // 4
    tp8 = built_70b["TP8 fp8"].profile.profile.target.sharding
    assert tp8.kv_bytes_per_token_per_device == 327_680 // 8 // 2  # fp8: one byte


def test_price_is_tp_devices_at_the_device_price(built_70b):
    for label, tp in (("TP2 bf16", 2), ("TP4 fp8", 4), ("TP8 bf16", 8)):
        d = built_70b[label]
        assert d.profile.profile.hardware.price_per_hour_usd == pytest.approx(3.0 * tp)
        assert d.device_price == pytest.approx(3.0)


def test_kv_cache_left_at_tp2_is_a_hand_worked_6951_tokens(built_70b):
    """TP2 bf16 holds 70,553,706,496 weight bytes per device and the engine 4,861,366,108
    (19.5 x 8,192 x 8,192 x 2 B of activations, 0.3 + 1.79 GiB outside torch), leaving
    76.554e9 - 75,415,072,604 = 1,138,927,396 bytes for 163,840 KV bytes a token; the 1B
    drafter's 1,235,814,400 bytes a device leave no cache at all."""
    from specsim.costs import kv_capacity_tokens
    from specsim.errors import SpecsimError
    from specsim.scenario import Engine

    profile = built_70b["TP2 bf16"].profile
    engine = Engine(tensor_parallel_size=2)
    assert kv_capacity_tokens(profile, None, False, engine) == 6951
    with pytest.raises(SpecsimError, match="leave no room for a KV cache"):
        kv_capacity_tokens(profile, "llama3.2-1b", True, engine)


def _result(label, tp, replicas, capacity_rps, drafter=None, k=0, policy="fixed"):
    deployment = Deployment(f"TP{tp} bf16", tp, "bf16", "roofline")
    candidate = capacity.Candidate(label, drafter, k, policy, deployment=deployment)
    price = 3.0 * tp
    return SimpleNamespace(
        candidate=candidate,
        replicas=replicas,
        capacity=capacity_rps,
        cost_per_hour=replicas * price,
    )


def test_the_cheapest_fleet_wins_over_the_fewest_replicas():
    """3 x TP4 = 12 devices ($36/hour) against 2 x TP8 = 16 devices ($48/hour): the cheaper
    fleet has more replicas."""
    tp4 = _result("TP4 bf16, speculation off", 4, 3, 4.0)
    tp8 = _result("TP8 bf16, speculation off", 8, 2, 7.0)
    assert capacity.choose_candidate([tp8, tp4]) is tp4
    # At one price, the higher capacity per device breaks the tie.
    same = _result("TP8 bf16, other", 8, 2, 7.5)
    assert capacity.choose_candidate([tp8, same]) is same


def test_a_tie_in_cost_goes_to_speculation_off_and_says_why():
    """3 replicas either way ($36/hour): the drafter's higher capacity per replica buys no
    replica, so speculation off wins whichever comes first, and the tie is named."""
    off = _result("TP4 bf16, speculation off", 4, 3, 8.23)
    k4 = _result("TP4 bf16, 1b k=4", 4, 3, 8.74, drafter="1b", k=4)
    adaptive = _result("TP4 bf16, 1b adaptive", 4, 3, 8.89, drafter="1b", k=4, policy="adaptive")
    for order in ([adaptive, k4, off], [off, k4, adaptive], [k4, off, adaptive]):
        assert capacity.choose_candidate(order) is off
    tie = capacity.cost_ties([adaptive, k4, off], off)
    assert tie["candidates"] == ["TP4 bf16, 1b adaptive", "TP4 bf16, 1b k=4"]
    assert tie["reason"].startswith(
        "TP4 bf16, 1b adaptive ties with speculation off on replicas and cost (3 replicas, "
        "$36.00/hour): speculation would add headroom (8.89 against 8.23 req/s per replica)"
    )
    # Across deployments: 6 x TP2 with the drafter costs what 3 x TP4 without it does.
    tp2 = _result("TP2 bf16, 1b k=4", 2, 6, 3.99, drafter="1b", k=4)
    assert capacity.choose_candidate([tp2, off]) is off
    tie = capacity.cost_ties([tp2, off], off)
    assert tie["candidates"] == ["TP2 bf16, 1b k=4"]
    assert "on cost ($36.00/hour; 6 replicas against 3)" in tie["reason"]


def test_a_tie_where_speculation_has_less_headroom_does_not_claim_it_adds_some():
    """README tour 8's case: 4 replicas either way, speculation's capacity per replica below
    speculation off's (10.75 against 11.62): nothing to add, the simpler setting wins."""
    off = _result("speculation off", 1, 4, 11.62)
    k2 = _result("llama3.2-1b k=2", 1, 4, 10.75, drafter="llama3.2-1b", k=2)
    reason = capacity.cost_ties([off, k2], off)["reason"]
    assert reason == (
        "llama3.2-1b k=2 ties with speculation off on replicas and cost (4 replicas, "
        "$12.00/hour): speculation adds no headroom either (10.75 against 11.62 req/s per "
        "replica), and the simpler setting wins: no drafter to deploy and keep in step with "
        "the target"
    )


def test_the_console_names_the_tie_and_why():
    from specsim.planning.capacity import capacity_report

    off = _result("TP4 bf16, speculation off", 4, 3, 8.23)
    k4 = _result("TP4 bf16, 1b k=4", 4, 3, 8.74, drafter="1b", k=4)
    plan = SimpleNamespace(scenario=SimpleNamespace(name="chat"), target_rps=20, candidates=[1, 2])
    rec = {"candidate": off.candidate.label, "replicas": 3, "planned_replicas": 3}
    rec |= {"cost_usd_per_hour": 36.0, "fleet_meets_slo": True, "devices": 12}
    rec |= {"tensor_parallel_size": 4, "tie_on_cost": capacity.cost_ties([off, k4], off)}
    summary = {"simulations": {"computed": 9, "cached": 0}, "candidates": []}
    summary["fleet_checked_too"] = []
    summary["recommendation"] = rec | {"regressions_vs_speculation_off": None}
    text = capacity_report.human(plan, summary)
    assert "recommendation: 3 replicas with TP4 bf16, speculation off ($36.00/h)" in text
    assert "tie on cost: TP4 bf16, 1b k=4 ties with speculation off on replicas and cost" in text
    assert "no drafter to deploy" in text


def test_the_comparison_with_speculation_off_says_when_that_fleet_misses_the_slo():
    from specsim.planning.capacity import capacity_report

    off = {"replicas": 3, "meets_slo": False}
    rec = {"speculation_off_fleet": off, "compared_vs_speculation_off": ["ttft_s.p90"]}
    rec["regressions_vs_speculation_off"] = []
    words = capacity_report._against_off_words({"recommendation": rec})
    assert words == (
        "against speculation off on its 3 replicas at the target rate (a fleet that misses the "
        "SLO), none of the 1 compared metrics is worse"
    )
    off["meets_slo"] = True
    assert "misses" not in capacity_report._against_off_words({"recommendation": rec})


def test_speculation_that_saves_wins_and_no_tie_is_reported():
    off = _result("TP4 bf16, speculation off", 4, 4, 5.9)
    k4 = _result("TP4 bf16, 1b k=4", 4, 3, 7.1, drafter="1b", k=4)
    assert capacity.choose_candidate([off, k4]) is k4
    assert capacity.cost_ties([off, k4], k4) is None
    # Between speculative settings at one cost: the headroom, then a fixed k before adaptive.
    k2 = _result("TP4 bf16, 1b k=2", 4, 3, 7.4, drafter="1b", k=2)
    assert capacity.choose_candidate([k4, k2]) is k2
    adaptive = _result("TP4 bf16, 1b adaptive", 4, 3, 7.4, drafter="1b", k=4, policy="adaptive")
    assert capacity.choose_candidate([adaptive, k2]) is k2


@pytest.fixture(scope="module")
def tp_plan(tmp_path_factory, repo):
    """8B on H100 at TP1 and TP2 in bf16, speculation off and k = 2: 4 candidates."""
    folder = tmp_path_factory.mktemp("tp-plan")
    scenario = write_scenario(folder, repo, requests=200, slo={"ttft_s": 0.5, "tpot_s": 0.02})
    out = folder / "out"
    argv = ["plan", "capacity", str(scenario), "--target-rps", "30", "--k", "2"]
    argv += ["--tolerance", "0.1", "--workers", "2", "--no-progress", "--out", str(out)]
    argv += ["--hardware", str(repo / H100), "--target-model", str(repo / LLAMA_8B)]
    argv += ["--draft-model", DRAFT.replace("=", f"={repo}/"), "--draft-model", "ngram"]
    argv += ["--tp", "1,2"]
    argv += ["--acceptance-from", str(repo / ACCEPTANCE), "--emit", "vllm"]
    code = main(argv)
    return SimpleNamespace(
        code=code, out=out, summary=json.loads((out / "summary.json").read_text())
    )


@pytest.mark.slow
def test_a_tp_plan_prices_devices_and_names_its_deployment(tp_plan):
    assert tp_plan.code == 0
    s = tp_plan.summary
    assert [d["deployment"] for d in s["deployments"]] == ["TP1 bf16", "TP2 bf16"]
    assert all(d["fits"] for d in s["deployments"])
    for item in s["candidates"]:
        tp = item["tensor_parallel_size"]
        if item["replicas"] is not None:
            assert item["devices"] == item["replicas"] * tp
            assert item["cost_usd_per_hour"] == pytest.approx(item["replicas"] * tp * 3.0)
    rec = s["recommendation"]
    assert rec["fleet_meets_slo"]
    assert rec["devices"] == rec["replicas"] * rec["tensor_parallel_size"]
    assert rec["cost_usd_per_hour"] == pytest.approx(rec["devices"] * 3.0)
    cheapest = min(
        (c for c in s["candidates"] if c["cost_usd_per_hour"] is not None),
        key=lambda c: c["cost_usd_per_hour"],
    )
    assert rec["planned_replicas"] * rec["tensor_parallel_size"] * 3.0 == pytest.approx(
        cheapest["cost_usd_per_hour"]
    )
    # Each deployment's row names the candidate the plan's own ranking picks there.
    row = next(d for d in s["deployments"] if d["deployment"] == rec["deployment"])
    assert f"{rec['deployment']}, {row['best_candidate']}" == rec["candidate"]
    # The built profiles the runs loaded are in the output folder.
    for d in s["deployments"]:
        assert Path(d["profile"]).parent == tp_plan.out / "deployments"


@pytest.mark.slow
def test_the_pareto_csv_marks_the_undominated_probes(tp_plan):
    with open(tp_plan.out / "pareto.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {r["deployment"] for r in rows} <= {"TP1 bf16", "TP2 bf16"}
    points = [(float(r["tokens/s per user"]), float(r["tokens/s per device"])) for r in rows]
    assert [r["on frontier"] == "yes" for r in rows] == frontier_flags(points)
    assert any(r["on frontier"] == "yes" for r in rows)
    assert (tp_plan.out / "pareto_frontier.png").stat().st_size > 0
    report = (tp_plan.out / "report.md").read_text()
    assert "## Deployments" in report and "By capacity the cheapest fleet is" in report


@pytest.mark.slow
def test_emit_writes_the_chosen_deployments_tp(tp_plan):
    rec = tp_plan.summary["recommendation"]
    words = shlex.split((tp_plan.out / "engine" / "vllm.args").read_text(), comments=True)
    at = words.index("--tensor-parallel-size")
    assert words[at + 1] == str(rec["tensor_parallel_size"])


def test_a_fleet_check_that_needs_more_replicas_checks_the_next_deployment(monkeypatch):
    """TP2 plans 5 replicas ($30/hour at $3 a device) but its fleet check needs 7 ($42);
    TP4's plan of 3 ($36) is below that, so it is checked too, confirmed at 3 and chosen."""
    tp2 = _result("TP2 bf16, speculation off", 2, 5, 4.0)
    tp4 = _result("TP4 bf16, speculation off", 4, 3, 7.0)
    tp8 = _result("TP8 bf16, speculation off", 8, 2, 11.0)  # $48: never checked
    needs = {tp2.candidate.label: 7, tp4.candidate.label: 3, tp8.candidate.label: 2}
    checked = []

    def confirm(plan, entry, sweeper):
        checked.append(entry.candidate.label)
        met = SimpleNamespace(ok=True, summary={"slo_attainment": 1.0})
        return [(needs[entry.candidate.label], met)]

    monkeypatch.setattr(capacity, "confirm", confirm)
    plan = SimpleNamespace(
        deployments=[tp2.candidate.deployment, tp4.candidate.deployment], attainment=0.99
    )
    monkeypatch.setattr(
        capacity, "replica_price", lambda plan, candidate: 3.0 * candidate.deployment.tp
    )
    chosen, fleet, others = capacity.cheapest_confirmed(plan, [tp2, tp4, tp8], None)
    assert checked == [tp2.candidate.label, tp4.candidate.label]
    assert chosen is tp4 and fleet[-1][0] == 3
    assert [entry for entry, _ in others] == [tp2]


def test_a_tie_whose_simpler_fleet_needs_more_replicas_checks_the_tied_setting(monkeypatch):
    """Speculation off and k = 4 both plan 3 replicas ($36/hour); off wins the tie, but its
    fleet check needs 4 ($48): k = 4 is checked too, holds at 3 and is chosen (on one
    deployment, as a plan without deployment options has)."""
    off = _result("speculation off", 4, 3, 8.23)
    k4 = _result("1b k=4", 4, 3, 8.74, drafter="1b", k=4)
    k2 = _result("1b k=2", 4, 4, 6.0, drafter="1b", k=2)  # $48: never checked
    needs = {"speculation off": 4, "1b k=4": 3, "1b k=2": 4}
    checked = []

    def confirm(plan, entry, sweeper):
        checked.append(entry.candidate.label)
        met = SimpleNamespace(ok=True, summary={"slo_attainment": 1.0})
        return [(needs[entry.candidate.label], met)]

    monkeypatch.setattr(capacity, "confirm", confirm)
    monkeypatch.setattr(capacity, "replica_price", lambda plan, candidate: 12.0)
    plan = SimpleNamespace(deployments=[], attainment=0.99)
    chosen, fleet, others = capacity.cheapest_confirmed(plan, [k2, k4, off], None)
    assert checked == ["speculation off", "1b k=4"]
    assert chosen is k4 and fleet[-1][0] == 3
    assert [entry for entry, _ in others] == [off]
    from specsim.planning.capacity.capacity_pareto import checked_too_words

    item = {"candidate": "speculation off", "planned_replicas": 3, "replicas": 4}
    item |= {"cost_usd_per_hour": 48.0, "meets_slo": True}
    assert checked_too_words(item) == (
        "A fleet check needed more replicas than planned, so speculation off (planned 3) was "
        "checked as well: its fleet met the SLO with 4 replicas, $48.00/hour."
    )


def test_given_profiles_are_deployments_with_their_tp_precision_and_device_price(repo):
    from specsim.planning.capacity.capacity_deploy import given_deployments

    names = ["4xh100-tp4", "8xh100-tp8", "h200-fp8"]
    paths = [str(repo / f"profiles/llama3.1-70b_llama3.2-1b_{n}-roofline.yaml") for n in names]
    deployments = given_deployments(paths)
    assert [d.label for d in deployments] == ["TP4 bf16", "TP8 bf16", "TP1 fp8"]
    assert [d.devices for d in deployments] == [4, 8, 1]
    assert [d.device_price for d in deployments] == pytest.approx([3.0, 3.0, 3.8])
    assert deployments[1].overrides()[1] == "engine.tensor_parallel_size=8"
    twice = given_deployments([paths[0], paths[0]])
    assert [d.label for d in twice] == ["TP4 bf16 #1", "TP4 bf16 #2"]


def test_expert_parallel_deployments_of_mixtral(tmp_path, repo):
    """Mixtral's 8 experts over TP 2, 4, 8 with expert parallelism; TP1 is built without it
    (one device deals nothing out) and fits neither way on an H100 (93.4 GB of bf16)."""
    recipe = RooflineRecipe(
        str(repo / H100), str(repo / "profiles/models/mixtral-8x7b.json"), [], None, None, True
    )
    built = {d.label: d for d in roofline_deployments(recipe, [1, 2, 8], [BF16], tmp_path)}
    assert list(built) == ["TP1 bf16", "TP2 bf16 EP", "TP8 bf16 EP"]
    assert not built["TP1 bf16"].fits and "93.4 GB per device" in built["TP1 bf16"].reason
    tp8 = built["TP8 bf16 EP"].profile.profile
    assert "Expert parallelism over 8 devices" in tp8.provenance.notes
    assert "--enable-expert-parallel" in tp8.provenance.command
    args = build_parser().parse_args(shlex.split(tp8.provenance.command)[1:])  # a real command
    assert (args.mode, args.tp, args.expert_parallel) == ("roofline", 8, True)
    assert tp8.target.sharding.weight_bytes_per_device == 93_405_585_408 // 8
    # The split is recorded where TP is, so --emit can ask the engine for it.
    from specsim.serving.setting import deployment

    assert tp8.target.sharding.expert_parallel_size == 8
    assert deployment(tp8, None) == {"tensor_parallel_size": 8, "expert_parallel": True}
    plain = RooflineRecipe(str(repo / H100), str(repo / "profiles/models/mixtral-8x7b.json"), [])
    (tp8_sharded,) = roofline_deployments(plain, [8], [BF16], tmp_path / "plain")
    assert tp8_sharded.profile.profile.target.sharding.expert_parallel_size is None
    assert deployment(tp8_sharded.profile.profile, None) == {"tensor_parallel_size": 8}
