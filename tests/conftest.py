"""Shared pytest fixtures."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Test helpers (slow reference implementations) are imported by module name from this folder. The
# folder is not a package on purpose: some wheels (openrlhf) install a top-level ``tests`` package.
sys.path.insert(0, str(Path(__file__).parent))

from envs.paths import shared_data_dir


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One torch thread: on 2 shared cores the default (2) was measured 10-27x slower under load, with
    identical results."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data; skips the test with a clear message where it is absent."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"public benchmark data not found at {path} (set DRMAS_SHARED_DATA or run "
                    f"`drmas data prepare`); skipping tests that read it")
    return path
