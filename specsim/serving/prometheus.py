"""Prometheus ``/metrics`` scrapes: the engines' acceptance series (the text parser:
``prometheus_text``).

vLLM (V1 engine) exports, per engine and model, the counters (engine-formats.md section 2)

* ``vllm:spec_decode_num_drafts``: speculative steps (requests x iterations that drafted);
* ``vllm:spec_decode_num_draft_tokens``: tokens drafted;
* ``vllm:spec_decode_num_accepted_tokens``: tokens accepted;
* ``vllm:spec_decode_num_accepted_tokens_per_pos`` with a ``position`` label: steps whose draft
  at that position was accepted (the accepted prefix, so it is unconditional: the share of steps
  whose first i + 1 drafts were all accepted).

(The exposition format appends ``_total`` to counters; both spellings are read.) Several label
sets (engines, models) are summed, optionally filtered by labels. From the sums: the
unconditional per-position rates u_i = per_pos_i / drafts, the conditional chain rates
u_i / u_(i-1), and the mean acceptance length 1 + accepted / drafts at the deployed k. They are
totals since the server started, not one run's.

SGLang exports gauges instead (engine-formats.md section 4.4): ``sglang:spec_accept_length``
(accepted drafts + bonus per forward) and ``sglang:spec_accept_rate`` (accepted / proposed
drafts), both over the latest logging interval only, and ``sglang:spec_num_steps``; no
per-position series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from specsim.bounds import MAX_COUNT, MAX_K
from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.serving.prometheus_text import Sample, matches, parse_prometheus
from specsim.serving.runs import SpecCounters

PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


@dataclass(frozen=True)
class SpecDecodeCounters:
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: list[float]  # accepted-at-position counts, position 0 first
    series: int  # label sets (or requests) summed
    series_of: str = "label sets"

    @property
    def k(self) -> int:
        """The deployed window: positions reported (vLLM reports every position up to k)."""
        return len(self.per_position)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    def unconditional_rates(self) -> list[float]:
        return [c / self.drafts for c in self.per_position]

    def conditional_rates(self) -> list[float]:
        """u_0, u_1 / u_0, ...; stops before a position no step reached."""
        rates, previous = [], 1.0
        for u in self.unconditional_rates():
            if previous <= 0:
                break
            rates.append(min(max(u / previous, 0.0), 1.0))
            previous = u
        return rates


def _base(name: str) -> str | None:
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX) :]
    if rest.endswith("_created"):
        return None
    rest = rest.removesuffix("_total")
    return rest if rest in COUNTERS else None


# Labels whose values are summed over (one deployment's engines); any other label that varies
# among the matched series means counters of different deployments would be mixed.
SUMMED_LABELS = ("engine",)


def _refuse_mixed_series(series: set[tuple[tuple[str, str], ...]], source: str) -> None:
    values: dict[str, set[str]] = {}
    for labels in series:
        for key, value in labels:
            if key not in SUMMED_LABELS:
                values.setdefault(key, set()).add(value)
    keys = {k for k in values if len(values[k]) > 1}
    if not keys:
        return
    for labels in series:  # a label missing from some series also splits them
        keys |= {k for k in values if k not in dict(labels)}
    key = sorted(keys)[0]
    shown = ", ".join(sorted(values[key]))
    raise SpecsimError(
        f"the counters come from several deployments ({key} = {shown}); adding them together "
        "would mix different drafters and models",
        file=source,
        key=key,
        fix=f"pick one with --label {key}=VALUE",
    )


def read_counters(
    path: str | Path, label_filter: dict[str, str] | None = None
) -> SpecDecodeCounters:
    """Sum vLLM's speculative-decoding counters over the label sets matching ``label_filter``."""
    source = str(path)
    samples = parse_prometheus(read_text(path, "metrics dump"), source)
    return counters_from_samples(samples, source, label_filter)


def counters_from_samples(
    samples: list[Sample], source: str, label_filter: dict[str, str] | None = None
) -> SpecDecodeCounters:
    """``read_counters`` over samples already parsed from ``source``."""
    totals = dict.fromkeys(COUNTERS[:3], 0.0)
    per_pos: dict[int, float] = {}
    series = set()
    for sample in samples:
        base = _base(sample.name)
        if base is None:
            continue
        if not matches(sample, label_filter):
            continue
        others = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "position"))
        series.add(others)
        if not (math.isfinite(sample.value) and 0 <= sample.value <= MAX_COUNT):
            raise SpecsimError(
                f"counter value {sample.value:g} is not a count from 0 to {MAX_COUNT:.0e}",
                file=source,
                key=f"line {sample.line}",
                fix="give the unmodified /metrics text of vLLM",
            )
        if base == "num_accepted_tokens_per_pos":
            if "position" not in sample.labels or not sample.labels["position"].isdigit():
                raise SpecsimError(
                    "per-position counter without an integer 'position' label",
                    file=source,
                    key=f"line {sample.line}",
                    fix="give the unmodified /metrics text of vLLM",
                )
            position = int(sample.labels["position"])
            if position >= MAX_K:
                raise SpecsimError(
                    f"position {position} is past the longest window specsim models "
                    f"(k up to {MAX_K})",
                    file=source,
                    key=f"line {sample.line}",
                    fix="give the unmodified /metrics text of vLLM",
                )
            per_pos[position] = per_pos.get(position, 0.0) + sample.value
        else:
            totals[base] += sample.value
    _refuse_mixed_series(series, source)
    if totals["num_drafts"] <= 0:
        what = f" with labels {label_filter}" if label_filter else ""
        raise SpecsimError(
            f"no speculative steps counted{what} ({PREFIX}num_drafts is absent or 0)",
            file=source,
            key=f"{PREFIX}num_drafts",
            fix="scrape a vLLM server with speculative decoding on, after it served requests",
        )
    if not per_pos:
        raise SpecsimError(
            "no per-position acceptance counters",
            file=source,
            key=f"{PREFIX}num_accepted_tokens_per_pos",
            fix="use a vLLM version that exports per-position acceptance",
        )
    _check_consistent(totals, per_pos, source)
    width = max(per_pos) + 1
    return SpecDecodeCounters(
        drafts=totals["num_drafts"],
        draft_tokens=totals["num_draft_tokens"],
        accepted=totals["num_accepted_tokens"],
        per_position=[per_pos.get(i, 0.0) for i in range(width)],
        series=len(series),
    )


def _check_consistent(totals: dict[str, float], per_pos: dict[int, float], source: str) -> None:
    """Counters that no server can have produced: a damaged or hand-edited scrape."""
    drafts = totals["num_drafts"]
    problems = []
    if totals["num_accepted_tokens"] > totals["num_draft_tokens"]:
        problems.append("more tokens accepted than drafted")
    if totals["num_draft_tokens"] > drafts * MAX_K:
        problems.append(f"more than {MAX_K} draft tokens per speculative step")
    if any(count > drafts for count in per_pos.values()):
        problems.append("a position accepted in more steps than there were")
    skipped = [i for i in range(max(per_pos)) if i not in per_pos]
    if skipped:  # vLLM exports every position up to k, accepted or not
        problems.append(f"the position labels skip {skipped[0]}")
    if problems:
        raise SpecsimError(
            f"the counters disagree: {problems[0]}",
            file=source,
            key=f"{PREFIX}num_accepted_tokens",
            fix="give the unmodified /metrics text of vLLM, scraped at one moment",
        )


# -- what a scrape says of acceptance, in the benchmark runs' terms --------------------------------

SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"
SGLANG_NUM_STEPS = "sglang:spec_num_steps"


@dataclass(frozen=True)
class Scrape:
    """The acceptance a /metrics scrape reports, with what it averages over."""

    source: str
    engine: str  # the registry's name of the engine that exported it
    speculation: SpecCounters
    notes: tuple[str, ...]


def spec_counters(counters: SpecDecodeCounters) -> SpecCounters:
    """vLLM's summed counters as a run's ``SpecCounters`` (unconditional per-position rates)."""
    return SpecCounters(
        k=counters.k,
        num_drafts=int(counters.drafts),
        draft_tokens=int(counters.draft_tokens),
        accepted_tokens=int(counters.accepted),
        per_position=tuple(counters.unconditional_rates()),
        acceptance_length=counters.mean_acceptance_length,
        acceptance_rate=counters.draft_acceptance_rate,
    )


def _gauge(samples: list[Sample], name: str, source: str, labels: dict[str, str] | None):
    """The one value of gauge ``name`` (None when absent); differing series are refused."""
    found = [s for s in samples if s.name == name and matches(s, labels)]
    values = {s.value for s in found}
    if len(values) > 1:
        shown = ", ".join(f"{s.labels} = {s.value:g}" for s in found)
        raise SpecsimError(
            f"{len(found)} series with different values ({shown})",
            file=source,
            key=name,
            fix="pick one with --label KEY=VALUE",
        )
    if not found:
        return None
    value = found[0].value
    if not math.isfinite(value) or value < 0:
        raise SpecsimError(
            f"{value:g} is not a finite, non-negative value",
            file=source,
            key=f"line {found[0].line}",
            fix="give the unmodified /metrics text of SGLang",
        )
    return value


def sglang_gauges(
    samples: list[Sample], source: str, label_filter: dict[str, str] | None = None
) -> SpecCounters:
    """SGLang's acceptance gauges as a scalar-only ``SpecCounters`` (k from spec_num_steps)."""
    length = _gauge(samples, SGLANG_ACCEPT_LENGTH, source, label_filter)
    rate = _gauge(samples, SGLANG_ACCEPT_RATE, source, label_filter)
    steps = _gauge(samples, SGLANG_NUM_STEPS, source, label_filter)
    if not length and not rate:
        raise SpecsimError(
            "no speculative steps in the latest logging interval (both gauges absent or 0)",
            file=source,
            key=SGLANG_ACCEPT_LENGTH,
            fix="scrape SGLang while it serves requests with speculative decoding on",
        )
    k = None
    if steps:
        if steps != int(steps) or steps > MAX_K:
            raise SpecsimError(
                f"{steps:g} is not a whole number of steps from 1 to {MAX_K}",
                file=source,
                key=SGLANG_NUM_STEPS,
                fix="give the unmodified /metrics text of SGLang",
            )
        k = int(steps)
    top = (k or MAX_K) + 1
    if length is not None and length and not 1 <= length <= top:
        raise SpecsimError(
            f"acceptance length {length:g} is outside [1, {top}] (bonus token included)",
            file=source,
            key=SGLANG_ACCEPT_LENGTH,
            fix="give the unmodified /metrics text of SGLang",
        )
    if rate is not None and rate > 1:
        raise SpecsimError(
            f"acceptance rate {rate:g} is above 1",
            file=source,
            key=SGLANG_ACCEPT_RATE,
            fix="give the unmodified /metrics text of SGLang",
        )
    return SpecCounters(
        k=k, acceptance_length=length or None, acceptance_rate=rate, scalar_only=True
    )


def vllm_scrape(samples: list[Sample], source: str, label_filter) -> Scrape | None:
    """vLLM's spec-decode counters (None: the scrape has none)."""
    if not any(_base(s.name) for s in samples):
        return None
    counters = counters_from_samples(samples, source, label_filter)
    note = "vLLM's counters are totals since the server started, not one run's"
    return Scrape(source, "vllm", spec_counters(counters), (note,))


def sglang_scrape(samples: list[Sample], source: str, label_filter) -> Scrape | None:
    """SGLang's acceptance gauges (None: the scrape has none)."""
    if not any(s.name.startswith("sglang:spec_") for s in samples):
        return None
    note = (
        "SGLang's gauges hold the latest logging interval only (one value per mean "
        "acceptance length and rate), not an average over a run"
    )
    return Scrape(source, "sglang", sglang_gauges(samples, source, label_filter), (note,))


# The engines' scrape readers, tried in order; the engine registry names each its own.
SCRAPERS = (vllm_scrape, sglang_scrape)


def read_scrape(path: str | Path, label_filter: dict[str, str] | None = None) -> Scrape:
    """The acceptance in a vLLM or SGLang /metrics scrape, the engine told from the series."""
    source = str(path)
    samples = parse_prometheus(read_text(path, "metrics dump"), source)
    for scraper in SCRAPERS:
        scrape = scraper(samples, source, label_filter)
        if scrape is not None:
            return scrape
    raise SpecsimError(
        "no speculative-decoding series of vLLM (vllm:spec_decode_*) or SGLang "
        "(sglang:spec_accept_length)",
        file=source,
        fix="scrape the /metrics of a server with speculative decoding on",
    )
