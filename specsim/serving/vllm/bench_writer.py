"""Writing a run of specsim's (simulated, or its built-in engine's) in vLLM's bench result format.

``bench_result`` gives the object ``vllm bench serve --save-result`` (vLLM 0.33) writes, as
if run with ``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 90,99``, from the
per-request record columns of ``requests.csv`` and the run's ``summary.json``:

- TTFT = first_token_s - arrival_s, E2EL = finish_s - arrival_s, TPOT per request =
  (E2EL - TTFT) / (output_tokens - 1) over requests with 2 or more tokens; statistics by
  ``np.percentile`` (linear), as vLLM's ``calculate_metrics`` (``specsim.serving.latency``).
- ITL: the records hold no per-token times, only each request's first and last token and its
  ``steps`` (iterations that emitted tokens after prefill). vLLM's client records one gap per
  streamed chunk, and an iteration emits one chunk, so each request contributes ``steps`` gaps
  of (finish_s - first_token_s) / steps: the mean is exact, the spread within a request is lost
  (the ITL percentiles are narrower than the simulator's own ``itl_s``).
- ``spec_decode_*`` (when anything was drafted): drafts = accepted / (mean acceptance length -
  1) (drafted / k when nothing was accepted) and per-position counts = rate x drafts, rounded to
  whole counts, from the summary's 6-digit figures; accepted_tokens is their sum, so the keys
  agree with one another exactly as vLLM's do, and with the records' totals to that precision.
- Left out, because specsim has no such figure: ``generated_texts``, ``server_queue_times`` /
  ``server_ttfts``, ``max_output_tokens_per_s``, ``max_concurrent_requests``, ``rtfx`` and
  the goodput (``request_goodput`` is null, as without ``--goodput``). ``queue_times`` (the
  client's wait for a ``--max-concurrency`` slot) are 0: a simulated request arrives when sent.
- ``date`` only when given, so the same run writes the same bytes. An infinite rate or
  burstiness (evenly spaced sends) is written ``"inf"``, as vLLM writes its infinite rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specsim.serving.latency import statistics, time_per_output_token
from specsim.serving.runs import Traffic

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


def chunk_gaps(records: Mapping[str, np.ndarray]) -> list[list[float]]:
    """Per request, its ``steps`` equal gaps between the first and the last token."""
    gaps = []
    for first, finish, steps, output in zip(
        records["first_token_s"],
        records["finish_s"],
        records["steps"],
        records["output_tokens"],
        strict=True,
    ):
        chunks = int(steps) if steps > 0 else max(int(output) - 1, 0)
        gaps.append([float(finish - first) / chunks] * chunks if chunks else [])
    return gaps


def bench_result(
    records: Mapping[str, np.ndarray],
    summary: Mapping[str, Any],
    traffic: Traffic,
    model: str,
    *,
    label: str | None = None,
    backend: str = "vllm",
    date: str | None = None,
    percentiles: Sequence[float] = PERCENTILES,
    save_detailed: bool = False,
) -> dict[str, Any]:
    """The vLLM 0.33 result object of one run (module docstring)."""
    arrival = np.asarray(records["arrival_s"], dtype=np.float64)
    ttfts = np.asarray(records["first_token_s"], dtype=np.float64) - arrival
    latencies = np.asarray(records["finish_s"], dtype=np.float64) - arrival
    input_lens = np.asarray(records["prompt_tokens"], dtype=np.int64)
    output_lens = np.asarray(records["output_tokens"], dtype=np.int64)
    itls = chunk_gaps(records)
    duration = float(summary["duration_s"])
    completed = int(arrival.size)
    total_in, total_out = int(input_lens.sum()), int(output_lens.sum())
    result: dict[str, Any] = {} if date is None else {"date": date}
    result.update(
        endpoint_type=backend,
        backend=backend,
        label=label,
        model_id=model,
        tokenizer_id=model,
        num_prompts=traffic.num_prompts or completed,
        request_rate=traffic.request_rate if math.isfinite(traffic.request_rate) else "inf",
        burstiness=traffic.burstiness if math.isfinite(traffic.burstiness) else "inf",
        max_concurrency=traffic.max_concurrency,
        duration=duration,
        completed=completed,
        failed=0,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=completed / duration,
        request_goodput=None,
        output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
    )
    arrays = {
        "input_lens": input_lens.tolist(),
        "output_lens": output_lens.tolist(),
        "ttfts": ttfts.tolist(),
        "itls": itls,
        "latencies": latencies.tolist(),
        "start_times": arrival.tolist(),
        "queue_times": [0.0] * completed,
        "errors": [""] * completed,
    }
    kept = arrays if save_detailed else ("latencies", "queue_times")  # what vLLM 0.33 keeps
    result.update({key: arrays[key] for key in kept})
    values = {
        "ttft": ttfts,
        "tpot": time_per_output_token(latencies, ttfts, output_lens),
        "itl": np.array([gap for row in itls for gap in row]),
        "e2el": latencies,
    }
    drafted = int(np.asarray(records["drafted"]).sum())
    if drafted > 0:
        accepted = int(np.asarray(records["accepted"]).sum())
        result.update(spec_decode_keys(summary, accepted, drafted))
    for name in PERCENTILE_METRICS:
        for statistic, value in statistics(values[name], percentiles).items():
            result[f"{statistic}_{name}_ms"] = value * 1000
    return result


def spec_decode_keys(summary: Mapping[str, Any], accepted: int, drafted: int) -> dict[str, Any]:
    """vLLM's ``spec_decode_*`` keys from the summary's acceptance and the records' totals."""
    rates = [float(r) for r in summary["per_position_acceptance"]]
    length = float(summary["mean_acceptance_length"])
    k = max(len(rates), 1)
    drafts = round(accepted / (length - 1)) if accepted and length > 1 else round(drafted / k)
    drafts = max(drafts, math.ceil(drafted / k), 1)  # no step drafts more than k
    counts = [min(round(rate * drafts), drafts) for rate in rates]
    accepted = min(sum(counts), drafted)
    return {
        "spec_decode_acceptance_rate": accepted / drafted * 100,
        "spec_decode_acceptance_length": 1 + accepted / drafts,
        "spec_decode_num_drafts": drafts,
        "spec_decode_draft_tokens": drafted,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_per_position_acceptance_rates": [count / drafts for count in counts],
    }
