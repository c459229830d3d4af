"""SGLang's ``bench_serving --output-file`` JSONL: one line per run, read into ``BenchRun``s.

The line's keys (engine-formats.md section 4.1, SGLang 0.5.23): ``backend``, ``dataset_name``,
``request_rate`` (a float; ``inf`` is written as the bare token ``Infinity``, or ``"trace"``),
``max_concurrency``, ``random_input_len`` / ``random_output_len`` / ``random_range_ratio``,
``server_info`` (the whole ``/server_info``, or null), ``duration``, ``completed``, the token
totals, ``request_throughput``, ``output_throughput``, and ``{mean,median,std,p90,p95,p99}``
of ``e2e_latency``, ``ttft``, ``tpot`` and ``itl`` in ms (the percentiles are fixed; ``std`` is
not kept), ``accept_length``; with ``--output-details`` the per-request arrays too.

- Arrivals are Poisson (no ``--burstiness``) and not rescaled to n / rate.
- ITL is per token for the native ``sglang`` backend (each chunk's gap is split evenly over its
  tokens) and for ``sglang-oai`` / ``sglang-oai-chat`` when ``accept_length`` is reported (the
  client re-tokenises each chunk); per chunk for any other backend (section 4.2).
- ``accept_length`` is the only acceptance figure: a scalar (bonus token included), and
  SGLang's average since the server's last cache flush, not this run's alone (section 4.4).
- Lengths of the ``random`` datasets are uniform in [max(L r, 1), L] (section 4.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specsim.bounds import MAX_COUNT, MAX_K, MAX_RATE, MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS
from specsim.serving.fields import Where, agree, completed_and_duration, number, numbers, text
from specsim.serving.runs import BenchRun, Lengths, SpecCounters, Traffic, check_pace, metric_key

FORMAT = "sglang-bench"
METRICS = {"e2e_latency": "e2e_s", "ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s"}
STATISTICS = ("mean", "median", "p90", "p95", "p99")
SERVER_KEYS = (
    "version",
    "model_path",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "tp_size",
)
PER_TOKEN_BACKENDS = ("sglang",)  # split every chunk's gap over its tokens
RETOKENISING_BACKENDS = ("sglang-oai", "sglang-oai-chat")  # do so when accept_length is known
LIFETIME_NOTE = (
    "accept_length is SGLang's average since the server's last cache flush, earlier traffic "
    "included unless the run flushed it (--flush-cache): a scalar, not per position"
)


def is_sglang_result(data: Any) -> bool:
    return isinstance(data, dict) and "duration" in data and "mean_e2e_latency_ms" in data


def engine_of(backend: str | None) -> str:
    name = (backend or "sglang").lower()
    if name.startswith("sglang"):
        return "sglang"
    return "vllm" if name.startswith("vllm") else "other"


def read_runs(objects: list[dict], source: str, sha256: str) -> list[BenchRun]:
    return [read_run(data, Where(source, i), sha256) for i, data in enumerate(objects)]


def server_settings(data: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """What ``server_info`` says of the server's version, model and speculation."""
    info = data.get("server_info")
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise where.error("expected the /server_info object or null", "server_info")
    if isinstance(info.get("decode"), list) and info["decode"]:  # disaggregated: the decode side
        info = info["decode"][0]
    return {key: info[key] for key in SERVER_KEYS if isinstance(info, dict) and key in info}


def read_run(data: Mapping[str, Any], where: Where, sha256: str) -> BenchRun:
    if data.get("request_rate") == "trace":
        raise where.error(
            "replays a trace's timestamps, which the file does not hold",
            "request_rate",
            fix="benchmark at a fixed --request-rate",
        )
    completed, duration = completed_and_duration(data, where)
    rate = number(data, "request_rate", where, MAX_RATE, allow_inf=True)
    cap = number(data, "max_concurrency", where, MAX_REQUESTS, integer=True, required=False)
    if rate == 0 or cap == 0:
        raise where.error("is 0", "request_rate" if rate == 0 else "max_concurrency")
    backend = text(data, "backend", where)
    server = server_settings(data, where)
    speculation = _speculation(data, where, server)
    retokenised = backend in RETOKENISING_BACKENDS and speculation is not None
    run = BenchRun(
        source=where.source,
        sha256=sha256,
        index=where.run,
        format=FORMAT,
        engine=engine_of(backend),
        engine_version=server.get("version") if engine_of(backend) == "sglang" else None,
        model=server.get("model_path"),
        label=text(data, "tag", where),
        traffic=Traffic(rate, 1.0, cap, completed),
        lengths=_lengths(data, where, completed),
        duration_s=duration,
        completed=completed,
        metrics=_metrics(data, where, completed, duration),
        itl_per_token=backend in PER_TOKEN_BACKENDS or retokenised,
        speculation=speculation,
        server=server,
        notes=(LIFETIME_NOTE,) if speculation is not None else (),
    )
    check_pace(run, "request_rate", "duration")
    return run


def _metrics(data, where: Where, completed: int, duration: float) -> dict[str, float]:
    found = {}
    for name, ours in METRICS.items():
        for statistic in STATISTICS:
            key = f"{statistic}_{name}_ms"
            found[metric_key(ours, statistic)] = number(data, key, where, MAX_SECONDS * 1000) / 1000
    totals = (
        ("output_throughput", "throughput_tokens_per_s", "total_output_tokens", MAX_COUNT),
        ("request_throughput", "request_throughput", None, MAX_RATE),
    )
    for key, ours, total_key, bound in totals:
        value = number(data, key, where, bound)
        count = completed if total_key is None else number(data, total_key, where, MAX_COUNT)
        if not agree(value, count / duration):
            raise where.error(f"{value:.6g} /s is not {count} / duration", key)
        found[ours] = value
    return dict(sorted(found.items()))


def _lengths(data, where: Where, completed: int) -> Lengths:
    total_in = number(data, "total_input_tokens", where, MAX_COUNT, integer=True)
    total_out = number(data, "total_output_tokens", where, MAX_COUNT, integer=True)
    per_request = {}
    errors = data.get("errors")
    if isinstance(errors, list):
        mask = np.array([not error for error in errors], dtype=bool)
        for key, total in (("input_lens", total_in), ("output_lens", total_out)):
            lens = numbers(data, key, where, MAX_TOKENS, integer=True)
            if lens is None:
                continue
            if len(lens) != mask.size:
                raise where.error(f"{len(lens)} entries, not one per request ({mask.size})", key)
            kept = tuple(int(n) for n, ok in zip(lens, mask, strict=True) if ok)
            if len(kept) != completed or sum(kept) != total:
                raise where.error(f"the completed requests' lengths do not sum to {total}", key)
            per_request[key] = kept
    if text(data, "dataset_name", where) in ("random", "random-ids"):
        ratio = number(data, "random_range_ratio", where, 1.0)
        for key, name in (
            ("random_input_len", "input_range"),
            ("random_output_len", "output_range"),
        ):
            top = number(data, key, where, MAX_TOKENS, integer=True)
            per_request[name] = (max(int(top * ratio), 1), top)
    return Lengths(total_in / completed, total_out / completed, **per_request)


def _speculation(data, where: Where, server: dict) -> SpecCounters | None:
    length = number(data, "accept_length", where, MAX_K + 1, required=False)
    algorithm = server.get("speculative_algorithm")
    if not length:
        if algorithm:
            raise where.error(
                f"a speculative run ({algorithm}) without counters: accept_length is null",
                "accept_length",
                fix="benchmark with an sglang backend (it reads accept_length from /server_info)",
            )
        return None
    steps = number(server, "speculative_num_steps", where, MAX_K, integer=True, required=False)
    k = steps or None
    if not 1 <= length <= (k or MAX_K) + 1:
        raise where.error(
            f"{length:g} is outside [1, k + 1] (bonus token included)", "accept_length"
        )
    return SpecCounters(k=k, acceptance_length=length, scalar_only=True)
