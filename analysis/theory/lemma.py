"""Lemma 4.2 evaluated on a sample, with the advantages of the advantage core.

For agent k with samples Y_k (its steps, pooled over the task groups), score vectors z and advantages A,

    E_{Y_k} ||A z||^2 = E_{Y_k} ||z||^2 * factor_k + Delta_k,                                (Lemma 4.2)
    factor_k = E_{Y_k}[(R - mu)^2 / sigma^2] = (sigma_k^2 + (mu_k - mu)^2) / sigma^2,
    Delta_k  = Cov_{Y_k}(||z||^2, (R - mu)^2 / sigma^2).

This is an identity on any distribution when mu_k, sigma_k^2, mu, sigma are population statistics of
that distribution. On a Monte Carlo sample the advantage core normalizes *per task group* g, so the
statistics are those of the group: mu_g, sigma_g (what the estimator uses) and mu_gk, sigma_gk^2 of R
over agent k's steps in g. The pooled version used here is

    factor_k = sum_g n_gk * (sigma_gk^2 + (mu_gk - mu_g)^2) / sigma_g^2 / sum_g n_gk,

the |Y_gk|-weighted mean of the per-group factors, which equals E_{Y_k}[A^2] exactly when the core runs
with ddof=0 and eps=0 (its statistics are then population statistics of each group). Delta_k is the
covariance over all of agent k's samples of ||z||^2 and A^2 = (R - mu_g)^2 / sigma_g^2.

What R, mu and sigma are depends on the estimator (this module never re-implements an estimator; it
calls :func:`drmas.algos.compute_advantages` and reads its statistics):

- ``pooled_grpo`` (global): R = the step's own score, mu_g, sigma_g over all steps of the group;
- ``trajectory_grpo`` (global, paper Eq. 2): R = mean step score of the step's trajectory,
  mu_g, sigma_g over the group's trajectories (each trajectory once); over Y_k a trajectory counts
  as many times as agent k acted in it;
- ``drmas`` (agent-wise, paper Eq. 5): R = the step's own score, mu_g, sigma_g = mu_gk, sigma_gk; the
  factor is exactly 1 and E||A z||^2 = E||z||^2 + Delta'_k.

A group with sigma_g = 0 (all equal scores) gets A = 0 from the core; it contributes 0 to the factor
(the ``degenerate`` fraction says how many samples that concerns).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from drmas.algos import compute_advantages

NORMALIZATION = {"pooled_grpo": "global", "trajectory_grpo": "global", "drmas": "agent"}
"""Estimators the theory studies use, and the normalization each one stands for."""


@dataclass(frozen=True)
class SampleTable:
    """One Monte Carlo sample: a minimal tensor view of a step table (one row = one agent step = one
    training sample) with each step's score-vector norm. Not the trainer's ``drmas.step_table``: only
    the columns Lemma 4.2 needs.

    scores:  float64 [n], the step score x (outcome reward minus the invalid-action penalty);
    task:    int64 [n], task group id (normalization group of the global estimators);
    agent:   int64 [n], agent index 0..n_agents-1;
    traj:    int64 [n], trajectory id, unique over the whole table;
    sq_norm: float64 [n], ||z||^2 of the step's score vector z = grad log pi(a | s) at theta_old.
    """

    scores: torch.Tensor
    task: torch.Tensor
    agent: torch.Tensor
    traj: torch.Tensor
    sq_norm: torch.Tensor
    n_agents: int

    def __post_init__(self) -> None:
        n = self.scores.numel()
        for name in ("task", "agent", "traj", "sq_norm"):
            if getattr(self, name).numel() != n:
                raise ValueError(f"SampleTable.{name} has {getattr(self, name).numel()} rows, scores has {n}; "
                                 "give one value per agent step")

    def select(self, mask: torch.Tensor) -> "SampleTable":
        """The rows where ``mask`` is true (e.g. the task groups of a calibration batch)."""
        return SampleTable(self.scores[mask], self.task[mask], self.agent[mask], self.traj[mask], self.sq_norm[mask],
                         self.n_agents)


@dataclass(frozen=True)
class LemmaTerms:
    """Per-agent terms of Lemma 4.2 on one sample (numpy arrays of length n_agents) and the row-level
    advantages. ``predicted = score_m2 * factor + delta``; ``identity_residual`` is its relative gap
    to ``m2`` (float rounding only: the identity is exact on the sample)."""

    estimator: str
    n: np.ndarray  # |Y_k|, agent k's samples over all groups
    n_groups: int
    score_m2: np.ndarray  # E_{Y_k} ||z||^2
    factor: np.ndarray  # sum_g n_gk (sigma_gk^2 + (mu_gk - mu_g)^2) / sigma_g^2 / sum_g n_gk
    delta: np.ndarray  # Cov_{Y_k}(||z||^2, (R - mu_g)^2 / sigma_g^2), centred two-pass
    delta_se: np.ndarray  # delete-one-group jackknife standard error of delta
    m2: np.ndarray  # E_{Y_k} ||A z||^2 with A from compute_advantages
    m2_se: np.ndarray  # standard error of m2 (groups as clusters)
    adv_m2: np.ndarray  # E_{Y_k} A^2 (equals factor: the second half of the identity)
    degenerate: np.ndarray  # fraction of Y_k in groups with sigma_g = 0 (A = 0 there)
    advantages: torch.Tensor  # float64 [n], A of each row

    @property
    def predicted(self) -> np.ndarray:
        return self.score_m2 * self.factor + self.delta

    @property
    def identity_residual(self) -> np.ndarray:
        return (self.m2 - self.predicted) / np.where(self.m2 != 0, self.m2, 1.0)


def dense_codes(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Codes 0..C-1 of the distinct values of a non-negative int64 id column, in sorted order (a
    presence table instead of torch.unique's sort: ids here have a range of the order of n)."""
    if ids.numel() == 0:
        return ids.clone(), 0
    present = torch.bincount(ids) > 0
    remap = torch.cumsum(present, 0) - 1
    return remap.index_select(0, ids), int(present.sum())


def step_reward(estimator: str, scores: torch.Tensor, traj: torch.Tensor) -> torch.Tensor:
    """The R of Lemma 4.2 for each step as ``estimator`` normalizes it: the mean step score of the
    step's trajectory for ``trajectory_grpo`` (paper Eq. 2), the step's own score otherwise."""
    if estimator != "trajectory_grpo":
        return scores
    code, _ = dense_codes(traj)
    total = torch.bincount(code, weights=scores)
    return (total / torch.bincount(code).to(scores.dtype)).index_select(0, code)


def cell_moments(values: torch.Tensor, code: torch.Tensor, count: int) -> tuple[torch.Tensor, ...]:
    """(n, mean, population variance) of ``values`` in each cell 0..count-1 (two-pass, float64)."""
    n = torch.bincount(code, minlength=count).to(torch.float64)
    mean = torch.bincount(code, weights=values, minlength=count) / n.clamp_min(1)
    dev = values - mean.index_select(0, code)
    var = torch.bincount(code, weights=dev * dev, minlength=count) / n.clamp_min(1)
    return n, mean, var


def lemma_terms(table: SampleTable, estimator: str) -> LemmaTerms:
    """Both sides of Lemma 4.2 for every agent, with A from ``compute_advantages(..., ddof=0, eps=0)``.

    The three ingredients are computed independently of each other, so that the identity
    ``m2 == score_m2 * factor + delta`` is a check, not a definition: ``factor`` from the per-group
    statistics (sigma_gk^2 + (mu_gk - mu_g)^2) / sigma_g^2, ``delta`` as a centred covariance, ``m2``
    from the core's advantages.
    """
    if estimator not in NORMALIZATION:
        raise ValueError(f"estimator {estimator!r} is not one of the theory studies' {sorted(NORMALIZATION)}")
    k_all = table.n_agents
    res = compute_advantages(table.scores, table.task, table.agent, table.traj, estimator=estimator,
                             ddof=0, eps=0.0)
    adv = res.advantages.to(torch.float64)
    group = res.group_index
    mu_g = torch.from_numpy(res.stats["mean"].to_numpy(np.float64, copy=True))
    sd_g = torch.from_numpy(res.stats["std"].to_numpy(np.float64, copy=True))
    reward = step_reward(estimator, table.scores, table.traj)
    sd_row = sd_g.index_select(0, group)
    ok_row = sd_row > 0
    # (R - mu_g)^2 / sigma_g^2 per row, 0 in constant groups (where the core's A is 0).
    u2 = torch.where(ok_row, (reward - mu_g.index_select(0, group)) / torch.where(ok_row, sd_row, 1.0), 0.0) ** 2

    # factor: per (normalization group, agent) cell, then |Y_gk|-weighted mean over the cells of agent k.
    cell_id = group * k_all + table.agent
    cell, n_cells = dense_codes(cell_id)
    n_c, mean_c, var_c = cell_moments(reward, cell, n_cells)
    first = torch.zeros(n_cells, dtype=torch.int64).scatter_(0, cell, cell_id)  # the id of each cell
    g_c, k_c = first // k_all, first % k_all
    sd_c = sd_g.index_select(0, g_c)
    second_moment_c = var_c + (mean_c - mu_g.index_select(0, g_c)) ** 2  # sigma_gk^2 + (mu_gk - mu_g)^2
    factor_c = torch.where(sd_c > 0, second_moment_c / torch.where(sd_c > 0, sd_c, 1.0) ** 2, 0.0)
    n_k = torch.bincount(table.agent, minlength=k_all).to(torch.float64)
    factor = torch.bincount(k_c, weights=n_c * factor_c, minlength=k_all) / n_k

    s = table.sq_norm.to(torch.float64)
    agent = table.agent
    _, s_mean, _ = cell_moments(s, agent, k_all)
    _, u2_mean, _ = cell_moments(u2, agent, k_all)
    delta = torch.bincount(agent, weights=(s - s_mean[agent]) * (u2 - u2_mean[agent]), minlength=k_all) / n_k
    sq_adv = adv * adv
    m2 = torch.bincount(agent, weights=sq_adv * s, minlength=k_all) / n_k
    adv_m2 = torch.bincount(agent, weights=sq_adv, minlength=k_all) / n_k
    degenerate = torch.bincount(agent, weights=(~ok_row).to(torch.float64), minlength=k_all) / n_k

    # Standard error of the ratio estimator m2 = sum_g S_gk / sum_g n_gk, task groups as clusters.
    task, n_groups = dense_codes(table.task)
    tk = task * k_all + agent
    s_gk = torch.bincount(tk, weights=sq_adv * s, minlength=n_groups * k_all).view(n_groups, k_all)
    n_gk = torch.bincount(tk, minlength=n_groups * k_all).view(n_groups, k_all).to(torch.float64)
    resid = s_gk - m2[None, :] * n_gk
    scale = n_groups / max(n_groups - 1, 1)
    m2_se = (resid.pow(2).sum(0) * scale).sqrt() / n_k
    delta_se = _jackknife_cov_se(s, u2, tk, n_groups, k_all)

    as_np = lambda t: t.numpy().copy()  # noqa: E731
    return LemmaTerms(estimator=estimator, n=as_np(n_k), n_groups=n_groups, score_m2=as_np(s_mean),
                      factor=as_np(factor), delta=as_np(delta), delta_se=as_np(delta_se), m2=as_np(m2),
                      m2_se=as_np(m2_se),
                      adv_m2=as_np(adv_m2), degenerate=as_np(degenerate), advantages=adv)


def _jackknife_cov_se(s: torch.Tensor, u2: torch.Tensor, cell: torch.Tensor, n_groups: int,
                      k_all: int) -> torch.Tensor:
    """Delete-one-group jackknife standard error of Cov(s, u2) per agent (``cell`` = group * K + agent),
    vectorized over the groups from per-group sums: Cov_(-g) = S_su/N - S_s S_u / N^2 without group g."""
    size = n_groups * k_all

    def per_group(w: torch.Tensor) -> torch.Tensor:
        return torch.bincount(cell, weights=w, minlength=size).view(n_groups, k_all)

    sums = [per_group(w) for w in (torch.ones_like(s), s, u2, s * u2)]
    n, s1, u1, su = (t.sum(0, keepdim=True) - t for t in sums)  # totals without group g
    has = (sums[0] > 0).to(s.dtype)  # groups where the agent acted (the others leave Cov unchanged)
    loo = su / n.clamp_min(1) - s1 * u1 / n.clamp_min(1) ** 2
    g_k = has.sum(0)
    mean = (loo * has).sum(0) / g_k.clamp_min(1)
    var = ((loo - mean) ** 2 * has).sum(0) * (g_k - 1) / g_k.clamp_min(1)
    return var.sqrt()


def batch_index(task: torch.Tensor, batch_groups: int) -> torch.Tensor:
    """Batch of each row when consecutive task groups (by sorted task id) form batches of
    ``batch_groups`` tasks, as a trainer's batch of tasks (paper: 32 tasks per step for math)."""
    return dense_codes(task)[0] // batch_groups


def batch_weights(adv: torch.Tensor, agent: torch.Tensor, batch: torch.Tensor, n_agents: int) -> torch.Tensor:
    """Per-row weight A_y / |Y_k in the batch|, so that sum_y w_y z_y over agent k's rows of a batch is
    the gradient of agent k's sample-mean policy-gradient loss at theta = theta_old (Prop. 4.3's
    stacked gradient, what a training log's per-agent gradient norm shows)."""
    cell = batch * n_agents + agent
    count = torch.bincount(cell).to(torch.float64)
    return adv / count.index_select(0, cell)


@dataclass(frozen=True)
class LineFit:
    """Least-squares line y = slope * x + intercept with its coefficient of determination."""

    slope: float
    intercept: float
    r2: float
    n: int


def fit_line(x: np.ndarray, y: np.ndarray) -> LineFit:
    """Ordinary least squares of y on x (Prop. 4.3 predicts a line: E||A z||^2 linear in the factor)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    ss_res = float(np.sum((y - (slope * x + intercept)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return LineFit(float(slope), float(intercept), 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"), len(x))
