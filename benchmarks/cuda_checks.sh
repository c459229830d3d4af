#!/usr/bin/env bash
# Everything in this project that needs a CUDA GPU, in two parts, each step time-boxed and
# logged to OUT/STEP.log, so that one failing step still leaves the others' results:
#   bash benchmarks/cuda_checks.sh checks  OUT   # GPU tests, then a short engine run on the GPU
#   bash benchmarks/cuda_checks.sh measure OUT   # the built-in models' GPU profile, then
#                                                # bench_validation.py on the GPU
# Each part is sized to fit one call of a time-limited GPU lease (a few minutes).
# Run from the repository root with specsim importable (an install, or PYTHONPATH=.).
set -uo pipefail
part="${1:?checks or measure}"
out="${2:-runs/cuda}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=0

step() {  # step NAME SECONDS COMMAND...: run it under a time limit; print its status and tail
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - start)) s"
  tail -n 8 "$out/$name.log"
  if [ "$rc" -ne 0 ]; then failed=1; fi
}

case "$part" in
checks)
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$out/gpu.txt"
  cat "$out/gpu.txt"
  step gpu-tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_profiling_measure.py tests/test_sampling_verifiers.py \
    tests/test_engine.py tests/test_engine_speed.py tests/test_e2e_lossless.py
  # The engine on the GPU against the shipped CPU profile: this checks that it runs, and the
  # comparison's figures mean nothing (another machine's profile).
  step engine-smoke 90 python3 -m specsim validate scenarios/validate-b8-small-k2.yaml \
    --profile profiles/builtin-cpu.yaml --device cuda --replications 2 \
    --set workload.requests=24 --out "$out/smoke" --json
  ;;
measure)
  # The built-in models in bfloat16 (the profiler's GPU default), timed with CUDA events. Models
  # this small are expected to be bound by kernel launches on a GPU, not by its arithmetic.
  step profile 200 python3 -m specsim profile measure --target specsim-target \
    --drafter small=specsim-draft-small --drafter tiny=specsim-draft-tiny --drafter ngram \
    --device cuda --temperature 1.0 --temperature 0.7 --max-prompts 64 --max-new-tokens 128 \
    --grid batch=1,2,4,8,16,32,64 --sequences --out "$out/profile/builtin-cuda.yaml"
  step validation 420 python3 benchmarks/bench_validation.py --device cuda \
    --out "$out/validation"
  ;;
*)
  echo "unknown part $part: checks or measure" >&2
  exit 2
  ;;
esac
exit "$failed"  # 1 when any step failed or ran out of time
