"""Reading a prompt set: JSONL (``{"prompt": ...}`` per line) or plain text.

Plain text holds one prompt per paragraph (paragraphs separated by blank lines); a file without
blank lines holds one prompt per line.
"""

from __future__ import annotations

from pathlib import Path

from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.parsing import parse_json

PROMPT_KEYS = ("prompt", "text")
JSONL_FIX = 'write one JSON object per line, e.g. {"prompt": "..."}'


def read_prompts(path: str | Path) -> list[str]:
    path = Path(path)
    text = read_text(path, "prompt file")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # JSON lines under another suffix are still JSON: read as text, their keys would be prompts.
    if path.suffix in (".jsonl", ".ndjson", ".json") or (
        lines and all(line.startswith("{") and line.endswith("}") for line in lines)
    ):
        prompts = _jsonl(text, str(path))
    else:
        blocks = [b.strip() for b in text.replace("\r\n", "\n").split("\n\n")]
        blocks = [b for b in blocks if b]
        if len(blocks) <= 1:
            blocks = lines
        prompts = blocks
    if not prompts:
        raise SpecsimError(
            "the prompt file holds no prompts",
            file=str(path),
            fix='write one prompt per line or paragraph, or JSONL lines {"prompt": ...}',
        )
    return prompts


def _jsonl(text: str, source: str) -> list[str]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = parse_json(line, source, JSONL_FIX, line=number)
        value = next((row[k] for k in PROMPT_KEYS if isinstance(row, dict) and k in row), None)
        if not isinstance(value, str) or not value.strip():
            raise SpecsimError(
                "no non-empty 'prompt' string",
                file=source,
                key=f"line {number}",
                fix='give each line a "prompt" string',
            )
        prompts.append(value)
    return prompts
