"""Validation: the real engine against the simulator, and the two-sample rollout check.

- ``validate``: run the real engine and the simulator on one scenario and profile, and compare
  mean / p50 / p90 / p99 TTFT, TPOT and E2E, throughput and mean acceptance length against
  stated thresholds (``compare``), with a plot (``plot``).
- ``rollout``: ``check_rollout(baseline_records, candidate_records, alpha)`` flags a shift in the
  target log-likelihood, length or EOS share between two engine runs.

Simulation and comparison never import torch; only running the engine does.
"""
