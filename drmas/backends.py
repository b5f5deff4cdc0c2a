"""The registered backends (``train.backend``) and what each can do (:class:`Capabilities`), read by
:mod:`drmas.config` validation and the trainer. Built in:

========== ===================================== ===================================================
name       class                                 where the worker groups run
========== ===================================== ===================================================
local      drmas/workers/local.py                in this process (CPU default, the tests)
ray        drmas/workers/ray_backend.py          one Ray actor each, in one placement group
openrlhf   drmas/workers/openrlhf/backend.py     OpenRLHF DeepSpeed actors + vLLM (GPU) or hf engine
========== ===================================== ===================================================

A backend is registered with its capabilities and the place of its class (``"module:Class"``); the class is
imported only when a run builds it (:func:`drmas.workers.base.make_backend`), so validating a config imports
no Ray, vLLM or OpenRLHF, and this module imports nothing of drmas but the registry (no import cycle with
:mod:`drmas.config`, which the worker groups import). To add a backend: a class with the
:class:`drmas.workers.base.Backend` methods, and one :func:`register_backend` call here or in a module the run
imports before it loads its config (docs/architecture.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from drmas.registry import Registry


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports; config validation (``RunConfig._check_backend``) and the trainer ask these
    instead of comparing backend names."""

    engines: tuple[str, ...]
    """Rollout engines (``models.*.rollout.engine``) its worker groups generate with; the first is the one
    to suggest."""
    generates_with: str
    """How it generates, in words (error messages)."""
    restart: bool
    """It can replace dead workers (:meth:`Backend.restart`); otherwise a death stops the run."""
    reference_model: bool
    """It keeps a frozen reference model for a KL penalty (``algo.kl_coef > 0``)."""
    aggregations: tuple[str, ...] | None = None
    """The loss aggregations (``algo.aggregation``) it implements; ``None``: all of them."""
    needs_checkpoint: bool = False
    """Every model must name a checkpoint ``path`` (a folder or a hub id)."""
    one_temperature_per_model: bool = False
    """The agents that share a model must sample at one temperature (its update scores at one)."""


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: its capabilities, and its class as ``"module:Class"`` (imported on build)."""

    target: str
    capabilities: Capabilities
    states_check: str | None = None
    """``"module:function"``: ``function(specs, states)`` checks a checkpoint's worker states against what they
    point to outside the run's checkpoint folder (openrlhf: the DeepSpeed files) and raises
    :class:`~drmas.checkpoints.CheckpointDamaged`; ``None``: a worker state holds everything it needs."""

    def build(self, specs: dict[str, Any], **options: Any) -> Any:
        """An instance of the class at ``target`` for the worker groups ``specs`` (``WorkerSpec`` by key), with
        the class's keyword ``options``."""
        return _imported(self.target)(specs, **options)

    def check_states(self, specs: dict[str, Any], states: dict[str, Any]) -> None:
        """Run :attr:`states_check` on a checkpoint's worker ``states``, before a backend is built to load them
        (``drmas export`` refuses a damaged checkpoint before it starts the backend)."""
        if self.states_check is not None:
            _imported(self.states_check)(specs, states)


def _imported(target: str) -> Any:
    """The object at ``"module:name"``."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


BACKENDS: Registry[BackendEntry] = Registry("backend (train.backend)")


def register_backend(name: str, target: str, capabilities: Capabilities,
                     states_check: str | None = None) -> BackendEntry:
    """Register the backend class at ``target`` (``"module:Class"``) as ``train.backend: name``, with its
    :attr:`BackendEntry.states_check` if its worker states point outside the checkpoint folder."""
    return BACKENDS.register(name)(BackendEntry(target, capabilities, states_check))



_IN_WORKER = Capabilities(engines=("fast", "hf"), generates_with="drmas's engines in the worker", restart=True,
                          reference_model=True)
register_backend("local", "drmas.workers.local:LocalBackend", _IN_WORKER)
register_backend("ray", "drmas.workers.ray_backend:RayBackend", _IN_WORKER)
register_backend("openrlhf", "drmas.workers.openrlhf.backend:OpenRLHFBackend", Capabilities(
    engines=("vllm", "fast", "hf"), generates_with="vLLM (GPU) or drmas's engines in the driver", restart=False,
    reference_model=False, aggregations=("token_mean", "seq_mean_token_mean"), needs_checkpoint=True,
    one_temperature_per_model=True), states_check="drmas.workers.openrlhf.seam:check_states")
