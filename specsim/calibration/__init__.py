"""Calibration: profiles fitted to what serving engines report, by simulating their runs.

It sits above the simulator (it runs it) and below validation and the command line.

- ``from_bench``: ``specsim profile from-bench``, the whole fit and its report.
- ``acceptance``: acceptance entries from an engine's counters or scalars.
- ``workload``: a benchmark run's workload rebuilt as a scenario the simulator replays.
- ``terms``: the scale factors and added cost a calibration fits on the prior profile.
- ``simulate``: a run simulated on a candidate profile, measured as its client measures.
- ``fit``: least squares of the terms against the runs, with the prior and held-out runs.
- ``prometheus``: ``specsim profile calibrate``, acceptance from vLLM's /metrics counters.
"""
