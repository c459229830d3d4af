"""``plan capacity --disaggregated``: the cheapest prefill and decode pools (x prefill and y
decode replicas, xPyD) that hold the SLO at a target rate, beside the cheapest co-located fleet
of the scenario's replicas, each with the scenario's speculation and with speculation off.

Each of the four searches walks its layouts in order of price per hour (then fewer replicas,
then fewer prefill replicas): co-located n = 1, 2, ... and every (x, y) with x + y at most
``max_replicas``. Layouts are simulated in rounds of the sweep's parallelism, the four searches
side by side; a search stops at the first round holding a layout where at least ``attainment``
of the requests meet every SLO limit, and takes the cheapest such layout of that round (every
cheaper layout has failed). A layout is a scenario override set, so a run is one ordinary
simulation, cached by the sweep engine like any other point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specsim.errors import SpecsimError
from specsim.planning.common import load_axis, metric, scenario_identity
from specsim.planning.points import SweepPoint
from specsim.planning.rates import ArrivalScale
from specsim.planning.sweep import PointResult, Sweeper

COLOCATED, DISAGGREGATED = "co-located", "disaggregated"
SPEC_ON, SPEC_OFF = "speculation", "speculation off"
SPEC_OFF_OVERRIDES = ["speculation.drafter=null", "speculation.k=0", "speculation.policy=fixed"]


@dataclass(frozen=True)
class Pricing:
    """Price per hour and devices of one replica, for the co-located fleet and each pool."""

    colocated: tuple[float, int]
    prefill: tuple[float, int]
    decode: tuple[float, int]


@dataclass(frozen=True)
class Layout:
    """A fleet to try: co-located ``decode`` replicas (``prefill`` 0), or xPyD."""

    setting: str
    prefill: int
    decode: int

    @property
    def kind(self) -> str:
        return DISAGGREGATED if self.prefill else COLOCATED

    @property
    def label(self) -> str:
        if self.prefill:
            return f"{self.prefill}P{self.decode}D"
        return f"{self.decode} co-located"

    def price(self, pricing: Pricing) -> float:
        if not self.prefill:
            return self.decode * pricing.colocated[0]
        return self.prefill * pricing.prefill[0] + self.decode * pricing.decode[0]

    def devices(self, pricing: Pricing) -> int:
        if not self.prefill:
            return self.decode * pricing.colocated[1]
        return self.prefill * pricing.prefill[1] + self.decode * pricing.decode[1]

    def overrides(self) -> list[str]:
        spec = SPEC_OFF_OVERRIDES if self.setting == SPEC_OFF else []
        if not self.prefill:
            return [*spec, "fleet.disaggregation=null", f"fleet.replicas={self.decode}"]
        return [
            *spec,
            "fleet.replicas=null",
            f"fleet.disaggregation.prefill.replicas={self.prefill}",
            f"fleet.disaggregation.decode.replicas={self.decode}",
        ]


@dataclass
class Search:
    """One search's layouts in price order, what has run, and the layout it chose."""

    setting: str
    kind: str
    layouts: list[Layout]
    tried: dict[Layout, PointResult] = field(default_factory=dict)
    chosen: Layout | None = None
    done: bool = False

    def next_round(self, size: int) -> list[Layout]:
        return [layout for layout in self.layouts if layout not in self.tried][:size]


@dataclass
class DisaggregatedPlan:
    scenario_path: str
    base_overrides: list[str]
    scenario: Any
    target_rps: float
    load_overrides: list[str]
    attainment: float
    max_replicas: int
    pricing: Pricing
    searches: list[Search]

    def identity(self) -> dict[str, Any]:
        return {
            "command": "plan capacity --disaggregated",
            **scenario_identity(self.scenario_path, self.base_overrides),
            "target_rps": self.target_rps,
            "attainment": self.attainment,
            "max_replicas": self.max_replicas,
        }

    def point(self, layout: Layout) -> SweepPoint:
        overrides = [*self.base_overrides, *self.load_overrides, *layout.overrides()]
        return SweepPoint.make(self.scenario_path, overrides, layout=layout.label)


def layouts_by_price(setting: str, kind: str, max_replicas: int, pricing: Pricing) -> list[Layout]:
    """Every layout of a search within ``max_replicas`` replicas, cheapest first."""
    if kind == COLOCATED:
        found = [Layout(setting, 0, n) for n in range(1, max_replicas + 1)]
    else:
        found = [
            Layout(setting, x, y)
            for x in range(1, max_replicas)
            for y in range(1, max_replicas - x + 1)
        ]
    return sorted(
        found, key=lambda lay: (lay.price(pricing), lay.prefill + lay.decode, lay.prefill)
    )


def _replica_terms(loaded) -> tuple[float, int]:
    hardware = loaded.profile.hardware
    return hardware.price_per_hour_usd, hardware.devices


def prepare(
    scenario_path: str,
    base_overrides: list[str],
    target_rps: float,
    attainment: float,
    max_replicas: int,
) -> DisaggregatedPlan:
    """Check the scenario (a disaggregated fleet, an open-loop or trace workload, an SLO) and
    lay out the four searches."""
    from specsim.scenario import load_scenario
    from specsim.simulation.run import cached_profile

    scenario = load_scenario(scenario_path, base_overrides)
    where = str(scenario_path)
    split = scenario.fleet.disaggregation
    if split is None:
        raise SpecsimError(
            "--disaggregated sizes prefill and decode pools, but the scenario's fleet is not "
            "disaggregated",
            file=where,
            key="fleet.disaggregation",
            fix="add fleet.disaggregation (see scenarios/chat-70b-disagg.yaml)",
        )
    if scenario.slo is None:
        raise SpecsimError(
            "sizing needs an SLO", file=where, key="slo", fix="add an slo section (ttft_s...)"
        )
    if scenario.workload.kind == "closed_loop":
        raise SpecsimError(
            "a closed loop has no arrival rate to size for",
            file=where,
            key="workload.kind",
            fix="use an open-loop or trace workload",
        )
    axis = load_axis(scenario)
    load_overrides = axis.overrides(ArrivalScale.for_scenario(scenario, axis).knob(target_rps))
    main = cached_profile(scenario.resolve(scenario.profile))

    def pool_terms(pool) -> tuple[float, int]:
        if pool.profile is None:
            return _replica_terms(main)
        return _replica_terms(cached_profile(scenario.resolve(pool.profile)))

    pricing = Pricing(_replica_terms(main), pool_terms(split.prefill), pool_terms(split.decode))
    settings = [SPEC_ON, SPEC_OFF] if scenario.speculation.enabled else [SPEC_OFF]
    searches = [
        Search(setting, kind, layouts_by_price(setting, kind, max_replicas, pricing))
        for setting in settings
        for kind in (COLOCATED, DISAGGREGATED)
    ]
    return DisaggregatedPlan(
        str(scenario_path),
        list(base_overrides),
        scenario,
        target_rps,
        load_overrides,
        attainment,
        max_replicas,
        pricing,
        searches,
    )


def meets(result: PointResult | None, attainment: float) -> bool:
    value = metric(result.summary if result is not None and result.ok else None, "slo_attainment")
    return value is not None and value >= attainment


def run(plan: DisaggregatedPlan, sweeper: Sweeper) -> list[Search]:
    """Advance the searches round by round until each has chosen a layout or run out."""
    size = max(2, sweeper.parallelism)
    while True:
        rounds = [(s, s.next_round(size)) for s in plan.searches if not s.done]
        rounds = [(s, layouts) for s, layouts in rounds if layouts]
        for search in plan.searches:
            if not search.done and not search.next_round(1):
                search.done = True  # every layout within max_replicas missed the SLO
        if not rounds:
            return plan.searches
        points = [plan.point(layout) for _, layouts in rounds for layout in layouts]
        results = iter(sweeper.run(points, desc="layouts"))
        for search, layouts in rounds:
            for layout in layouts:
                search.tried[layout] = next(results)
            passing = [lay for lay in layouts if meets(search.tried[lay], plan.attainment)]
            if passing:
                search.chosen, search.done = passing[0], True
