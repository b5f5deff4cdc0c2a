"""The mini-batch plan and the metric reduction of one worker-group update, shared by the local worker
(drmas/workers/policy.py) and the OpenRLHF seam (drmas/workers/openrlhf/seam.py).

Plan (:func:`plan_minibatches`), per RL step:
1. rows are shuffled (seeded by the step) and split into ``min(mini_batches, n)`` mini-batches, one
   optimizer step each;
2. a mini-batch's rows go round-robin to ``world_size`` data-parallel ranks (the local worker is one
   rank);
3. on each rank, rows are grouped by agent (agents in sorted order; one group when no agents are
   given), ordered within a group by the caller's sort keys (less padding per micro-batch; the local
   worker also keeps rows with one prompt together, so they share it), and each group is cut into
   micro-batches of ``micro_batch_size``.
Each row's loss weight does not depend on its micro-batch, so the plan changes float rounding only,
never the gradient of an optimizer step.

Reduction (:func:`reduce_step_metrics`): the metrics of a step's optimizer steps become one value per
key: gradient norms take the max (a spike must not be averaged away; NaN when any step's norm is not
finite), ``skipped`` counts the skipped optimizer steps, ``lr`` is the last, everything else the mean.
Per-agent behaviour statistics (:func:`agent_behavior_metrics`): each agent's entropy and control-token
probability under the policy that sampled the rows, from whatever forward passes the backend ran.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class MicroBatch:
    """Rows (indices into the worker group's batch) run in one forward/backward pass."""

    rows: np.ndarray
    agent: str | None
    """The agent every row belongs to (None when the plan was made without agents)."""
    last_of_agent: bool
    """True on the last micro-batch of its agent on its rank (the point to read that agent's gradient)."""


def split_minibatches(n: int, mini_batches: int, seed: int) -> list[np.ndarray]:
    """Rows ``0..n-1`` shuffled with ``seed`` and split into ``min(mini_batches, n)`` near-equal mini-batches
    (never one without rows; ``[]`` for ``n = 0``)."""
    if mini_batches < 1:
        raise ValueError(f"mini_batches={mini_batches} must be >= 1")
    if n == 0:
        return []
    return np.array_split(np.random.default_rng(seed).permutation(n), min(mini_batches, n))


def plan_minibatches(n: int, mini_batches: int, micro_batch_size: int, seed: int,
                     sort_keys: Sequence[np.ndarray] = (), agents: np.ndarray | None = None,
                     world_size: int = 1) -> list[list[list[MicroBatch]]]:
    """``plan[m][r]``: the micro-batches of rank ``r`` in optimizer step ``m`` (module docstring).

    ``sort_keys`` are per-row arrays, most significant first; rows with equal keys keep their shuffled
    order. ``agents`` (per row) makes every micro-batch single-agent and agent-contiguous."""
    if micro_batch_size < 1 or world_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size}, world_size={world_size}: both must be >= 1")
    keys = [np.asarray(k) for k in sort_keys]
    plan = []
    for mini in split_minibatches(n, mini_batches, seed):
        ranks = []
        for rank_rows in (mini[r::world_size] for r in range(world_size)):
            ordered = rank_rows[np.lexsort([k[rank_rows] for k in reversed(keys)])] if keys else rank_rows
            groups = ([(None, ordered)] if agents is None else
                      [(str(a), ordered[agents[ordered] == a]) for a in sorted(set(agents[ordered].tolist()))])
            micro = []
            for agent, rows in groups:
                cuts = list(range(0, len(rows), micro_batch_size))
                micro += [MicroBatch(rows[c:c + micro_batch_size], agent, c == cuts[-1]) for c in cuts]
            ranks.append(micro)
        plan.append(ranks)
    return plan


def reduce_step_metrics(per_step: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One value per key from the metrics of one RL step's optimizer steps (module docstring): keys with
    ``grad_norm`` -> max (NaN if any is not finite), ``skipped`` -> sum, ``lr`` -> last, else the mean.
    A key missing from some steps is reduced over the steps that have it."""
    out: dict[str, float] = {}
    for key in sorted({k for d in per_step for k in d}):
        values = [float(d[key]) for d in per_step if key in d]
        if "grad_norm" in key:
            out[key] = max(values) if all(math.isfinite(v) for v in values) else float("nan")
        elif key == "skipped":
            out[key] = float(sum(values))
        elif key == "lr":
            out[key] = values[-1]
        else:
            out[key] = float(np.mean(values))
    return out


def agent_behavior_metrics(agents: np.ndarray, entropy: Mapping[str, Sequence[float]],
                           control_logp: np.ndarray) -> dict[str, float]:
    """Per-agent behaviour statistics of one RL step (keys in drmas/trainer/metrics.py), all under the
    policy before the step's first optimizer step, the one that sampled the rows (at its temperature):

    - ``agent_entropy/{k}`` = Σ_t H_t / T: token-mean entropy of agent k's response tokens, from
      ``entropy[k] = (Σ_t H_t, T)`` (agents in the order given; NaN where T = 0);
    - ``agent_control_prob/{k}`` and ``_min/{k}``: mean and smallest exp(``control_logp[i]``) over agent k's
      rows i that have a control token (``control_logp`` NaN elsewhere; absent when none has)."""
    out: dict[str, float] = {}
    for agent, (total, tokens) in entropy.items():
        out[f"agent_entropy/{agent}"] = float(total) / float(tokens) if tokens else float("nan")
    for agent in dict.fromkeys(np.asarray(agents).tolist()):
        p = np.exp(control_logp[(agents == agent) & np.isfinite(control_logp)])
        if p.size:
            out[f"agent_control_prob/{agent}"] = float(p.mean())
            out[f"agent_control_prob_min/{agent}"] = float(p.min())
    return out
