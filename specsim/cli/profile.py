"""Measure, estimate or calibrate a profile YAML: one sub-command for each source of its numbers.

Measure real models on this machine (latency grid, acceptance on a prompt set):
  specsim profile measure --target specsim-target --drafter small=specsim-draft-small \\
      --drafter ngram --device cpu --out profiles/mine.yaml

Estimate hardware you do not have from datasheet numbers (a roofline model):
  specsim profile roofline --hardware profiles/hardware/h100-sxm.yaml \\
      --target profiles/models/llama3.1-8b.json \\
      --drafter llama3.2-1b=profiles/models/llama3.2-1b.json --drafter ngram \\
      --acceptance-from profiles/acceptance/llama3.1-8b_llama3.2-1b.assumed.yaml \\
      --out profiles/llama3.1-8b_llama3.2-1b_h100-roofline.yaml

Calibrate a profile to the serving engine's own benchmark runs:
  specsim profile from-bench runs/*.json --into profiles/mine-roofline.yaml \\
      --drafter llama3.2-1b --out profiles/mine-calibrated.yaml

Calibrate acceptance from a production vLLM's Prometheus counters (or saved per-request
responses of vLLM or SGLang):
  specsim profile calibrate metrics.txt --into profiles/mine.yaml --drafter small \\
      --verifier rejection --temperature 1.0 --out profiles/mine-calibrated.yaml

Each sub-command's --help lists its options.
"""

from __future__ import annotations

import argparse
import importlib

# name -> (one-line help, module): the module has add_arguments(parser) and run(args).
MODES = {
    "measure": ("measure models on this machine", "specsim.cli.profile_measure"),
    "roofline": ("estimate a deployment from datasheet numbers", "specsim.cli.profile_roofline"),
    "from-bench": ("calibrate a profile to engine benchmark runs", "specsim.cli.profile_bench"),
    "calibrate": ("add acceptance from a vLLM metrics scrape", "specsim.cli.profile_calibrate"),
}
# The options that chose a mode before the modes were sub-commands.
OLD_SPELLINGS = {
    "--target": "measure",
    "--roofline": "roofline",
    "--from-bench": "from-bench",
    "--calibrate": "calibrate",
}


class _MovedTo(argparse.Action):
    """An option that chose a mode before: one line naming the sub-command that replaces it."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        mode = OLD_SPELLINGS[option_string]
        old, new = f"specsim profile {option_string}", f"specsim profile {mode}"
        if option_string == "--target":
            old, new = f"{old} MODEL", f"{new} --target MODEL"
        elif option_string != "--roofline":
            value = "RESULT..." if mode == "from-bench" else "SCRAPE"
            old, new = f"{old} {value}", f"{new} {value}"
        parser.error(f"{old} is now {new}; fix: write {new} (see specsim profile {mode} --help)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    for name, (help_text, module_name) in MODES.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_profile_run=module.run)
    for option in OLD_SPELLINGS:
        parser.add_argument(option, action=_MovedTo)


def run(args: argparse.Namespace) -> int:
    return args._profile_run(args)
