"""``plan capacity --disaggregated`` over deployments
(``specsim.planning.capacity.capacity_split``): each pool's TP and precision, priced as replicas x
TP x the device's price per pool, the layouts in price order across deployments, why each
deployment won or lost, and ``--tolerance`` on the choices' capacity bisection."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_plan_support import write_scenario

from specsim.cli import main
from specsim.planning.capacity.capacity_split import deployment_overrides, pairs
from specsim.planning.capacity.disagg import (
    COLOCATED,
    DISAGGREGATED,
    SPEC_ON,
    Layout,
    Pricing,
    layouts_by_price,
)

H100 = "profiles/hardware/h100-sxm.yaml"
LLAMA_8B = "profiles/models/llama3.1-8b.json"
DRAFT = "llama3.2-1b=profiles/models/llama3.2-1b.json"
ACCEPTANCE = "profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml"
# At $3 a device: a TP2 replica costs $6/h, a TP4 one $12/h.
PRICES = Pricing((0.0, 1), (0.0, 1), (0.0, 1), {"TP2 fp8": (6.0, 2), "TP4 fp8": (12.0, 4)})


def test_a_split_layout_costs_each_pools_replicas_times_tp_times_the_device_price():
    """2 prefill replicas of TP2 and 3 decode replicas of TP4: 2 x 2 x $3 + 3 x 4 x $3 = $48/h
    on 2 x 2 + 3 x 4 = 16 devices; 3 co-located TP4 replicas: 3 x 4 x $3 = $36/h, 12 devices."""
    split = Layout(SPEC_ON, 2, 3, "TP2 fp8", "TP4 fp8")
    assert split.price(PRICES) == 48.0 and split.devices(PRICES) == 16
    assert split.label == "2P3D (TP2 fp8 + TP4 fp8)" and split.placement == "TP2 fp8 + TP4 fp8"
    colocated = Layout(SPEC_ON, 0, 3, None, "TP4 fp8")
    assert colocated.price(PRICES) == 36.0 and colocated.devices(PRICES) == 12
    assert colocated.label == "3 co-located (TP4 fp8)"


def test_layouts_over_deployments_come_cheapest_first():
    """Within 3 replicas: 1P1D on TP2 + TP2 ($12), 2P1D TP2 + TP2 and 1P2D TP2 + TP2 ($18),
    1P1D TP2 + TP4 and TP4 + TP2 ($18), then $24 (1P1D TP4 + TP4; 2P1D TP2 + TP4; 1P2D TP4 +
    TP2). At one price, fewer replicas first, then fewer prefill replicas, then the pairs'
    order."""
    placements = [(p, d) for p in ("TP2 fp8", "TP4 fp8") for d in ("TP2 fp8", "TP4 fp8")]
    found = layouts_by_price(SPEC_ON, DISAGGREGATED, 3, PRICES, placements)
    head = [(lay.label, lay.price(PRICES)) for lay in found[:8]]
    assert head == [
        ("1P1D (TP2 fp8 + TP2 fp8)", 12.0),
        ("1P1D (TP2 fp8 + TP4 fp8)", 18.0),
        ("1P1D (TP4 fp8 + TP2 fp8)", 18.0),
        ("1P2D (TP2 fp8 + TP2 fp8)", 18.0),
        ("2P1D (TP2 fp8 + TP2 fp8)", 18.0),
        ("1P1D (TP4 fp8 + TP4 fp8)", 24.0),
        ("1P2D (TP4 fp8 + TP2 fp8)", 24.0),
        ("2P1D (TP2 fp8 + TP4 fp8)", 24.0),
    ]
    assert len(found) == 4 * 3  # (1,1), (1,2), (2,1) on each of the four pairs
    colocated = layouts_by_price(SPEC_ON, COLOCATED, 2, PRICES, [(None, "TP4 fp8")])
    assert [lay.price(PRICES) for lay in colocated] == [12.0, 24.0]


def test_pairs_share_a_precision_and_may_differ_in_tp():
    by_label = {
        "TP2 bf16": SimpleNamespace(precision="bf16"),
        "TP4 bf16": SimpleNamespace(precision="bf16"),
        "TP4 fp8": SimpleNamespace(precision="fp8"),
    }
    labels = list(by_label)
    assert pairs(labels, labels, by_label) == [
        ("TP2 bf16", "TP2 bf16"),
        ("TP2 bf16", "TP4 bf16"),
        ("TP4 bf16", "TP2 bf16"),
        ("TP4 bf16", "TP4 bf16"),
        ("TP4 fp8", "TP4 fp8"),
    ]


def test_each_pool_gets_its_deployments_profile_and_tp(tmp_path):
    from specsim.planning.capacity.capacity_deploy import Deployment

    def built(label, tp):
        profile = SimpleNamespace(path=tmp_path / f"{label}.yaml")
        return Deployment(label, tp, "bf16", "roofline", profile)

    prefill, decode = built("p", 2), built("d", 4)
    assert deployment_overrides(prefill, decode) == [
        f"profile={tmp_path / 'd.yaml'}",
        "engine.tensor_parallel_size=4",
        f"fleet.disaggregation.prefill.profile={tmp_path / 'p.yaml'}",
        "fleet.disaggregation.prefill.tensor_parallel_size=2",
        f"fleet.disaggregation.decode.profile={tmp_path / 'd.yaml'}",
        "fleet.disaggregation.decode.tensor_parallel_size=4",
    ]
    assert deployment_overrides(None, decode) == decode.overrides()
    assert deployment_overrides(None, None) == []


@pytest.mark.parametrize("capacity, roles", [(1_500, ["prefill"]), (2_100, ["all"])])
def test_a_deployment_holding_the_longest_prompt_but_not_its_output_serves_prefill_only(
    tmp_path, repo, capacity, roles
):
    """Prompts of 1,000 and outputs of 1,000 tokens: a 1,500-token cache holds a prompt and its
    one verified slot (a prefill replica's need), not the 2,000 tokens plus lookahead a decode
    or co-located row needs; at 2,100 tokens it serves every role."""
    from test_plan_support import PROFILE

    from specsim.planning.capacity.capacity_deploy import Deployment
    from specsim.planning.capacity.capacity_split import role_fits
    from specsim.profile import load_profile
    from specsim.scenario import load_scenario

    scenario_path = write_scenario(tmp_path, repo, requests=20)
    overrides = [
        "workload.prompt.dist=fixed",
        "workload.prompt.value=1000",
        "workload.output.dist=fixed",
        "workload.output.value=1000",
        f"engine.kv_capacity_tokens={capacity}",
    ]
    scenario = load_scenario(scenario_path, overrides)
    deployment = Deployment("TP1 bf16", 1, "bf16", "given", load_profile(repo / PROFILE))
    fit = role_fits(
        [deployment], scenario, str(scenario_path), overrides, {SPEC_ON: True, "off": False}
    )
    served = {role for (role, setting), labels in fit.serving.items() if labels}
    if roles == ["prefill"]:
        assert served == {"prefill"}
        assert [what for what, _ in fit.unfit] == ["TP1 bf16, " + SPEC_ON, "TP1 bf16, off"]
        assert "serves the prefill pool only" in fit.unfit[1][1]
    else:
        assert served == {"prefill", "co-located", "decode"} and fit.unfit == []


def test_a_headroom_search_counts_only_the_simulations_above_the_target():
    from specsim.planning.capacity.capacity_split import Headroom

    identity = SimpleNamespace(rate=lambda knob: knob)
    headroom = Headroom.above(4.0, 0.1)
    assert headroom.figures(identity, 4.0)["probes"] == 0  # the target's run is the choice's
    headroom.search.record(headroom.search.next_probes()[0], True)
    figures = headroom.figures(identity, 4.0)
    assert figures["probes"] == 1 and figures["capacity_rps"] > 4.0


def _run(ttft_p99: float, tpot_p99: float):
    from specsim.planning.sweep.sweeper import PointResult

    summary = {
        "slo_attainment": 0.5,
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
        "ttft_s": {"p99": ttft_p99},
        "tpot_s": {"p99": tpot_p99},
    }
    return PointResult(None, "key", True, summary)


@pytest.mark.parametrize(
    "ttft, tpot, why",
    [
        (3.0, 0.01, "the prefill pool is the bottleneck at 1P1D (TP2 fp8 + TP4 fp8) (TTFT p99 3 s "
         "over 1 s)"),
        (0.5, 0.08, "the decode pool is the bottleneck at 1P1D (TP2 fp8 + TP4 fp8) (TPOT p99 "
         "0.08 s over 0.05 s)"),
        (3.0, 0.08, "at 1P1D (TP2 fp8 + TP4 fp8): TTFT p99 3 s over 1 s, TPOT p99 0.08 s over "
         "0.05 s"),
    ],
)  # fmt: skip
def test_a_placement_that_misses_the_slo_names_the_limit_and_its_pool(ttft, tpot, why):
    """A missed TTFT points at the prefill pool, a missed TPOT at the decode pool (both: the
    limits alone); a dearer placement never simulated is 'not reached'."""
    from specsim.planning.capacity.capacity_split_report import candidate_rows
    from specsim.planning.capacity.disagg import DisaggregatedPlan, Search

    missed = Layout(SPEC_ON, 1, 1, "TP2 fp8", "TP4 fp8")  # $18/h
    chosen = Layout(SPEC_ON, 2, 1, "TP2 fp8", "TP2 fp8")  # $18/h, tried in the same round
    dearer = Layout(SPEC_ON, 1, 1, "TP4 fp8", "TP4 fp8")  # $24/h
    search = Search(SPEC_ON, DISAGGREGATED, [missed, chosen, dearer], chosen=chosen, done=True)
    search.tried = {missed: _run(ttft, tpot), chosen: _run(0.1, 0.01)}
    search.tried[chosen].summary["slo_attainment"] = 1.0
    plan = DisaggregatedPlan("s.yaml", [], None, 10.0, [], 0.99, 3, PRICES, [search])
    rows = {row["placement"]: row for row in candidate_rows(plan, [search])}
    assert rows["TP2 fp8 + TP4 fp8"]["status"] == "missed the SLO"
    assert rows["TP2 fp8 + TP4 fp8"]["reason"] == (
        f"every layout tried up to $18.00/h missed the SLO; {why}"
    )
    assert rows["TP2 fp8 + TP2 fp8"]["status"] == "chosen"
    assert rows["TP4 fp8 + TP4 fp8"]["status"] == "not reached"
    assert rows["TP4 fp8 + TP4 fp8"]["devices"] == 8


def split_scenario(folder: Path, repo: Path) -> Path:
    """The planner tests' 8B chat scenario as 1P1D over NVLink, 100 requests, and an SLO
    (TTFT 0.3 s, TPOT 9 ms) that one TP1 replica misses at 30 req/s."""
    path = write_scenario(folder, repo, requests=100, slo={"ttft_s": 0.3, "tpot_s": 0.009})
    data = yaml.safe_load(path.read_text())
    link = {"hardware": str(repo / H100), "link": "nvlink"}
    data["fleet"] = {
        "disaggregation": {"prefill": {}, "decode": {}, "kv_transfer": link},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan_argv(scenario: Path, repo: Path, out: Path, tolerance: str) -> list[str]:
    argv = ["plan", "capacity", str(scenario), "--disaggregated", "--target-rps", "30"]
    argv += ["--max-replicas", "3", "--tolerance", tolerance, "--workers", "2", "--no-progress"]
    argv += ["--hardware", str(repo / H100), "--target-model", str(repo / LLAMA_8B)]
    argv += ["--draft-model", DRAFT.replace("=", f"={repo}/"), "--draft-model", "ngram"]
    argv += ["--acceptance-from", str(repo / ACCEPTANCE), "--tp", "1,2,3"]
    return [*argv, "--out", str(out)]


@pytest.fixture(scope="module")
def split_plans(tmp_path_factory, repo):
    """The same plan at two tolerances (TP1, TP2 and TP3, which 32 heads do not split over)."""
    folder = tmp_path_factory.mktemp("split-plan")
    scenario = split_scenario(folder, repo)
    plans = {}
    for tolerance in ("0.3", "0.05"):
        out = folder / f"out-{tolerance}"
        code = main(plan_argv(scenario, repo, out, tolerance))
        summary = json.loads((out / "summary.json").read_text())
        rows = list(csv.DictReader((out / "candidates.csv").open()))
        layouts = list(csv.DictReader((out / "layouts.csv").open()))
        plans[tolerance] = SimpleNamespace(code=code, out=out, summary=summary, rows=rows)
        plans[tolerance].layouts = layouts
    return SimpleNamespace(scenario=scenario, plans=plans)


@pytest.mark.slow
def test_the_joint_search_chooses_the_cheapest_layout_on_any_deployment(split_plans):
    plan = split_plans.plans["0.05"]
    assert plan.code == 0
    s = plan.summary
    assert [d["deployment"] for d in s["deployments"]] == ["TP1 bf16", "TP2 bf16", "TP3 bf16"]
    assert s["not_fitting"] == [
        {
            "candidate": "TP3 bf16",
            "reason": "meta-llama/Llama-3.1-8B-Instruct (32 heads, 8 KV heads) cannot be split "
            "over 3 devices (--tp)",
        }
    ]
    prices = {d["deployment"]: (d["price_per_hour_usd"], d["devices"]) for d in s["deployments"]}
    assert prices["TP1 bf16"] == (3.0, 1) and prices["TP2 bf16"] == (6.0, 2)
    pricing = Pricing((0.0, 1), (0.0, 1), (0.0, 1), {k: v for k, v in prices.items() if v[0]})
    chosen = {(x["setting"], x["kind"]): x["chosen"] for x in s["searches"]}
    # One TP1 replica misses the 9 ms TPOT at 30 req/s; a TP2 one holds it ($6/h), as does
    # 1P1D on two TP1 replicas ($6/h: 1 x 1 x $3 + 1 x 1 x $3).
    assert chosen[(SPEC_ON, COLOCATED)]["layout"] == "1 co-located (TP2 bf16)"
    assert chosen[(SPEC_ON, DISAGGREGATED)]["layout"] == "1P1D (TP1 bf16 + TP1 bf16)"
    for search in s["searches"]:
        every = layouts_by_price(
            search["setting"], search["kind"], 3, pricing, _placements(search["kind"])
        )
        price = search["chosen"]["price_per_hour_usd"]
        below = {lay.label for lay in every if lay.price(pricing) < price}
        tried = {r["layout"]: r for r in plan.layouts if r["setting"] == search["setting"]}
        assert below <= set(tried), "every cheaper layout was simulated"
        assert all(tried[label]["meets_slo"] == "False" for label in below)
        assert next(lay for lay in every if lay.label == search["chosen"]["layout"]).price(
            pricing
        ) == pytest.approx(price)


def _placements(kind: str):
    fitting = ["TP1 bf16", "TP2 bf16"]
    if kind == COLOCATED:
        return [(None, label) for label in fitting]
    return [(p, d) for p in fitting for d in fitting]


@pytest.mark.slow
def test_each_deployment_says_why_it_won_or_lost(split_plans):
    rows = split_plans.plans["0.05"].rows
    by = {(r["setting"], r["kind"], r["placement"]): r for r in rows}
    # Co-located and disaggregated rows in one table, each search's choice once.
    assert {r["kind"] for r in rows} == {COLOCATED, DISAGGREGATED}
    for setting in ("speculation", "speculation off"):
        assert sum(r["status"] == "chosen" for r in rows if r["setting"] == setting) == 2
    tp1 = by[(SPEC_ON, COLOCATED, "TP1 bf16")]
    assert tp1["status"] == "missed the SLO" and float(tp1["slo_attainment"]) < 0.99
    assert tp1["reason"].startswith("every layout tried up to $3.00/h missed the SLO")
    assert "at 1 co-located (TP1 bf16): TPOT p99" in tp1["reason"]
    assert "over 0.009 s; the rest cost more than the choice" in tp1["reason"]
    assert by[(SPEC_ON, COLOCATED, "TP2 bf16")]["status"] == "chosen"
    dearer = by[(SPEC_ON, DISAGGREGATED, "TP2 bf16 + TP2 bf16")]
    assert dearer["status"] == "not reached"
    assert dearer["reason"] == (
        "its cheapest layout costs $12.00/h, above 1P1D (TP1 bf16 + TP1 bf16) at $6.00/h"
    )
    report = (split_plans.plans["0.05"].out / "report.md").read_text()
    assert "## Not fitting" in report and "TP3 bf16: " in report


@pytest.mark.slow
def test_tolerance_sets_how_closely_each_choices_capacity_is_bisected(split_plans):
    """The choices do not depend on the tolerance; their capacity brackets do: each ends
    within its tolerance (hi - lo <= tolerance x hi, on the arrival rate), and the tighter
    one takes more probes."""
    loose, tight = split_plans.plans["0.3"].summary, split_plans.plans["0.05"].summary
    assert [s["chosen"] for s in loose["searches"]] == [s["chosen"] for s in tight["searches"]]
    for summary, tolerance in ((loose, 0.3), (tight, 0.05)):
        assert summary["tolerance"] == tolerance
        for search in summary["searches"]:
            capacity = search["capacity"]
            assert capacity["status"] == "converged"
            lo, hi = capacity["bracket_rps"]
            assert 30 <= lo < hi and hi - lo <= tolerance * hi
    assert sum(s["capacity"]["probes"] for s in tight["searches"]) > sum(
        s["capacity"]["probes"] for s in loose["searches"]
    )


@pytest.mark.slow
def test_every_layout_within_the_slo_is_on_one_pareto_file_with_the_choices(split_plans):
    """pareto.csv holds exactly the layouts.csv rows that met the SLO, co-located and split on
    every deployment, each search's choice among them; per device = throughput / devices (each
    pool's replicas x TP, as layouts.csv counts them)."""
    plan = split_plans.plans["0.05"]
    points = list(csv.DictReader((plan.out / "pareto.csv").open()))
    assert (plan.out / "pareto_frontier.png").read_bytes().startswith(b"\x89PNG")
    assert len(points) == len(plan.summary["pareto"])
    met = {(r["setting"], r["layout"]): r for r in plan.layouts if r["meets_slo"] == "True"}
    assert {(p["setting"], p["layout"]) for p in points} == set(met)
    for p in points:
        assert int(p["devices"]) == int(met[(p["setting"], p["layout"])]["devices"])
        assert float(p["tokens_per_s_per_device"]) == pytest.approx(
            float(p["throughput_tokens_per_s"]) / int(p["devices"]), rel=1e-12
        )
    assert {p["kind"] for p in points} == {COLOCATED, DISAGGREGATED}
    named = {(p["setting"], p["layout"]) for p in points}
    for search in plan.summary["searches"]:
        assert (search["setting"], search["chosen"]["layout"]) in named
    assert any(p["on_frontier"] == "True" for p in points)
    line = f"Pareto frontier (pareto.csv, pareto_frontier.png): {len(points)} layouts within"
    assert line in (plan.out / "report.md").read_text()
    html = (plan.out / "report.html").read_text()
    assert line in html and html.count("data:image/png;base64,") == 1
    assert not (plan.out / "report.txt").exists()


def test_no_deployment_serving_both_pools_is_refused_before_anything_is_written(
    tmp_path, repo, capsys
):
    scenario = split_scenario(tmp_path, repo)
    out = tmp_path / "out"
    argv = plan_argv(scenario, repo, out, "0.1")
    argv[argv.index("1,2,3")] = "3"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no deployment serves both pools" in err and "cannot be split over 3" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_the_api_entry_writes_what_the_command_writes(split_plans, repo, tmp_path):
    import specsim
    from specsim.api.results import read_table

    cli = split_plans.plans["0.3"]
    out = tmp_path / "api"
    result = specsim.plan_disaggregated(
        split_plans.scenario,
        target_rps=30,
        max_replicas=3,
        tolerance=0.3,
        workers=2,
        progress=False,
        hardware=str(repo / H100),
        target_model=str(repo / LLAMA_8B),
        draft_models=[DRAFT.replace("=", f"={repo}/"), "ngram"],
        acceptance_from=str(repo / ACCEPTANCE),
        tp=[1, 2, 3],
        out=out,
    )
    for name in ("layouts.csv", "candidates.csv", "report.md", "report.html"):
        assert (out / name).read_text() == (cli.out / name).read_text()
    # The summaries differ only in where each run keeps its built profiles.
    written = (out / "summary.json").read_text()
    assert written.replace(str(out), "OUT") == (cli.out / "summary.json").read_text().replace(
        str(cli.out), "OUT"
    )
    assert result.summary == json.loads(written)
    assert result.command == "plan capacity --disaggregated"
    assert set(result.tables) == {"layouts", "candidates", "pareto"}
    for name, frame in result.tables.items():
        expected = read_table((cli.out / f"{name}.csv").read_text())
        assert frame.equals(expected)
    assert result.attachments == {}
    assert result.figures["pareto_frontier"].equals(
        read_table((cli.out / "pareto_frontier.csv").read_text())
    )


def test_the_api_refuses_what_the_options_bound(tmp_path, repo):
    """The CLI's bounds hold in Python too (--max-replicas 2..64, --tolerance in (0, 0.5)),
    before anything runs; the two bounds on the layouts' side are one number."""
    import specsim
    from specsim.cli.plan import MAX_DISAGG_REPLICAS
    from specsim.errors import SpecsimError
    from specsim.planning.capacity.disagg import MAX_LAYOUT_REPLICAS

    assert MAX_DISAGG_REPLICAS == MAX_LAYOUT_REPLICAS
    scenario = split_scenario(tmp_path, repo)
    for bad, key in (({"max_replicas": 1}, "--max-replicas"), ({"tolerance": 0.5}, "--tolerance")):
        with pytest.raises(SpecsimError, match=key):
            specsim.plan_disaggregated(scenario, target_rps=30, out=tmp_path / "o", **bad)
    with pytest.raises(SpecsimError, match="--target-rps"):
        specsim.plan_disaggregated(scenario, target_rps=float("nan"), out=tmp_path / "o")
    assert not (tmp_path / "o").exists()
