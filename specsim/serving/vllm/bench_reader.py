"""Reading ``vllm bench serve --save-result`` files (the layouts: ``specsim.serving.vllm``)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from specsim.bounds import MAX_COUNT, MAX_K, MAX_RATE, MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS
from specsim.serving.fields import Where, agree, completed_and_duration, number, numbers, text
from specsim.serving.latency import statistics, time_per_output_token
from specsim.serving.runs import BenchRun, Lengths, SpecCounters, Traffic, check_pace, metric_key

FORMAT = "vllm-bench"
METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}
_AGGREGATE = re.compile(r"^(?:(mean|median|std)|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
SPEC_KEYS = (
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)
DERIVED = (50, 90, 99)  # the percentiles computed from saved arrays when the file lacks them
# vllm bench serve writes no server version; ``--metadata vllm_version=0.11.0`` (any KEY=VALUE)
# adds one to the result, under one of these keys.
VERSION_KEYS = ("vllm_version", "engine_version", "version")
LAYOUTS = {
    "0.33": "with backend and burstiness (vLLM after 0.10.2)",
    "0.10": "with burstiness, without backend (vLLM 0.10)",
    "2024-script": "of benchmarks/benchmark_serving.py (2024)",
}
NO_COUNTERS_NOTE = (
    "this layout never records speculative counters: read as speculation off (a /metrics "
    "scrape supplies acceptance)"
)


def is_vllm_result(data: Any) -> bool:
    return isinstance(data, dict) and "model_id" in data and "duration" in data


def layout_of(data: Mapping[str, Any]) -> str:
    if "burstiness" not in data:
        return "2024-script"
    return "0.33" if "backend" in data else "0.10"


def engine_of(backend: str | None) -> str:
    name = (backend or "openai").lower()
    if "sglang" in name:
        return "sglang"
    return "vllm" if name.startswith(("openai", "vllm")) else "other"


def read_runs(objects: list[dict], source: str, sha256: str) -> list[BenchRun]:
    """Every run of one file (one object, or one per line with ``--append-result``)."""
    return [read_run(data, Where(source, i), sha256) for i, data in enumerate(objects)]


def read_run(data: Mapping[str, Any], where: Where, sha256: str) -> BenchRun:
    layout = layout_of(data)
    if data.get("ramp_up_strategy") is not None:
        raise where.error(
            "a ramp-up run: its request rate changes during the run",
            "ramp_up_strategy",
            fix="benchmark at one fixed --request-rate per run",
        )
    completed, duration = completed_and_duration(data, where)
    traffic = _traffic(data, where, completed)
    mask = _successes(data, where, completed)
    metrics, notes = _metrics(data, where, layout, mask)
    notes += [] if layout == "0.33" else [NO_COUNTERS_NOTE]
    backend = text(data, "backend", where) or text(data, "endpoint_type", where)
    version = next((text(data, key, where) for key in VERSION_KEYS if key in data), None)
    written = f"written by vLLM {version}" if version else "written by an unknown version"
    run = BenchRun(
        source=where.source,
        sha256=sha256,
        index=where.run,
        format=FORMAT,
        engine=engine_of(backend),
        engine_version=version,
        model=text(data, "model_id", where),
        label=text(data, "label", where),
        traffic=traffic,
        lengths=_lengths(data, where, completed, mask),
        duration_s=duration,
        completed=completed,
        metrics=metrics,
        itl_per_token=False,
        speculation=_speculation(data, where),
        server={"backend": backend} if backend else {},
        notes=(f"vLLM bench layout {LAYOUTS[layout]}, {written}", *notes),
    )
    check_pace(run, "request_rate", "duration")
    _check_throughput(data, where, run)
    return _checked_lead_in(run, where)


def _traffic(data: Mapping[str, Any], where: Where, completed: int) -> Traffic:
    rate = number(data, "request_rate", where, MAX_RATE, allow_inf=True)
    burstiness = number(data, "burstiness", where, MAX_RATE, allow_inf=True, required=False)
    cap = number(data, "max_concurrency", where, MAX_REQUESTS, integer=True, required=False)
    prompts = number(data, "num_prompts", where, MAX_REQUESTS, integer=True, required=False)
    given = {"request_rate": rate, "burstiness": burstiness, "max_concurrency": cap}
    for key, value in given.items():
        if value == 0:
            raise where.error("is 0", key)
    if prompts is not None and prompts < completed:
        raise where.error(f"{completed} requests completed of {prompts} sent", "num_prompts")
    return Traffic(rate, 1.0 if burstiness is None else burstiness, cap, prompts or completed)


def _successes(data: Mapping[str, Any], where: Where, completed: int) -> np.ndarray | None:
    """Which rows of the per-request arrays completed (failed rows hold zeros), if known."""
    errors = data.get("errors")
    if isinstance(errors, list):
        mask = np.array([not error for error in errors], dtype=bool)
        if int(mask.sum()) != completed:
            raise where.error(f"{int(mask.sum())} rows without an error, not {completed}", "errors")
        return mask
    sent = data.get("num_prompts")
    for key in ("latencies", "ttfts"):
        rows = data.get(key)
        if isinstance(rows, list) and isinstance(sent, int) and len(rows) != sent:
            raise where.error(f"{len(rows)} entries, not one per request sent ({sent})", key)
    rows = data.get("latencies", data.get("ttfts"))
    if isinstance(rows, list) and len(rows) == completed:
        return np.ones(completed, dtype=bool)  # every request sent completed
    return None


def _array(data, key: str, where: Where, mask: np.ndarray, maximum: float, integer=False):
    values = numbers(data, key, where, maximum, integer=integer)
    if values is None:
        return None
    if len(values) != mask.size:
        raise where.error(f"{len(values)} entries, not one per request ({mask.size})", key)
    return np.asarray(values, dtype=np.int64 if integer else np.float64)[mask]


def _itls(data, where: Where, mask: np.ndarray) -> list[np.ndarray] | None:
    rows = data.get("itls")
    if rows is None:
        return None
    if not isinstance(rows, list) or len(rows) != mask.size:
        raise where.error(f"expected one list of gaps per request ({mask.size})", "itls")
    out = []
    for i, row in enumerate(rows):
        key = f"itls[{i}]"
        gaps = numbers({key: row}, key, where, MAX_SECONDS)
        if gaps is None:
            raise where.error("not a list of gaps", f"itls[{i}]")
        if mask[i]:
            out.append(np.asarray(gaps, dtype=np.float64))
    return out


def _metrics(data, where: Where, layout: str, mask) -> tuple[dict[str, float], list[str]]:
    found: dict[str, float] = {}
    for key in data:
        match = _AGGREGATE.match(key)
        if match is None or match.group(1) == "std":
            continue
        if match.group(2) is not None and float(match.group(2)) > 100:
            raise where.error("a percentile above 100", key)
        name = metric_key(METRICS[match.group(3)], match.group(1) or f"p{match.group(2)}")
        seconds = number(data, key, where, MAX_SECONDS * 1000) / 1000
        if name in found and not agree(found[name], seconds):
            raise where.error(f"differs from the median of the same metric ({name})", key)
        found[name] = seconds
    if not found:
        raise where.error(
            "no latency aggregates ({mean,median,p99}_{ttft,tpot,itl,e2el}_ms)",
            "mean_ttft_ms",
            fix="benchmark with a tokenizer so that vLLM computes TTFT, TPOT and ITL",
        )
    notes = _unswap_e2el(found, data, where, mask) if layout == "2024-script" else []
    derived = {} if mask is None else _derived(data, where, mask)
    for name, value in derived.items():
        if name in found and not agree(found[name], value):
            raise where.error(
                f"the aggregate gives {found[name]:.6g} s, the per-request arrays {value:.6g} s",
                name,
            )
        found.setdefault(name, value)
    found["throughput_tokens_per_s"] = number(data, "output_throughput", where, MAX_COUNT)
    found["request_throughput"] = number(data, "request_throughput", where, MAX_RATE)
    return dict(sorted(found.items())), notes


def _derived(data, where: Where, mask: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 of each metric the saved arrays determine."""
    ttfts = _array(data, "ttfts", where, mask, MAX_SECONDS)
    latencies = _array(data, "latencies", where, mask, MAX_SECONDS)
    output_lens = _array(data, "output_lens", where, mask, MAX_TOKENS, integer=True)
    itls = _itls(data, where, mask)
    values = {"ttft_s": ttfts, "e2e_s": latencies}
    if itls is not None:
        values["itl_s"] = np.concatenate([np.zeros(0), *itls])
    if ttfts is not None and latencies is not None and output_lens is not None:
        values["tpot_s"] = time_per_output_token(latencies, ttfts, output_lens)
    out = {}
    for name, array in values.items():
        if array is not None:
            stats = statistics(array, DERIVED)
            out.update({metric_key(name, s): stats[s] for s in ("mean", "p50", "p90", "p99")})
    return out


def _unswap_e2el(found: dict[str, float], data, where: Where, mask) -> list[str]:
    """The 2024 script's mean and median E2EL, set right by what its arrays imply."""
    mean, median = found.get("e2e_s.mean"), found.get("e2e_s.p50")
    if mean is None or median is None:
        return []
    ttfts = None if mask is None else _array(data, "ttfts", where, mask, MAX_SECONDS)
    itls = None if mask is None else _itls(data, where, mask)
    if ttfts is None or itls is None:
        del found["e2e_s.mean"], found["e2e_s.p50"]
        return ["mean and median E2EL left out: the 2024 script swapped them, no arrays to tell"]
    e2e = ttfts + np.array([gaps.sum() for gaps in itls])
    true_mean, true_median = float(np.mean(e2e)), float(np.median(e2e))
    as_written = abs(mean - true_mean) + abs(median - true_median)
    if abs(mean - true_median) + abs(median - true_mean) >= as_written:
        return []
    found["e2e_s.mean"], found["e2e_s.p50"] = median, mean
    return [
        ("mean_e2el_ms and median_e2el_ms swapped back (the 2024 script wrote each as the other)")
    ]


def _lengths(data, where: Where, completed: int, mask) -> Lengths:
    total_in = number(data, "total_input_tokens", where, MAX_COUNT, integer=True)
    total_out = number(data, "total_output_tokens", where, MAX_COUNT, integer=True)
    per_request = {}
    if mask is not None:
        for key, total in (("input_lens", total_in), ("output_lens", total_out)):
            lens = _array(data, key, where, mask, MAX_TOKENS, integer=True)
            if lens is not None and int(lens.sum()) != total:
                raise where.error(f"completed requests sum to {int(lens.sum())}, not {total}", key)
            per_request[key] = None if lens is None else tuple(int(n) for n in lens)
        starts = _array(data, "start_times", where, mask, math.inf)
        if starts is not None:
            per_request["start_times_s"] = tuple(float(t) for t in starts - starts.min())
            latencies = _array(data, "latencies", where, mask, MAX_SECONDS)
            if latencies is not None:
                per_request["lead_in_s"] = _lead_in(starts - starts.min(), latencies, data)
    return Lengths(total_in / completed, total_out / completed, **per_request)


def _lead_in(starts: np.ndarray, latencies: np.ndarray, data) -> float:
    """From the benchmark's start to its first send: the duration less the span of the
    requests' own send times and latencies (the client stops its clock at the last finish).
    Negative when they disagree: ``_checked_lead_in`` refuses that."""
    return float(data["duration"]) - float(np.max(starts + latencies))


def _checked_lead_in(run: BenchRun, where: Where) -> BenchRun:
    lead_in = run.lengths.lead_in_s
    if lead_in is None:
        return run
    # Beyond rounding: a duration kept to 6 significant digits, times to the microsecond.
    if lead_in < -(run.duration_s * 1e-5 + 1e-5):
        raise where.error(
            f"the requests' send times and latencies span {run.duration_s - lead_in:.6g} s, "
            f"longer than the run's duration of {run.duration_s:.6g} s",
            "duration",
            fix="give the file as the benchmark wrote it (duration and arrays of one run)",
        )
    return replace(run, lengths=replace(run.lengths, lead_in_s=max(lead_in, 0.0)))


def _speculation(data, where: Where) -> SpecCounters | None:
    present = [key for key in SPEC_KEYS if key in data]
    if not present:
        return None
    missing = [key for key in SPEC_KEYS if key not in data]
    if missing:
        raise where.error(
            f"a speculative run without its counters ({present[0]} is there)", missing[0]
        )
    drafts = number(data, "spec_decode_num_drafts", where, MAX_COUNT, integer=True)
    drafted = number(data, "spec_decode_draft_tokens", where, MAX_COUNT, integer=True)
    accepted = number(data, "spec_decode_accepted_tokens", where, MAX_COUNT, integer=True)
    length = number(data, "spec_decode_acceptance_length", where, MAX_K + 1)
    percent = number(data, "spec_decode_acceptance_rate", where, 100)
    rates = numbers(data, "spec_decode_per_position_acceptance_rates", where, 1.0)
    k = len(rates) or None
    problem = None
    if drafts == 0 or drafted == 0:
        problem = ("spec_decode_num_drafts", "no drafts counted")
    elif accepted > drafted or drafted > drafts * (k or MAX_K):
        problem = ("spec_decode_draft_tokens", "more accepted than drafted, or too many drafted")
    elif not agree(length, 1 + accepted / drafts):
        problem = ("spec_decode_acceptance_length", "is not 1 + accepted / drafts")
    elif not agree(percent, 100 * accepted / drafted):
        problem = ("spec_decode_acceptance_rate", "is not 100 x accepted / draft tokens (percent)")
    elif k and not (agree(sum(rates), accepted / drafts) and _non_increasing(rates)):
        problem = ("spec_decode_per_position_acceptance_rates", "are not vLLM's prefix rates")
    if problem:
        raise where.error(f"the counters disagree: {problem[1]}", problem[0])
    if k and k > MAX_K:
        raise where.error(f"{k} positions, past specsim's k of {MAX_K}", SPEC_KEYS[-1])
    return SpecCounters(k, drafts, drafted, accepted, rates or None, length, percent / 100)


def _non_increasing(rates: tuple[float, ...]) -> bool:
    return all(b <= a + 1e-12 for a, b in itertools.pairwise(rates))


def _check_throughput(data, where: Where, run: BenchRun) -> None:
    """vLLM divides the totals by the duration; a file where they disagree was altered."""
    total_out = number(data, "total_output_tokens", where, MAX_COUNT, integer=True)
    pairs = (
        ("output_throughput", run.metrics["throughput_tokens_per_s"], total_out),
        ("request_throughput", run.metrics["request_throughput"], run.completed),
    )
    for key, value, count in pairs:
        if not agree(value, count / run.duration_s):
            raise where.error(
                f"{value:.6g} /s is not {count} / duration ({count / run.duration_s:.6g} /s)", key
            )
