"""File input and output with the project's guarantees.

Outputs are written atomically: into a temporary file or folder next to the destination, then
renamed, so an error never leaves a half-written result. Written files and folders get the
usual mode from the umask. A staging folder holds a lock while its run lives, so a later run can
tell a killed run's leftovers (removed) from a live concurrent run's (kept). Inputs fail with a
one-line ``SpecsimError`` naming the file.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from specsim.errors import SpecsimError
from specsim.parsing import parse_yaml

try:
    import fcntl
except ImportError:  # not POSIX: staging folders carry no lock, and none is reaped
    fcntl = None


def check_input_file(path: str | Path, what: str = "file") -> Path:
    """``path`` names an existing file, or a one-line error says what it is instead."""
    path = Path(path)
    if not path.exists():
        raise SpecsimError(f"{what} not found", file=str(path), fix="check the path")
    if path.is_dir():
        raise SpecsimError(
            f"expected a {what}, found a folder", file=str(path), fix="give the path of a file"
        )
    return path


def read_text(path: str | Path, what: str = "file") -> str:
    """Read a UTF-8 text file or fail with a one-line error."""
    path = check_input_file(path, what)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecsimError(
            f"not UTF-8 text (byte {exc.start})", file=str(path), fix="save the file as UTF-8"
        ) from None


def read_yaml(path: str | Path, what: str = "YAML file") -> dict[str, Any]:
    """Read a YAML mapping; anything else (syntax error, a list, empty) is a one-line error."""
    data = parse_yaml(read_text(path, what), str(path))
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


def umask() -> int:
    """The process's umask, read where the system shows it (Linux) rather than set and reset."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_folder(out: str | Path, option: str = "--out") -> Path:
    """Fail with a one-line error, before any work, when ``out`` cannot be a folder we write in.

    Results are staged beside ``out``, so the folder above it must be writable (or creatable)
    as well as ``out`` itself when it exists.
    """
    out = Path(out)
    if _exists(out, out, option) and not out.is_dir():
        raise SpecsimError(
            "output path exists and is not a folder",
            file=str(out),
            key=option,
            fix=f"choose another {option}, or remove that file",
        )
    _check_writable(out.parent, out, option)
    if out.is_dir():
        _check_writable(out, out, option)
        # Runs write into sub-folders of out (points, engine, deployments) as they go.
        _refuse_linked_folders(out, [Path(c.name, "file") for c in out.iterdir() if c.is_dir()])
    return out


def check_output_file(path: str | Path, option: str = "--out") -> Path:
    """As ``check_output_folder`` for a file to be written: its folder must be usable."""
    path = Path(path)
    if _exists(path, path, option) and path.is_dir():
        raise SpecsimError(
            "output file is an existing folder",
            file=str(path),
            key=option,
            fix=f"give {option} a file name that is not a folder",
        )
    _check_writable(path.parent, path, option)
    return path


def _check_writable(folder: Path, out: Path, option: str) -> None:
    """``folder`` (made if missing) can hold new files: its nearest existing ancestor is a
    folder in which one can be made. Tried by making and removing one, which holds for root."""
    above = folder
    while not _exists(above, out, option) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise SpecsimError(
            f"{above} is a file, so no folder can be made under it",
            file=str(out),
            key=option,
            fix=f"choose an {option} that is not under the file {above}",
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specsim-write-check.", dir=above))
    except OSError as exc:
        raise SpecsimError(
            f"cannot write in {above} ({exc.strerror})",
            file=str(out),
            key=option,
            fix=f"choose an {option} in a folder you can write to, or change its permissions",
        ) from None


def _exists(path: Path, out: Path, option: str) -> bool:
    try:
        return path.exists()
    except OSError as exc:  # e.g. a folder above it that this user may not enter
        raise SpecsimError(
            f"cannot look at {path} ({exc.strerror})",
            file=str(out),
            key=option,
            fix=f"choose an {option} in a folder you can read and write",
        ) from None


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    path = Path(path)
    _make_folder(path.parent, path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); a result gets the mode any new file would.
        os.chmod(tmp, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


STAGING_LOCK = ".specsim-staging.lock"


@contextlib.contextmanager
def atomic_output_dir(out: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success move its files into ``out``, on error drop it.

    Files already in ``out`` that the run does not produce are left alone; files it produces
    replace the old ones only once the whole run has succeeded. Staging folders of runs that
    were killed (their lock is free) are removed first.
    """
    out = check_output_folder(out)
    parent = out.parent
    _make_folder(parent, out)
    remove_stale_staging(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    lock = _hold_staging_lock(staging)
    try:
        yield staging
        _make_folder(out, out)
        items = [p for p in sorted(staging.rglob("*")) if p.is_file() and p.name != STAGING_LOCK]
        _refuse_linked_folders(out, [item.relative_to(staging) for item in items])
        for item in items:
            dest = out / item.relative_to(staging)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(item, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def _refuse_linked_folders(out: Path, relatives: list[Path]) -> None:
    """Refuse, before any file moves, a folder inside ``out`` that is a symbolic link: results
    would land wherever it points, outside the folder the user named."""
    for relative in relatives:
        folder = out
        for part in relative.parent.parts:
            folder = folder / part
            if folder.is_symlink():
                raise SpecsimError(
                    f"{folder} is a symbolic link, and results are not written through one",
                    file=str(out),
                    key="--out",
                    fix="remove the link, or choose another --out",
                )


def _make_folder(folder: Path, out: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecsimError(
            f"cannot make the folder {folder} ({exc.strerror})",
            file=str(out),
            fix="choose an output path in a folder you can write to",
        ) from None


def _hold_staging_lock(staging: Path) -> int | None:
    """Lock a file in ``staging`` for as long as this process lives (the kernel drops it then).

    The lock is taken under another name and renamed into place, so a reaper never finds the
    lock file unlocked while its owner is alive.
    """
    if fcntl is None:
        return None
    claiming = staging / (STAGING_LOCK + ".new")
    fd = os.open(claiming, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.replace(claiming, staging / STAGING_LOCK)
    return fd


def remove_stale_staging(out: str | Path) -> list[Path]:
    """Remove the staging folders beside ``out`` whose owner is gone; return what was removed.

    A staging folder's lock is free only once its run has ended; a run that ended normally
    removed its folder itself, so a free lock marks a killed run. Folders without a lock (being
    set up this instant, or of another system) are left alone.
    """
    if fcntl is None:
        return []
    out = Path(out)
    removed = []
    for folder in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        lock_path = folder / STAGING_LOCK
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live run holds it
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed
