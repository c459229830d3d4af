"""The flow runs one way: every import (at module level or inside a function) reaches only an
earlier part in ``specsim.layers.LAYERS``, and no import cycle exists between modules even when
the imports inside functions count, so none hides in a function to dodge one. The rules the order
exists for are also checked on their own, through every chain of imports: the parts that measure
devices or run models never reach the simulator or what runs it, and only they import torch."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from specsim.layers import LAYERS

PACKAGE = Path(__file__).resolve().parent.parent / "specsim"
ROOT_MODULES = {"__init__", "__main__", "layers"}  # the version, `python -m specsim`, this list
ABOVE_SIMULATION = ("calibration", "planning", "validation", "api", "cli")
# Part -> the parts it must never reach, directly or through any chain of imports.
NEVER_REACHES = {
    **dict.fromkeys(
        ("engine", "profiling", "sampling", "models", "costs", "profile"),
        ("simulation", *ABOVE_SIMULATION),
    ),
    "simulation": ABOVE_SIMULATION,
}
TORCH_PARTS = {"profiling", "sampling", "models", "engine"}  # the parts that run models


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, package: str = "specsim") -> list[tuple[int, str]]:
    """(line, imported name) of every import of ``package`` in the file, wherever it stands
    (a relative import resolved against the file's own package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if (name + ".").startswith(package + ".")]


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = path.relative_to(PACKAGE.parent).parent.parts
    base = package[: len(package) - node.level + 1]
    return ".".join((*base, node.module) if node.module else base)


def _is(path: Path, inside: str) -> bool:
    return path.relative_to(PACKAGE).as_posix() == inside


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

    def planted(path, package="specsim"):
        extra = [(1, "specsim.simulation.run")] if _is(path, "costs/step.py") else []
        return real(path, package) + extra

    monkeypatch.setattr(sys.modules[__name__], "imports", planted)
    assert upward_imports() == ["specsim/costs/step.py:1 imports specsim.simulation.run"]


def import_graph() -> dict[str, set[str]]:
    """Module -> the specsim modules it imports, at module level or inside functions."""
    known = modules()
    graph = {m: set() for m in known}
    for module, path in known.items():
        for _, name in imports(path):
            target = resolve(name, known)
            if target and target != module:
                graph[module].add(target)
    return graph


def forbidden_chains() -> list[str]:
    """Each module's shortest chain of imports to a part its own part must never reach."""
    graph = import_graph()
    found = []
    for module in graph:
        banned = NEVER_REACHES.get(part_of(module))
        if not banned:
            continue
        came_from = {module: None}
        todo = [module]
        while todo:  # breadth first, so the chain reported is a shortest one
            node = todo.pop(0)
            if part_of(node) in banned:
                chain = [node]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                found.append(" -> ".join(reversed(chain)))
                break
            for target in sorted(graph[node] - came_from.keys()):
                came_from[target] = node
                todo.append(target)
    return found


def test_measuring_and_model_parts_never_reach_the_simulator_or_what_runs_it():
    chains = forbidden_chains()
    assert not chains, "forbidden import chains:\n" + "\n".join(chains)


def test_a_planted_chain_through_an_allowed_part_is_found(monkeypatch):
    # The real engine importing the load estimates, which run the simulator's acceptance chains.
    real = imports

    def planted(path, package="specsim"):
        extra = [(1, "specsim.estimate.point")] if _is(path, "engine/batch.py") else []
        return real(path, package) + extra

    monkeypatch.setattr(sys.modules[__name__], "imports", planted)
    [chain] = [c for c in forbidden_chains() if c.startswith("specsim.engine.batch ")]
    assert chain.startswith("specsim.engine.batch -> specsim.estimate.point -> ")
    assert chain.rpartition(" -> ")[2].startswith("specsim.simulation.")


def torch_imports() -> list[str]:
    found = []
    for module, path in modules().items():
        if part_of(module) not in TORCH_PARTS:
            where = path.relative_to(PACKAGE.parent)
            found += [f"{where}:{line} imports {name}" for line, name in imports(path, "torch")]
    return found


def test_only_the_parts_that_run_models_import_torch():
    found = torch_imports()
    where = ", ".join(sorted(TORCH_PARTS))
    assert not found, f"torch imported outside {where}:\n" + "\n".join(found)


def test_a_planted_torch_import_is_found(monkeypatch):
    real = imports

    def planted(path, package="specsim"):
        extra = [(7, "torch.nn")] if _is(path, "costs/step.py") and package == "torch" else []
        return real(path, package) + extra

    monkeypatch.setattr(sys.modules[__name__], "imports", planted)
    assert torch_imports() == ["specsim/costs/step.py:7 imports torch.nn"]


def test_a_relative_import_is_resolved(tmp_path, monkeypatch):
    # A relative import must not dodge the rules: it names the same module an absolute one would.
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "specsim")
    (tmp_path / "specsim" / "costs").mkdir(parents=True)
    module = tmp_path / "specsim" / "costs" / "step.py"
    source = "from . import tree\nfrom ..simulation import run\nfrom torch import nn\n"
    module.write_text(source, encoding="utf-8")
    assert imports(module) == [(1, "specsim.costs.tree"), (2, "specsim.simulation.run")]
    assert imports(module, "torch") == [(3, "torch.nn")]


def test_no_module_import_cycle_even_through_imports_inside_functions():
    cycles = _strongly_connected(import_graph())
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
