"""Options and output shared by the ``specsim profile`` sub-commands: each option is defined
once here and added to the sub-commands that take it."""

from __future__ import annotations

import argparse
from pathlib import Path

from specsim.bounds import MAX_TEMPERATURE
from specsim.cli.common import SEED, Number, add_json, emit
from specsim.errors import SpecsimError
from specsim.sampling.kinds import LOSSY_VERIFIERS, VERIFIER_KINDS

TEMPERATURE = Number(float, 0, MAX_TEMPERATURE)


class Once(argparse.Action):
    """Store an option's value, refusing a second one: the last silently winning hides a typo."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) not in (None, self.default):
            raise argparse.ArgumentError(self, "given twice; fix: give it once")
        setattr(namespace, self.dest, values)


def add_output(parser: argparse.ArgumentParser, name: bool = True) -> None:
    """``--out`` (a file or a folder), ``--name`` where the sub-command names the profile, and
    ``--json``."""
    parser.add_argument(
        "--out",
        metavar="FILE",
        required=True,
        help="profile YAML to write (a path ending in .yaml), or a folder to write NAME.yaml in",
    )
    if name:
        parser.add_argument(
            "--name", metavar="NAME", help="profile name (default: the output file's stem)"
        )
    parser.set_defaults(_check_out=_check_out_path, name=None)
    add_json(parser)


def add_drafter_models(parser: argparse.ArgumentParser, model: str) -> None:
    """``--drafter NAME=MODEL`` (repeatable), for the sub-commands that describe drafters."""
    parser.add_argument(
        "--drafter",
        metavar="NAME=MODEL",
        action="append",
        default=[],
        help=f"a drafter: NAME=MODEL ({model}), NAME=ngram, NAME=ngram:N (prompt lookup with "
        "n-gram size N), NAME=mtp (the target's own multi-token-prediction module, "
        "DeepSeek-V3's) or, for profile roofline, NAME=eagle:CONFIG / NAME=eagle3:CONFIG (an "
        "EAGLE or EAGLE-3 head's config.json) or NAME=dflash:CONFIG / NAME=p_eagle:CONFIG:K "
        "(a parallel drafter); repeatable",
    )


def add_fit_options(
    parser: argparse.ArgumentParser, into: str, required: bool, defaults: dict | None = None
) -> None:
    """``--into``, ``--drafter NAME``, ``--verifier`` and ``--temperature``: the profile a
    calibration starts from and the acceptance entry it writes. ``defaults`` ends the help of
    the last three where they are optional (a missing --into is the calibration's to explain)."""
    parser.add_argument("--into", metavar="PROFILE", required=required, help=into)
    for option, what, kind in (
        (
            "--drafter",
            "the drafter the server ran, one of the --into profile's",
            {"metavar": "NAME"},
        ),
        ("--verifier", "the verifier the server ran", {"choices": tuple(VERIFIER_KINDS)}),
        ("--temperature", "the temperature it sampled at", {"metavar": "T", "type": TEMPERATURE}),
    ):
        parser.add_argument(
            option,
            action=Once,
            required=required,
            help=what + (defaults or {}).get(option, ""),
            **kind,
        )


def add_seed(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--seed", metavar="SEED", type=SEED, default=0, help=f"{what} (default 0)")


def out_path(out: str, name: str | None) -> tuple[Path, str]:
    """``--out x.yaml`` is the file; any other ``--out`` is a folder for ``NAME.yaml``."""
    path = Path(out)
    option = "--name" if name else "--out"
    if path.suffix in (".yaml", ".yml"):
        return path, _profile_name(name or path.stem, option)
    name = _profile_name(name or "profile", option)
    return path / f"{name}.yaml", name


def _profile_name(name: str, option: str) -> str:
    """The profile's name goes into its file name and its reports: a plain, printable one."""
    from specsim.config import check_name

    try:
        check_name(name)
    except ValueError as exc:
        message, _, fix = str(exc).partition("; fix: ")
        raise SpecsimError(message, file="command line", key=option, fix=fix) from None
    if "/" in name or "\\" in name:
        raise SpecsimError(
            f"name {name!r} holds a path separator",
            file="command line",
            key=option,
            fix="give the folder in --out and a plain name in --name",
        )
    return name


def _check_out_path(args: argparse.Namespace) -> None:
    from specsim.fileio import check_output_file

    check_output_file(out_path(args.out, args.name)[0])


def summarise(args, profile, out: Path, extra: list[str] | None = None) -> None:
    """The written profile's summary: its target's and drafters' costs, its acceptance."""
    from specsim.profile import LatencyModel

    context = _summary_context(profile.target.latency)
    target = LatencyModel(profile.target.latency, "target")
    decode = target.pass_seconds([context], 1)
    lines = [
        f"wrote {out} ({profile.provenance.source}, {profile.provenance.device})",
        *(extra or []),
        f"  target: {profile.target.description}: decode at context {context} "
        f"{decode * 1e3:.2f} ms/pass",
    ]
    summary = {
        "out": str(out),
        "source": profile.provenance.source,
        "device": profile.provenance.device,
        "summary_context": context,
        "target_decode_s": decode,
        "drafters": {},
        "acceptance_entries": len(profile.acceptance),
    }
    for dname, spec in profile.drafters.items():
        if spec.latency is not None:
            secs = LatencyModel(spec.latency, dname).pass_seconds([context], 1)
            lines.append(f"  drafter {dname}: decode at context {context} {secs * 1e3:.2f} ms/pass")
        else:
            secs = spec.draft_step_s
            lines.append(f"  drafter {dname}: {spec.kind}, {secs * 1e3:.3g} ms per step")
        summary["drafters"][dname] = {"kind": spec.kind, "step_s": secs}
    for entry in profile.acceptance:
        mal = entry.mean_acceptance_length
        k = 4 if 4 in mal else max(mal)
        lines.append(
            f"  acceptance {entry.drafter}/{entry.verifier}@T={entry.temperature:g} "
            f"({entry.source}{', lossy' if entry.verifier in LOSSY_VERIFIERS else ''}): "
            f"mean acceptance length at k={k}: {mal[k]:.2f}"
        )
    emit(args, summary, "\n".join(lines))


def _summary_context(latency) -> int:
    """1024 tokens of context, or the largest measured context if the grid stopped short."""
    if latency.valid_range is None:
        return 1024
    return min(1024, latency.valid_range.context[1])
