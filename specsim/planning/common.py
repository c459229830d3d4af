"""What the three planner commands share: the load axis, k ranges, metrics and the choice rule.

The load axis follows the scenario's workload: an open-loop workload is loaded by its arrival
rate (``workload.rate``), a closed loop by its concurrency (``workload.concurrency``) and a trace
replay by its speed (``workload.time_scale`` = 1 / speed). The choice rule: with an SLO, the
highest goodput (SLO-meeting requests per second) wins, and goodputs closer to the best than
``GOODPUT_TIE`` of the served request rate count as equal; then, and without an SLO, the lowest
mean end-to-end latency; then the smaller k. Only this module knows these rules, so the three
commands agree.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.bounds import MAX_K
from specsim.errors import SpecsimError
from specsim.sampling.kinds import LOSSY_VERIFIERS

# Goodputs less than 1 % of the served request rate apart are treated as equal: at low load every
# k meets the SLO and goodput differs only by when the last request happens to finish; deep in
# overload every k misses it and a sliver of goodput says nothing (the latency then decides).
GOODPUT_TIE = 0.01
OPEN_LOOP = ("poisson", "bursty", "fixed_rate")


@dataclass(frozen=True)
class LoadAxis:
    """How a load level becomes overrides, and what to call it in tables."""

    kind: str  # "rate", "concurrency" or "speed"
    label: str
    unit: str
    base: float  # the scenario's own load on this axis

    def overrides(self, load: float) -> list[str]:
        if self.kind == "rate":
            return [f"workload.rate={_plain(load)}"]
        if self.kind == "concurrency":
            return [f"workload.concurrency={round(load)}"]
        return [f"workload.time_scale={_plain(1.0 / load)}"]

    def fmt(self, load: float) -> str:
        if self.kind == "concurrency":
            n = round(load)
            return f"{n} client{'s' if n != 1 else ''}"
        if self.kind == "speed":
            return f"{load:g}x trace speed"
        return f"{load:g} {self.unit}"


def switch_overrides(speculation, policy: str, tree: bool = False) -> list[str]:
    """``--set`` overrides that drop the scenario's engine switches a swept candidate refuses:
    max_concurrency (policy fixed only), the acceptance off-switch (fixed or by_batch),
    adaptive_steps' config (its own policy) and an acceptance shift (chains only). A planner
    comparing policies runs each as its engine would be configured for it; a scenario that sets
    none of them gets none, so its sweep is as before."""
    drop = []
    if speculation.max_concurrency is not None and policy != "fixed":
        drop.append("max_concurrency")
    if speculation.acceptance_gate is not None and policy not in ("fixed", "by_batch"):
        drop.append("acceptance_gate")
    if speculation.adaptive_steps is not None and policy != "adaptive_steps":
        drop.append("adaptive_steps")
    if speculation.acceptance_shift is not None and tree:
        drop.append("acceptance_shift")
    return [f"speculation.{key}=null" for key in drop]


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def k_text(ks: Sequence[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``"0..3"``; ``[0, 2, 4]`` -> ``"0, 2, 4"``."""
    ks = sorted(ks)
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}..{ks[-1]}"
    return ", ".join(str(k) for k in ks)


def _plain(value: float) -> str:
    """A float as a short, exact-enough override text (repr keeps it round-trippable)."""
    return repr(float(value))


def load_axis(scenario) -> LoadAxis:
    kind = scenario.workload.kind
    if kind in OPEN_LOOP:
        return LoadAxis("rate", "arrival rate (req/s)", "req/s", float(scenario.workload.rate))
    if kind == "closed_loop":
        return LoadAxis(
            "concurrency", "concurrency (clients)", "clients", float(scenario.workload.concurrency)
        )
    return LoadAxis(
        "speed", "trace speed (x recorded rate)", "x", 1.0 / scenario.workload.time_scale
    )


def default_loads(axis: LoadAxis, max_batch: int) -> list[float]:
    """A ladder around the scenario's load, wide enough to show where speculation stops paying."""
    if axis.kind == "concurrency":
        ladder, c = [], 1
        while c <= max_batch:
            ladder.append(float(c))
            c *= 2
        return ladder
    return [round(axis.base * f, 6) for f in (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)]


MAX_LOADS = 64


def parse_loads(values: Sequence[str] | None, option: str = "--loads") -> list[float] | None:
    """``--loads 1 2 4`` or ``--loads 1,2,4``: positive numbers, sorted, duplicates dropped."""
    if values is None:
        return None
    items = [t for v in values for t in re.split(r"[,\s]+", str(v).strip()) if t]
    if not items:
        raise SpecsimError("the load list is empty", key=option, fix="give loads, e.g. 1,2,4")
    loads = []
    for item in items:
        try:
            load = float(item)
        except ValueError:
            raise SpecsimError(
                f"load {item!r} is not a number", key=option, fix="give numbers, e.g. 1,2,4"
            ) from None
        if not math.isfinite(load) or load <= 0:
            raise SpecsimError(
                f"load {item} must be positive", key=option, fix="give loads above 0"
            )
        loads.append(load)
    loads = sorted(set(loads))
    if len(loads) > MAX_LOADS:
        raise SpecsimError(
            f"{len(loads):,} loads: a sweep simulates every k at each, so past {MAX_LOADS} it "
            "runs for hours and adds nothing a plot can show",
            key=option,
            fix=f"give at most {MAX_LOADS} loads",
        )
    return loads


def check_loads(
    scenario_path: str | Path,
    overrides: Sequence[str],
    axis: LoadAxis,
    loads: Sequence[float],
    seed: int,
    option: str = "--loads",
) -> None:
    """Refuse a load at which the scenario cannot run (a rate past the bound, too many
    requests) before the sweep starts, so that nothing is written: as failed points, every
    simulation at it would be recorded in --out."""
    from specsim.scenario import load_scenario

    for load in loads:
        try:
            load_scenario(scenario_path, [*overrides, f"seed={seed}", *axis.overrides(load)])
        except SpecsimError as exc:
            where = f"{exc.key}: " if exc.key else ""
            raise SpecsimError(
                f"at {axis.fmt(load)} the scenario cannot run ({where}{exc.message})",
                key=option,
                fix=f"give {option} within the scenario's bounds ({exc.fix or 'see the message'})",
            ) from None


@dataclass(frozen=True)
class ListWords:
    """What a list option's refusals say: ``{part}`` is the piece refused, ``{lo}``..``{hi}`` its
    range, ``{low}``..``{high}`` the option's (each option keeps the words its users know)."""

    unreadable: str
    unreadable_fix: str
    reversed: str
    reversed_fix: str
    outside: str
    outside_fix: str
    none: str
    none_fix: str


_OUTSIDE = "{part!r} is outside {low}..{high} (or an empty range)"
COUNT_WORDS = ListWords(
    unreadable="cannot read {part!r} as whole numbers",
    unreadable_fix="write e.g. 1,2,4 or 1..4",
    reversed=_OUTSIDE,
    reversed_fix="give values from {low} to {high}",
    outside=_OUTSIDE,
    outside_fix="give values from {low} to {high}",
    none="no values given",
    none_fix="write e.g. 1,2,4",
)
_K_WORDS = ListWords(
    unreadable="cannot read {part!r} as k values",
    unreadable_fix="write e.g. 0..8 or 0,2,4",
    reversed="empty k range {part!r}",
    reversed_fix="write low..high",
    outside="k = {hi} is more than a window takes (at most {high})",
    outside_fix="give k values from {low} to {high}",
    none="no k values given",
    none_fix="write e.g. 0..8",
)


def parse_counts(
    text: str | None,
    option: str,
    low: int,
    high: int,
    words: ListWords = COUNT_WORDS,
    dashes: bool = False,
) -> list[int] | None:
    """``1,3,5``, ``2..4`` (with ``dashes`` also ``2-4``) or a mix: distinct whole numbers in
    [low, high], sorted."""
    if text is None:
        return None
    ranges = r"(?:\.\.|-)" if dashes else r"\.\."
    values: set[int] = set()
    for part in [p for p in re.split(r"[,\s]+", str(text).strip()) if p]:
        match = re.fullmatch(rf"(\d+)(?:{ranges}(\d+))?", part)
        if not match:
            raise _refusal(words.unreadable, words.unreadable_fix, option, part=part)
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        where = dict(part=part, lo=lo, hi=hi, low=low, high=high)
        if hi < lo:
            raise _refusal(words.reversed, words.reversed_fix, option, **where)
        if lo < low or hi > high:
            raise _refusal(words.outside, words.outside_fix, option, **where)
        values.update(range(lo, hi + 1))
    if not values:
        raise _refusal(words.none, words.none_fix, option)
    return sorted(values)


def _refusal(message: str, fix: str, option: str, **where: Any) -> SpecsimError:
    return SpecsimError(message.format(**where), key=option, fix=fix.format(**where))


def parse_k_values(text: str | None, option: str = "--k") -> list[int] | None:
    """``0..8``, ``0-8``, ``0,2,4`` or a mix (``0,2..4``): distinct window sizes, sorted."""
    return parse_counts(text, option, 0, MAX_K, _K_WORDS, dashes=True)


def answerable_k(profile, speculation) -> int:
    """The largest k the profile can answer for the scenario's drafter and verifier.

    Per-position acceptance is measured for ``len(per_position)`` positions; beyond them the
    simulator would repeat the last rate, which is a guess, not a measurement. One i.i.d. rate and
    replayed sequences answer any k. A target latency fit that refuses queries outside its
    measured range also caps k at its largest measured new-token count - 1 (verification width),
    and a block drafter at its ``max_k`` (the drafts its trained block holds).
    """
    entry = profile.acceptance(speculation.drafter, speculation.verifier, speculation.temperature)
    limit = 32 if speculation.acceptance in ("iid", "sequences") else len(entry.per_position)
    latency = profile.profile.target.latency
    if latency is not None and latency.outside_range == "error" and latency.valid_range:
        limit = min(limit, latency.valid_range.new_tokens[1] - 1)
    block = profile.drafter(speculation.drafter).max_k
    return limit if block is None else min(limit, block)


def check_k_values(ks: list[int], limit: int, drafter: str, profile_path: Path | str) -> None:
    too_big = [k for k in ks if k > limit]
    if too_big:
        raise SpecsimError(
            f"k = {too_big[0]} is beyond what the profile can answer for drafter {drafter!r} "
            f"(it answers k up to {limit}: measured acceptance positions, the target fit's range "
            "and a block drafter's max_k)",
            file=str(profile_path),
            key="acceptance.per_position",
            fix=f"use --k 0..{limit}, or profile more positions where those are the limit",
        )


# -- metrics --------------------------------------------------------------------------------------


def metric(summary: Mapping[str, Any] | None, name: str, stat: str | None = None) -> float | None:
    """``metric(s, "e2e_s", "p99")``; None where the summary lacks it (a failed point)."""
    if summary is None:
        return None
    value = summary.get(name)
    if stat is not None:
        value = value.get(stat) if isinstance(value, Mapping) else None
    elif isinstance(value, Mapping):
        value = value.get("mean")
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def choose(candidates: Sequence[tuple[Any, Mapping[str, Any] | None]], use_slo: bool) -> Any:
    """The label of the best candidate by the module's rule; candidates in tie-break order."""
    scored = [(label, s) for label, s in candidates if s is not None]
    if not scored:
        return None
    if use_slo:
        goodput = [metric(s, "goodput_requests_per_s") or 0.0 for _, s in scored]
        served = [metric(s, "throughput_requests_per_s") or 0.0 for _, s in scored]
        band = GOODPUT_TIE * max(*served, *goodput)
        best = max(goodput)
        scored = [item for item, g in zip(scored, goodput, strict=True) if g >= best - band]
    return min(enumerate(scored), key=lambda item: (_mean_e2e(item[1][1]), item[0]))[1][0]


def _mean_e2e(summary: Mapping[str, Any]) -> float:
    value = metric(summary, "e2e_s", "mean")
    return math.inf if value is None else value


def without_pools(scenario) -> list[str]:
    """Overrides that replace a scenario's pools by plain replicas running the swept settings.

    A pool's own speculation settings would override what the planner sweeps, so the planner
    runs the scenario's top-level settings on the same number of replicas instead.
    """
    if not scenario.fleet.pools:
        return []
    return ["fleet.pools=[]", f"fleet.replicas={scenario.fleet.total_replicas}"]


def lossy_note(profile, speculation) -> str | None:
    """None for an exact verifier; for a lossy one, what it costs in distribution distance.

    The distance is the profile's ``tv_distance`` for that drafter and verifier. The planner does
    not compute one (that would need the models and torch); it says so when the profile lacks it.
    """
    if speculation.drafter is None or speculation.verifier not in LOSSY_VERIFIERS:
        return None
    entry = profile.acceptance(speculation.drafter, speculation.verifier, speculation.temperature)
    distance = (
        f"TV distance from p = {entry.tv_distance:.3g} (profile)"
        if entry.tv_distance is not None
        else "distance from p not measured (the profile has no tv_distance)"
    )
    return (
        f"{speculation.verifier} acceptance is lossy: the output is not the target model's "
        f"distribution; {distance}"
    )


def method_text(scenario, seed: int) -> str:
    """One paragraph on how the numbers were made, shared by the three reports."""
    w = scenario.workload
    size = f"{w.requests} requests" if w.requests else f"{w.duration_s:g} s of arrivals"
    if w.requests and w.duration_s:
        size = f"{w.requests} requests or {w.duration_s:g} s of arrivals, whichever ends first"
    return (
        f"Each point is one simulation of {size} ({w.kind} workload) on the profile "
        f"`{scenario.profile}`. Every point uses seed {seed}, so arrivals and lengths are the "
        "same across k and drafters and differences come from the setting compared (common "
        "random numbers); latency percentiles are per request, throughput is over the run."
    )


def slo_text(scenario) -> str:
    if scenario.slo is None:
        return "none"
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "end-to-end", "queueing_s": "queueing"}
    return ", ".join(f"{names[k]} ≤ {v:g} s" for k, v in scenario.slo.limits().items())


def scenario_identity(path: str | Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The part of a sweep's identity that names its inputs (content, not only the path)."""
    from specsim.planning.sweep.points import referenced_digest

    return {
        "scenario": str(Path(path).resolve()),
        "content": referenced_digest(path, list(overrides)),
        "overrides": list(overrides),
    }


def not_fitting_rows(unfit: list[tuple[str, str]]) -> list[dict[str, str]]:
    """summary.json's ``not_fitting``: each candidate that cannot be deployed, and why."""
    return [{"candidate": what, "reason": why} for what, why in unfit]


def rows_csv(columns: Sequence[str], rows: list[dict[str, Any]]) -> str:
    """``rows`` (mappings) as CSV text with ``columns`` as its header."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
