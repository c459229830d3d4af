"""The Pareto frontier of ``plan capacity --disaggregated``
(``specsim.planning.capacity.disagg_pareto``), on layouts whose figures are given by hand: which
layouts are points, their throughput per device from each pool's replicas x TP, and which are on
the frontier."""

from __future__ import annotations

import csv
import io

import pytest

from specsim.planning.capacity.disagg import (
    COLOCATED,
    DISAGGREGATED,
    SPEC_OFF,
    SPEC_ON,
    DisaggregatedPlan,
    Layout,
    Pricing,
    Search,
)
from specsim.planning.capacity.disagg_pareto import frontier_line, pareto_csv, pareto_points
from specsim.planning.sweep.sweeper import PointResult

# A TP2 replica is 2 devices at $6/h, a TP4 one 4 devices at $12/h.
PRICING = Pricing((0.0, 1), (0.0, 1), (0.0, 1), {"TP2": (6.0, 2), "TP4": (12.0, 4)})


def _ran(attainment: float, tpot_p50: float, throughput: float, ok: bool = True) -> PointResult:
    summary = {
        "slo_attainment": attainment,
        "tpot_s": {"p50": tpot_p50},
        "throughput_tokens_per_s": throughput,
    }
    return PointResult(None, "key", ok, summary if ok else None, None if ok else "crashed")


def _searches() -> list[Search]:
    colocated_on = Search(SPEC_ON, COLOCATED, [])
    colocated_on.tried = {
        Layout(SPEC_ON, 0, 2, None, "TP2"): _ran(0.995, 0.01, 4000.0),  # 4 devices
    }
    split_on = Search(SPEC_ON, DISAGGREGATED, [])
    split_on.tried = {
        Layout(SPEC_ON, 1, 1, "TP2", "TP4"): _ran(0.99, 0.008, 4200.0),  # 2 + 4 devices
    }
    colocated_off = Search(SPEC_OFF, COLOCATED, [])
    colocated_off.tried = {
        # Best on both axes, but it misses the SLO: not a point.
        Layout(SPEC_OFF, 0, 1, None, "TP4"): _ran(0.5, 0.001, 8000.0),
        Layout(SPEC_OFF, 0, 1, None, "TP2"): _ran(0.999, 0.01, 2000.0),  # 2 devices
    }
    split_off = Search(SPEC_OFF, DISAGGREGATED, [])
    split_off.tried = {
        Layout(SPEC_OFF, 1, 1, "TP2", "TP2"): _ran(0.0, 0.0, 0.0, ok=False),  # failed
        Layout(SPEC_OFF, 2, 1, "TP2", "TP2"): _ran(0.99, 0.0125, 3600.0),  # 2 x 2 + 2 devices
    }
    return [colocated_on, split_on, colocated_off, split_off]


def _points():
    plan = DisaggregatedPlan("s.yaml", [], None, 10.0, [], 0.99, 8, PRICING, _searches())
    return pareto_points(plan, plan.searches)


def test_every_layout_within_the_slo_is_a_point_per_device_of_all_its_pools():
    points = _points()
    got = [
        (p.setting, p.layout, p.devices, p.tokens_per_s_per_device, p.user_tokens_per_s)
        for p in points
    ]
    # tokens/s per device = throughput / (prefill x TP + decode x TP); per user = 1 / TPOT p50.
    expected = [
        (SPEC_ON, "2 co-located (TP2)", 4, 4000 / 4, 1 / 0.01),
        (SPEC_ON, "1P1D (TP2 + TP4)", 6, 4200 / 6, 1 / 0.008),
        (SPEC_OFF, "1 co-located (TP2)", 2, 2000 / 2, 1 / 0.01),
        (SPEC_OFF, "2P1D (TP2 + TP2)", 6, 3600 / 6, 1 / 0.0125),
    ]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected, strict=True):  # float64 quotients of small numbers
        assert g[3:] == pytest.approx(e[3:], rel=1e-12)
    assert [p.placement for p in points] == ["TP2", "TP2 + TP4", "TP2", "TP2 + TP2"]
    assert [p.kind for p in points] == [COLOCATED, DISAGGREGATED, COLOCATED, DISAGGREGATED]


def test_the_frontier_spans_co_located_and_disaggregated_layouts():
    # (per device, per user): 2 co-located (1000, 100) and 1 co-located off (1000, 100) tie, so
    # both stay; 1P1D (700, 125) is the fastest per user; 2P1D off (600, 80) is beaten by all.
    points = _points()
    assert [p.on_frontier for p in points] == [True, True, True, False]
    rows = list(csv.DictReader(io.StringIO(pareto_csv([p.__dict__ for p in points]))))
    assert [r["layout"] for r in rows] == [
        "2 co-located (TP2)",
        "1 co-located (TP2)",
        "1P1D (TP2 + TP4)",
        "2P1D (TP2 + TP2)",
    ]
    assert [r["on_frontier"] for r in rows] == ["True", "True", "True", "False"]
    line = frontier_line([p.__dict__ for p in points])
    # Every layout within the SLO is a point of the plot; the frontier is a subset of them.
    assert line.startswith(
        "Pareto frontier (pareto.csv, pareto_frontier.png): 4 layouts within the SLO, 3 of them "
        "on the frontier: "
    )
    assert "1P1D (TP2 + TP4), speculation (125 tokens/s per user, 700 per device)" in line
    assert "2P1D" not in line
