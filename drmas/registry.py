"""One small registry type for every pluggable thing (agents, orchestras, environments, task sources,
rollout engines): a decorator to register under a name (duplicates rejected) and a lookup whose error
lists the registered names. No dependencies, so any layer may use it."""
from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name (a KeyError and a ValueError, so either handler catches it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` on a class or factory."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {sorted(self._items)}")
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
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
