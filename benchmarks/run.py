"""Run the benchmark scripts and print one JSON object per benchmark, one per line.

Each ``benchmarks/bench_*.py`` prints one JSON object on its last stdout line with at least
``name``, ``figures`` (a mapping), ``baseline`` (what the ratio is against) and ``ratio``. Timing
figures are ratios against a baseline measured in the same process, because the machine is shared
and absolute times drift.

    python benchmarks/run.py              # all benchmarks
    python benchmarks/run.py sampler sim  # those whose file name contains a word
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIRED = ("name", "figures", "baseline", "ratio")


def run_one(script: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"name": script.stem, "error": f"exit {proc.returncode}: {tail[0]}"}
    result = json.loads(lines[-1])
    missing = [k for k in REQUIRED if k not in result]
    if missing:
        return {"name": script.stem, "error": f"missing keys {missing}"}
    return result


def main(words: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if words:
        scripts = [s for s in scripts if any(w in s.stem for w in words)]
    failed = 0
    for script in scripts:
        result = run_one(script)
        failed += "error" in result
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
