"""Rollout engines: the interface (:mod:`drmas.rollout.base`), the fused decode loop for small Qwen2 models
("fast", the CPU default, :mod:`drmas.rollout.fast`), the HF ``generate`` engine ("hf", its reference) and the vLLM
engine ("vllm", :mod:`drmas.rollout.vllm_engine`; vLLM itself is imported only when an engine is launched)."""
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
from drmas.rollout.fast import FastRolloutEngine
from drmas.rollout.vllm_engine import VLLMRolloutEngine

__all__ = ["ENGINES", "Generation", "RolloutEngine", "SamplingParams", "make_engine", "register_engine",
           "stop_positions", "FastRolloutEngine", "HFRolloutEngine", "VLLMRolloutEngine"]
