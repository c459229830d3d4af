"""Parsing YAML, JSON and CSV text with limits, each failure one line naming the source.

PyYAML's and Python's parsers fail on some hostile or broken input with a traceback (deep
nesting past the stack, an integer past Python's digit limit, a CSV field past 128 KiB) or
run for ever (aliases that refer to aliases); here each is refused as a ``SpecsimError``. YAML
also refuses a key given twice, which the parser would settle silently by keeping the last.
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterator
from typing import Any

import yaml

from specsim.errors import SpecsimError

# Limits on what a YAML or JSON file may hold: far past any file specsim reads, and each keeps a
# hostile or broken file from exhausting the stack (nesting), memory (aliases referring to
# aliases) or the integer parser (thousands of digits).
MAX_DEPTH = 100
MAX_VALUES = 1_000_000
MAX_DIGITS = 100  # below Python's own limit (4,300); a longer one is past any bound a key has


SYNTAX_FIX = "correct the YAML syntax there (indentation, quotes, brackets)"
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(yaml.MarkedYAMLError):
    def __init__(self, problem: str, mark, fix: str):
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys, deep nesting and huge integers."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", mark, "flatten the nesting")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        # Checked before merge keys (<<) are expanded: a key may override a merged one.
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != MERGE_TAG:
                if (key_node.tag, key_node.value) in seen:
                    raise _Refused(
                        f"key {key_node.value!r} given twice", key_node.start_mark, "keep one"
                    )
                seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_DIGITS:
            raise _Refused(
                f"an integer of {len(node.value)} characters",
                node.start_mark,
                "give a number of the size the key takes",
            )
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values in ``node`` with every alias expanded, counted once per node (so linear time)."""
    if id(node) in sizes:
        if sizes[id(node)] < 0:
            raise _Refused(
                "an alias refers to a node that holds it", node.start_mark, "remove the alias"
            )
        return sizes[id(node)]
    sizes[id(node)] = -1
    children = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1 + sum(_expanded_size(child, sizes) for child in children)
    if size > MAX_VALUES:
        raise _Refused(
            f"over {MAX_VALUES:,} values once aliases are expanded",
            node.start_mark,
            "write the values out, without aliases of aliases",
        )
    sizes[id(node)] = size
    return size


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as data, or a one-line error naming ``source`` and the line."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecsimError(
            f"invalid YAML: {problem}",
            file=source,
            key=where,
            fix=getattr(exc, "fix", SYNTAX_FIX),
        ) from None
    finally:
        loader.dispose()


def _json_int(text: str) -> int:
    if len(text) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


JSON_DECODER = json.JSONDecoder(parse_int=_json_int)


@contextlib.contextmanager
def reading_json(source: str, fix: str, line: int | None = None) -> Iterator[None]:
    """Turn the JSON parser's failures (syntax, nesting past the stack, a huge integer) into a
    one-line error naming ``source`` and the line (``line``, for one line of a JSONL file)."""
    try:
        yield
    except json.JSONDecodeError as exc:
        where = f"line {line or exc.lineno}"
        raise SpecsimError(f"invalid JSON: {exc.msg}", file=source, key=where, fix=fix) from None
    except (RecursionError, ValueError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        where = None if line is None else f"line {line}"
        raise SpecsimError(f"invalid JSON: {problem}", file=source, key=where, fix=fix) from None


def parse_json(text: str, source: str, fix: str, line: int | None = None) -> Any:
    """JSON text as data, or a one-line error naming ``source`` with ``fix``."""
    with reading_json(source, fix, line):
        return JSON_DECODER.decode(text)


@contextlib.contextmanager
def reading_csv(source: str) -> Iterator[None]:
    """Turn the CSV reader's own failures (a field past its 128 KiB limit, a NUL byte) into a
    one-line error naming ``source``."""
    try:
        yield
    except csv.Error as exc:
        raise SpecsimError(
            f"unreadable CSV: {exc}", file=source, fix="give the table as comma-separated text"
        ) from None
