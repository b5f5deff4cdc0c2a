"""Shared pytest fixtures."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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


@contextmanager
def held_by_another_process(folder: Path) -> Iterator[subprocess.Popen]:
    """A live process holding ``folder``'s lock (``drmas.locks.folder_lock``) for the ``with`` body."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom drmas.locks import folder_lock\n"
                               f"with folder_lock({str(folder)!r}, 'run folder'):\n    print('held', flush=True)\n"
                               "    sys.stdin.read()"], cwd=Path(__file__).resolve().parents[1],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
