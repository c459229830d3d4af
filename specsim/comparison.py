"""A run's summary against a baseline's, metric by metric: what got better, what got worse.

Every summary that sets one configuration against another (``simulate --compare-baseline``,
the drafter-swap recommendation, the capacity plan's fleet against speculation off) compares
the same metrics, ``COMPARED``, and states every one that got worse. A metric counts as worse
when it moved the wrong way by at least ``UNCHANGED`` relative to the baseline (latency and cost
up, throughput and goodput down); smaller moves are reported as unchanged.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

UNCHANGED = 0.005  # relative change below which a metric counts as unchanged

# (metric key in summary.json, statistic or None, label, higher is better)
COMPARED: tuple[tuple[str, str | None, str, bool], ...] = (
    *(
        (key, stat, f"{label} {stat}", False)
        for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
        for stat in ("mean", "p50", "p90", "p99")
    ),
    ("throughput_tokens_per_s", None, "throughput", True),
    ("goodput_requests_per_s", None, "goodput", True),
    ("cost_usd_per_million_tokens", None, "cost per million tokens", False),
)


@dataclass(frozen=True)
class Change:
    """One compared metric. ``worse_by`` is the relative change in the bad direction (0.3: 30 %
    worse; negative: better), None when the baseline's value is 0."""

    metric: str  # "ttft_s.p99" style, as in validate's comparison.json
    label: str
    value: float
    baseline: float
    worse_by: float | None

    @property
    def worse(self) -> bool:
        return self.worse_by is not None and self.worse_by >= UNCHANGED

    @property
    def higher_is_better(self) -> bool:
        return any(self.metric == _name(k, s) and up for k, s, _, up in COMPARED)

    def words(self) -> str:
        """'TTFT p99 37 % higher' (the direction the value moved, by how much)."""
        if self.worse_by is None:
            return f"{self.label} {self.value:.4g} against 0"
        moved_up = (self.worse_by > 0) != self.higher_is_better
        return f"{self.label} {abs(self.worse_by):.0%} {'higher' if moved_up else 'lower'}"


def _name(key: str, stat: str | None) -> str:
    return key if stat is None else f"{key}.{stat}"


def _value(summary: dict[str, Any] | None, key: str, stat: str | None) -> float | None:
    if summary is None or key not in summary:
        return None
    value = summary[key] if stat is None else summary[key].get(stat)
    return None if value is None else float(value)


def compare(summary: dict[str, Any], baseline: dict[str, Any]) -> list[Change]:
    """Every compared metric both summaries hold (goodput only where an SLO defines it)."""
    out = []
    for key, stat, label, higher_is_better in COMPARED:
        if key == "goodput_requests_per_s" and not (summary.get("slo") or baseline.get("slo")):
            continue  # without an SLO every request counts: goodput is the request rate
        value, base = _value(summary, key, stat), _value(baseline, key, stat)
        if value is None or base is None:
            continue
        worse_by = None
        if base != 0:
            worse_by = (base - value) / base if higher_is_better else (value - base) / base
        out.append(Change(_name(key, stat), label, value, base, worse_by))
    return out


def regressions(changes: Sequence[Change]) -> list[Change]:
    """The changes that are worse, the largest first."""
    worse = [c for c in changes if c.worse]
    return sorted(worse, key=lambda c: -(c.worse_by or 0.0))


def regressions_json(changes: Sequence[Change]) -> list[dict[str, Any]]:
    return [asdict(c) for c in regressions(changes)]


def regressions_text(changes: Sequence[Change], subject: str = "") -> str:
    """'worse: TTFT p99 37 % higher, ...' or that none of the compared metrics is worse."""
    worse = regressions(changes)
    if not worse:
        return f"{subject}none of the {len(changes)} compared metrics is worse"
    return subject + ", ".join(c.words() for c in worse)


def across_loads(
    pairs: Sequence[tuple[float, dict[str, Any] | None, dict[str, Any] | None]],
) -> list[dict[str, Any]]:
    """The metrics that are worse at some load, from (load, summary, baseline) triples: for each,
    the loads where it is worse and the range of how much (min, median, max), largest first."""
    worse: dict[str, dict[str, Any]] = {}
    compared = 0
    for load, summary, baseline in pairs:
        if summary is None or baseline is None:
            continue
        compared += 1
        for change in regressions(compare(summary, baseline)):
            entry = worse.setdefault(
                change.metric, {"metric": change.metric, "label": change.label, "by_load": []}
            )
            entry["by_load"].append({"load": load, "worse_by": change.worse_by})
    out = []
    for entry in worse.values():
        amounts = [item["worse_by"] for item in entry["by_load"]]
        entry["loads_worse"] = len(amounts)
        entry["loads_compared"] = compared
        entry["worse_by"] = {
            "min": min(amounts),
            "median": statistics.median(amounts),
            "max": max(amounts),
        }
        out.append(entry)
    return sorted(out, key=lambda e: -e["worse_by"]["max"])


def across_loads_text(entries: Sequence[dict[str, Any]]) -> str:
    """'TTFT p99 22-30 % higher (at 3 of 3 loads), ...' for ``across_loads``' entries."""
    parts = []
    for e in entries:
        low, high = e["worse_by"]["min"], e["worse_by"]["max"]
        amount = f"{high:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"{low * 100:.0f}–{high:.0%}"
        higher_is_better = any(_name(k, s) == e["metric"] and up for k, s, _, up in COMPARED)
        direction = "lower" if higher_is_better else "higher"
        parts.append(
            f"{e['label']} {amount} {direction} (at {e['loads_worse']} of "
            f"{e['loads_compared']} loads)"
        )
    return ", ".join(parts)
