"""The serving engines' own formats: benchmark results, /metrics scrapes (readers and writers).

- ``registry``: one ``Engine`` entry per engine (vLLM, SGLang, TensorRT-LLM): its writer, files,
  method per drafter kind, router, bench client, readers and defaults, found by name.
- ``runs``: ``BenchRun``, the one record every reader returns (seconds, specsim's metric keys).
- ``prometheus``: the Prometheus text parser; vLLM's spec-decode counters, SGLang's gauges.
- ``vllm``: ``vllm bench serve --save-result`` JSON, read and written.
- ``sglang``: SGLang ``bench_serving`` JSONL.
- ``normalised``: specsim's CSV for results of any other tool.
- ``detect``: ``read_bench_files``, the format told from each file's content.

No simulation and no torch here: profiling, validation and planning build on these.
"""
