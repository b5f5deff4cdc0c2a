"""Advantage estimators for multi-agent GRPO (Dr. MAS paper, Eqs. 2 and 5).

One training sample is one *agent step* (one LLM call of one agent in one trajectory). Every estimator
is a pure function of four table columns (score, task id, agent id, trajectory id) and returns one
advantage per step. All of them are written with segment reductions (factorized ids + ``index_add``),
because the rows of a (task, agent) group are not contiguous in a step table: there is no per-sample
Python loop anywhere.

Registered estimators (``ESTIMATORS``):

=================== =========================== ===========================================================
name                statistics (per task group) advantage of a step with score x in trajectory i
=================== =========================== ===========================================================
``trajectory_grpo`` mu, sigma over trajectories  (R_i - mu) / (sigma + eps), R_i = mean step score of traj i
                    (reference "vanilla" GRPO,   (paper Eq. 2; every step of i gets the same value)
                    groups by ``uid``)
``pooled_grpo``     mu, sigma over all steps     (x - mu) / (sigma + eps)
``drmas``           mu_k, sigma_k over the steps (x - mu_k) / (sigma_k + eps)              (paper Eq. 5,
                    of agent k (``(uid, agent)``) reference ``group_by_agent_id=True``)
``drmas_mean_only`` mu_k and trajectory sigma    (x - mu_k) / (sigma + eps)                 (Table 3)
``drmas_std_only``  trajectory mu and sigma_k    (x - mu) / (sigma_k + eps)                 (Table 3)
``{m}_{s}``         official ablation branch     m, s in {agent, traj}: the mean from level m, the std from
                    (``adv_estimator``), group   level s; "agent" = over the group's step scores, "traj" =
                    (task, agent); ``{m}_{s}_uid`` over the group's per-trajectory mean scores (a row then
                    the same with group = task  normalizes its trajectory's mean when m = traj). See
                                                 docs/algorithms.md for the map to Table 3
``rloo``            leave-one-out over trajs     (R_i - mean_{j != i} R_j) [/ (sigma + eps)]
``rloo_agent``      leave-one-out within (task,  (x - mean of the agent's other steps) [/ (sigma_k + eps)]
                    agent) over steps
=================== =========================== ===========================================================

Conventions (all parameters, :class:`Conventions`; defaults = reference code):
- ``ddof=1``: unbiased std, as ``torch.std``;
- ``eps=1e-6`` added to the std in the denominator;
- ``singleton="raw"``: a group with one sample gets mean 0 and std 1, so its advantage is its raw score
  divided by (1 + eps); ``"zero"``: its advantage is 0;
- a group whose scores are all equal gets advantage 0 (std 0, numerator 0);
- ``scale_by_std=False`` drops the division (mean-only, Dr. GRPO style) for every estimator.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from drmas.algos.catalog import (DEFAULT, ESTIMATOR_TERMS, ESTIMATORS, GLOBAL_BASELINES,  # noqa: F401
                                 REFERENCE_ABLATIONS, Conventions, Ddof, EstimatorTerms, Singleton,
                                 register_estimator)

IdColumn = Sequence | np.ndarray | torch.Tensor | pd.Series


class AdvantageResult:
    """Output of :func:`compute_advantages`.

    advantages:  float32 tensor [n_steps], one value per agent step.
    stats:       (computed on first access) one row per normalization group (row order unspecified: read the id columns);
                 columns ``task_id`` (and ``agent_id`` for agent-wise estimators), ``n``, ``mean``,
                 ``std`` (the values used, after the singleton rule), ``singleton``; agent-wise
                 estimators add the task group's trajectory-level ``task_n``, ``task_mean``,
                 ``task_std`` (mu, sigma of Eq. 2) and step-level ``task_step_mean``, ``task_step_std``.
    group_index: int64 tensor [n_steps], the row of ``stats`` each step was normalized in.
    """

    def __init__(self, advantages: torch.Tensor, stats: pd.DataFrame | Callable[[], pd.DataFrame],
                 group_index: torch.Tensor):
        self.advantages = advantages
        self.group_index = group_index
        self._stats = stats

    @property
    def stats(self) -> pd.DataFrame:
        """Built on first access (a per-group summary most hot paths never read)."""
        if callable(self._stats):
            self._stats = self._stats()
        return self._stats




# --------------------------------------------------------------------------------------------------
# Segments (groups of rows) and their statistics
# --------------------------------------------------------------------------------------------------
def _dense_codes(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..G-1 for the values of ``arr`` and the value of each code.

    Non-negative integer ids of moderate range (the common case: ids from a step table) are remapped
    with a presence table in O(n); anything else goes through pandas' hash-based factorize.
    """
    n = arr.shape[0]
    if arr.dtype.kind in "iu" and n and arr.min() >= 0 and arr.max() < 4 * n + 1024:
        present = np.zeros(int(arr.max()) + 1, dtype=bool)
        present[arr] = True
        remap = np.cumsum(present, dtype=np.int64) - 1
        return remap[arr], np.flatnonzero(present)
    codes, labels = pd.factorize(arr, sort=False, use_na_sentinel=False)
    return codes.astype(np.int64, copy=False), np.asarray(labels)


@dataclass(frozen=True)
class Segments:
    """A partition of the rows: ``code[i]`` is the segment of row i, ``first[g]`` a row of segment g."""

    code: torch.Tensor  # int64 [n]
    count: int

    @cached_property
    def first(self) -> torch.Tensor:
        n = self.code.numel()
        init = torch.full((self.count,), n, dtype=torch.int64, device=self.code.device)
        rows = torch.arange(n, dtype=torch.int64, device=self.code.device)
        return init.scatter_reduce_(0, self.code, rows, reduce="amin")

    def combine(self, other: "Segments") -> "Segments":
        """Segments of the pairs (self, other)."""
        codes, _ = _dense_codes((self.code * other.count + other.code).numpy())
        code = torch.from_numpy(codes)
        return Segments(code, int(code.max()) + 1 if code.numel() else 0)


@dataclass(frozen=True)
class SegmentStats:
    """Per-segment statistics after the singleton rule, and each row's centered value.

    ``centered[i] = x[i] - mean[code[i]]`` computed from data shifted by a member of the segment, so a
    constant segment gets exactly 0 (a plain sum / n can be one ulp off, which turns 0 / 0 into noise
    of order 1 when eps = 0). Singleton segments get mean 0 and std 1 (reference convention), hence
    ``centered = x``; the ``"zero"`` rule is applied to the advantages, not to the statistics.
    """

    n: torch.Tensor  # float64 [G]
    mean: torch.Tensor  # float64 [G]
    std: torch.Tensor  # float64 [G]
    singleton: torch.Tensor  # bool [G]
    centered: torch.Tensor  # float64 [n]


def segment_stats(x: torch.Tensor, seg: Segments, conv: Conventions) -> SegmentStats:
    """Mean and std (``conv.ddof``) of ``x`` within each segment, float64, no Python loop."""
    code = seg.code
    n = torch.bincount(code, minlength=seg.count).to(x.dtype)
    singleton = n <= 1
    # Row-level work is gathers and subtractions only; the singleton rule acts on per-group arrays.
    shift = torch.where(singleton, 0.0, x.index_select(0, seg.first))
    y = x - shift.index_select(0, code)
    mean_y = torch.bincount(code, weights=y, minlength=seg.count) / n
    mean_y = torch.where(singleton, 0.0, mean_y)  # singleton: centered value = raw score
    centered = y - mean_y.index_select(0, code)
    sum_sq = torch.bincount(code, weights=centered * centered, minlength=seg.count)
    mean = shift + mean_y
    std = torch.where(singleton, 1.0, (sum_sq / (n - conv.ddof).clamp_min(1)).sqrt())
    return SegmentStats(n=n, mean=mean, std=std, singleton=singleton, centered=centered)


def _gather(values: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """values[code] (index_select is several times faster than advanced indexing on CPU)."""
    return values.index_select(0, code)


def _scale(centered: torch.Tensor, std: torch.Tensor, conv: Conventions) -> torch.Tensor:
    """centered / (std + eps), or centered itself when ``scale_by_std`` is off (per-row inputs)."""
    if not conv.scale_by_std:
        return centered
    denom = std + conv.eps
    if conv.eps <= 0:  # constant groups: 0 / 0 -> 0
        denom = torch.where(denom > 0, denom, 1.0)
    return centered / denom


def _apply_singleton_rule(adv: torch.Tensor, singleton_rows: torch.Tensor, conv: Conventions) -> torch.Tensor:
    if conv.singleton == "zero":
        return torch.where(singleton_rows, 0.0, adv)
    return adv


# --------------------------------------------------------------------------------------------------
# A validated batch with the groupings every estimator draws from (each computed once, on demand)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrajectoryLevel:
    """Trajectory-averaged rewards R_i and the task statistics over them (reference vanilla GRPO)."""

    reward: torch.Tensor  # float64 [n_traj], mean step score of each trajectory
    task_of_traj: Segments  # the task segment of each trajectory
    stats: SegmentStats  # over trajectories, per task group


class StepBatch:
    """The four columns as tensors, with ids turned into segment codes; groupings are cached."""

    def __init__(self, scores: torch.Tensor, task_ids: IdColumn, agent_ids: IdColumn, traj_ids: IdColumn,
                 conv: Conventions):
        n = scores.numel()
        self.scores, self.conv = scores, conv
        self.task, self.task_labels = _segments(task_ids, "task_ids", n)
        self.agent, self.agent_labels = _segments(agent_ids, "agent_ids", n)
        traj_raw, _ = _segments(traj_ids, "traj_ids", n)
        # Trajectory ids are scoped by task. When every trajectory id already lies in a single task
        # (globally unique ids, the usual case) the pairs are the ids themselves: skip the combine.
        same_task = n == 0 or bool((self.task.code[traj_raw.first][traj_raw.code] == self.task.code).all())
        self.traj = traj_raw if same_task else self.task.combine(traj_raw)

    @cached_property
    def task_agent(self) -> Segments:
        return self.task.combine(self.agent)

    @cached_property
    def task_steps(self) -> SegmentStats:
        return segment_stats(self.scores, self.task, self.conv)

    @cached_property
    def agent_steps(self) -> SegmentStats:
        return segment_stats(self.scores, self.task_agent, self.conv)

    @cached_property
    def trajectories(self) -> TrajectoryLevel:
        traj = self.traj
        steps = torch.bincount(traj.code, minlength=traj.count).to(self.scores.dtype)
        reward = torch.bincount(traj.code, weights=self.scores, minlength=traj.count) / steps
        task_of_traj = Segments(self.task.code[traj.first], self.task.count)
        return TrajectoryLevel(reward, task_of_traj, segment_stats(reward, task_of_traj, self.conv))


def _segments(ids: IdColumn, name: str, n: int) -> tuple[Segments, np.ndarray]:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    arr = ids.to_numpy() if isinstance(ids, pd.Series) else np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one id per step), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but scores has {n}; give one id per step")
    codes, labels = _dense_codes(arr)
    return Segments(torch.from_numpy(codes), len(labels)), labels


# --------------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grouping:
    """The normalization groups an estimator used: segments, their statistics, agent-wise or not."""

    segments: Segments
    stats: SegmentStats
    by_agent: bool


EstimatorFn = Callable[[StepBatch], tuple[torch.Tensor, Grouping]]


@register_estimator("trajectory_grpo")
def trajectory_grpo(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Paper Eq. 2 as the reference code implements it: A_i = (R_i - mu) / (sigma + eps), R_i the mean
    step score of trajectory i, mu/sigma over the task group's trajectories; every step of i gets A_i."""
    t = b.trajectories
    task = t.task_of_traj.code
    adv = _apply_singleton_rule(_scale(t.stats.centered, _gather(t.stats.std, task), b.conv), _gather(t.stats.singleton, task), b.conv)
    return _gather(adv, b.traj.code), Grouping(b.task, t.stats, by_agent=False)


@register_estimator("pooled_grpo")
def pooled_grpo(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Step-level global baseline: mu, sigma over every step score of the task group."""
    s, task = b.task_steps, b.task.code
    adv = _apply_singleton_rule(_scale(s.centered, _gather(s.std, task), b.conv), _gather(s.singleton, task), b.conv)
    return adv, Grouping(b.task, s, by_agent=False)


@register_estimator("drmas")
def drmas(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Paper Eq. 5: A = (x - mu_k) / (sigma_k + eps), mu_k, sigma_k over all steps of agent k in the
    task group (reference ``group_by_agent_id=True``); each step normalized with its own score."""
    s, key = b.agent_steps, b.task_agent.code
    adv = _apply_singleton_rule(_scale(s.centered, _gather(s.std, key), b.conv), _gather(s.singleton, key), b.conv)
    return adv, Grouping(b.task_agent, s, by_agent=True)


def _mixed(b: StepBatch, agent_mean: bool) -> tuple[torch.Tensor, Grouping]:
    """Table 3 ablations: one statistic from the agent group, the other from the task group (Eq. 2's
    trajectory-level mu, sigma). Each statistic follows the singleton rule of the group it comes from."""
    s_agent, key = b.agent_steps, b.task_agent.code
    s_task, task = b.trajectories.stats, b.task.code
    if agent_mean:
        centered, std = s_agent.centered, _gather(s_task.std, task)
    else:
        centered, std = b.scores - _gather(s_task.mean, task), _gather(s_agent.std, key)
    singleton = _gather(s_agent.singleton, key) | _gather(s_task.singleton, task)
    adv = _apply_singleton_rule(_scale(centered, std, b.conv), singleton, b.conv)
    return adv, Grouping(b.task_agent, s_agent, by_agent=True)


@register_estimator("drmas_mean_only")
def drmas_mean_only(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Table 3 ablation (mu_k, sigma): A = (x - mu_k) / (sigma + eps)."""
    return _mixed(b, agent_mean=True)


@register_estimator("drmas_std_only")
def drmas_std_only(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Table 3 ablation (mu, sigma_k): A = (x - mu) / (sigma_k + eps)."""
    return _mixed(b, agent_mean=False)


def _reference_ablation(b: StepBatch, mean_level: str, std_level: str, by_agent: bool) -> tuple[torch.Tensor, Grouping]:
    """The official code's ablation branch (``compute_grpo_outcome_advantage(adv_estimator=...)``): within a
    group G (``(task, agent)`` with ``group_by_agent_id``, else the task), "agent" statistics are over G's step
    scores and "traj" statistics over G's per-trajectory mean scores (the mean of a trajectory's steps *in G*).
    The mean comes from ``mean_level``, the std from ``std_level``; the value normalized is the row's score
    when the mean is step-level, its trajectory's mean in G when it is trajectory-level. Each statistic
    follows the singleton rule of its own level."""
    group = b.task_agent if by_agent else b.task
    steps = segment_stats(b.scores, group, b.conv)
    group_traj = group.combine(b.traj)
    count = torch.bincount(group_traj.code, minlength=group_traj.count).to(b.scores.dtype)
    traj_mean = torch.bincount(group_traj.code, weights=b.scores, minlength=group_traj.count) / count
    group_of_traj = Segments(group.code[group_traj.first], group.count)
    trajs = segment_stats(traj_mean, group_of_traj, b.conv)
    key = group.code
    level = {"agent": (steps, steps.centered), "traj": (trajs, _gather(trajs.centered, group_traj.code))}
    mean_stats, centered = level[mean_level]
    std_stats = level[std_level][0]
    singleton = _gather(mean_stats.singleton, key) | _gather(std_stats.singleton, key)
    adv = _apply_singleton_rule(_scale(centered, _gather(std_stats.std, key), b.conv), singleton, b.conv)
    return adv, Grouping(group, mean_stats, by_agent=by_agent)


def _register_reference_ablations() -> None:
    from functools import partial

    for name in REFERENCE_ABLATIONS:  # agent_traj, agent_traj_uid, ...: mean level, std level, _uid = by task
        mean_level, std_level = name.split("_")[:2]
        fn = partial(_reference_ablation, mean_level=mean_level, std_level=std_level, by_agent=not name.endswith("_uid"))
        register_estimator(name)(fn)


_register_reference_ablations()


def _leave_one_out(s: SegmentStats, seg: torch.Tensor, conv: Conventions) -> torch.Tensor:
    """x - mean of the other members of its segment = n / (n - 1) * (x - mean); a singleton has no
    baseline and keeps its raw score; optional division by the segment's std."""
    n = _gather(s.n, seg)
    single = _gather(s.singleton, seg)
    loo = torch.where(single, s.centered, s.centered * n / (n - 1).clamp_min(1))
    return _apply_singleton_rule(_scale(loo, _gather(s.std, seg), conv), single, conv)


@register_estimator("rloo")
def rloo(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """RLOO over the trajectories of the task group (trajectory-averaged rewards, as trajectory_grpo):
    A_i = R_i - mean_{j != i} R_j, divided by (sigma + eps) when ``scale_by_std``."""
    t = b.trajectories
    return _leave_one_out(t.stats, t.task_of_traj.code, b.conv).index_select(0, b.traj.code), Grouping(b.task, t.stats, False)


@register_estimator("rloo_agent")
def rloo_agent(b: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """Agent-wise RLOO: leave-one-out baseline over the other steps of the same agent in the task group,
    divided by (sigma_k + eps) when ``scale_by_std``."""
    return _leave_one_out(b.agent_steps, b.task_agent.code, b.conv), Grouping(b.task_agent, b.agent_steps, True)


# --------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------
def _as_scores(scores: torch.Tensor | np.ndarray | Sequence[float]) -> torch.Tensor:
    if isinstance(scores, torch.Tensor):
        x = scores.detach().cpu()
    else:
        x = torch.as_tensor(np.asarray(scores, dtype=np.float64), device="cpu")
    if x.ndim != 1:
        raise ValueError(f"scores must be a 1-D tensor (one score per agent step), got shape {tuple(x.shape)}")
    x = x.to(torch.float64)
    bad = ~torch.isfinite(x)
    if bad.any():
        rows = torch.nonzero(bad).flatten()[:5].tolist()
        raise ValueError(f"scores contain {int(bad.sum())} non-finite value(s) (NaN/inf), first rows {rows}; "
                         "check the reward function and the invalid-action penalty")
    return x


def _stats_frame(b: StepBatch, grouping: Grouping) -> pd.DataFrame:
    s, first = grouping.stats, grouping.segments.first
    task_of_group = b.task.code[first]
    frame = {"task_id": b.task_labels[task_of_group.numpy()]}
    if grouping.by_agent:
        frame["agent_id"] = b.agent_labels[b.agent.code[first].numpy()]
    frame.update(n=s.n.numpy().astype(np.int64), mean=s.mean.numpy(), std=s.std.numpy(),
                 singleton=s.singleton.numpy())
    if grouping.by_agent:
        traj, steps = b.trajectories.stats, b.task_steps
        frame.update(task_n=traj.n[task_of_group].numpy().astype(np.int64),
                     task_mean=traj.mean[task_of_group].numpy(), task_std=traj.std[task_of_group].numpy(),
                     task_step_mean=steps.mean[task_of_group].numpy(),
                     task_step_std=steps.std[task_of_group].numpy())
    return pd.DataFrame(frame)


def compute_advantages(
    scores: torch.Tensor | np.ndarray | Sequence[float],
    task_ids: IdColumn,
    agent_ids: IdColumn,
    traj_ids: IdColumn,
    estimator: str = "drmas",
    ddof: int = DEFAULT.ddof,
    eps: float = DEFAULT.eps,
    singleton: Singleton = DEFAULT.singleton,
    scale_by_std: bool = DEFAULT.scale_by_std,
) -> AdvantageResult:
    """Advantages for the agent steps of a batch of task groups (paper Eqs. 2 and 5).

    Args:
        scores: 1-D float tensor, one score per agent step (outcome reward minus the invalid-action
            penalty). Non-finite values raise ``ValueError``.
        task_ids: task-group id of each step (the reference ``uid``).
        agent_ids: id of the agent that took the step.
        traj_ids: trajectory id of each step (scoped by task: equal ids in different tasks are
            different trajectories).
        estimator: a name in :data:`ESTIMATORS`.
        ddof, eps, singleton, scale_by_std: the statistical conventions (:class:`Conventions`, whose
            defaults these are).

    Returns:
        :class:`AdvantageResult` with float32 advantages and the per-group statistics. The statistics
        are computed on the CPU (the grouping factorizes ids with numpy / pandas); ``advantages`` and
        ``group_index`` are returned on the device of ``scores`` when it is a tensor (e.g. CUDA in, CUDA
        out), else on the CPU.
    """
    estimate = ESTIMATORS.get(estimator)  # an unknown name: a ValueError listing the registered ones
    conv = Conventions(ddof=ddof, eps=float(eps), singleton=singleton, scale_by_std=bool(scale_by_std))
    device = scores.device if isinstance(scores, torch.Tensor) else torch.device("cpu")
    x = _as_scores(scores)
    batch = StepBatch(x, task_ids, agent_ids, traj_ids, conv)
    if x.numel() == 0:
        empty = pd.DataFrame(columns=["task_id", "n", "mean", "std", "singleton"])
        return AdvantageResult(torch.zeros(0, device=device), empty, torch.zeros(0, dtype=torch.int64, device=device))
    adv, grouping = estimate(batch)
    return AdvantageResult(adv.to(device=device, dtype=torch.float32), lambda: _stats_frame(batch, grouping),
                           grouping.segments.code.to(device))
