"""``specsim profile from-bench``: a profile calibrated to a serving engine's own benchmark runs.

1. The runs are read (``specsim.serving.detect.read_bench_files``: vLLM, SGLang or the
   normalised CSV; one deployment per call).
2. Acceptance: the speculative runs' counters (or scalars, from the runs or the command line;
   or a /metrics scrape given to a result file without counters: ``specsim.serving.scrapes``)
   become acceptance entries of the prior (``acceptance``), so that each run is simulated
   with the acceptance it counted.
3. Each run's workload is rebuilt as a trace (``workload``) and simulated on the prior
   with a few of its terms scaled (``terms``); the terms are fitted to every run's
   figures at once, the undetermined ones kept at the prior, and each run predicted from a fit
   without it (``fit``).
4. The profile is the prior with the fitted terms and the new acceptance, ``source:
   calibrated``, its provenance naming the files (with their sha256), the engine, the fitted
   terms and the errors; the full report (per run and figure: measured, the prior's
   prediction, fitted, held out) goes beside it as ``NEW.calibration.json``.
5. ``--check-runs``: runs of the same deployment that the fit never sees, predicted on the
   fitted terms as ``validate --bench`` predicts them (same replay, same seed); their error
   per figure goes into the report and ``provenance.calibration.checked``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.calibration.acceptance import (
    Scalar,
    acceptance_entry,
    add_scalars,
    parse_scalar,
    run_k,
    windows_from_runs,
)
from specsim.calibration.caps import resolve_caps
from specsim.calibration.fit import DETERMINED, calibrate
from specsim.calibration.gate import MAX_HELD_OUT_ERROR, accepted_note, judge
from specsim.calibration.report import calibration_report, check_report, run_report
from specsim.calibration.simulate import Evaluator
from specsim.calibration.terms import apply, terms_for
from specsim.calibration.workload import Speculation, replay
from specsim.config import validate_as
from specsim.errors import SpecsimError
from specsim.profile import Acceptance, LoadedProfile, Profile, load_profile
from specsim.profiling.writer import build_profile, software_versions, today
from specsim.sampling.kinds import DEFAULT_VERIFIER
from specsim.serving.detect import read_bench_files
from specsim.serving.prefix_share import parse_share, state_shares
from specsim.serving.registry import entries
from specsim.serving.runs import BenchRun
from specsim.serving.scrapes import attach_scrapes, parse_pair

REPORT_SUFFIX = ".calibration.json"


@dataclass(frozen=True)
class BenchOptions:
    files: tuple[str, ...]
    into: str | None
    out: Path
    name: str
    drafter: str | None = None
    verifier: str = DEFAULT_VERIFIER
    temperature: float = 1.0
    k: int | None = None
    caps: dict[str, tuple[int, str]] = field(default_factory=dict)  # given: cap -> (value, where)
    server_args: str | None = None  # the server's log or flags file, for its caps
    prefix_hits: tuple[str, ...] = ()  # RESULT=SHARE: stated prefix-cache hit shares
    acceptance_lengths: tuple[str, ...] = ()  # NAME:K=L
    acceptance_rates: tuple[str, ...] = ()  # NAME:K=R
    metrics: tuple[str, ...] = ()  # RESULT=SCRAPE: acceptance for a result file without counters
    seed: int = 0
    held_out: bool = True
    command: str | None = None
    max_held_out_error: float = MAX_HELD_OUT_ERROR  # the quality gate (``gate``)
    accept_poor_fit: bool = False
    check_files: tuple[str, ...] = ()  # runs the fit does not see, predicted on its result
    runs_source: str | None = None  # where the runs come from, as stated


@dataclass
class BenchCalibration:
    profile: Profile
    report: dict[str, Any]
    report_name: str

    @property
    def writable(self) -> bool:
        """Under the quality gate's threshold, or accepted above it."""
        gate = self.report["gate"]
        return gate["passed"] or gate["accepted_with"] is not None


def report_name(out: Path) -> str:
    """The report's file name beside the profile: FILE.calibration.json for --out FILE.yaml."""
    return out.stem + REPORT_SUFFIX


def bench_drafter(loaded: LoadedProfile, name: str | None, needed: bool) -> str | None:
    """The drafter the speculative runs ran: ``--drafter``, else the profile's only one."""
    if name is not None:
        loaded.drafter(name)  # a clear error when the profile lacks it
        return name
    if not needed:
        return None
    names = sorted(loaded.profile.drafters)
    if len(names) == 1:
        return names[0]
    raise SpecsimError(
        "the runs speculate, and the benchmark files do not name the drafter; the --into "
        f"profile has {len(names)} drafters ({', '.join(names) or 'none'})",
        file=str(loaded.path),
        key="drafters",
        fix="name the deployed drafter with --drafter NAME"
        if names
        else "give --into a profile with the deployed drafter",
    )


def _same_entry(entry: dict, drafter: str, verifier: str, temperature: float) -> bool:
    return (
        entry["drafter"] == drafter
        and entry["verifier"] == verifier
        and abs(entry["temperature"] - temperature) <= 0.05
    )


def scalars(loaded: LoadedProfile, opts: BenchOptions) -> list[Scalar]:
    """The command line's acceptance lengths and rates, checked against the profile."""
    drafters = list(loaded.profile.drafters)
    return [parse_scalar(t, "--acceptance-length", drafters) for t in opts.acceptance_lengths] + [
        parse_scalar(t, "--acceptance-rate", drafters) for t in opts.acceptance_rates
    ]


def with_acceptance(
    loaded: LoadedProfile, spec_runs: list[BenchRun], drafter: str | None, opts: BenchOptions
) -> tuple[dict, list[dict]]:
    """The prior's data with the runs' and the options' acceptance in place of its own."""
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
    given = scalars(loaded, opts)
    by_drafter = {drafter: windows_from_runs(spec_runs, opts.k)} if spec_runs else {}
    for scalar in given:
        by_drafter.setdefault(scalar.drafter, {})
    described = []
    for name, windows in by_drafter.items():
        add_scalars(windows, given, name)
        kept = data["acceptance"]
        prior = next(
            (a for a in kept if _same_entry(a, name, opts.verifier, opts.temperature)), None
        )
        entry, about = acceptance_entry(name, opts.verifier, opts.temperature, windows, prior)
        data["acceptance"] = [a for a in kept if a is not prior] + [entry]
        described.append(about)
    return data, described


def _move_sequences(data: dict, old: Path, new: Path) -> None:
    """Sequence files stay where they are: re-point them from the new profile's folder."""
    old_dir, new_dir = old.resolve().parent, new.resolve().parent
    for entry in data["acceptance"]:
        if "sequences" in entry and old_dir != new_dir:
            path = old_dir / entry["sequences"]["path"]
            entry["sequences"]["path"] = os.path.relpath(path, new_dir)


def own_acceptance(run: BenchRun, drafter: str, opts: BenchOptions, prior: Profile) -> Acceptance:
    """The acceptance entry of ``run`` alone, as it is simulated (``simulate``)."""
    pooled = next(
        a.model_dump(mode="json", exclude_none=True)
        for a in prior.acceptance
        if _same_entry(a.model_dump(), drafter, opts.verifier, opts.temperature)
    )
    windows = windows_from_runs([run], opts.k)
    entry, _ = acceptance_entry(drafter, opts.verifier, opts.temperature, windows, pooled)
    return validate_as(Acceptance, entry, run.where)


def calibrate_from_bench(opts: BenchOptions) -> BenchCalibration:
    """The calibrated profile and its report (module docstring); writes nothing."""
    if opts.into is None:
        raise SpecsimError(
            "profile from-bench needs a prior profile: the latency form and the model's sizes that "
            "the runs' figures scale",
            file="command line",
            key="--into",
            fix="add --into PROFILE (a roofline or measured profile of the same model and "
            "device: specsim profile roofline makes one)",
        )
    pairs = [parse_pair(text) for text in opts.metrics]
    shares = [parse_share(text) for text in opts.prefix_hits]
    runs = state_shares(attach_scrapes(read_bench_files(opts.files), pairs), shares)
    checks = []
    if opts.check_files:
        checks = state_shares(attach_scrapes(read_bench_files(opts.check_files), pairs), shares)
    loaded = load_profile(opts.into)
    spec_runs = [run for run in runs if run.speculation is not None]
    drafter = bench_drafter(loaded, opts.drafter, bool(spec_runs))
    data, acceptance = with_acceptance(loaded, spec_runs, drafter, opts)
    prior = build_profile(data, str(loaded.path))
    caps = resolve_caps(runs, opts.caps, opts.server_args, prior)
    fits_engine_cost, engine_cost_why = engine_cost_rule(runs, prior)
    terms = terms_for(prior, drafter if spec_runs else None, fits_engine_cost)
    with tempfile.TemporaryDirectory(prefix="specsim-bench-") as tmp:
        folder = Path(tmp)
        replays = replays_of(runs, folder, drafter, caps, prior, opts)
        evaluator = Evaluator(prior, str(loaded.path), replays, terms, folder)
        result = calibrate(evaluator, opts.held_out)
        per_run = [run_report(evaluator, result, i) for i in range(len(runs))]
        checked = None
        if checks:
            replays = replays_of(checks, folder / "check", drafter, caps, prior, opts)
            checker = Evaluator(prior, str(loaded.path), replays, terms, folder / "check")
            checked = check_report(checker, result.theta, _files(checks))
    report = calibration_report(evaluator, result, per_run, loaded, acceptance)
    report["checked"] = checked
    report["engine_caps"] = {
        cap: {"value": getattr(caps, cap), "source": source}
        for cap, source in zip(("max_batch", "max_batched_tokens"), caps.sources, strict=True)
    }
    report["engine_request_cost"] = engine_cost_why
    report["gate"] = judge(report, opts.max_held_out_error, opts.accept_poor_fit)
    profile = _calibrated_profile(prior, evaluator, result, runs, loaded, opts, report)
    return BenchCalibration(profile, report, report_name(opts.out))


def engine_cost_rule(runs: list[BenchRun], prior: Profile) -> tuple[bool, str]:
    """Whether the fit takes ``overhead.per_request_engine_s`` from 0 (the runs' engine pays
    work per request in its own loop: ``Engine.request_work``), and why, for the report and
    the provenance."""
    names = sorted({run.engine for run in runs})
    known = entries(names)
    stated = prior.overhead.per_request_engine_s
    if stated > 0:
        return False, f"fitted from the prior's {stated:g} s"
    if len(known) == len(names) and all(e.request_work for e in known):
        work = "; ".join(f"{e.display}: {e.request_work}" for e in known)
        return True, f"fitted from 0: the engine's loop pays work per request it admits ({work})"
    return False, (
        f"kept at the prior's 0: {', '.join(names)} is not known to pay work per request in "
        "its loop (the registry's request_work)"
    )


def replays_of(runs: list[BenchRun], folder: Path, drafter, caps, prior, opts) -> list:
    """Each run's workload rebuilt as a trace under ``folder`` (``workload.replay``), a
    speculative one with its own acceptance."""
    folder.mkdir(parents=True, exist_ok=True)
    replays = []
    for i, run in enumerate(runs):
        spec = None
        if run.speculation is not None:
            if drafter is None:
                raise SpecsimError(
                    "a --check-runs file speculates, and the fitted runs do not",
                    file=run.source,
                    key="--check-runs",
                    fix="check on runs of the deployment the fit describes (speculation off), "
                    "or fit on speculative runs too",
                )
            spec = Speculation(
                drafter,
                run_k(run, opts.k),
                opts.verifier,
                opts.temperature,
                own_acceptance(run, drafter, opts, prior),
            )
        replays.append(replay(run, folder / f"run-{i:03d}.csv", spec, caps, opts.seed))
    return replays


def _files(runs: list[BenchRun]) -> list[dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry = files.setdefault(
            run.source,
            {
                "path": run.source,
                "sha256": run.sha256,
                "runs": 0,
                "format": run.format,
                "engine": run.engine,
            },
        )
        entry["runs"] += 1
        for key in ("engine_version", "model"):
            if getattr(run, key) and key not in entry:
                entry[key] = getattr(run, key)
    return list(files.values())


def _calibrated_profile(prior, evaluator, result, runs, loaded, opts, report) -> Profile:
    final = apply(prior, evaluator.terms, result.theta)
    data = final.model_dump(mode="json", exclude_none=True)
    data["name"] = opts.name
    _drop_stale_samples(data, prior, final)
    _move_sequences(data, loaded.path, opts.out)
    terms, fit, held, acceptance = (report[k] for k in ("terms", "fit", "held_out", "acceptance"))
    fitted = (
        ", ".join(f"{t['name']} {t['value']:.4g}" for t in terms if t["determined"])
        or "none (every term kept the prior's value)"
    )
    kept = ", ".join(t["name"] for t in terms if not t["determined"])
    scalar = [a for a in acceptance if a["from_scalar"]]
    note = (
        f"Calibrated to {len(runs)} benchmark run(s) of {runs[0].engine} in "
        f"{len({r.source for r in runs})} file(s) on the prior {loaded.path.name} "
        f"({loaded.profile.provenance.source}). Fitted: {fitted}."
        + (f" Kept at the prior (the runs do not determine them): {kept}." if kept else "")
        + f" Engine cost per admitted request: {report['engine_request_cost']}."
        + f" Fit error median {fit['median_abs_error']:.1%}"
        + ("" if held is None else f", held out {held['median_abs_error']:.1%}")
        + "."
        + checked_note(report["checked"])
        + "".join(
            f" Acceptance of {a['drafter']} at k = {', '.join(map(str, a['from_scalar']))} came "
            f"from a scalar: {a['rule']}."
            for a in scalar
        )
        + ("" if report["gate"]["accepted_with"] is None else accepted_note(report["gate"]))
    )
    data["provenance"] = {
        "source": "calibrated",
        "device": loaded.profile.provenance.device,
        "date": today(),
        "software": software_versions(),
        "command": opts.command,
        "notes": f"{note} Prior's notes: {loaded.profile.provenance.notes}".strip(),
        "calibration": {
            "prior": str(loaded.path),
            "prior_source": loaded.profile.provenance.source,
            "files": _files(runs),
            "terms": [{k: v for k, v in t.items() if k != "description"} for t in terms],
            "threshold": DETERMINED,
            "fit_median_abs_error": fit["median_abs_error"],
            "held_out": None
            if held is None
            else {
                "runs": len(runs),
                "median_abs_error": held["median_abs_error"],
                "max_abs_error": held["max_abs_error"],
            },
            "report": report_name(opts.out),
        },
    }
    if opts.runs_source is not None:
        data["provenance"]["calibration"]["runs_source"] = opts.runs_source
    if report["checked"] is not None:
        checked = {
            k: v for k, v in report["checked"].items() if k not in ("errors", "prior_errors")
        }
        data["provenance"]["calibration"]["checked"] = checked
    if data["provenance"]["command"] is None:
        del data["provenance"]["command"]
    if held is None:
        del data["provenance"]["calibration"]["held_out"]
    return build_profile(data, str(opts.out))


def checked_note(checked: dict | None) -> str:
    """The provenance note's sentence on the runs the fit never saw."""
    if checked is None:
        return ""
    figures = ", ".join(
        f"{name} {f['median_abs_error']:.1%} ({f['max_abs_error']:.1%})"
        for name, f in checked["figures"].items()
    )
    return (
        f" Predicted on {len(checked['runs'])} run(s) the fit never saw "
        f"({', '.join(checked['runs'])}): median |error| per figure (worst) {figures}."
    )


def _drop_stale_samples(data: dict, prior: Profile, final: Profile) -> None:
    """A scaled latency fit no longer fits the prior's measured samples: drop them (and its
    held-out error), which describe the prior's fit."""
    pairs = [("target", prior.target, final.target)]
    pairs += [(name, spec, final.drafters[name]) for name, spec in prior.drafters.items()]
    for name, before, after in pairs:
        if before.latency is None or before.latency.fit == after.latency.fit:
            continue
        latency = data["target" if name == "target" else "drafters"]
        latency = latency["latency"] if name == "target" else latency[name]["latency"]
        latency["samples"] = []
        latency["fit"].pop("held_out", None)
