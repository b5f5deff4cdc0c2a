"""The one mini-batch plan and metric reduction (drmas/workers/minibatch.py) of the local worker and the
OpenRLHF seam."""
from __future__ import annotations

import math

import numpy as np
import pytest

from drmas.workers.minibatch import plan_minibatches, reduce_step_metrics, split_minibatches


def test_split_is_a_seeded_partition():
    minis = split_minibatches(11, 3, seed=4)
    assert [len(m) for m in minis] == [4, 4, 3]
    assert sorted(np.concatenate(minis).tolist()) == list(range(11))
    assert all((a == b).all() for a, b in zip(minis, split_minibatches(11, 3, seed=4)))
    assert [len(m) for m in split_minibatches(2, 5, seed=0)] == [1, 1]  # never a mini-batch without rows
    assert split_minibatches(0, 2, seed=0) == []
    with pytest.raises(ValueError):
        split_minibatches(3, 0, seed=0)


def test_plan_is_agent_contiguous_sorted_and_cut():
    agents = np.array(["v", "s", "s", "v", "s", "s", "v", "s"])
    length = np.array([5, 9, 2, 7, 4, 9, 1, 3])
    plan = plan_minibatches(8, 1, 3, seed=0, sort_keys=[length], agents=agents)
    assert len(plan) == 1 and len(plan[0]) == 1  # one mini-batch, one rank
    micro = plan[0][0]
    # agents in sorted order; rows by length within an agent; cut into 3s; last_of_agent closes each agent
    assert [(mb.agent, length[mb.rows].tolist(), mb.last_of_agent) for mb in micro] == [
        ("s", [2, 3, 4], False), ("s", [9, 9], True), ("v", [1, 5, 7], True)]
    assert sorted(np.concatenate([mb.rows for mb in micro]).tolist()) == list(range(8))


def test_plan_ranks_round_robin_without_agents():
    plan = plan_minibatches(10, 2, 2, seed=1, sort_keys=[-np.arange(10)], world_size=2)
    assert len(plan) == 2 and all(len(mini) == 2 for mini in plan)
    for mini, rows in zip(plan, split_minibatches(10, 2, seed=1)):
        for r, rank in enumerate(mini):
            got = np.concatenate([mb.rows for mb in rank]).tolist()
            assert got == sorted(rows[r::2].tolist(), reverse=True)  # the rank's rows, largest key first
            assert all(mb.agent is None and len(mb.rows) <= 2 for mb in rank)


def test_reduce_step_metrics_by_hand():
    steps = [{"grad_norm": 1.0, "agent_grad_norm/s": 0.5, "loss": 0.2, "skipped": 0.0, "lr": 1e-3},
             {"grad_norm": 3.0, "agent_grad_norm/s": 0.25, "loss": 0.4, "skipped": 1.0, "lr": 2e-3}]
    out = reduce_step_metrics(steps)
    # norms: max(1, 3) = 3 and max(0.5, 0.25) = 0.5; loss: (0.2 + 0.4) / 2; skipped: 0 + 1; lr: the last
    assert out == {"grad_norm": 3.0, "agent_grad_norm/s": 0.5, "loss": pytest.approx(0.3), "skipped": 1.0,
                   "lr": 2e-3}
    bad = reduce_step_metrics([{"grad_norm": 2.0}, {"grad_norm": float("inf")}])
    assert math.isnan(bad["grad_norm"])  # a non-finite step is not hidden by a finite one
    assert reduce_step_metrics([]) == {}
