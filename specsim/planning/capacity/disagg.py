"""``plan capacity --disaggregated``: the cheapest prefill and decode pools (x prefill and y
decode replicas, xPyD) that hold the SLO at a target rate, beside the cheapest co-located fleet,
each with the scenario's speculation and with speculation off.

Without deployment options the replicas are the scenario's own (each pool's profile); with them
(``--tp``, ``--precision``, ``--profile``: ``capacity_deploy``'s deployments) a co-located layout
runs on any deployment that serves it and a split one on any pair (``capacity_split``), so the
pools may differ in TP. Each of the four searches walks every one of its layouts in order of
price per hour (then fewer replicas, then fewer prefill replicas, then the order the deployments
were given): co-located n = 1, 2, ... and every (x, y) with x + y at most ``max_replicas``.
Layouts are simulated in rounds of the sweep's parallelism, the four searches side by side; a
search stops at the first round holding a layout where at least ``attainment`` of the requests
meet every SLO limit, and takes the cheapest such layout of that round (every cheaper layout has
failed). Each choice's own capacity is then bisected upwards from the target to ``tolerance``
(the rounds and bisections: ``disagg_search``).
A layout is a scenario override set, so a run is one ordinary simulation, cached by the sweep
engine like any other point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from specsim.errors import SpecsimError
from specsim.planning.capacity.capacity_deploy import Deployment
from specsim.planning.capacity.capacity_split import (
    Fit,
    Headroom,
    deployment_overrides,
    pairs,
    role_fits,
)
from specsim.planning.common import load_axis, scenario_identity
from specsim.planning.rates import ArrivalScale
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.sweeper import PointResult

COLOCATED, DISAGGREGATED = "co-located", "disaggregated"
SPEC_ON, SPEC_OFF = "speculation", "speculation off"
MAX_LAYOUT_REPLICAS = 64  # as specsim.cli.plan.MAX_DISAGG_REPLICAS (the (x, y) grid's side)
SPEC_OFF_OVERRIDES = ["speculation.drafter=null", "speculation.k=0", "speculation.policy=fixed"]


@dataclass(frozen=True)
class Pricing:
    """Price per hour and devices of one replica, for the co-located fleet and each pool of the
    scenario's own, and of each deployment searched (by label)."""

    colocated: tuple[float, int]
    prefill: tuple[float, int]
    decode: tuple[float, int]
    deployments: dict[str, tuple[float, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """A fleet to try: co-located ``decode`` replicas (``prefill`` 0), or xPyD; on the scenario's
    own replicas, or on the deployments labelled ``prefill_on`` and ``decode_on`` (a co-located
    layout's in ``decode_on``)."""

    setting: str
    prefill: int
    decode: int
    prefill_on: str | None = None
    decode_on: str | None = None

    @property
    def kind(self) -> str:
        return DISAGGREGATED if self.prefill else COLOCATED

    @property
    def label(self) -> str:
        if self.prefill:
            on = "" if self.decode_on is None else f" ({self.prefill_on} + {self.decode_on})"
            return f"{self.prefill}P{self.decode}D{on}"
        on = "" if self.decode_on is None else f" ({self.decode_on})"
        return f"{self.decode} co-located{on}"

    @property
    def placement(self) -> str | None:
        """The deployment (co-located) or pair a layout runs on, as the report names it."""
        if self.decode_on is None:
            return None
        return self.decode_on if not self.prefill else f"{self.prefill_on} + {self.decode_on}"

    def _terms(self, pricing: Pricing, role: str) -> tuple[float, int]:
        on = self.prefill_on if role == "prefill" else self.decode_on
        return getattr(pricing, role) if on is None else pricing.deployments[on]

    def price(self, pricing: Pricing) -> float:
        return self._total(pricing, 0)

    def devices(self, pricing: Pricing) -> int:
        return self._total(pricing, 1)

    def _total(self, pricing: Pricing, term: int):
        """The layout's sum of one replica term (0: price per hour, 1: devices)."""
        if not self.prefill:
            return self.decode * self._terms(pricing, "colocated")[term]
        prefill, decode = self._terms(pricing, "prefill"), self._terms(pricing, "decode")
        return self.prefill * prefill[term] + self.decode * decode[term]

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
    headroom: Headroom | None = None  # the choice's capacity above the target

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
    tolerance: float = 0.02
    scale: ArrivalScale | None = None
    deployments: list[Deployment] = field(default_factory=list)  # empty: the scenario's own
    unfit: list[tuple[str, str]] = field(default_factory=list)  # (deployment[, role], why)

    def identity(self) -> dict[str, Any]:
        identity = {
            "command": "plan capacity --disaggregated",
            **scenario_identity(self.scenario_path, self.base_overrides),
            "target_rps": self.target_rps,
            "attainment": self.attainment,
            "max_replicas": self.max_replicas,
        }
        if self.deployments:
            identity["deployments"] = [d.identity() for d in self.deployments]
        return identity

    def deployment(self, label: str | None) -> Deployment | None:
        return next((d for d in self.deployments if d.label == label), None)

    def point(self, layout: Layout, load_overrides: list[str] | None = None) -> SweepPoint:
        placed = deployment_overrides(
            self.deployment(layout.prefill_on) if layout.prefill else None,
            self.deployment(layout.decode_on),
        )
        load = self.load_overrides if load_overrides is None else load_overrides
        overrides = [*self.base_overrides, *load, *layout.overrides(), *placed]
        return SweepPoint.make(self.scenario_path, overrides, layout=layout.label)


def layouts_by_price(
    setting: str,
    kind: str,
    max_replicas: int,
    pricing: Pricing,
    placements: list[tuple[str | None, str | None]] | None = None,
) -> list[Layout]:
    """Every layout of a search within ``max_replicas`` replicas, cheapest first.
    ``placements``: the (prefill, decode) deployments it may run on ((None, label) for a
    co-located one; default the scenario's own replicas)."""
    placements = placements or [(None, None)]
    order = {placement: i for i, placement in enumerate(placements)}
    if kind == COLOCATED:
        found = [
            Layout(setting, 0, n, None, on)
            for _, on in placements
            for n in range(1, max_replicas + 1)
        ]
    else:
        found = [
            Layout(setting, x, y, p, d)
            for p, d in placements
            for x in range(1, max_replicas)
            for y in range(1, max_replicas - x + 1)
        ]
    return sorted(
        found,
        key=lambda lay: (
            lay.price(pricing),
            lay.prefill + lay.decode,
            lay.prefill,
            order[(lay.prefill_on, lay.decode_on)],
        ),
    )


def _replica_terms(loaded) -> tuple[float, int]:
    hardware = loaded.profile.hardware
    return hardware.price_per_hour_usd, hardware.devices


def _check(scenario, where: str, target_rps, tolerance, attainment, max_replicas) -> None:
    """A disaggregated fleet, an open-loop or trace workload and an SLO; the options in range."""
    if scenario.fleet.disaggregation is None:
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
    if not 0 < tolerance < 0.5:
        raise SpecsimError("tolerance must be in (0, 0.5)", key="--tolerance", fix="e.g. 0.02")
    if not (math.isfinite(target_rps) and target_rps > 0):
        raise SpecsimError(
            f"target rate must be positive (got {target_rps:g})",
            key="--target-rps",
            fix="give requests per second above 0",
        )
    if not 0 < attainment <= 1:
        raise SpecsimError("attainment must be in (0, 1]", key="--attainment", fix="e.g. 0.99")
    if not 2 <= max_replicas <= MAX_LAYOUT_REPLICAS:
        raise SpecsimError(
            f"max_replicas must be from 2 to {MAX_LAYOUT_REPLICAS} (got {max_replicas})",
            key="--max-replicas",
            fix="e.g. 8 (the layouts grow as its square)",
        )


def prepare(
    scenario_path: str,
    base_overrides: list[str],
    target_rps: float,
    attainment: float,
    max_replicas: int,
    tolerance: float = 0.02,
    deployments: list[Deployment] | None = None,
) -> DisaggregatedPlan:
    """Check the scenario and the deployments (when given), and lay out the four searches."""
    from specsim.scenario import load_scenario

    scenario = load_scenario(scenario_path, base_overrides)
    where = str(scenario_path)
    _check(scenario, where, target_rps, tolerance, attainment, max_replicas)
    axis = load_axis(scenario)
    scale = ArrivalScale.for_scenario(scenario, axis)
    load_overrides = axis.overrides(scale.knob(target_rps))
    built = list(deployments or [])
    pricing = _pricing(scenario, built)
    settings = [SPEC_ON, SPEC_OFF] if scenario.speculation.enabled else [SPEC_OFF]
    fit = _role_fits(built, scenario_path, base_overrides, settings) if built else None
    searches = [
        Search(
            setting,
            kind,
            layouts_by_price(
                setting, kind, max_replicas, pricing, _placements(fit, built, setting, kind)
            ),
        )
        for setting in settings
        for kind in (COLOCATED, DISAGGREGATED)
    ]
    return DisaggregatedPlan(
        str(scenario_path),
        list(base_overrides),
        scenario,
        float(target_rps),
        load_overrides,
        attainment,
        max_replicas,
        pricing,
        searches,
        tolerance,
        scale,
        built,
        [] if fit is None else fit.unfit,
    )


def _role_fits(built: list[Deployment], scenario_path: str, base_overrides, settings) -> Fit:
    """Which deployments fit each role (colocated, prefill, decode) with and without
    speculation; refused where none fits."""
    from specsim.scenario import load_scenario

    colocated = [*base_overrides, "fleet.disaggregation=null", "fleet.replicas=1"]
    fit = role_fits(
        built,
        load_scenario(scenario_path, colocated),
        scenario_path,
        colocated,
        {s: s != SPEC_OFF for s in settings},
    )
    _check_some_fit(built, fit, settings)
    return fit


def _pricing(scenario, built: list[Deployment]) -> Pricing:
    """A replica's price and devices: the scenario's, each pool's profile's, each fitting
    deployment's."""
    from specsim.simulation.run import cached_profile

    main = cached_profile(scenario.resolve(scenario.profile))
    split = scenario.fleet.disaggregation

    def pool_terms(pool) -> tuple[float, int]:
        if pool.profile is None:
            return _replica_terms(main)
        return _replica_terms(cached_profile(scenario.resolve(pool.profile)))

    terms = {d.label: (d.replica_price, d.devices) for d in built if d.fits}
    return Pricing(_replica_terms(main), pool_terms(split.prefill), pool_terms(split.decode), terms)


def _placements(fit: Fit | None, built: list[Deployment], setting: str, kind: str):
    if fit is None:
        return None
    if kind == COLOCATED:
        return [(None, label) for label in fit.serving.get((COLOCATED, setting), [])]
    by_label = {d.label: d for d in built}
    prefill = fit.serving.get(("prefill", SPEC_OFF), [])
    return pairs(prefill, fit.serving.get(("decode", setting), []), by_label)


def _check_some_fit(built: list[Deployment], fit: Fit, settings: list[str]) -> None:
    """Every search needs a deployment to run on: refuse, with each one's reason, if one has
    none (before anything is simulated or written)."""
    for setting in settings:
        colocated = fit.serving.get((COLOCATED, setting), [])
        if colocated and pairs(
            fit.serving.get(("prefill", SPEC_OFF), []),
            fit.serving.get(("decode", setting), []),
            {d.label: d for d in built},
        ):
            continue
        reasons = "; ".join(f"{what}: {why}" for what, why in fit.unfit) or (
            "no prefill and decode deployments of one precision"
        )
        raise SpecsimError(
            f"no deployment serves both pools with {setting}: {reasons}",
            key="--tp",
            fix="give more devices per replica (--tp), smaller formats (--precision) or a "
            "device with more memory",
        )


def fewer(layout: Layout, dx: int, dy: int) -> Layout:
    """The same layout with ``dx`` and ``dy`` more replicas in each pool (negative: fewer)."""
    return replace(layout, prefill=layout.prefill + dx, decode=layout.decode + dy)
