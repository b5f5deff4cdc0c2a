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


REFERENCE_ABLATIONS = {f"{m}_{s}{suffix}": (m, s, by_agent) for m in ("agent", "traj") for s in ("agent", "traj")
                       for by_agent, suffix in ((True, ""), (False, "_uid"))}


def reference_ablation(scores, task_ids, agent_ids, traj_ids, mean_level, std_level, by_agent, ddof, eps, singleton,
                       scale_by_std) -> list[float]:
    """The official ablation branch's ``compute_grpo_outcome_advantage`` (commit 72d1dbc), line by line: the
    group index is ``uid_agent`` (``group_by_agent_id``) or ``uid``; scores accumulate per (index, traj)."""
    n = len(scores)
    index = [f"{task_ids[i]}_{agent_ids[i]}" if by_agent else task_ids[i] for i in range(n)]
    traj_accumulator: dict = defaultdict(list)
    for i in range(n):
        traj_accumulator[(index[i], traj_ids[i])].append(scores[i])
    id2score_agent: dict = defaultdict(list)
    id2score_traj: dict = defaultdict(list)
    traj2avg = {}
    for (idx, t_idx), reward_list in traj_accumulator.items():
        id2score_agent[idx].extend(reward_list)
        traj2avg[(idx, t_idx)] = sum(reward_list) / len(reward_list)
        id2score_traj[idx].append(traj2avg[(idx, t_idx)])
    stats = {"agent": {k: _stats(v, ddof) for k, v in id2score_agent.items()},
             "traj": {k: _stats(v, ddof) for k, v in id2score_traj.items()}}
    out = []
    for i in range(n):
        x = traj2avg[(index[i], traj_ids[i])] if mean_level == "traj" else scores[i]
        mean, _, s1 = stats[mean_level][index[i]]
        _, std, s2 = stats[std_level][index[i]]
        adv = 0.0 if (s1 or s2) and singleton == "zero" else _norm(x, mean, std, eps, scale_by_std)
        out.append(adv)
    return out


def reference_advantages(scores, task_ids, agent_ids, traj_ids, estimator, ddof=1, eps=1e-6,
                         singleton="raw", scale_by_std=True) -> list[float]:
    n = len(scores)
    scores = [float(s) for s in scores]
    if estimator in REFERENCE_ABLATIONS:
        return reference_ablation(scores, task_ids, agent_ids, traj_ids, *REFERENCE_ABLATIONS[estimator], ddof=ddof,
                                  eps=eps, singleton=singleton, scale_by_std=scale_by_std)
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
