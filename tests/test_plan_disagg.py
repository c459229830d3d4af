"""``plan capacity --disaggregated`` (``specsim.planning.capacity.disagg``): layouts in price
order, the overrides each one simulates, and a small end-to-end sizing whose choices are checked
against every cheaper layout it tried."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import yaml
from test_sim_disagg import BASE, DATA

from specsim.cli import main
from specsim.planning.capacity.disagg import (
    COLOCATED,
    DISAGGREGATED,
    SPEC_OFF,
    SPEC_ON,
    Layout,
    Pricing,
    layouts_by_price,
)


def test_layouts_come_cheapest_first():
    # Co-located replicas at $10/h; prefill replicas $3/h, decode replicas $5/h (one device
    # each): 1P1D $8, 2P1D $11, 1P2D $13 within three replicas.
    pricing = Pricing((10.0, 1), (3.0, 1), (5.0, 2))
    split = layouts_by_price(SPEC_ON, DISAGGREGATED, 3, pricing)
    assert [(lay.prefill, lay.decode) for lay in split] == [(1, 1), (2, 1), (1, 2)]
    assert [lay.price(pricing) for lay in split] == [8.0, 11.0, 13.0]
    assert [lay.devices(pricing) for lay in split] == [3, 4, 5]
    colocated = layouts_by_price(SPEC_ON, COLOCATED, 3, pricing)
    assert [lay.decode for lay in colocated] == [1, 2, 3] and colocated[2].price(pricing) == 30


def test_a_layout_is_an_override_set():
    assert Layout(SPEC_ON, 2, 3).overrides() == [
        "fleet.replicas=null",
        "fleet.disaggregation.prefill.replicas=2",
        "fleet.disaggregation.decode.replicas=3",
    ]
    assert Layout(SPEC_OFF, 0, 4).overrides() == [
        "speculation.drafter=null",
        "speculation.k=0",
        "speculation.policy=fixed",
        "fleet.disaggregation=null",
        "fleet.replicas=4",
    ]


@pytest.fixture()
def disagg_scenario(tmp_path) -> Path:
    data = copy.deepcopy(BASE)
    data["profile"] = str(DATA / "sim_profile.yaml")
    data["workload"]["requests"] = 120
    data["slo"] = {"ttft_s": 0.5, "tpot_s": 0.03}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_sizing_chooses_the_cheapest_layout_that_holds_the_slo(disagg_scenario, tmp_path):
    out = tmp_path / "plan"
    argv = ["plan", "capacity", str(disagg_scenario), "--disaggregated", "--target-rps", "40"]
    argv += ["--max-replicas", "4", "--attainment", "0.9", "--workers", "1", "--no-progress"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = list(csv.DictReader((out / "layouts.csv").open()))
    assert len(summary["searches"]) == 4
    prices = summary["replica_price_per_hour_usd"]
    pricing = Pricing((prices["co-located"], 1), (prices["prefill"], 1), (prices["decode"], 1))
    for search in summary["searches"]:
        chosen = search["chosen"]
        tried = [r for r in rows if (r["setting"], _kind(r)) == (search["setting"], search["kind"])]
        assert len(tried) == search["layouts_tried"]
        if chosen is None:
            assert all(r["meets_slo"] == "False" for r in tried)
            continue
        assert chosen["meets_slo"] and chosen["slo_attainment"] >= 0.9
        # Every layout cheaper than the choice was simulated and missed the SLO.
        cheaper = [
            r for r in tried if float(r["price_per_hour_usd"]) < chosen["price_per_hour_usd"]
        ]
        assert all(r["meets_slo"] == "False" for r in cheaper)
        every = layouts_by_price(search["setting"], search["kind"], 4, pricing)
        below = {lay.label for lay in every if lay.price(pricing) < chosen["price_per_hour_usd"]}
        assert below == {r["layout"] for r in cheaper}
        assert search["reasons"][0].startswith(chosen["layout"])
    assert any("bottleneck" in r for s in summary["searches"] for r in s["reasons"])
    assert len(summary["comparison"]) == 2


def _kind(row) -> str:
    return DISAGGREGATED if int(row["prefill_replicas"]) else COLOCATED


def test_sizing_refuses_a_co_located_scenario_and_options_it_ignores(tmp_path, capsys):
    data = copy.deepcopy(BASE)
    data["profile"] = str(DATA / "sim_profile.yaml")
    data["slo"] = {"ttft_s": 0.5}
    del data["fleet"]
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(data))
    argv = ["plan", "capacity", str(path), "--disaggregated", "--target-rps", "5"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "fleet.disaggregation" in capsys.readouterr().err
    assert main([*argv, "--k", "1", "--out", str(tmp_path / "o")]) == 2
    assert "--k does not apply" in capsys.readouterr().err
    # The deployment search builds rooflines, which need the hardware and the model.
    assert main([*argv, "--tp", "2", "--out", str(tmp_path / "o")]) == 2
    assert "need --hardware and --target-model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _result(attainment: float, busy=(0.4, 0.9), link=0.1):
    from specsim.planning.sweep.sweeper import PointResult

    split = {
        "busy_fraction": {"prefill": busy[0], "decode": busy[1]},
        "transfer_share_of_ttft": 0.02,
        "link_busy_fraction": link,
    }
    summary = {"slo_attainment": attainment, "ttft_s": {"p90": 0.5}, "disaggregation": split}
    return PointResult(None, "key", True, summary)


def _plan(searches):
    from specsim.planning.capacity.disagg import DisaggregatedPlan

    pricing = Pricing((4.0, 1), (2.0, 1), (2.0, 1))
    return DisaggregatedPlan("s.yaml", [], None, 10.0, [], 0.99, 8, pricing, searches)


@pytest.mark.parametrize(
    "prefill_fewer, decode_fewer, link, bottleneck",
    [
        (0.97, 0.80, 0.1, "the decode pool is the bottleneck"),
        (0.80, 0.97, 0.1, "the prefill pool is the bottleneck"),
        (0.80, 0.97, 0.6, "the prefill pool's KV links are the bottleneck"),
    ],
)
def test_the_bottleneck_is_the_pool_that_can_least_spare_a_replica(
    prefill_fewer, decode_fewer, link, bottleneck
):
    from specsim.planning.capacity.disagg import Search
    from specsim.planning.capacity.disagg_report import reasons

    chosen = Layout(SPEC_ON, 2, 2)
    search = Search(SPEC_ON, DISAGGREGATED, [], chosen=chosen, done=True)
    search.tried = {
        Layout(SPEC_ON, 1, 2): _result(prefill_fewer),
        Layout(SPEC_ON, 2, 1): _result(decode_fewer),
        chosen: _result(0.995, link=link),
    }
    lines = reasons(_plan([search]), search)
    assert lines[0] == "2P2D: 4 devices at $8.00/h, SLO met for 99.5% of requests"
    assert lines[1] == bottleneck
    assert f"one prefill replica fewer (1P2D): SLO met for {prefill_fewer:.1%}" in lines
    assert f"one decode replica fewer (2P1D): SLO met for {decode_fewer:.1%}" in lines
    assert lines[-1] == f"the KV transfer is 2.0% of the mean TTFT (links busy {link:.0%})"
