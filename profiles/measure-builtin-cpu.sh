#!/usr/bin/env bash
# Measure the built-in models on this machine's CPU and write profiles/builtin-cpu.yaml (plus its
# per-request acceptance sequences). Run from the repository root; a few minutes on 2 cores.
# --clock reference times passes by process CPU time, rescaled to the machine's quiet speed by
# decode and prefill reference passes of each model re-timed every 0.25 s: the shared development machine runs
# other processes, which inflate wall-clock passes at random and slow this process's own CPU
# time too (see specsim/engine/speed.py).
# The shipped file was measured on the project's 2-core development machine (see its
# provenance): re-run this on your own machine for numbers that describe it.
set -euo pipefail
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
specsim profile measure --target specsim-target \
  --drafter small=specsim-draft-small --drafter tiny=specsim-draft-tiny --drafter ngram \
  --device cpu --clock reference --repeats 11 --temperature 1.0 --temperature 0.7 --max-prompts 64 \
  --max-new-tokens 128 \
  --sequences \
  --out profiles/builtin-cpu.yaml "$@"
