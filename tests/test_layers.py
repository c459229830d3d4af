"""The flow runs one way: every import (at module level or inside a function) reaches only an
earlier part in ``specsim.layers.LAYERS``, and no import cycle exists between modules even when
the imports inside functions count, so none hides in a function to dodge one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from specsim.layers import LAYERS

PACKAGE = Path(__file__).resolve().parent.parent / "specsim"
ROOT_MODULES = {"__init__", "__main__", "layers"}  # the version, `python -m specsim`, this list


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported name) of every specsim import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specsim"):
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("specsim")]
    return found


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module an imported name lives in (``a.b.c`` is module a.b.c, or a name in a.b)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_every_part_is_placed_in_the_order():
    parts = {part_of(m) for m in modules()} - {None} - ROOT_MODULES
    assert parts == set(LAYERS), "add the new part to specsim/layers.py"
    assert len(LAYERS) == len(set(LAYERS))


def upward_imports() -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    known = modules()
    upward = []
    for module, path in known.items():
        source = part_of(module)
        if source is None or source in ROOT_MODULES:
            continue
        for line, name in imports(path):
            target = part_of(resolve(name, known) or name)
            if target in (None, source, "__version__") or target in ROOT_MODULES - {"layers"}:
                continue
            if rank[target] > rank[source]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return upward


def test_no_import_reaches_a_later_part():
    upward = upward_imports()
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_a_planted_upward_import_is_found(monkeypatch):
    # The cost model importing the simulator (what StepCosts' old home made possible).
    real = imports

    def planted(path):
        extra = [(1, "specsim.simulation.run")] if path.name == "step.py" else []
        return real(path) + extra

    monkeypatch.setattr(sys.modules[__name__], "imports", planted)
    assert upward_imports() == ["specsim/costs/step.py:1 imports specsim.simulation.run"]


def test_no_module_import_cycle_even_through_imports_inside_functions():
    known = modules()
    graph = {m: set() for m in known}
    for module, path in known.items():
        for _, name in imports(path):
            target = resolve(name, known)
            if target and target != module:
                graph[module].add(target)
    cycles = _strongly_connected(graph)
    assert not cycles, f"import cycles: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize(
    "edges, expected",
    [({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]), ({"a": {"b"}, "b": set()}, [])],
)
def test_the_cycle_finder_finds_a_planted_cycle(edges, expected):
    assert _strongly_connected(edges) == expected
