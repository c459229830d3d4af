"""Profiling: measure (or estimate) drafter/target pairs and write profile files.

Pure (numpy, no torch):

- ``flops``: parameters, FLOPs and bytes per pass from a model configuration.
- ``roofline``: latency estimates from datasheet numbers (``profiles/hardware/*.yaml``).
- ``fit``: fitting the profile's latency form to measured passes, with held-out error.
- ``acceptance``: chain statistics from scored text (the walk, per-position rates, sequences).
- ``specs``, ``writer``: ``--drafter`` arguments, writing profiles.

With torch (imported only when called):

- ``timing``: timing real forward passes with a real KV cache over a grid.
- ``scoring``: generating with the target and scoring drafters along its text.
- ``acceptance_measure``: acceptance entries for every drafter x verifier x temperature.
- ``measure``: the whole measured profile (``specsim profile``).

Fitting a profile to a serving engine's reports runs the simulator: ``specsim.calibration``.
"""
