#!/usr/bin/env bash
# Rewrite profiles/calibrated/: for each deployment of tests/data/engine_runs/ that can be
# described, its roofline prior (calibrated/priors/), its runs split as its deployment.yaml's
# `fit:` says (calibrated/runs/NAME/fit and held-out), and the profile `specsim profile
# from-bench` fits on the fit runs and checks on the others (calibrated/NAME.yaml and its
# .calibration.json report). The same operator path benchmarks/bench_fidelity.py measures; its
# JSON (uncalibrated and held-out errors per deployment) goes to stdout. Run from the
# repository root (about 20 minutes on 2 cores).
set -euo pipefail
rm -rf profiles/calibrated
python benchmarks/bench_fidelity.py --library profiles/calibrated
