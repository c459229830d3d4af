"""Sweep points: one independent simulation each, named by a hash of what determines its result.

A point is a scenario file plus a list of ``--set`` overrides. Its key hashes the scenario's bytes,
the bytes of every file the (overridden) scenario refers to (the profile, a trace, acceptance
sequences beside the profile) and the overrides, so a cached result is reused only when nothing
that could change it has changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specsim.config import apply_overrides
from specsim.fileio import read_yaml

# Part of every key: bump it when the meaning of a stored result changes, so old caches are ignored.
KEY_VERSION = 1


@dataclass(frozen=True)
class SweepPoint:
    """One simulation: ``scenario`` (a path) with ``overrides`` applied in order.

    ``tags`` label the point for tables (load, k, drafter...); they do not enter the key.
    """

    scenario: str
    overrides: tuple[str, ...]
    tags: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def make(cls, scenario: str | Path, overrides: list[str] | tuple[str, ...], **tags: Any):
        return cls(str(Path(scenario).resolve()), tuple(overrides), dict(tags))

    def key(self) -> str:
        digest = referenced_digest(self.scenario, self.overrides)
        payload = json.dumps(
            {"v": KEY_VERSION, "content": digest, "overrides": list(self.overrides)},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, cached on (path, size, mtime) so a big trace is read once."""
    stat = os.stat(path)
    return _cached_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=256)
def _cached_digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _yaml(path: Path) -> dict[str, Any]:
    """``read_yaml`` cached on (path, size, mtime): a sweep hashes the same profile many times."""
    stat = os.stat(path)
    return _cached_yaml(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _cached_yaml(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    return read_yaml(path)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _strings(value)


def _referenced_files(base: Path, data: Mapping[str, Any]) -> list[Path]:
    """Existing files named by string values of ``data`` (relative to ``base`` or absolute).

    Found generically rather than by key, so a new file-valued scenario key is covered too. A
    profile's own references (acceptance sequences) are followed one level down.
    """
    found: dict[Path, None] = {}
    for text in _strings(data):
        if not text or "\n" in text or len(text) > 4096:
            continue
        # Relative paths may be meant relative to the scenario or to the working folder.
        for candidate in (base / text, Path(text)):
            try:
                if candidate.is_file():
                    found[candidate.resolve()] = None
            except OSError:
                continue
    for path in list(found):
        if path.suffix in (".yaml", ".yml"):
            try:
                nested = _yaml(path)
            except Exception:  # a malformed file still hashes by its bytes; the simulator says why
                continue
            for text in _strings(nested):
                candidate = path.parent / text
                try:
                    if "\n" not in text and len(text) < 4096 and candidate.is_file():
                        found[candidate.resolve()] = None
                except OSError:
                    continue
    return sorted(found)


def referenced_digest(scenario: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> str:
    """One digest over the scenario file and every file it refers to after ``overrides``."""
    scenario = Path(scenario)
    data = apply_overrides(_yaml(scenario), list(overrides))
    sha = hashlib.sha256(file_digest(scenario).encode())
    for path in _referenced_files(scenario.parent, data):
        sha.update(f"\0{path.name}\0{file_digest(path)}".encode())
    return sha.hexdigest()
