"""One small registry type for every pluggable thing (agents, orchestras, environments, task sources,
rollout engines): a decorator to register under a name (duplicates rejected) and a lookup whose error
lists the registered names. A registry may declare its built-in names with the module of each (a catalogue), so
that the names are known before any implementation is imported. No dependencies, so any layer may use it."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name (a KeyError and a ValueError, so either handler catches it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: Mapping[str, str] | None = None):
        """``builtins``: the built-in names, each with the module that registers it. They are listed (``names``,
        ``in``) without importing anything, and the module is imported on the first ``get``, so that validating a
        config reads the catalogue only and never imports an implementation (torch)."""
        self.kind = kind
        self._items: dict[str, T] = {}
        self._builtins: dict[str, str] = dict(builtins or {})

    def _load(self, name: str) -> None:
        """Import the module that registers the built-in ``name`` (nothing when it is registered already, or
        while that module is being imported: ``import_module`` returns the module in progress)."""
        if name in self._builtins and name not in self._items:
            importlib.import_module(self._builtins[name])

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` on a class or factory. A built-in name is registered by
        its own module only: anyone else's registration under it is a duplicate."""

        def deco(obj: T) -> T:
            self._load(name)
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        self._load(name)
        if name not in self._items:
            if name in self._builtins:
                raise LookupError(f"{self.kind} {name!r} is declared as a built-in of {self._builtins[name]}, "
                                  "which did not register it")
            raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._items[name]

    __getitem__ = get

    def build(self, name: str, **kwargs: Any) -> Any:
        """``get(name)(**kwargs)``; a wrong keyword becomes a ValueError naming the registered item."""
        factory = self.get(name)
        try:
            return factory(**kwargs)  # type: ignore[operator]
        except TypeError as exc:
            raise ValueError(f"bad arguments for {self.kind} {name!r}: {exc}") from None

    def names(self) -> list[str]:
        """Every name: the built-ins (imported or not) and the registered ones."""
        return sorted(self._items.keys() | self._builtins.keys())

    def builtin_modules(self) -> dict[str, str]:
        """The declared built-in names and the modules that register them."""
        return dict(self._builtins)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._builtins

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
