"""Metrics of one RL step and of an evaluation (where they are written: :mod:`drmas.loggers`).

Logged keys (every step; ``{k}`` = agent name, ``{m}`` = worker group / model key):

==================================== ==========================================================================
key                                  definition
==================================== ==========================================================================
reward/mean, reward/std              outcome reward R over trajectories
rollout/digest                       52-bit digest of the step's sampled token ids (every row's prompt and response, in
                                     table order; :func:`rollout_digest`): two runs with equal digests at a step drew
                                     the same rollout there (twins at step 0, a resumed run against its original)
score/mean                           score = R − c·(1 − valid) over steps
agent/{k}/reward_mean, _std          μk, σk: mean/std (ddof=1) of agent k's step scores, averaged over task groups
task/mu, task/sigma                  μ, σ: trajectory-level task statistics of Eq. 2, averaged over task groups
agent/{k}/lemma_factor               Lemma 4.2 factor F_k = (σk² + (μk − μb)²) / σb² of agent k under the baseline
                                     (μb, σb) of the run's own estimator, on the values that estimator normalizes
                                     (trajectory GRPO: trajectory-mean scores; penalties included), per task group
                                     (population moments, groups with σb > 0), averaged over groups
                                     (``drmas.algos.lemma_factors``); _max: the largest group's; = 1 under Dr. MAS
agent/{k}/lemma_factor_{b}           the same under the global baselines b = trajectory_grpo, pooled_grpo
                                     (what a global baseline would do to this batch, whatever the run uses)
agent/{k}/distinct_share              share of distinct (prompt, response) token-id pairs among agent k's steps in a task
                                     group (identical pairs share one per-sample gradient), averaged over groups
agent/{k}/class_factor_{b}           class-aware factor Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(drmas)², S_c = Σ_{i∈c} A_i over a
                                     class c of identical (prompt, response) pairs, for b = trajectory_grpo,
                                     pooled_grpo: the predicted squared grad-norm ratio b / Dr. MAS with orthogonal,
                                     equal-norm class gradients (``drmas.algos.class_factors``; docs/theory.md)
agent/{k}/adv_mean, _std, _m2        moments of agent k's advantages (_m2 = realized E_k[A²] of the run's estimator
                                     over the batch); _absmax: max |A|
agent/{k}/steps                      |Yk| summed over the batch; /invalid_rate, /truncated_rate, /response_len
agent/{k}/calls_per_traj             agent k's calls per trajectory (|Yk| / trajectories; 0 in a step it was not called; the paper's collapse: the
                                     Search agent no longer called)
agent/{k}/entropy                    token-mean entropy of agent k's responses under the policy that sampled them
                                     (before the step's first optimizer step, at the sampling temperature)
agent/{k}/control_prob, _min         mean (min) probability of the sampled control token of agent k's responses
                                     under the policy that sampled them: the token holding the first non-blank
                                     character after ``Agent.control_tag`` (<verify>: the verdict; <search>: the
                                     query's start; <answer>; \\boxed{}); rows without the tag left out
agent/{k}/grad_norm                  pre-clip norm of agent k's contribution to its model's gradient (max over
                                     mini-batches); /spike_ratio, /spike: the spike statistic (docs/algorithms.md)
agent/{k}/grad_share                 agent k's share g_k·g / ||g||² of its model's pre-clip gradient g = Σ_k g_k (mean
                                     over mini-batches; Σ_k = 1); logged where several agents share the model
wg/{m}/grad_cos/{a}~{b}              cosine between agents a's and b's contributions to model m's gradient (mean over
                                     mini-batches; shared models)
wg/{m}/grad_norm                     pre-clip gradient norm of model m (max over mini-batches); /spike
wg/{m}/loss, clip_frac, entropy,     policy loss terms (mean over mini-batches); approx_kl_old = E[(r − 1) − log r]
  approx_kl_old, lr, skipped         skipped: optimizer steps skipped for a non-finite gradient
wg/{m}/update_norm                   ||θ_after − θ_before|| of model m's optimizer step (mean over mini-batches; 0 when
                                     skipped): how far the weights moved, after the clip and AdamW's normalisation
wg/{m}/weights_finite                1 when every parameter of model m is finite after the update, else 0 (openrlhf
                                     backend, whose DeepSpeed step is taken even on a non-finite gradient; the local
                                     worker's update_norm tells the same)
timing/rollout, rewards, advantages,  seconds per phase; timing/step = their sum; timing/generate/{m}: generation
  update, step                       seconds per model
tokens/{k}                           prompt + response tokens of agent k's calls (cost accounting)
tools/{tool}/calls                   calls of a tool during the step (tool = retrieval: queries sent to the retrieval
                                     server; grader: answers graded); logged when the task source has the tool
tools/{tool}/failures                of those, the calls that failed after the tool's own retries (retrieval: no
                                     answer, 5xx, malformed; grader: workers that died or did not start): scored 0 /
                                     "search unavailable", so a step with failures has degraded rewards
actor/{m}/grad_norm, pg_loss, ...    W&B only: the reference code's names of wg/{m}/grad_norm, loss, clip_frac
                                     (pg_clipfrac), entropy, approx_kl_old (ppo_kl), lr (``reference_names``)
train/nonfinite, train/skipped       worker groups whose pre-clip gradient norm is non-finite / whose optimizer
                                     step was skipped (sum of wg/{m}/skipped) this step
search/answered_without_search       search orchestras: share of trajectories answered with no search step;
search/unanswered                    share that ended without an answer (the turn budget used up)
search/verifier_yes_turn{t}          search hierarchy: the Verifier's yes rate at turn t; _after_miss, _after_hit:
search/verifier_yes_after_miss, _hit at a turn whose preceding search missed (ranks k+1..2k) / retrieved the top k
math/reject_rate, math/solver_rounds math loop: share of Verifier calls that rejected; Solver calls per trajectory
==================================== ==========================================================================

The ``search/*`` and ``math/*`` keys come from the run's orchestra (``Orchestra.behavior_metrics``), the others
from every run.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from drmas.algos import GLOBAL_BASELINES, SpikeDetector, class_factors, lemma_factors
from drmas.step_table import StepTable
from drmas.trainer.collect import Collected

if TYPE_CHECKING:  # the type only: the metrics do not depend on the orchestras
    from drmas.orchestra.base import Orchestra

logger = logging.getLogger(__name__)


def _agent_reward_stats(table: StepTable, traj_reward: np.ndarray, traj_task: np.ndarray) -> dict[str, float]:
    """μk, σk (agent k's step scores) and μ, σ (trajectory outcomes), per task group, averaged over groups."""
    steps = pd.DataFrame({"task": table.task, "agent": table.agent, "score": table.score})
    trajs = pd.DataFrame({"task": traj_task, "R": traj_reward})
    task = trajs.groupby("task")["R"].agg(mu="mean", sigma="std")
    agent = steps.groupby(["task", "agent"])["score"].agg(mu_k="mean", sigma_k="std")
    out: dict[str, float] = {"task/mu": float(task["mu"].mean()), "task/sigma": float(task["sigma"].mean(skipna=True))}
    for name, g in agent.groupby(level="agent"):
        out[f"agent/{name}/reward_mean"] = float(g["mu_k"].mean())
        out[f"agent/{name}/reward_std"] = float(g["sigma_k"].mean(skipna=True))
    return out


def _lemma_factor_stats(table: StepTable, estimator: str) -> dict[str, float]:
    """``lemma_factor`` (mean over task groups, and ``_max``) under the run's estimator, and
    ``lemma_factor_{b}`` under each global baseline b (see the module table)."""
    out: dict[str, float] = {}
    for baseline in dict.fromkeys([estimator, *GLOBAL_BASELINES]):
        per_group = lemma_factors(table.score, table.task, table.agent, table.traj, baseline)
        by_agent = per_group.groupby("agent")["factor"]
        means, maxes = by_agent.mean(), by_agent.max()
        for name in dict.fromkeys(table.agent):
            mean = float(means.get(name, np.nan))
            if baseline == estimator:
                out[f"agent/{name}/lemma_factor"] = mean
                out[f"agent/{name}/lemma_factor_max"] = float(maxes.get(name, np.nan))
            if baseline in GLOBAL_BASELINES:
                out[f"agent/{name}/lemma_factor_{baseline}"] = mean
    return out


def _class_stats(table: StepTable, classes: np.ndarray) -> dict[str, float]:
    """``distinct_share`` and ``class_factor_{b}`` of every agent (see the module table), from the step classes
    (``drmas.algos.step_classes``)."""
    per_agent = class_factors(table.score, table.task, table.agent, table.traj, classes, GLOBAL_BASELINES)
    out: dict[str, float] = {}
    for name, row in per_agent.iterrows():
        out[f"agent/{name}/distinct_share"] = float(row["distinct"])
        out.update({f"agent/{name}/class_factor_{b}": float(row[f"factor_{b}"]) for b in GLOBAL_BASELINES})
    return out


def step_metrics(rollout: Collected, update: dict[str, dict[str, Any]], estimator: str,
                 classes: np.ndarray) -> dict[str, Any]:
    """The step's batch and update keys (rewards, per-agent statistics, Lemma and class factors, the worker
    groups' update metrics), from its rollout (``rollout.table``: the step table, advantages assigned), each
    worker group's update metrics and the step classes (``drmas.algos.step_classes`` of the table, computed once
    per step: the degenerate-training check reads them too). The trainer adds :func:`spike_metrics`, then
    :func:`closing_metrics`."""
    table = rollout.table
    n_traj = len(rollout.traj_reward)
    m: dict[str, Any] = {
        "reward/mean": float(rollout.traj_reward.mean()), "reward/std": float(rollout.traj_reward.std()),
        "score/mean": float(table.score.mean()) if len(table) else float("nan"),
        "steps": len(table), "rollout/digest": rollout_digest(table.prompt_ids, table.response_ids),
    }
    m.update(_agent_reward_stats(table, rollout.traj_reward, rollout.traj_task))
    if len(table):
        m.update(_lemma_factor_stats(table, estimator))
        m.update(_class_stats(table, classes))
    resp_len = table.response_len
    for name in dict.fromkeys(table.agent):
        rows = table.agent == name
        a = table.advantage[rows]
        m[f"agent/{name}/steps"] = int(rows.sum())
        m[f"agent/{name}/adv_mean"] = float(a.mean())
        m[f"agent/{name}/adv_std"] = float(a.std())
        m[f"agent/{name}/adv_m2"] = float((a ** 2).mean())
        m[f"agent/{name}/adv_absmax"] = float(np.abs(a).max())
        m[f"agent/{name}/invalid_rate"] = float(1.0 - table.valid[rows].mean())
        m[f"agent/{name}/truncated_rate"] = float(table.truncated[rows].mean())
        m[f"agent/{name}/response_len"] = float(resp_len[rows].mean())
        m[f"agent/{name}/calls_per_traj"] = float(rows.sum() / max(n_traj, 1))
        m[f"tokens/{name}"] = int(rollout.tokens_per_agent.get(name, 0))
    for wg, metrics in update.items():
        for key, value in metrics.items():
            if key.startswith("agent_") and "/" in key:  # agent_grad_norm/{k} -> agent/{k}/grad_norm, ...
                stat, name = key.split("/", 1)
                m[f"agent/{name}/{stat.removeprefix('agent_')}"] = value
            else:
                m[f"wg/{wg}/{key}"] = value
    return m


def spike_metrics(spikes: dict[str, SpikeDetector], metrics: dict[str, Any]) -> dict[str, Any]:
    """``.../spike_ratio`` and ``.../spike`` of every agent and worker group whose gradient norm ``metrics``
    holds. Advances each detector by this step (a detector's history is the trainer's state, checkpointed)."""
    out: dict[str, Any] = {}
    for name, det in spikes.items():
        key = f"agent/{name}/grad_norm" if f"agent/{name}/grad_norm" in metrics else f"wg/{name}/grad_norm"
        if key in metrics:
            ratio, spike = det.update(float(metrics[key]))
            prefix = key.rsplit("/", 1)[0]
            out[f"{prefix}/spike_ratio"] = ratio
            out[f"{prefix}/spike"] = int(spike)
    return out


def rollout_digest(prompt_ids: list[list[int]], response_ids: list[list[int]]) -> int:
    """The first 52 bits of BLAKE2b over the rows' token ids (each row: its prompt and response lengths, then
    their ids; int64 little-endian), an integer that JSON and float64 readers keep exactly. Equal rollouts have
    equal digests; two different rollouts share one with probability 2^-52."""
    rows = [[len(p), len(r), *p, *r] for p, r in zip(prompt_ids, response_ids)]
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype="<i8")
    return int.from_bytes(hashlib.blake2b(flat.tobytes(), digest_size=8).digest(), "little") >> 12


def closing_metrics(rollout: Collected, update: dict[str, dict[str, Any]], timings: dict[str, float],
                    metrics: dict[str, Any], orchestra: Orchestra | None = None) -> dict[str, Any]:
    """The step's last keys: 0 calls for a slot nobody called (absent from ``metrics``), the non-finite and
    skipped counts, the orchestra's behaviour keys and the timings."""
    table, n_traj = rollout.table, len(rollout.traj_reward)
    m: dict[str, Any] = {}
    if orchestra is not None:  # a slot nobody called this step: 0 calls (its other keys are absent)
        m.update({key: 0.0 for name in orchestra.slots
                  if (key := f"agent/{name}/calls_per_traj") not in metrics})
    norms = [float(v) for wg in update for k, v in update[wg].items() if k == "grad_norm"]
    m["train/nonfinite"] = int(sum(not math.isfinite(v) for v in norms))
    m["train/skipped"] = int(sum(float(update[wg].get("skipped", 0.0)) for wg in update))
    if orchestra is not None:
        m.update(orchestra.behavior_metrics(table, n_traj, rollout.step_infos))
    for wg, secs in rollout.seconds_per_wg.items():
        m[f"timing/generate/{wg}"] = secs
    m.update({f"timing/{k}": v for k, v in timings.items()})
    m["timing/step"] = sum(timings.values())
    return m


def evaluation_metrics(traj_reward: np.ndarray, k: int) -> dict[str, Any]:
    """avg@k (mean success over the k samples of each task, averaged over tasks) and pass@k (any
    success among the k), with the per-task success counts for bootstrap CIs. ``traj_reward`` is
    task-major: the k samples of a task are adjacent. A NaN/inf reward raises (``> 0.5`` would count it
    as a silent failure)."""
    reward = np.asarray(traj_reward, np.float64)
    if not np.isfinite(reward).all():
        raise ValueError(f"evaluation rewards contain {int((~np.isfinite(reward)).sum())} non-finite value(s) "
                         "(NaN/inf); check the environment's reward function")
    success = (reward > 0.5).reshape(-1, k)
    per_task = success.sum(1)
    return {"avg": float(success.mean()), "pass": float((per_task > 0).mean()), "k": k,
            "n_tasks": int(success.shape[0]), "successes": per_task.tolist()}


def tool_metrics(counts: dict[str, tuple[int, int]]) -> dict[str, int]:
    """``tools/{tool}/calls`` and ``tools/{tool}/failures`` of one step from (calls, failures) per tool."""
    return {f"tools/{tool}/{what}": int(n) for tool, (calls, failures) in counts.items()
            for what, n in (("calls", calls), ("failures", failures))}
