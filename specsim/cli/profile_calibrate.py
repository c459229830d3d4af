"""Add an acceptance entry, calibrated from a production vLLM's Prometheus counters (a /metrics
scrape) or from saved responses that carry per-request acceptance (vLLM
--per-request-spec-decode-metrics, SGLang meta_info: their histograms keep the spread across
requests), to a profile and write the result.

  specsim profile calibrate metrics.txt --into profiles/mine.yaml --drafter small \\
      --verifier rejection --temperature 1.0 --out profiles/mine-calibrated.yaml
"""

from __future__ import annotations

import argparse

from specsim.cli.common import emit
from specsim.cli.profile_shared import add_fit_options, add_output, out_path
from specsim.errors import SpecsimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "scrape",
        metavar="SCRAPE",
        help="Prometheus text dump of vLLM's /metrics, or per-request responses as JSON or "
        "JSON Lines (vLLM metrics.speculative_decoding, SGLang meta_info)",
    )
    add_fit_options(parser, "the profile to add the acceptance to", required=True)
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only count series with this label (repeatable)",
    )
    add_output(parser, name=False)


def run(args: argparse.Namespace) -> int:
    from specsim.calibration.prometheus import calibrate_profile
    from specsim.profiling.writer import write_profile

    out, _ = out_path(args.out, None)
    if "=" in args.drafter:
        raise SpecsimError(
            "profile calibrate takes --drafter NAME (a drafter of the --into profile)",
            file="command line",
            key="--drafter",
            fix="give the drafter's name alone",
        )
    profile, counters = calibrate_profile(
        args.into,
        args.scrape,
        args.drafter,
        args.verifier,
        args.temperature,
        out,
        _labels(args.label),
    )
    write_profile(profile, out)
    entry = profile.acceptance[-1]
    summary = {
        "out": str(out),
        "drafter": entry.drafter,
        "verifier": entry.verifier,
        "temperature": entry.temperature,
        "k": counters.k,
        "speculative_steps": counters.drafts,
        counters.series_of.replace(" ", "_"): counters.series,
        "mean_acceptance_length": counters.mean_acceptance_length,
        "draft_acceptance_rate": counters.draft_acceptance_rate,
        "per_position_unconditional": counters.unconditional_rates(),
        "per_position_conditional": entry.per_position,
    }
    rates = ", ".join(f"{r:.3f}" for r in entry.per_position)
    human = (
        f"wrote {out}: {entry.drafter}/{entry.verifier} at T={entry.temperature:g} calibrated "
        f"from {counters.drafts:.0f} steps ({counters.series} {counters.series_of}), "
        f"k={counters.k}\n"
        f"  mean acceptance length {counters.mean_acceptance_length:.3f}, draft acceptance rate "
        f"{counters.draft_acceptance_rate:.3f}, conditional per-position rates [{rates}]"
    )
    emit(args, summary, human)
    return 0


def _labels(texts: list[str]) -> dict[str, str]:
    labels = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise SpecsimError(
                f"label {text!r} is not KEY=VALUE",
                file="--label",
                fix="write --label NAME=VALUE, e.g. --label model_name=my-model",
            )
        labels[key] = value
    return labels
