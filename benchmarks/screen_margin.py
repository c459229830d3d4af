"""The screen's estimate against simulation on every shipped scenario: the evidence its margin
is set from (docs/notes/2026-12-01-screen-margin.md).

For each scenario under ``scenarios/`` that ``plan window`` takes (a drafter, no validation
fixture), every point of its default ``plan window`` grid (k = 0..8 and the adaptive policy at
each default load) is estimated (``specsim.estimate``) and simulated (2 workers). The ranking
error is measured within each load, where the planner chooses: for every pair of
configurations, how far the estimate's ratio of their mean end-to-end latencies (and
goodputs) is from the simulated ratio, and the worst pair the estimate orders the wrong way.

    python benchmarks/screen_margin.py OUT.json     # several minutes; prints the JSON record
    python benchmarks/screen_margin.py OUT2.json --reuse OUT.json   # new estimates, same runs
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ["poisson", "chat", "code", "closed_loop", "drafter_swap"]


def rows_for(name: str, folder: Path, simulated: dict | None = None) -> list[dict]:
    from specsim.estimate import estimate_point
    from specsim.planning.common import metric
    from specsim.planning.sweep.sweeper import Sweeper
    from specsim.planning.window import window

    path = str(REPO / "scenarios" / f"{name}.yaml")
    plan = window.prepare(path, [], None, None, None)
    points = plan.grid()
    rows, estimate_s = [], 0.0
    for point in points:
        started = time.perf_counter()
        est = estimate_point(point.scenario, list(point.overrides))
        estimate_s += time.perf_counter() - started
        rows.append({"scenario": name, **point.tags, "estimate": est.figures()})
    if simulated is not None:
        for row in rows:
            row["simulated"] = simulated[(name, row["load"], row["config"])]
            row["use_slo"] = plan.use_slo
        return rows
    with Sweeper(folder / name, {"command": "margin"}, progress=False, workers=2) as sweeper:
        results = sweeper.run(points)
    for row, result in zip(rows, results, strict=True):
        s = result.summary
        row["simulated"] = {
            "e2e_mean_s": metric(s, "e2e_s", "mean"),
            "goodput_requests_per_s": metric(s, "goodput_requests_per_s") if plan.use_slo else None,
            "throughput_requests_per_s": metric(s, "throughput_requests_per_s"),
            "slo_attainment": metric(s, "slo_attainment") if plan.use_slo else None,
        }
        row["use_slo"] = plan.use_slo
    print(f"{name}: {len(points)} points, estimates {estimate_s:.2f} s", file=sys.stderr)
    return rows


def main(argv: list[str]) -> dict:
    out = Path(argv[0])
    simulated = None
    if "--reuse" in argv:  # estimate again; the simulations of an earlier run's OUT.json
        earlier = json.loads(Path(argv[argv.index("--reuse") + 1]).read_text())
        simulated = {(r["scenario"], r["load"], r["config"]): r["simulated"] for r in earlier}
    rows = []
    with tempfile.TemporaryDirectory(prefix="screen-margin-") as tmp:
        for name in SCENARIOS:
            rows += rows_for(name, Path(tmp), simulated)
    out.write_text(json.dumps(rows, indent=1))
    from specsim.planning.sweep.screen import ranking_errors

    return {"name": "screen_margin", "points": len(rows), "errors": ranking_errors(rows)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
