"""vLLM's ``vllm bench serve --save-result`` JSON: read into ``BenchRun``s, and written from
specsim's per-request records (``bench_result``).

One JSON object per run; ``--append-result`` puts several in one file, one per line. Three
layouts are read (engine-formats.md sections 1.1-1.6), told apart by their keys:

- ``0.33``: ``backend`` and ``burstiness``, and with speculation the ``spec_decode_*`` keys
  (``spec_decode_acceptance_rate`` in percent, the per-position rates as fractions).
- ``0.10``: ``burstiness``, no ``backend`` (``endpoint_type`` names it), no ``spec_decode_*``.
- ``2024-script`` (``benchmarks/benchmark_serving.py``): no ``burstiness`` and no
  ``max_concurrency``; its per-request arrays are always saved, and it wrote the mean E2EL
  as the median and the median as the mean. When both are present they are compared with the
  E2EL its arrays imply (TTFT + the ITL gaps) and swapped back when they match swapped.

Aggregates are ``{mean,median,std}_{ttft,tpot,itl,e2el}_ms`` and ``p{P}_{metric}_ms`` for any
``--metric-percentiles`` (``p99.9_ttft_ms``); ``std`` is not kept. With ``--save-detailed`` the
per-request arrays (seconds) give the lengths and the send times, and the percentiles the file
lacks (p50, p90, p99) are computed from them as vLLM would; where the file has a figure the
arrays also give, the two must agree. ITL is one gap per streamed chunk (vLLM's client does not
count tokens in a chunk), so ``itl_per_token`` is False; under speculation a chunk carries
several tokens. The engine is told from ``backend``: names with ``sglang`` are SGLang, the
``openai*`` and ``vllm*`` backends (vLLM's own clients) vLLM, any other "other". The client
writes no server version: a ``vllm_version`` (or ``engine_version``, ``version``) key added
with ``--metadata`` is the run's engine version, and the layout's note says "an unknown
version" otherwise (the layout names the keys, not the version that wrote them).
"""

from specsim.serving.vllm.bench_reader import FORMAT, is_vllm_result, read_run, read_runs
from specsim.serving.vllm.bench_writer import bench_result

__all__ = ["FORMAT", "bench_result", "is_vllm_result", "read_run", "read_runs"]
