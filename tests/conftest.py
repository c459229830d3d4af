"""Shared test set-up: one thread per worker (CI has 2 cores); GPU tests skip cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
# Read the public traces from the shared data folder when it is beside the checkout (as in CI);
# otherwise use the project's attributed copies.
SHARED_TRACES = REPO.parent / "shared" / "data" / "traces"
TRACES = SHARED_TRACES if SHARED_TRACES.is_dir() else REPO / "scenarios" / "traces"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return TRACES
