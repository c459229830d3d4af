"""Profiling: measure (or estimate) drafter/target pairs and write profile files.

- ``flops``: parameters, FLOPs and bytes per pass from a model configuration.
- ``roofline``: latency estimates from datasheet numbers (``profiles/hardware/*.yaml``).
- ``fit``: fitting the profile's latency form to measured passes, with held-out error.
- ``timing``: timing real forward passes with a real KV cache (torch).
- ``acceptance``: acceptance statistics (pure functions) and the torch scorer.
- ``ngram``: the prompt-lookup drafter, measured on the same text.
- ``calibrate``: acceptance from a production vLLM's Prometheus counters.
- ``writer``: assembling, validating and atomically writing profiles.

Only ``timing``, the scorer in ``acceptance`` and ``measure`` import torch, and only when called.
"""
