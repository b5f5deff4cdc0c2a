"""The config schema documents itself: every field of every section has a description, and the advantage
conventions' defaults are the one Conventions dataclass's."""
from __future__ import annotations

from dataclasses import asdict

from pydantic import BaseModel

from drmas.algos.advantages import Conventions
from drmas.config import AlgoConfig, RunConfig


def _sections(model: type[BaseModel], seen: set) -> list[type[BaseModel]]:
    import typing

    out = [model]
    seen.add(model)
    for field in model.model_fields.values():
        for t in [field.annotation, *typing.get_args(field.annotation)]:
            if isinstance(t, type) and issubclass(t, BaseModel) and t not in seen:
                out += _sections(t, seen)
    return out


def test_every_config_field_is_described():
    missing = [f"{m.__name__}.{name}" for m in _sections(RunConfig, set())
               for name, f in m.model_fields.items() if not f.description]
    assert not missing, f"fields without a description: {missing}"


def test_algo_conventions_default_to_the_one_dataclass():
    assert AlgoConfig().conventions() == Conventions()
    assert asdict(AlgoConfig().conventions()) == asdict(Conventions())
