"""A benchmark run's prefix-cache hit share: the share of its prompt tokens the server found
in its prefix cache, which the replayed workload then skips (``workload.prefix`` source
'fraction').

- From a /metrics scrape (``--metrics RESULT=SCRAPE``): vLLM's token counters
  ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` (``_total`` as exported), summed
  over their series: totals since the server started, not the run's own, as its spec-decode
  counters are; SGLang's ``sglang:cache_hit_rate`` gauge (its latest logging interval).
- Stated (``--prefix-hit RESULT=FRACTION``, or a normalised table's ``prefix_hit_share`` column).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.serving.prometheus_text import Sample
from specsim.serving.runs import BenchRun

OPTION = "--prefix-hit"
VLLM_HITS, VLLM_QUERIES = "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"
SGLANG_RATE = "sglang:cache_hit_rate"


def _total(samples: list[Sample], name: str) -> float | None:
    found = [s.value for s in samples if s.name in (name, f"{name}_total")]
    return sum(found) if found else None


def scrape_share(samples: list[Sample], source: str) -> tuple[float, str] | None:
    """The hit share a scrape reports and what it averages over (None: no cache series)."""
    hits, queries = _total(samples, VLLM_HITS), _total(samples, VLLM_QUERIES)
    if hits is not None and queries is not None:
        if not (math.isfinite(hits) and math.isfinite(queries)) or not 0 <= hits <= queries:
            raise SpecsimError(
                f"{hits:g} hits of {queries:g} queried tokens",
                file=source,
                key=VLLM_HITS,
                fix="give the unmodified /metrics text of vLLM",
            )
        if queries == 0:
            return None
        return hits / queries, "vLLM's prefix-cache counters: totals since the server started"
    rate = [s.value for s in samples if s.name == SGLANG_RATE]
    if rate:
        if len(set(rate)) > 1 or not 0 <= rate[0] <= 1:
            raise SpecsimError(
                f"not one share in [0, 1] ({', '.join(f'{r:g}' for r in rate)})",
                file=source,
                key=SGLANG_RATE,
                fix="give the unmodified /metrics text of one SGLang server",
            )
        return rate[0], "SGLang's cache_hit_rate gauge: its latest logging interval"
    return None


def parse_share(text: str) -> tuple[str, float]:
    """``RESULT=SHARE`` as (result, share)."""
    result, sep, share = text.partition("=")
    try:
        value = float(share)
    except ValueError:
        value = math.nan
    if not sep or not result or not 0 <= value <= 1:
        raise SpecsimError(
            f"{text!r} is not RESULT=FRACTION with a share from 0 to 1",
            file="command line",
            key=OPTION,
            fix="give a benchmark result file and its prefix-cache hit share, e.g. runs.json=0.6",
        )
    return result, value


def state_shares(runs: list[BenchRun], pairs: list[tuple[str, float]]) -> list[BenchRun]:
    """``runs`` with each pair's stated share given to the runs of its result file."""
    by_file = {}
    for result, share in pairs:
        path = Path(result).resolve()
        if path in by_file or not any(Path(r.source).resolve() == path for r in runs):
            raise SpecsimError(
                f"{result} is given twice or is not one of the benchmark result files given",
                file="command line",
                key=OPTION,
                fix="name each result file once, as given to profile from-bench (or under --bench)",
            )
        by_file[path] = share
    out = []
    for run in runs:
        share = by_file.get(Path(run.source).resolve())
        if share is not None:
            note = f"prefix-cache hit share {share:g}, stated ({OPTION})"
            run = replace(run, prefix_hit_share=share, notes=(*run.notes, note))
        out.append(run)
    return out
