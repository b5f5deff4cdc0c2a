"""Gradient diagnostics: pre-clip gradient norm per model and per agent, and a spike statistic.

Per-agent norms under LLM sharing. When several agents share one model, the model's gradient is the
sum of each agent's contribution g = sum_k g_k (each g_k computed with the loss weights of the full
batch). :class:`AgentGradNorms` measures ||g_k|| without extra backward passes: the update loop runs
the micro-batches of one agent after another and calls ``mark(agent)`` after each agent; the norm of
the gradient accumulated since the previous mark is that agent's contribution. Cost: one copy of the
gradients and one subtraction per agent.

Spike statistic (the paper shows spikes but never defines one): for the norm series g_1, g_2, ...
of one agent, ``ratio_t = g_t / median(g_{t-W}, ..., g_{t-1})`` over a rolling window of the previous
W steps (at least ``min_history`` of them); step t is a *spike* when ``ratio_t > threshold`` or g_t is
not finite. Defaults: W = 20, threshold = 3.0, min_history = 5.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd
import torch


def grad_norm(params: Iterable[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients (pre-clip); inf/nan propagate so that callers can detect them."""
    grads = [p.grad.detach().flatten() for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.cat([g.float() for g in grads])))


class AgentGradNorms:
    """Norm of each agent's contribution to the accumulated gradient of one model (see module doc)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self._last = self._flat()
        self.norms: dict[str, float] = {}

    def _flat(self) -> torch.Tensor:
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten() for p in self.params]
        return torch.cat(parts) if parts else torch.zeros(0)

    def mark(self, agent: str) -> float:
        """Record the norm of the gradient accumulated since the previous mark as ``agent``'s."""
        now = self._flat()
        norm = float(torch.linalg.vector_norm(now - self._last))
        self._last = now
        if agent in self.norms:
            raise ValueError(f"agent {agent!r} was already marked since the last zero_grad: run each agent's "
                             "micro-batches contiguously, or start a new AgentGradNorms after zero_grad")
        self.norms[agent] = norm
        return norm


@dataclass(frozen=True)
class SpikeRule:
    window: int = 20  # W: how many previous steps the rolling median covers
    threshold: float = 3.0  # a step is a spike when g_t > threshold * median of the window
    min_history: int = 5  # no verdict before this many previous steps

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_history < 1 or self.min_history > self.window or self.threshold <= 1:
            raise ValueError(f"invalid spike rule {self}: need window >= min_history >= 1 and threshold > 1")


def spike_ratios(norms: Iterable[float], rule: SpikeRule = SpikeRule()) -> pd.DataFrame:
    """Vectorized spike statistic over a whole series (for analysis): columns ``norm``, ``ratio``
    (NaN before ``min_history`` steps), ``spike``. Non-finite norms are spikes and are left out of the
    later medians."""
    s = pd.Series(np.asarray(list(norms), dtype=np.float64))
    finite = s.where(np.isfinite(s))
    median = finite.shift(1).rolling(rule.window, min_periods=rule.min_history).median()
    ratio = s / median
    spike = (ratio > rule.threshold) | ~np.isfinite(s)
    return pd.DataFrame({"norm": s, "ratio": ratio, "spike": spike.astype(bool)})


class SpikeDetector:
    """Streaming form of :func:`spike_ratios` for the trainer (same numbers, one step at a time)."""

    def __init__(self, rule: SpikeRule = SpikeRule()):
        self.rule = rule
        self.history: deque[float] = deque(maxlen=rule.window)
        self.count = 0

    def update(self, norm: float) -> tuple[float, bool]:
        """Return (ratio, is_spike) for the new norm, then add it to the window."""
        finite = math.isfinite(norm)
        window = [h for h in self.history if math.isfinite(h)]
        ratio = float("nan")
        if len(window) >= self.rule.min_history:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(np.float64(norm) / np.median(window))
        spike = (not finite) or (ratio > self.rule.threshold)
        self.history.append(norm)
        self.count += int(spike)
        return ratio, spike
