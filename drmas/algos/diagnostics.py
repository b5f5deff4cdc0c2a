"""Gradient diagnostics: pre-clip gradient norm per model and per agent, and a spike statistic.

Per-agent norms under LLM sharing. When several agents share one model, the model's gradient is the
sum of each agent's contribution g = sum_k g_k (each g_k computed with the loss weights of the full
batch). :class:`AgentGradNorms` measures ||g_k|| without extra backward passes: the update loop runs
the micro-batches of one agent after another and calls ``mark(agent)`` after each agent; the norm of
the gradient accumulated since the previous mark is that agent's contribution. Cost: one copy of the
gradients and one subtraction per agent.

Agents' shares of a shared update. With ``keep_parts=True`` the tracker also keeps each contribution g_k
(one more float32 copy of the gradient per agent) and gives, once every agent is marked,

    share_k = g_k · g / ||g||²     (Σ_k share_k = 1; g = Σ_k g_k, the accumulated pre-clip gradient)
    cos_ab  = g_a · g_b / (||g_a|| ||g_b||)

``share_k`` is the part of the shared update's direction that agent k's rows pull for: clipping and AdamW act on g,
so an estimator that rescales one agent's advantages changes the shares, not only ||g_k||. A share is NaN where
||g|| = 0 and a cosine where either norm is 0.

Spike statistic (the paper shows spikes but never defines one): for the norm series g_1, g_2, ...
of one agent, ``ratio_t = g_t / median(g_{t-W}, ..., g_{t-1})`` over a rolling window of the previous
W steps (at least ``min_history`` of them); step t is a *spike* when ``ratio_t > threshold`` or g_t is
not finite. A window whose median is below ``min_baseline`` gives no ratio (NaN) and no spike: an agent whose
gradient is ~0 most steps (all-zero advantages, near-deterministic outputs such as a Verifier's yes/no)
would otherwise turn any non-zero step into a "spike" of ratio 10^3 (13-15 such Verifier spikes in 30
steps of a CPU search run without the floor). Defaults: W = 20, threshold = 3.0, min_history = 5, min_baseline = 1e-3 (the pre-clip
norms of agents that learn are 0.05-2 at CPU scale).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd
import torch


def lemma_factors(scores, task_ids, agent_ids, traj_ids, baseline: str) -> pd.DataFrame:
    """Lemma 4.2 factor of each agent in each task group, under the baseline (μ_b, σ_b) of ``baseline``
    (an estimator of :data:`drmas.algos.ESTIMATORS`):

        F_k = E_{Y_k}[(x − μ_b)²] / σ_b²  =  (σ_k² + (μ_k − μ_b)²) / σ_b²      (Lemma 4.2, population moments)

    where x is the value the estimator normalizes for each of agent k's steps (``trajectory_grpo``: the
    step's trajectory-mean score, μ_b and σ_b over the group's trajectories; ``pooled_grpo``: the step
    score over all steps of the group; ``drmas``: agent k's own μ_k, σ_k, so F_k = 1). Computed as the
    mean of A² over agent k's steps with A the estimator's advantage at population std and no ε
    (``ddof=0, eps=0``). Normalization groups with σ_b = 0 (a constant group, or a single step: A = 0,
    no gradient) are left out, as the Lemma divides by σ². Returns one row per (task, agent) with
    ``factor`` and ``n`` (agent k's steps in the group)."""
    from drmas.algos.advantages import compute_advantages

    a = compute_advantages(scores, task_ids, agent_ids, traj_ids, estimator=baseline, ddof=0, eps=0.0,
                           singleton="zero", scale_by_std=True).advantages.double().numpy()
    frame = pd.DataFrame({"task": np.asarray(task_ids), "agent": np.asarray(agent_ids), "a2": a * a, "signal": a != 0})
    g = frame.groupby(["task", "agent"], sort=False).agg(factor=("a2", "mean"), n=("a2", "size"), signal=("signal", "any"))
    return g[g["signal"]].drop(columns="signal").reset_index()


ROUNDING = 1e-6
"""A class sum S_c = Σ_{i∈c} A_i with |S_c| <= ROUNDING · Σ_{i∈c} |A_i| is zero: the float32 advantages carry a
relative rounding error of 2^-24 ≈ 6e-8 each, so an exact cancellation (Dr. MAS on a fully repeated response)
leaves a residue below that bound, which would otherwise turn a zero second moment into 1e-14 and a ratio into
1e15."""


def step_classes(task_ids, agent_ids, prompt_ids, response_ids) -> np.ndarray:
    """Class code (0 .. C−1) of each step: two steps share a class when they have the same task group, agent,
    prompt token ids and response token ids. The per-sample gradient z = ∇θ log π(response | prompt) depends
    on the prompt and the response alone, so the steps of one class have one and the same z (whatever the
    loss aggregation: it weights a sample by its token count, also shared). Each step's token ids are hashed
    once (a tuple key); the grouping is a pandas factorization, exact (no hash collisions)."""
    keys = np.empty(len(response_ids), object)
    keys[:] = [(tuple(p), tuple(r)) for p, r in zip(prompt_ids, response_ids)]
    frame = pd.DataFrame({"task": np.asarray(task_ids), "agent": np.asarray(agent_ids),
                          "pair": pd.factorize(keys)[0]})
    return frame.groupby(["task", "agent", "pair"], sort=False).ngroup().to_numpy()


def class_sums(advantages, class_ids) -> np.ndarray:
    """S_c = Σ_{i∈c} A_i for each class c (index = class code), float64, with sums below float32 rounding set
    to 0 (:data:`ROUNDING`)."""
    a = np.asarray(advantages, np.float64)
    codes = np.asarray(class_ids)
    s = np.bincount(codes, weights=a)
    s[np.abs(s) <= ROUNDING * np.bincount(codes, weights=np.abs(a))] = 0.0
    return s


def class_factors(scores, task_ids, agent_ids, traj_ids, class_ids, baselines,
                  reference: str = "drmas") -> pd.DataFrame:
    """Class-aware Lemma 4.2 factor of each agent under each estimator b of ``baselines``, relative to
    ``reference`` (agent-wise normalization), and the agent's share of distinct classes per task group.

    Agent k's batch gradient is g_k ∝ Σ_g Σ_{c ∈ C_gk} S_c z_c with S_c = Σ_{i∈c} A_i: the steps of a class c
    (identical prompt and response, :func:`step_classes`) share one per-sample gradient z_c, so their
    advantages add up before they multiply it (docs/theory.md, "Repeated responses"). With the z_c
    orthogonal (or independent with mean 0) and of equal norm, E‖g_k‖² ∝ M_k = Σ_g Σ_c S_c², and

        class_factor_k(b) = M_k(b) / M_k(reference) = Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(ref)²

    the predicted ratio of squared gradient norms, b over the reference, on this batch. A is the estimator's
    advantage at population std and no ε (``ddof=0, eps=0``, singletons 0), the convention of
    :func:`lemma_factors`, so that the two factors differ only in the grouping: when every class holds one
    step, class_factor_k = Σ_i A_i(b)² / Σ_i A_i(ref)², the n-weighted mean over task groups of F_k (groups
    whose reference std is 0 aside). Under the reference (Dr. MAS) Σ_{i ∈ group} A_i = 0 for each agent, so a
    group whose agent-k steps are all one class adds 0 to M_k(ref), while a global baseline leaves
    S = n (μk − μ)/σ. M_k(ref) = 0 gives inf (M_k(b) > 0) or NaN (both 0).

    Returns one row per agent (index ``agent``): ``distinct`` = |C_gk| / n_gk averaged over task groups,
    ``m2_{name}`` = M_k for the reference and each b, and ``factor_{b}``."""
    from drmas.algos.advantages import compute_advantages

    codes = np.asarray(class_ids)
    steps = pd.DataFrame({"task": np.asarray(task_ids), "agent": np.asarray(agent_ids), "cls": codes})
    per_group = steps.groupby(["task", "agent"], sort=False)["cls"].agg(["nunique", "size"])
    out = (per_group["nunique"] / per_group["size"]).groupby(level="agent", sort=False).mean().to_frame("distinct")
    class_agent = steps.groupby("cls")["agent"].first().reindex(np.arange(codes.max() + 1 if codes.size else 0))
    for name in dict.fromkeys([reference, *baselines]):
        a = compute_advantages(scores, task_ids, agent_ids, traj_ids, estimator=name, ddof=0, eps=0.0,
                               singleton="zero", scale_by_std=True).advantages.double().numpy()
        s = class_sums(a, codes)
        out[f"m2_{name}"] = pd.Series(s * s, index=class_agent.to_numpy()).groupby(level=0).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        for b in baselines:
            out[f"factor_{b}"] = out[f"m2_{b}"] / out[f"m2_{reference}"]
    out.index.name = "agent"
    return out


def grad_norm(params: Iterable[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients (pre-clip); inf/nan propagate so that callers can detect them."""
    grads = [p.grad.detach().flatten() for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.cat([g.float() for g in grads])))


class AgentGradNorms:
    """Norm of each agent's contribution to the accumulated gradient of one model (see module doc)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], keep_parts: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self._last = self._flat()
        self.norms: dict[str, float] = {}
        self.keep_parts = keep_parts
        self._parts: dict[str, torch.Tensor] = {}

    def _flat(self) -> torch.Tensor:
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten() for p in self.params]
        return torch.cat(parts) if parts else torch.zeros(0)

    def mark(self, agent: str) -> float:
        """Record the norm of the gradient accumulated since the previous mark as ``agent``'s."""
        if agent in self.norms:
            raise ValueError(f"agent {agent!r} was already marked since the last zero_grad: run each agent's "
                             "micro-batches contiguously, or start a new AgentGradNorms after zero_grad")
        now = self._flat()
        part = now - self._last
        self._last = now
        self.norms[agent] = float(torch.linalg.vector_norm(part))
        if self.keep_parts:
            self._parts[agent] = part
        return self.norms[agent]

    def shares(self) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
        """``(share_k per agent, cos_ab per pair of agents in marking order)`` of the marked contributions
        (module doc); needs ``keep_parts=True``."""
        if not self.keep_parts:
            raise ValueError("AgentGradNorms.shares needs keep_parts=True (the contributions are not kept otherwise)")
        names = list(self._parts)
        if not names:
            return {}, {}
        parts = torch.stack([self._parts[n].double() for n in names])
        gram = parts @ parts.T  # g_a · g_b
        total = float(gram.sum())  # ||Σ_k g_k||²
        nan = float("nan")
        share = {n: float(gram[i].sum()) / total if total > 0 else nan for i, n in enumerate(names)}
        norm = gram.diagonal().sqrt()
        cos = {(a, b): float(gram[i, j] / (norm[i] * norm[j])) if norm[i] > 0 and norm[j] > 0 else nan
               for i, a in enumerate(names) for j, b in enumerate(names) if i < j}
        return share, cos


def token_pieces(tokenizer: Any) -> np.ndarray:
    """Every token id of ``tokenizer`` decoded alone: the ``pieces`` of :func:`control_positions`."""
    return np.array(tokenizer.batch_decode([[i] for i in range(len(tokenizer))]), object)


def control_positions(pieces: np.ndarray, responses: list[list[int]], tags: Iterable[str]) -> np.ndarray:
    """Index of each response's control token (-1: none): the token whose text holds the first non-blank
    character after the first occurrence of the row's tag (``Agent.control_tag``) in the response text.
    ``pieces[id]`` is token ``id`` decoded alone; the response text is taken as their concatenation, so a
    character maps to the token that wrote it (a token such as ``>yes`` that holds the tag's end and the
    verdict is the verdict's token)."""
    out = np.full(len(responses), -1, np.int64)
    for row, (ids, tag) in enumerate(zip(responses, tags)):
        if not tag or not ids:
            continue
        parts = pieces[np.asarray(ids, np.int64)]
        text = "".join(parts)
        start = text.find(tag)
        if start < 0:
            continue
        rest = text[start + len(tag):]
        target = len(text) - len(rest.lstrip())
        if target < len(text):
            ends = np.cumsum(np.fromiter((len(p) for p in parts), np.int64, len(parts)))
            out[row] = int(np.searchsorted(ends, target, side="right"))
    return out


class ControlTokens:
    """:func:`control_positions` for one tokenizer; its :func:`token_pieces` are decoded once, on first use (both
    backends' policy updates read the control tokens through this)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._pieces: np.ndarray | None = None

    def __call__(self, responses: list[list[int]], tags: Iterable[str] | None) -> np.ndarray:
        """Each response's control-token index (-1: none; every row -1 where the batch has no tags)."""
        if tags is None:
            return np.full(len(responses), -1, np.int64)
        if self._pieces is None:
            self._pieces = token_pieces(self.tokenizer)
        return control_positions(self._pieces, responses, tags)


@dataclass(frozen=True)
class SpikeRule:
    window: int = 20  # W: how many previous steps the rolling median covers
    threshold: float = 3.0  # a step is a spike when g_t > threshold * median of the window
    min_history: int = 5  # no verdict before this many previous steps
    min_baseline: float = 1e-3  # no verdict while the rolling median is below this (a ~0 gradient is no baseline)

    def __post_init__(self) -> None:
        if (self.window < 1 or self.min_history < 1 or self.min_history > self.window or self.threshold <= 1
                or not self.min_baseline >= 0):
            raise ValueError(f"invalid spike rule {self}: need window >= min_history >= 1, threshold > 1 and "
                             "min_baseline >= 0")


def spike_ratios(norms: Iterable[float], rule: SpikeRule = SpikeRule()) -> pd.DataFrame:
    """Vectorized spike statistic over a whole series (for analysis): columns ``norm``, ``ratio``
    (NaN before ``min_history`` steps), ``spike``. Non-finite norms are spikes and are left out of the
    later medians."""
    s = pd.Series(np.asarray(list(norms), dtype=np.float64))
    finite = s.where(np.isfinite(s))
    median = finite.shift(1).rolling(rule.window, min_periods=rule.min_history).median()
    ratio = s / median.where(median >= rule.min_baseline)
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
        if len(window) >= self.rule.min_history and np.median(window) >= self.rule.min_baseline:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(np.float64(norm) / np.median(window))
        spike = (not finite) or (ratio > self.rule.threshold)
        self.history.append(norm)
        self.count += int(spike)
        return ratio, spike


def first_nonfinite(state, prefix: str = "") -> str | None:
    """The dotted key of the first floating tensor of ``state`` (a tensor, or dicts / lists / tuples of them: a
    model's ``state_dict``, an optimizer's state) holding a NaN or an inf; ``None`` when every one is finite.
    One ``isfinite`` reduction per tensor."""
    if isinstance(state, torch.Tensor):
        return prefix or "tensor" if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        found = first_nonfinite(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None
