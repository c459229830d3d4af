"""The training corpus of the built-in models: Python's own standard library source.

It is present offline wherever Python is, so anyone can retrain the built-ins. The file list is
fixed (the top-level ``*.py`` files of the stdlib folder, sorted by name); every tenth file is held
out for evaluation and for the shipped prompt set. The corpus differs between Python versions, so
its sha256 is recorded and training says when it does not match.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np

from specsim.models.tokenizer import BYTE_BOS_ID, BYTE_EOS_ID

HELD_OUT_EVERY = 10
HELD_OUT_OFFSET = 5


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[Path]:
    """Top-level ``*.py`` files of the standard library, sorted by name."""
    root = stdlib_dir() if root is None else root
    return sorted((p for p in root.glob("*.py") if p.is_file()), key=lambda p: p.name)


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): every tenth file is held out."""
    held = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_OFFSET]
    train = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY != HELD_OUT_OFFSET]
    return train, held


def corpus_sha256(files: list[Path]) -> str:
    """Digest of the file names and contents, in order."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def token_stream(files: list[Path]) -> np.ndarray:
    """Byte-level ids of the files, each wrapped in BOS ... EOS, as one int64 array."""
    parts = []
    for path in files:
        parts.append(np.array([BYTE_BOS_ID], dtype=np.int64))
        parts.append(np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int64))
        parts.append(np.array([BYTE_EOS_ID], dtype=np.int64))
    return np.concatenate(parts)


def make_prompts(
    files: list[Path],
    count: int,
    rng: np.random.Generator,
    min_bytes: int = 160,
    max_bytes: int = 320,
) -> list[str]:
    """``count`` prompts of whole lines (``min_bytes``..``max_bytes`` UTF-8 bytes each), drawn
    round-robin from the files at random line offsets. Prompts end with a newline, as a code
    completion request does; ones that are mostly blank are skipped."""
    texts = [f.read_text(encoding="utf-8") for f in files]
    lines = [t.splitlines(keepends=True) for t in texts]
    prompts: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(prompts) < count:
        attempts += 1
        if attempts > 100 * count:
            raise RuntimeError("could not draw enough prompts from the held-out files")
        file_lines = lines[attempts % len(lines)]
        if len(file_lines) < 10:
            continue
        start = int(rng.integers(0, len(file_lines) - 5))
        chosen: list[str] = []
        size = 0
        for line in file_lines[start:]:
            line_size = len(line.encode("utf-8"))
            if size + line_size > max_bytes:
                break
            chosen.append(line)
            size += line_size
            if size >= min_bytes:
                break
        text = "".join(chosen)
        if size < min_bytes or len(text.strip()) < min_bytes // 2 or text in seen:
            continue
        seen.add(text)
        prompts.append(text)
    return prompts


def prompts_jsonl(prompts: list[str]) -> str:
    return "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts)
