"""Rollout engine interface: batched text generation from the current policy, and its weight refresh.

Implementations register under a name (``register_engine``) and are built with ``make_engine``; the
orchestra and agents only see :class:`RolloutEngine`. This module imports no backend (HF, vLLM).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from drmas.rollout.catalog import ENGINES, register_engine  # noqa: F401


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response per prompt."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax) decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with probability mass >= top_p (1 = off)."""
    top_k: int = 0
    """Keep only the top_k most likely tokens (0 = off)."""
    max_new_tokens: int = 64
    """Longest response, in tokens; a response that reaches it without EOS is marked truncated."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy decoding)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; use 1.0 to turn nucleus sampling off")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0; use 0 to turn top-k sampling off")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One response per prompt, in prompt order."""

    prompt_ids: list[list[int]]
    """Token ids of each prompt as the model saw it (after left truncation)."""
    response_ids: list[list[int]]
    """Generated token ids, without the stop token and padding."""
    texts: list[str]
    """Decoded responses (special tokens skipped)."""
    truncated: list[bool]
    """True where the response hit ``max_new_tokens`` without a stop token."""

    def response_ids_with_eos(self, eos_id: int) -> list[list[int]]:
        """Response ids with ``eos_id`` appended where the model stopped by itself: the tokens to train on,
        so that the policy gradient also reaches the decision to stop."""
        return [ids + [eos_id] if not cut else list(ids) for ids, cut in zip(self.response_ids, self.truncated)]


class RolloutEngine(abc.ABC):
    """Generates responses with the current policy weights."""

    @abc.abstractmethod
    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        """One response per prompt; the same ``seed`` (and inputs) gives the same responses."""

    @abc.abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Refresh the weights after an update. ``None``: the engine shares the trainer's module (nothing
        to copy); a state dict: copy it in (what a separate inference engine does once per step)."""


def render_prompts(tokenizer: Any, prompts: Sequence[str], chat_template: bool,
                   chat_template_kwargs: dict[str, Any] | None = None) -> list[str]:
    """Prompts as the model sees them: raw text, or each wrapped as one user message in the tokenizer's
    chat template with the generation prompt appended (reference: ``data.return_raw_chat=True``)."""
    if not chat_template:
        return list(prompts)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("rollout.chat_template is on but the tokenizer has no chat template; turn it off for "
                         "checkpoints without one (e.g. the tiny CPU models)")
    kwargs = dict(chat_template_kwargs or {})
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True, **kwargs) for p in prompts]


def stop_positions(tokens: torch.Tensor, stop_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For generated tokens [B, T]: the length of each response before its first stop token, and
    whether it has none (truncated). Tokens after the first stop token (padding) are ignored."""
    is_stop = torch.isin(tokens, stop_ids)
    has_stop = is_stop.any(dim=1)
    first_stop = torch.where(has_stop, is_stop.int().argmax(dim=1), torch.full_like(has_stop, tokens.shape[1], dtype=torch.long))
    return first_stop.long(), ~has_stop


EngineFactory = Callable[..., RolloutEngine]


def make_engine(name: str, **kw) -> RolloutEngine:
    """Build the engine registered as ``name`` (a built-in one is imported on first use)."""
    return ENGINES.build(name, **kw)
