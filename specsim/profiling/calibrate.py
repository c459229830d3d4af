"""Acceptance calibrated from production: vLLM's speculative-decoding Prometheus counters.

vLLM exports, per engine and model, the counters

* ``vllm:spec_decode_num_drafts``: speculative steps (requests x iterations that drafted);
* ``vllm:spec_decode_num_draft_tokens``: tokens drafted;
* ``vllm:spec_decode_num_accepted_tokens``: tokens accepted;
* ``vllm:spec_decode_num_accepted_tokens_per_pos`` with a ``position`` label: steps whose draft
  at that position was accepted (the accepted prefix, so it is unconditional: the share of steps
  whose first i + 1 drafts were all accepted).

(The exposition format appends ``_total`` to counters; both spellings are read.) Several label
sets (engines, models) are summed, optionally filtered by labels. From the sums: the
unconditional per-position rates u_i = per_pos_i / drafts, the conditional chain rates
u_i / u_(i-1), and the mean acceptance length 1 + accepted / drafts at the deployed k.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from specsim.bounds import MAX_COUNT, MAX_K
from specsim.errors import SpecsimError
from specsim.fileio import read_text

PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    line: int = 0


def parse_prometheus(text: str, source: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (comments and blank lines skipped)."""
    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise SpecsimError(
                "not a Prometheus sample line",
                file=source,
                key=f"line {number}",
                fix="give the text of a /metrics scrape",
            )
        labels = {}
        raw = match.group("labels") or ""
        pos = 0
        while pos < len(raw):
            label = _LABEL.match(raw, pos)
            if label is None:
                raise SpecsimError(
                    "malformed labels",
                    file=source,
                    key=f"line {number}",
                    fix='write labels as {name="value",...}',
                )
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
        try:
            value = float(match.group("value"))
        except ValueError:
            raise SpecsimError(
                f"sample value {match.group('value')!r} is not a number",
                file=source,
                key=f"line {number}",
            ) from None
        samples.append(Sample(match.group("name"), labels, value, number))
    return samples


def _unescape(value: str) -> str:
    """Prometheus label escapes: backslash, double quote and newline."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


@dataclass(frozen=True)
class SpecDecodeCounters:
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: list[float]  # accepted-at-position counts, position 0 first
    series: int  # label sets summed

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
    totals = dict.fromkeys(COUNTERS[:3], 0.0)
    per_pos: dict[int, float] = {}
    series = set()
    for sample in samples:
        base = _base(sample.name)
        if base is None:
            continue
        if label_filter and any(sample.labels.get(k) != v for k, v in label_filter.items()):
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
    if problems:
        raise SpecsimError(
            f"the counters disagree: {problems[0]}",
            file=source,
            key=f"{PREFIX}num_accepted_tokens",
            fix="give the unmodified /metrics text of vLLM, scraped at one moment",
        )


def calibrated_entry(
    counters: SpecDecodeCounters, drafter: str, verifier: str, temperature: float
) -> dict:
    """A profile acceptance entry (``source: calibrated``) from summed counters."""
    rates = counters.conditional_rates()
    if not rates:
        raise SpecsimError("no position was ever accepted", key="per_position")
    return {
        "drafter": drafter,
        "verifier": verifier,
        "temperature": temperature,
        "per_position": rates,
        "mean_acceptance_length": {counters.k: counters.mean_acceptance_length},
        "source": "calibrated",
        "tokens_scored": int(counters.draft_tokens),
    }


def calibrate_profile(
    profile_path: str | Path,
    metrics_path: str | Path,
    drafter: str,
    verifier: str,
    temperature: float,
    out_path: str | Path,
    label_filter: dict[str, str] | None = None,
):
    """The profile at ``profile_path`` with the (drafter, verifier, temperature) acceptance
    entry replaced by one calibrated from ``metrics_path``. Returns (Profile, counters)."""
    import os

    from specsim.profile import load_profile
    from specsim.profiling.writer import build_profile

    loaded = load_profile(profile_path)
    loaded.drafter(drafter)  # a clear error when the profile lacks it
    counters = read_counters(metrics_path, label_filter)
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
    entry = calibrated_entry(counters, drafter, verifier, temperature)
    kept = [
        a
        for a in data["acceptance"]
        if not (
            a["drafter"] == drafter
            and a["verifier"] == verifier
            and abs(a["temperature"] - temperature) <= 0.05
        )
    ]
    # Sequence files stay where they are; re-point them if the profile moves.
    old_dir, new_dir = Path(profile_path).resolve().parent, Path(out_path).resolve().parent
    for a in kept:
        if "sequences" in a and old_dir != new_dir:
            a["sequences"]["path"] = os.path.relpath(old_dir / a["sequences"]["path"], new_dir)
    data["acceptance"] = [*kept, entry]
    note = (
        f" Acceptance of {drafter}/{verifier} at T={temperature:g} calibrated from "
        f"{Path(metrics_path).name}: {counters.drafts:.0f} speculative steps over "
        f"{counters.series} label set(s), k={counters.k}, draft acceptance rate "
        f"{counters.draft_acceptance_rate:.3f}."
    )
    data["provenance"]["notes"] = (data["provenance"].get("notes", "") + note).strip()
    return build_profile(data, str(out_path)), counters
