"""Lazy re-exports for a package's ``__init__`` (PEP 562): each public name is imported from its home module on
first access, so that importing a light submodule (a catalogue) does not import the heavy ones (torch)."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, homes: Mapping[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, whose names live in ``homes`` (module -> names)."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home_of[name]), name)

    def __dir__() -> list[str]:
        return sorted(home_of)

    return __getattr__, __dir__, list(home_of)
