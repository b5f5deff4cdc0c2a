"""Where data lives. Public benchmark files are looked up in ``$DRMAS_SHARED_DATA`` (default: the
``shared/data`` folder beside the repository checkout); prepared files go to ``$DRMAS_DATA_DIR``
(default ``<repo>/data_cache``)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """Folder with the public benchmark files (may not exist on a user's machine)."""
    return Path(os.environ.get("DRMAS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def data_cache_dir() -> Path:
    """Folder for prepared data, indexes and other derived files (git-ignored)."""
    path = Path(os.environ.get("DRMAS_DATA_DIR", REPO_ROOT / "data_cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path
