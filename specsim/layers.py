"""The order of specsim's parts, lowest first: each imports only from parts before it.

The flow runs one way (profile -> costs -> simulation -> metrics -> calibration and planning);
the sampling core and the models sit low because the profiler, the real engine and the checker
all use them, and the real engine and the profiler sit below the simulator, which they never
run. A part is a package under ``specsim/`` or a module at its top level.
``tests/test_layers.py`` walks every import, at module level and inside functions alike, and
fails on one that reaches a later part.
"""

from __future__ import annotations

LAYERS: tuple[str, ...] = (
    "version",  # the version string the outputs name
    "errors",  # SpecsimError: the one-line error every part raises
    "bounds",  # the limits every number is held to
    "parsing",  # YAML, JSON and CSV read within limits (depth, size, aliases, duplicate keys)
    "fileio",  # atomic writes, checked reads
    "axes",  # the rules every figure is drawn by (matplotlib, imported when drawing)
    "config",  # strict YAML models, --set overrides
    "tree",  # speculation tree shapes: drafted nodes as paths of child ranks
    "model_keys",  # config.json checks the loader and the roofline share (no torch)
    "sampling",  # verifiers, the exact checker (torch; the closed form in numpy)
    "models",  # the decoder, its KV cache, loading model folders (torch)
    "profile",  # the profile file: schema, latency fits, model kinds
    "hardware",  # the hardware file: a device's datasheet figures, links, efficiencies
    "trace_formats",  # the request-trace layouts the scenario names and the workload reads
    "choices",  # what a scenario may name: window policies, routers
    "policy_settings",  # the engines' switches on speculation a scenario may set
    "workload_settings",  # a scenario's workload section: arrivals, lengths, prefix hits
    "speculation_settings",  # its speculation section: drafter, k or tree, verifier, policies
    "fleet_settings",  # its fleet section: replicas, router, pools, a split fleet
    "scenario",  # the scenario file
    "workload",  # traffic: arrivals, lengths, traces, prompt sets
    "drafters",  # proposal rules that need no model (prompt lookup)
    "serving",  # the serving engines' own files: benchmark results, /metrics, configurations
    "costs",  # what an iteration costs: StepCosts, KV capacity, drafter kinds
    "metrics",  # pure functions of per-request records
    "comparison",  # a summary against a baseline's
    "analytic",  # closed forms for speculation's speed-up
    "engine",  # the real engine on the built-in models (torch)
    "profiling",  # measuring and fitting profiles (torch), rooflines
    "simulation",  # the SimPy serving engine
    "estimate",  # closed-form estimates under load (the simulator's chains, no simulation)
    "calibration",  # profiles fitted to serving engines' reports by simulating their runs
    "validation",  # the real engine against the simulator
    "planning",  # sweeps, plans and reports
    "api",  # the Python API: the commands as functions returning DataFrames (pandas)
    "cli",  # the specsim command
    "docs",  # reference pages generated from the code
)
