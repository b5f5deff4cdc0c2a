"""Slow, per-row reference implementations of every advantage estimator, written for the tests.

They follow the reference code's structure literally (dicts of lists keyed by group id, torch.std for
the unbiased std) so that the vectorized estimators in drmas.algos can be checked against them.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch


def _stats(values: list[float], ddof: int) -> tuple[float, float, bool]:
    """(mean, std, singleton) with the reference singleton rule: one sample -> mean 0, std 1."""
    if len(values) == 1:
        return 0.0, 1.0, True
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std(correction=ddof)), False


def _norm(x, mean, std, eps, scale):
    return (x - mean) / (std + eps) if scale else x - mean


def reference_advantages(scores, task_ids, agent_ids, traj_ids, estimator, ddof=1, eps=1e-6,
                         singleton="raw", scale_by_std=True) -> list[float]:
    n = len(scores)
    scores = [float(s) for s in scores]
    # trajectory-level rewards: mean step score of each (task, traj)
    traj_scores: dict = defaultdict(list)
    for i in range(n):
        traj_scores[(task_ids[i], traj_ids[i])].append(scores[i])
    traj_reward = {k: sum(v) / len(v) for k, v in traj_scores.items()}
    task_traj_rewards: dict = defaultdict(list)
    for (task, traj), r in traj_reward.items():
        task_traj_rewards[task].append(r)
    task_traj_stats = {t: _stats(v, ddof) for t, v in task_traj_rewards.items()}
    # step-level groups
    task_steps: dict = defaultdict(list)
    agent_steps: dict = defaultdict(list)
    for i in range(n):
        task_steps[task_ids[i]].append(scores[i])
        agent_steps[(task_ids[i], agent_ids[i])].append(scores[i])
    task_step_stats = {t: _stats(v, ddof) for t, v in task_steps.items()}
    agent_stats = {k: _stats(v, ddof) for k, v in agent_steps.items()}

    out = []
    for i in range(n):
        x, t, a = scores[i], task_ids[i], agent_ids[i]
        r_i = traj_reward[(t, traj_ids[i])]
        if estimator == "trajectory_grpo":
            mean, std, single = task_traj_stats[t]
            adv = _norm(r_i, mean, std, eps, scale_by_std)
        elif estimator == "pooled_grpo":
            mean, std, single = task_step_stats[t]
            adv = _norm(x, mean, std, eps, scale_by_std)
        elif estimator == "drmas":
            mean, std, single = agent_stats[(t, a)]
            adv = _norm(x, mean, std, eps, scale_by_std)
        elif estimator == "drmas_mean_only":
            mean, _, s1 = agent_stats[(t, a)]
            _, std, s2 = task_traj_stats[t]
            single = s1 or s2
            adv = _norm(x, mean, std, eps, scale_by_std)
        elif estimator == "drmas_std_only":
            _, std, s1 = agent_stats[(t, a)]
            mean, _, s2 = task_traj_stats[t]
            single = s1 or s2
            adv = _norm(x, mean, std, eps, scale_by_std)
        elif estimator in ("rloo", "rloo_agent"):
            if estimator == "rloo":
                group, value = task_traj_rewards[t], r_i
                _, std, single = task_traj_stats[t]
            else:
                group, value = agent_steps[(t, a)], x
                _, std, single = agent_stats[(t, a)]
            if single:
                adv = value
            else:
                others = (sum(group) - value) / (len(group) - 1)
                adv = value - others
            if scale_by_std:
                adv = adv / (std + eps)
        else:
            raise ValueError(estimator)
        if single and singleton == "zero":
            adv = 0.0
        assert math.isfinite(adv)
        out.append(adv)
    return out
