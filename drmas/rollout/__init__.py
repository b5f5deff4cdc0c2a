"""Rollout engines: the interface (:mod:`drmas.rollout.base`) and the HF ``generate`` engine ("hf")."""
from drmas.rollout.base import (
    ENGINES,
    Generation,
    RolloutEngine,
    SamplingParams,
    make_engine,
    register_engine,
    stop_positions,
)
from drmas.rollout.hf import HFRolloutEngine

__all__ = ["ENGINES", "Generation", "RolloutEngine", "SamplingParams", "make_engine", "register_engine",
           "stop_positions", "HFRolloutEngine"]
