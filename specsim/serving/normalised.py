"""specsim's normalised benchmark CSV: one row per run, for results of any other tool.

A tool without a reader of its own (GuideLLM, trtllm-bench, a home-made load test) is turned
into this table by hand or by a short script. Times are in seconds and the metric columns are
named like summary.json's keys (``ttft_s.p99``); an empty cell is an absent value. The columns
are listed in ``COLUMNS``, the checks in ``RULES``. Definitions differ between tools:
GuideLLM's ``inter_token_latency_ms`` is vLLM's TPOT, and its ``time_per_output_token_ms``
includes the first token (GuideLLM 0.8.1, ``guidellm/schemas/base/request_stats.py``), so
convert to the definitions below rather than copying a column by its name.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass

from specsim.bounds import MAX_COUNT, MAX_K, MAX_RATE, MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS
from specsim.parsing import reading_csv
from specsim.serving import registry
from specsim.serving.fields import Where, agree, number
from specsim.serving.runs import (
    METRIC_NAMES,
    BenchRun,
    Lengths,
    SpecCounters,
    Traffic,
    check_pace,
)

FORMAT = "normalised-csv"
ENGINES = (*registry.NAMES, "other")  # "other": a tool of no engine specsim knows
REFERENCE = "docs/reference/bench-csv.md"
FIX = f"correct the row (the columns: {REFERENCE})"


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # text, rate, number, count, flag, rates
    required: bool
    description: str


_METRIC_TEXT = {
    "ttft_s": "time to first token: first token - send",
    "tpot_s": "time per output token after the first: (last - first token) / (tokens - 1), "
    "per request with 2+ tokens",
    "itl_s": "inter-token latency: the gaps between a request's streamed chunks (or tokens: "
    "itl_per_token)",
    "e2e_s": "end-to-end latency: last token - send",
}
COLUMNS = (
    Column("label", "text", False, "a name for the run"),
    Column("model", "text", False, "the served model (runs of two models are refused)"),
    Column("engine", "text", False, f"{', '.join(ENGINES[:-1])} or other (the default)"),
    Column("engine_version", "text", False, "the engine's version"),
    Column(
        "request_rate",
        "rate",
        False,
        "requests per second, inf for all at once; "
        "required unless max_concurrency is given (then inf by default)",
    ),
    Column(
        "burstiness",
        "number",
        False,
        "gamma shape of the inter-arrival times (1, the default, is Poisson; vLLM's --burstiness)",
    ),
    Column("max_concurrency", "count", False, "the client's cap on requests in flight"),
    Column("num_prompts", "count", False, "requests sent (default: completed)"),
    Column("completed", "count", True, "requests completed"),
    Column("duration_s", "number", True, "seconds from the first send to the last response"),
    Column("input_mean", "number", True, "mean prompt tokens of the completed requests"),
    Column("output_mean", "number", True, "mean output tokens of the completed requests"),
    Column("input_min", "count", False, "uniform prompt lengths: the shortest (with input_max)"),
    Column("input_max", "count", False, "uniform prompt lengths: the longest"),
    Column("output_min", "count", False, "uniform output lengths: the shortest (with output_max)"),
    Column("output_max", "count", False, "uniform output lengths: the longest"),
    *(
        Column(f"{name}.{stat}", "number", False, f"{_METRIC_TEXT[name]} ({stat}, seconds)")
        for name in METRIC_NAMES
        for stat in ("mean", "p50", "p90", "p95", "p99")
    ),
    Column(
        "throughput_tokens_per_s",
        "number",
        False,
        "output tokens per second (default: output_mean x completed / duration_s)",
    ),
    Column(
        "request_throughput",
        "number",
        False,
        "completed requests per second (default: completed / duration_s)",
    ),
    Column(
        "prefix_hit_share",
        "number",
        False,
        "the share of prompt tokens the server's prefix cache held (vLLM's "
        "prefix_cache_hits / prefix_cache_queries over the run); absent: no cache hits",
    ),
    Column(
        "itl_per_token",
        "flag",
        False,
        "true when each ITL gap was split over the tokens "
        "of its chunk (SGLang's native client), false (the default) for one gap per chunk",
    ),
    Column("speculation", "flag", False, "on or off; on when any spec_ column is filled"),
    Column("spec_k", "count", False, "tokens drafted per step"),
    Column(
        "spec_num_drafts",
        "count",
        False,
        "speculative steps (vLLM: one per request per verify step)",
    ),
    Column("spec_draft_tokens", "count", False, "tokens drafted"),
    Column("spec_accepted_tokens", "count", False, "draft tokens accepted"),
    Column(
        "spec_acceptance_length",
        "number",
        False,
        "mean tokens per step, the bonus token included: 1 + accepted / drafts",
    ),
    Column("spec_acceptance_rate", "number", False, "accepted / drafted tokens, a fraction"),
    Column(
        "spec_per_position",
        "rates",
        False,
        "semicolon-separated unconditional rates, "
        "position 1 first: the share of steps whose first i drafts were all accepted",
    ),
)
BY_NAME = {column.name: column for column in COLUMNS}
FLAGS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}
# Hand-made tables round their figures to 3 or 4 digits; a percent written for a fraction, or
# conditional rates for unconditional ones, are off by far more than this.
ROUNDED = 1e-3
RULES = (
    "One row per run; the header names the columns used, in any order; an empty cell is an "
    "absent value. A column not listed here is refused (a misspelt name would be lost).",
    "Every number is finite and not negative (`inf` only for request_rate).",
    "At least one latency or throughput column is filled (a published table's throughput-only "
    "row is a run); only the figures measured need be given, and a figure missing is left out.",
    "A line whose first character is # is a comment (a table's source, its units).",
    "An open-loop run (finite request_rate, no max_concurrency) whose duration_s is too short "
    "to send its completed requests at that rate is refused (5 standard deviations of the "
    "arrival process below its expected span).",
    "A speculative run needs spec_acceptance_length, spec_acceptance_rate, spec_per_position "
    "or the counts they come from; where several are given they must agree within "
    f"{ROUNDED:.1%}. A run given only a length or a rate is marked scalar-only.",
    "Every row of one call comes from one model on one engine.",
)
EXAMPLE = (
    "label,model,engine,request_rate,max_concurrency,completed,duration_s,input_mean,"
    "output_mean,ttft_s.p50,ttft_s.p99,tpot_s.mean,tpot_s.p99,e2e_s.p99,spec_k,"
    "spec_per_position\n"
    "rate-2,Qwen/Qwen2.5-7B-Instruct,vllm,2,,120,61.5,512,200,0.074,0.2,0.0151,0.022,4.6,,\n"
    "eagle-c16,Qwen/Qwen2.5-7B-Instruct,vllm,,16,400,95,512,200,0.13,0.33,0.0112,0.02,3.9,3,"
    "0.6;0.45;0.25\n"
)


def _uncommented(text: str) -> str:
    """The table without its comment lines (``#`` first)."""
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("#")
    )


def is_normalised_csv(text: str) -> bool:
    first = next((line for line in _uncommented(text).splitlines() if line.strip()), "")
    try:
        names = next(csv.reader([first]), [])
    except csv.Error:  # a field past the reader's limit: not this table's header
        return False
    return "completed" in names and "duration_s" in names


def read_runs(text: str, source: str, sha256: str) -> list[BenchRun]:
    """One run per row of the table (``COLUMNS``)."""
    with reading_csv(source):
        return _read_rows(csv.DictReader(io.StringIO(_uncommented(text))), source, sha256)


def _read_rows(reader: csv.DictReader, source: str, sha256: str) -> list[BenchRun]:
    header = reader.fieldnames or []
    where = Where(source, fix=FIX)
    for name in header:
        if name not in BY_NAME:
            raise where.error("unknown column", name, fix=f"use the columns of {REFERENCE}")
        if header.count(name) > 1:
            raise where.error("column given twice", name, fix="keep one")
    runs = []
    for index, row in enumerate(reader):
        where = Where(source, index, FIX)
        if None in row:
            raise where.error("more cells than columns", f"line {index + 2}", fix="quote commas")
        cells = {k: v.strip() for k, v in row.items() if v is not None and v.strip()}
        runs.append(_run(cells, where, sha256))
    if not runs:
        raise where.error("no rows", None, fix="write one row per run under the header")
    return runs


def _value(cells, name: str, where: Where, maximum: float, *, integer=False, required=False):
    """A cell as a checked number (``fields.number``); ``inf`` only for a rate."""
    cell = cells.get(name)
    kind = BY_NAME[name].kind
    if cell is not None and not (kind == "rate" and cell.lower() == "inf"):
        try:
            cell = float(cell)
        except ValueError:
            raise where.error(f"{cell!r} is not a number", name, fix="write a number") from None
    value = number(
        {name: cell},
        name,
        where,
        maximum,
        integer=integer,
        required=required,
        allow_inf=kind == "rate",
    )
    if value == 0 and name in (
        "duration_s",
        "completed",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "spec_k",
        "spec_num_drafts",
    ):
        raise where.error("is 0", name)
    return value


def _flag(cells, name: str, where: Where) -> bool | None:
    cell = cells.get(name)
    if cell is None:
        return None
    if cell.lower() not in FLAGS:
        raise where.error(f"{cell!r} is not true or false", name, fix="write true or false")
    return FLAGS[cell.lower()]


def _run(cells: dict[str, str], where: Where, sha256: str) -> BenchRun:
    completed = _value(cells, "completed", where, MAX_REQUESTS, integer=True, required=True)
    duration = _value(cells, "duration_s", where, MAX_SECONDS, required=True)
    cap = _value(cells, "max_concurrency", where, MAX_REQUESTS, integer=True)
    rate = _value(cells, "request_rate", where, MAX_RATE, required=cap is None)
    burstiness = _value(cells, "burstiness", where, MAX_RATE)
    prompts = _value(cells, "num_prompts", where, MAX_REQUESTS, integer=True)
    engine = cells.get("engine", "other")
    if engine not in ENGINES:
        raise where.error(f"{engine!r} is not one of {', '.join(ENGINES)}", "engine")
    metrics = {}
    for column in COLUMNS:
        if column.name.split(".")[0] in METRIC_NAMES and column.name in cells:
            metrics[column.name] = _value(cells, column.name, where, MAX_SECONDS)
    lengths = _lengths(cells, where)
    output_rate = _value(cells, "throughput_tokens_per_s", where, MAX_COUNT)
    request_rate = _value(cells, "request_throughput", where, MAX_RATE)
    if not metrics and output_rate is None and request_rate is None:
        raise where.error(
            "no latency or throughput column is filled",
            "ttft_s.mean",
            fix=f"fill the measured figures ({REFERENCE})",
        )
    metrics["throughput_tokens_per_s"] = (
        lengths.output_mean * completed / duration if output_rate is None else output_rate
    )
    metrics["request_throughput"] = completed / duration if request_rate is None else request_rate
    run = BenchRun(
        source=where.source,
        sha256=sha256,
        index=where.run,
        format=FORMAT,
        engine=engine,
        engine_version=cells.get("engine_version"),
        model=cells.get("model"),
        label=cells.get("label"),
        traffic=Traffic(
            math.inf if rate is None else rate, burstiness or 1.0, cap, prompts or completed
        ),
        lengths=lengths,
        duration_s=duration,
        completed=completed,
        metrics=dict(sorted(metrics.items())),
        itl_per_token=bool(_flag(cells, "itl_per_token", where)),
        speculation=_speculation(cells, where),
        prefix_hit_share=_value(cells, "prefix_hit_share", where, 1.0),
    )
    check_pace(run, "request_rate", "duration_s")
    return run


def _lengths(cells, where: Where) -> Lengths:
    means = [
        _value(cells, f"{side}_mean", where, MAX_TOKENS, required=True)
        for side in ("input", "output")
    ]
    ranges = []
    for side, mean in zip(("input", "output"), means, strict=True):
        low = _value(cells, f"{side}_min", where, MAX_TOKENS, integer=True)
        high = _value(cells, f"{side}_max", where, MAX_TOKENS, integer=True)
        if (low is None) != (high is None):
            raise where.error("give both ends of the range or neither", f"{side}_min/{side}_max")
        if low is not None and not low <= mean <= high:
            raise where.error(f"the mean {mean:g} is outside [{low}, {high}]", f"{side}_mean")
        ranges.append(None if low is None else (low, high))
    return Lengths(means[0], means[1], input_range=ranges[0], output_range=ranges[1])


def _rates(cells, where: Where) -> tuple[float, ...] | None:
    cell = cells.get("spec_per_position")
    if cell is None:
        return None
    key = "spec_per_position"
    try:
        rates = tuple(float(part) for part in cell.split(";"))
    except ValueError:
        raise where.error(f"{cell!r} is not numbers separated by ;", key) from None
    for rate in rates:
        number({key: rate}, key, where, 1.0)
    if len(rates) > MAX_K or any(b > a for a, b in itertools.pairwise(rates)):
        raise where.error(f"not {MAX_K} or fewer non-increasing (unconditional) rates", key)
    return rates


def _speculation(cells, where: Where) -> SpecCounters | None:
    filled = [name for name in cells if name.startswith("spec_")]
    on = _flag(cells, "speculation", where)
    if on is None:
        on = bool(filled)
    if not on:
        if filled:
            raise where.error("filled, but speculation is off", filled[0], fix="empty it")
        return None
    k = _value(cells, "spec_k", where, MAX_K, integer=True)
    drafts = _value(cells, "spec_num_drafts", where, MAX_COUNT, integer=True)
    drafted = _value(cells, "spec_draft_tokens", where, MAX_COUNT, integer=True)
    accepted = _value(cells, "spec_accepted_tokens", where, MAX_COUNT, integer=True)
    length = _value(cells, "spec_acceptance_length", where, MAX_K + 1)
    rate = _value(cells, "spec_acceptance_rate", where, 1.0)
    rates = _rates(cells, where)
    if rates is not None and k is not None and len(rates) != k:
        raise where.error(f"{len(rates)} rates for spec_k = {k}", "spec_per_position")
    k = k or (len(rates) if rates else None)
    if accepted is not None and drafted is not None and accepted > drafted:
        raise where.error("more tokens accepted than drafted", "spec_accepted_tokens")
    counted_length = 1 + accepted / drafts if accepted is not None and drafts else None
    counted_rate = accepted / drafted if accepted is not None and drafted else None
    checks = [
        ("spec_acceptance_length", length, counted_length),
        ("spec_acceptance_rate", rate, counted_rate),
    ]
    if rates and length is not None:  # unconditional rates sum to the accepted per step
        checks.append(("spec_per_position", sum(rates), length - 1))
    for key, given, derived in checks:
        if given is not None and derived is not None and not agree(given, derived, ROUNDED):
            raise where.error(
                f"{given:g} disagrees with the other spec_ columns ({derived:g})", key
            )
    if length is None:
        length = (
            counted_length if counted_length is not None else (1 + sum(rates) if rates else None)
        )
    if rate is None:
        rate = counted_rate
    if length is None and rate is None:
        raise where.error(
            "a speculative run without counters",
            "spec_acceptance_length",
            fix="fill spec_acceptance_length, spec_acceptance_rate or spec_per_position",
        )
    if length is not None and not 1 <= length <= (k or MAX_K) + 1:
        raise where.error(f"{length:g} is outside [1, k + 1]", "spec_acceptance_length")
    return SpecCounters(k, drafts, drafted, accepted, rates, length, rate, scalar_only=not rates)
