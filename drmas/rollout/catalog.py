"""The rollout engines' catalogue: each built-in engine's name and the module that implements it. Torch-free,
so that validating ``models.*.rollout.engine`` imports no engine."""
from __future__ import annotations

from drmas.registry import Registry

ENGINES: Registry = Registry("rollout engine", builtins={"fast": "drmas.rollout.fast", "hf": "drmas.rollout.hf",
                                                         "vllm": "drmas.rollout.vllm_engine"})
"""Engine name -> factory (:data:`drmas.rollout.base.EngineFactory`), built with :func:`drmas.rollout.make_engine`."""

register_engine = ENGINES.register  # class decorator: make an engine buildable as make_engine(name, ...)
