"""Rollout engines: the interface (:mod:`drmas.rollout.base`), the fused decode loop for small Qwen2 models
("fast", the CPU default, :mod:`drmas.rollout.fast`), the HF ``generate`` engine ("hf", its reference) and the vLLM
engine ("vllm", :mod:`drmas.rollout.vllm_engine`; vLLM itself is imported only when an engine is launched).

The names below are imported from their modules on first access (PEP 562), so that the torch-free catalogue
:mod:`drmas.rollout.catalog` (what config validation reads) imports no engine."""
from __future__ import annotations

from drmas.lazy import lazy_exports

_HOMES: dict[str, tuple[str, ...]] = {
    "drmas.rollout.catalog": ("ENGINES", "register_engine"),
    "drmas.rollout.base": ("Generation", "RolloutEngine", "SamplingParams", "make_engine", "stop_positions"),
    "drmas.rollout.hf": ("HFRolloutEngine",),
    "drmas.rollout.fast": ("FastRolloutEngine",),
    "drmas.rollout.vllm_engine": ("VLLMRolloutEngine",),
}
__getattr__, __dir__, __all__ = lazy_exports("drmas.rollout", _HOMES)
