"""Every notebook runs top to bottom, as a newcomer would run it from a fresh checkout.

Each notebook is executed with nbclient in a temporary folder laid out like the repository (the
notebook under ``notebooks/``, copies of ``profiles/`` and ``scenarios/`` beside it), so it can use
only what the project ships and what specsim installs, and its outputs never land in the working
tree. The kernel is this interpreter (a kernel spec written into the temporary folder points at
``sys.executable``), so no ``ipykernel install`` is needed on a fresh machine. Each notebook has
a wall-clock budget for all its cells together (``NOTEBOOK_BUDGET_S``): past it the kernel is
interrupted and the test fails.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SHIPPED = ("profiles", "scenarios")
NOTEBOOK_BUDGET_S = 300  # all cells of one notebook; each takes well under a minute on 2 cores
KERNEL_NAME = "specsim-test-python"
FIGURES = {
    "01-quickstart": 2,
    "02-choosing-k": 2,
    "03-drafter-swap": 2,
    "04-losslessness": 1,
    "05-tree-search": 1,
}  # at least, per notebook


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder with the shipped inputs and a kernel spec for this interpreter."""
    root = tmp_path_factory.mktemp("checkout")
    for name in SHIPPED:
        shutil.copytree(ROOT / name, root / name)
    (root / "notebooks").mkdir()
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    kernel = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "specsim tests",
        "language": "python",
    }
    (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
    return root


class NotebookOverBudget(AssertionError):
    """A notebook's cells together ran longer than its budget."""


def execute(path: Path, checkout: Path, budget_s: float) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` inside ``checkout/notebooks``; return it."""
    nb = nbformat.read(path, as_version=4)
    specs = KernelSpecManager(kernel_dirs=[str(checkout / "kernels")])
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    client = NotebookClient(
        nb,
        km=manager,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(checkout / "notebooks")}},
        startup_timeout=120,
    )
    # Over budget, interrupt the kernel: the running cell then fails with KeyboardInterrupt.
    watchdog = threading.Timer(budget_s, manager.interrupt_kernel)
    with client.setup_kernel():
        watchdog.start()
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
        except CellExecutionError as exc:
            if watchdog.finished.is_set():
                raise NotebookOverBudget(f"{path.name}: over its {budget_s} s budget") from exc
            raise
        finally:
            watchdog.cancel()
    return nb


def test_every_notebook_is_found():
    names = [p.stem for p in NOTEBOOKS]
    assert names == [
        "01-quickstart",
        "02-choosing-k",
        "03-drafter-swap",
        "04-losslessness",
        "05-tree-search",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from specsim" in sources, "notebooks use specsim's API or CLI, not their own logic"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, checkout, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows figures
    nb = execute(path, checkout, NOTEBOOK_BUDGET_S)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any(o.output_type == "stream" for o in outputs), "a notebook shows its results"
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= FIGURES.get(path.stem, 0), "a figure is missing"
    # Nothing was written into the shipped inputs: outputs stay under notebooks/runs.
    for name in SHIPPED:
        copied = sorted(p.relative_to(checkout / name) for p in (checkout / name).rglob("*"))
        shipped = sorted(p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*"))
        assert copied == shipped


def test_a_failing_cell_fails_the_run(checkout, tmp_path, monkeypatch):
    """Negative control for the runner: an error or an overrun in any cell fails the test."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}
    )
    nb.cells = [
        nbformat.v4.new_code_cell("import specsim\nprint('ok')"),
        nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'planted failure'"),
    ]
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    with pytest.raises(CellExecutionError, match="planted failure"):
        execute(broken, checkout, 120)
    nb.cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(30)")]
    nbformat.write(nb, broken)
    with pytest.raises(NotebookOverBudget, match="over its 2 s budget"):
        execute(broken, checkout, 2)
