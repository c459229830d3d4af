"""The Prometheus text exposition format: a ``/metrics`` scrape's samples, with their labels."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specsim.errors import SpecsimError

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
                fix="give the /metrics text as the server wrote it",
            ) from None
        samples.append(Sample(match.group("name"), labels, value, number))
    return samples


def _unescape(value: str) -> str:
    """Prometheus label escapes: backslash, double quote and newline."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def matches(sample: Sample, labels: dict[str, str] | None) -> bool:
    """Whether ``sample`` carries every label of ``labels`` (None or empty: any sample)."""
    return not labels or all(sample.labels.get(k) == v for k, v in labels.items())
