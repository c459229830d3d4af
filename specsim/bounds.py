"""Bounds on the numbers specsim reads: every one finite, and within what any deployment has.

A value past them is a typo or a slip of units (``sigma: 1e6``, ``replicas: 1e9``); left in, it
would overflow, hang or quietly give nonsense. The schemas use the constrained types below
(pydantic's message states the bound), the command line ``specsim.cli.common.Number`` with the
same constants. Non-finite numbers are refused by every schema model (``StrictModel``).
"""

from __future__ import annotations

import sys
from typing import Annotated

# annotated_types, not pydantic: the command line reads these bounds, and building its parser
# stays free of pydantic's import time.
from annotated_types import Ge, Le

MAX_SECONDS = 1e6  # 11.6 days: past any pass, limit, think time, budget or simulated run
MAX_TOKENS = 10_000_000  # tokens in one request, context or iteration
MAX_BATCH = 65_536  # sequences in one running batch
MAX_REPLICAS = 10_000
MAX_REQUESTS = 10_000_000  # requests (or closed-loop clients) one simulation takes on
MAX_RATE = 1e6  # requests per second
MAX_K = 32  # tokens drafted per step
MAX_TEMPERATURE = 100.0
MAX_SIGMA = 10.0  # a lognormal length's log-space spread: e**10 is a factor of 22,000
MAX_CV = 100.0  # coefficient of variation of bursty inter-arrival times
MAX_FACTOR = 1e6  # dimensionless positive factors: speeds, error ratios, concentrations
MIN_FACTOR = 1e-6  # and the floor of a share of a whole (an efficiency) that must not be 0
# Positive reals have a floor: a denormal (5e-324) passes "> 0" but divides to infinity, and
# 1e-300 of a unit is no more real. The command line's other positives are at least normal.
MIN_POSITIVE = sys.float_info.min
MIN_SECONDS = 1e-9  # a nanosecond: shorter than any pass, limit or run
MIN_RATE = 1 / MAX_SECONDS  # one request in the longest run
MIN_LEVEL = 1e-12  # a statistical test's level: below it no run draws the samples to reject
MAX_BYTES = 1e15  # a petabyte: device memory, weights, bytes per second
MAX_FLOPS = 1e18  # per second, or per token
MAX_PRICE = 1e4  # US dollars per device-hour
MAX_COUNT = 10**15  # counts: samples, points, parameters, tokens scored
MAX_DIMENSION = 10**7  # a model dimension: layers, hidden size, heads, vocabulary
MAX_TENSOR_PARALLEL = 64  # devices one replica spans
MAX_SEED = 2**63 - 1

Seconds = Annotated[float, Ge(0), Le(MAX_SECONDS)]
PositiveSeconds = Annotated[float, Ge(MIN_SECONDS), Le(MAX_SECONDS)]
Tokens = Annotated[int, Ge(1), Le(MAX_TOKENS)]
TokenCount = Annotated[int, Ge(0), Le(MAX_TOKENS)]
BatchSize = Annotated[int, Ge(1), Le(MAX_BATCH)]
Replicas = Annotated[int, Ge(1), Le(MAX_REPLICAS)]
Requests = Annotated[int, Ge(1), Le(MAX_REQUESTS)]
Rate = Annotated[float, Ge(MIN_RATE), Le(MAX_RATE)]
WindowSize = Annotated[int, Ge(0), Le(MAX_K)]
TensorParallel = Annotated[int, Ge(1), Le(MAX_TENSOR_PARALLEL)]
Temperature = Annotated[float, Ge(0), Le(MAX_TEMPERATURE)]
Probability = Annotated[float, Ge(0), Le(1)]
Factor = Annotated[float, Ge(MIN_FACTOR), Le(MAX_FACTOR)]
Share = Annotated[float, Ge(MIN_FACTOR), Le(1)]
NonNegFactor = Annotated[float, Ge(0), Le(MAX_FACTOR)]
Bytes = Annotated[float, Ge(1), Le(MAX_BYTES)]
ByteCount = Annotated[int, Ge(0), Le(MAX_COUNT)]
Flops = Annotated[float, Ge(0), Le(MAX_FLOPS)]
PositiveFlops = Annotated[float, Ge(1), Le(MAX_FLOPS)]
Price = Annotated[float, Ge(0), Le(MAX_PRICE)]
Count = Annotated[int, Ge(0), Le(MAX_COUNT)]
Dimension = Annotated[int, Ge(0), Le(MAX_DIMENSION)]
Seed = Annotated[int, Ge(0), Le(MAX_SEED)]
