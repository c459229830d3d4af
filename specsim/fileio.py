"""File input and output with the project's guarantees.

Outputs are written atomically: into a temporary file or folder next to the destination, then
renamed, so an error never leaves a half-written result. Inputs fail with a one-line
``SpecsimError`` naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from specsim.errors import SpecsimError


def read_text(path: str | Path, what: str = "file") -> str:
    """Read a UTF-8 text file or fail with a one-line error."""
    path = Path(path)
    if not path.exists():
        raise SpecsimError(f"{what} not found", file=str(path), fix="check the path")
    if path.is_dir():
        raise SpecsimError(
            f"expected a {what}, found a folder", file=str(path), fix="give the path of a file"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecsimError(
            f"not UTF-8 text (byte {exc.start})", file=str(path), fix="save the file as UTF-8"
        ) from None


def read_yaml(path: str | Path, what: str = "YAML file") -> dict[str, Any]:
    """Read a YAML mapping; anything else (syntax error, a list, empty) is a one-line error."""
    text = read_text(path, what)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecsimError(
            f"invalid YAML: {problem}",
            file=str(path),
            key=where,
            fix="correct the YAML syntax there (indentation, quotes, brackets)",
        ) from None
    if data is None:
        raise SpecsimError("file is empty", file=str(path), fix=f"write a {what}")
    if not isinstance(data, dict):
        raise SpecsimError(
            f"expected a mapping at the top level, found {type(data).__name__}",
            file=str(path),
            fix=f"write a {what} as 'key: value' lines",
        )
    return data


def dump_yaml(data: Any) -> str:
    """YAML text with a stable key order, so equal inputs give byte-identical files."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def atomic_output_dir(out: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success move its files into ``out``, on error drop it.

    Files already in ``out`` that the run does not produce are left alone; files it produces
    replace the old ones only once the whole run has succeeded.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecsimError(
            "output path exists and is not a folder",
            file=str(out),
            fix="choose another --out, or remove that file",
        )
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        yield staging
        out.mkdir(exist_ok=True)
        for item in sorted(staging.rglob("*")):
            if item.is_file():
                dest = out / item.relative_to(staging)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(item, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
