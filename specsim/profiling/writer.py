"""Assembling, validating and writing profile files.

Every profile the profiler writes is validated against ``specsim.profile.schema.Profile`` before
it touches the disk, then written atomically (sequence files first, the profile last, so a profile
never names a file that is not there). Floats are rounded to 6 significant digits so files stay
readable and equal inputs give byte-identical files.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from specsim.config import validate_as
from specsim.errors import SpecsimError
from specsim.fileio import dump_yaml, read_yaml, write_text_atomic
from specsim.profile.acceptance import Acceptance
from specsim.profile.latency import Latency
from specsim.profile.schema import Profile
from specsim.profiling.flops import ModelShape
from specsim.version import __version__

MAX_K = 8


def today() -> str:
    """ISO date; ``SOURCE_DATE_EPOCH`` (the reproducible-builds convention) pins it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.strip().isdigit():
        return dt.datetime.fromtimestamp(int(epoch), tz=dt.timezone.utc).date().isoformat()
    return dt.datetime.now(tz=dt.timezone.utc).date().isoformat()


def software_versions(extra: dict[str, str] | None = None) -> dict[str, str]:
    versions = {
        "specsim": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    versions.update(extra or {})
    return versions


def command_line(argv: list[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["specsim", *args])  # quoted: an argument may hold spaces


def model_spec(
    shape: ModelShape,
    kind: str,
    dtype_bytes: float,
    latency: Latency | dict[str, Any],
    description: str = "",
) -> dict[str, Any]:
    """A target or draft-model entry with its shape numbers and latency section."""
    if isinstance(latency, Latency):
        latency = latency.model_dump(mode="json", exclude_none=True)
    return {
        "kind": kind,
        "description": description or shape.name,
        "params": shape.param_count(),
        "layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "vocab_size": shape.vocab_size,
        "kv_bytes_per_token": shape.kv_bytes_per_token(dtype_bytes),
        "weight_bytes": shape.weight_bytes(dtype_bytes),
        "flops_per_token": shape.flops_per_token(),
        "attention_flops_per_context_token": shape.attention_flops_per_pair(),
        "latency": latency,
    }


def ngram_spec(n: int, draft_step_s: float, description: str = "") -> dict[str, Any]:
    """A prompt-lookup drafter: no model, a fixed lookup cost per step."""
    return {
        "kind": "ngram",
        "description": description
        or f"prompt lookup: propose the continuation of the last {n}-gram's earlier occurrence",
        "draft_step_s": draft_step_s,
    }


def chain_mean_acceptance_lengths(
    per_position: list[float], proposal_rate: float = 1.0, max_k: int = MAX_K
) -> dict[int, float]:
    """Mean acceptance length (1 + accepted / steps) for k = 1..max_k implied by conditional
    per-position rates: ``1 + r x sum_i prod_{j<=i} a_j``. Positions past the list reuse its
    last rate. Only for entries without measured lengths (measured ones come from the walk)."""
    rates = list(per_position) + [per_position[-1]] * max(0, max_k - len(per_position))
    result = {}
    reach, total = 1.0, 0.0
    for k in range(1, max_k + 1):
        reach *= rates[k - 1]
        total += reach
        result[k] = 1.0 + proposal_rate * total
    return result


def complete_acceptance(entry: dict[str, Any]) -> dict[str, Any]:
    """Fill ``mean_acceptance_length`` from the chain rates when the entry has none (an entry
    given by its acceptance_histograms has its length derived by the schema)."""
    entry = dict(entry)
    if not entry.get("mean_acceptance_length") and entry.get("per_position"):
        entry["mean_acceptance_length"] = chain_mean_acceptance_lengths(
            entry["per_position"], entry.get("proposal_rate", 1.0)
        )
    return entry


def round_floats(value: Any, digits: int = 6) -> Any:
    """Round every float to ``digits`` significant digits (recursively)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if np.isfinite(value) else value
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [round_floats(v, digits) for v in value]
    return value


def build_profile(data: dict[str, Any], source: str) -> Profile:
    """Validate a profile mapping (with acceptance lengths completed and floats rounded)."""
    data = dict(data)
    data["acceptance"] = [complete_acceptance(a) for a in data.get("acceptance", [])]
    return validate_as(Profile, round_floats(data), source)


def profile_yaml(profile: Profile) -> str:
    data = profile.model_dump(mode="json", exclude_none=True)
    for entry in data.get("acceptance", []):
        # JSON mode turns the k keys into strings; YAML keeps them as integers.
        entry["mean_acceptance_length"] = {
            int(k): v for k, v in entry.get("mean_acceptance_length", {}).items()
        }
        if not entry.get("acceptance_histograms"):  # none given: the file says nothing of them
            entry.pop("acceptance_histograms", None)
    header = (
        f"# specsim profile {profile.name!r} ({profile.provenance.source}, "
        f"{profile.provenance.device}). Schema: `specsim schema profile`.\n"
    )
    return header + dump_yaml(round_floats(data))


def write_profile(
    profile: Profile, path: str | Path, side_files: dict[str, str] | None = None
) -> Path:
    """Write side files (acceptance sequences) next to ``path``, then the profile itself."""
    path = Path(path)
    for name, text in (side_files or {}).items():
        write_text_atomic(path.parent / name, text)
    return write_text_atomic(path, profile_yaml(profile))


def acceptance_entries(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """Acceptance entries from a YAML mapping with an ``acceptance`` list, each validated."""
    entries = data.get("acceptance")
    if not isinstance(entries, list) or not entries:
        raise SpecsimError(
            "no acceptance entries",
            file=source,
            key="acceptance",
            fix="give a file with an 'acceptance' list (a profile or an acceptance file)",
        )
    result = []
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise SpecsimError(
                "expected a mapping",
                file=source,
                key=f"acceptance[{i}]",
                fix="write each entry as 'key: value' lines (see docs/reference/profile.md)",
            )
        try:
            # Checked as given first: completing the lengths needs well-formed rates.
            given = validate_as(Acceptance, raw, source).model_dump(mode="json", exclude_none=True)
            checked = validate_as(Acceptance, complete_acceptance(given), source)
        except SpecsimError as exc:
            key = f"acceptance[{i}]" + (f".{exc.key}" if exc.key else "")
            raise SpecsimError(exc.message, file=source, key=key, fix=exc.fix) from None
        result.append(checked.model_dump(mode="json", exclude_none=True))
    return result


def copied_acceptance(path: str | Path, drafters: set[str]) -> tuple[list[dict], str]:
    """Acceptance entries of an acceptance file or another profile, checked against the given
    drafter names, and a provenance note saying where they came from."""
    data = read_yaml(path, "acceptance file")
    entries = acceptance_entries(data, str(path))
    for i, entry in enumerate(entries):
        if entry["drafter"] not in drafters:
            raise SpecsimError(
                f"acceptance names drafter {entry['drafter']!r}, not given with --drafter",
                file=str(path),
                key=f"acceptance[{i}].drafter",
                fix=f"add --drafter {entry['drafter']}=... or use a matching file",
            )
    extra = data.get("notes") if isinstance(data.get("notes"), str) else ""
    return entries, f"Acceptance copied from {Path(path).name}. {extra}".strip()
