"""The execution layer's contract: every registered backend implements the Backend protocol, and its
declared capabilities are what config validation asks."""
from __future__ import annotations

import importlib
import inspect

import pytest

from drmas.config import ConfigError, load_config
from drmas.workers.base import Backend
from drmas.backends import BACKENDS

OPERATIONS = [name for name, _ in inspect.getmembers(Backend, inspect.isfunction) if not name.startswith("_")]


def test_the_protocol_is_what_the_trainer_uses():
    assert sorted(OPERATIONS) == ["close", "generators", "get_states", "restart", "set_states", "update"]


@pytest.mark.parametrize("name", BACKENDS.names())
def test_every_registered_backend_implements_the_protocol(name):
    module, _, cls_name = BACKENDS.get(name).target.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    for op in OPERATIONS:
        assert callable(getattr(cls, op, None)), f"{name}: {cls_name} lacks {op}"
        assert list(inspect.signature(getattr(cls, op)).parameters) == \
            list(inspect.signature(getattr(Backend, op)).parameters), f"{name}.{op}: signature differs"


def test_validation_asks_capabilities_not_names(monkeypatch):
    """A backend registered under a new name is validated by what it declares."""
    from dataclasses import replace

    from drmas.backends import BackendEntry

    openrlhf = BACKENDS.get("openrlhf")
    vllm_only = replace(openrlhf, target="nowhere:Nothing",
                        capabilities=replace(openrlhf.capabilities, engines=("vllm",), generates_with="vLLM"))
    monkeypatch.setitem(BACKENDS._items, "elsewhere", vllm_only)
    assert isinstance(vllm_only, BackendEntry)
    with pytest.raises(ConfigError, match="needs train.backend=elsewhere or openrlhf"):
        load_config(None, ["models.shared.rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="the elsewhere backend generates with vLLM"):
        load_config(None, ["train.backend=elsewhere", "models.shared.path=org/m"])
