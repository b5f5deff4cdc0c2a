"""Executing a notebook headless in the tests (nbclient), as a researcher's Jupyter would."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def execute_notebook(path: Path) -> tuple[str, list[dict]]:
    """Run every cell of ``path`` with the repository root as working directory; return (the cells' text output,
    every output). The kernel "python3" is the ipykernel of the interpreter running the tests (the venv's) and
    inherits its environment, so parameters go in as environment variables (``monkeypatch.setenv``)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return "".join(o.get("text", "") for o in outputs), outputs
