"""The folder a sweep writes: ``sweep.json`` names the sweep it holds, ``points/`` its results.
A folder holding another sweep, or points without a manifest, is refused before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.fileio import dump_json, write_text_atomic

MANIFEST = "sweep.json"
POINTS = "points"
MANIFEST_FORMAT = 1


def check_folder(out: Path, identity: dict[str, Any]) -> None:
    """Refuse a folder that holds another sweep or unrelated files; touch nothing."""
    if out.exists() and not out.is_dir():
        raise SpecsimError(
            "output path exists and is not a folder", file=str(out), fix="choose a folder"
        )
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            stored = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise SpecsimError(
                "sweep manifest is unreadable",
                file=str(manifest),
                fix="delete the folder or choose another --out",
            ) from None
        theirs, ours = stored.get("identity"), jsonable(identity)
        if theirs != ours:
            raise SpecsimError(
                f"folder holds a different sweep ({identity_difference(theirs, ours)})",
                file=str(out),
                key=MANIFEST,
                fix="choose another --out folder, or delete this one to start afresh",
            )
    elif out.is_dir() and (out / POINTS).exists():
        raise SpecsimError(
            "folder holds sweep points but no sweep.json",
            file=str(out),
            fix="choose another --out folder, or delete this one",
        )


def write_manifest(out: Path, identity: dict[str, Any]) -> None:
    """Name the sweep ``out`` holds (once) and make its points folder."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        text = dump_json({"format": MANIFEST_FORMAT, "identity": jsonable(identity)})
        write_text_atomic(manifest, text)
    (out / POINTS).mkdir(parents=True, exist_ok=True)


def jsonable(value: Any) -> Any:
    """``value`` as JSON gives it back (keys sorted, the rest as text)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def identity_difference(theirs: Any, ours: dict[str, Any]) -> str:
    """Which settings differ between the stored sweep and this one, in a few words."""
    if not isinstance(theirs, dict):
        return "unrecognised manifest"
    keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    shown = []
    for key in keys[:3]:
        old, new = json.dumps(theirs.get(key)), json.dumps(ours.get(key))
        if key == "content":
            shown.append("the scenario or a file it refers to has changed since")
        elif len(old) + len(new) > 80:
            shown.append(f"{key} differs")
        else:
            shown.append(f"{key}: {old} there, {new} here")
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return "; ".join(shown) + more
