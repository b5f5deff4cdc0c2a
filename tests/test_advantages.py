"""Advantage core: numeric vectors (arithmetic in comments), conventions, properties, equivalence with
the slow per-row reference in reference_advantages.py."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drmas.algos import ESTIMATORS, compute_advantages
from drmas.algos.advantages import Conventions
from drmas.testing import check_estimator
from reference_advantages import reference_advantages

EPS = 1e-6
ALL = sorted(ESTIMATORS)


def adv(scores, tasks, agents, trajs, **kw):
    return compute_advantages(torch.tensor(scores, dtype=torch.float32), tasks, agents, trajs, **kw).advantages


# ---------------------------------------------------------------------------------------------- vectors
@pytest.mark.parametrize("estimator", ["trajectory_grpo", "pooled_grpo", "drmas"])
def test_single_group_1000(estimator):
    # scores [1,0,0,0], one agent, one step per trajectory: all three estimators coincide.
    # mean = 0.25; unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = 0.75 / 3 = 0.25 -> std 0.5
    # A = (1 - 0.25) / 0.5 = 1.5 ; (0 - 0.25) / 0.5 = -0.5
    got = adv([1, 0, 0, 0], [0] * 4, ["a"] * 4, [0, 1, 2, 3], estimator=estimator)
    torch.testing.assert_close(got, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("estimator", ALL)
def test_builtin_estimators_pass_check_estimator(estimator):
    """The checks a plug-in estimator gets (drmas.testing): its return value, finite advantages, row-permutation
    equivariance and advantage 0 for a group whose scores are all equal, under three conventions."""
    report = check_estimator(estimator)
    assert report.passed == ("returns", "finite", "row permutation", "zero on constant groups"), report
    # one task group whose scores are all equal, written out
    check_estimator(estimator, table=([0.7] * 6, [0] * 6, ["a", "b"] * 3, [0, 0, 1, 1, 2, 2]))


def test_two_agents_on_different_scales_pooled_vs_agentwise():
    # One task, 4 trajectories, each with one solver step and one verifier step.
    # solver scores:   [1.0, 1.0, 0.0, 0.0]  (team reward)
    # verifier scores: [1.0, 0.9, 0.9, 0.0]  (team reward minus the 0.1 invalid-format penalty on two)
    # pooled (steps): mean = (2 + 2.8) / 8 = 0.6. Verifier's 0.9 -> above the mean: positive.
    # drmas, verifier: mean_k = 2.8 / 4 = 0.7; the 0.9 steps are above it -> positive as well;
    # solver: mean_k = 0.5, var = (4 * 0.25) / 3 = 1/3, std = 0.57735 -> +-0.8660.
    # verifier: var = (0.09 + 0.04 + 0.04 + 0.49) / 3 = 0.22, std = 0.46904
    #   A(1.0) = 0.3 / 0.46904 = 0.6396, A(0.9) = 0.2 / 0.46904 = 0.4264, A(0.0) = -0.7 / 0.46904 = -1.4924
    scores = [1.0, 1.0, 1.0, 0.9, 0.0, 0.9, 0.0, 0.0]
    agents = ["solver", "verifier"] * 4
    trajs = [0, 0, 1, 1, 2, 2, 3, 3]
    tasks = [0] * 8
    dr = adv(scores, tasks, agents, trajs, estimator="drmas")
    expected = torch.tensor([0.8660, 0.6396, 0.8660, 0.4264, -0.8660, 0.4264, -0.8660, -1.4924])
    torch.testing.assert_close(dr, expected, atol=1e-4, rtol=0)
    # A step of score 0.0 of the solver (trajectory 2) and the verifier's 0.9 in the same trajectory get
    # opposite signs under drmas; under trajectory_grpo they share one value (R_2 = 0.45 < mu = 0.6).
    traj = adv(scores, tasks, agents, trajs, estimator="trajectory_grpo")
    assert traj[4] == traj[5] and traj[4] < 0
    assert dr[4] < 0 < dr[5]
    # Different reward scales: agent b's scores are 10x agent a's. pooled gives all of a's steps the sign
    # of (small - pooled mean) < 0, agent-wise normalization gives a's best step a positive advantage.
    scores2 = [0.1, 0.0, 10.0, 0.0]
    agents2 = ["a", "a", "b", "b"]
    trajs2 = [0, 1, 0, 1]
    pooled = adv(scores2, [0] * 4, agents2, trajs2, estimator="pooled_grpo")
    agentwise = adv(scores2, [0] * 4, agents2, trajs2, estimator="drmas")
    assert pooled[0] < 0 and pooled[1] < 0  # mean = 2.525
    assert agentwise[0] > 0 > agentwise[1]  # +-0.7071 = (0.05 / 0.0707)
    torch.testing.assert_close(agentwise, torch.tensor([0.7071, -0.7071, 0.7071, -0.7071]), atol=1e-4, rtol=0)


def test_trajectory_grpo_averages_steps_first():
    # traj 0: steps [1.0, 0.9] -> R = 0.95; traj 1: [0.0] -> R = 0; traj 2: [1.0, 1.0, 1.0] -> R = 1
    # mu = 1.95 / 3 = 0.65; var = (0.09 + 0.4225 + 0.1225) / 2 = 0.3175; std = 0.563471
    # A0 = 0.3 / 0.563471 = 0.5324; A1 = -0.65 / 0.563471 = -1.1536; A2 = 0.35 / 0.563471 = 0.6211
    got = adv([1.0, 0.9, 0.0, 1.0, 1.0, 1.0], [7] * 6, ["s", "v", "s", "s", "v", "s"], [0, 0, 1, 2, 2, 2],
              estimator="trajectory_grpo")
    exp = torch.tensor([0.5324, 0.5324, -1.1536, 0.6211, 0.6211, 0.6211])
    torch.testing.assert_close(got, exp, atol=1e-4, rtol=0)


def test_ablation_vectors_two_groups():
    # Task 0: trajs 0,1; agent a scores [1, 0], agent b scores [1, 1] -> R = [1, 0.5]
    #   traj mu = 0.75, sigma = std([1, .5]) = 0.353553; agent a: mu_a = .5, sigma_a = .707107;
    #   agent b: mu_b = 1, sigma_b = 0.
    #   mean_only (mu_k, sigma): a: (1-.5)/.353553 = 1.41421, (0-.5)/.353553 = -1.41421; b: 0, 0
    #   std_only (mu, sigma_k): a: (1-.75)/.707107 = .353553, (0-.75)/.707107 = -1.06066;
    #                            b: (1-.75)/(0+1e-6) = 250000 (a zero-variance agent blows up: Table 3's point)
    # Task 1: a single trajectory (singleton task group) with agent a once -> raw rule: x / (1 + eps).
    scores = [1, 1, 0, 1, 0.3]
    tasks = [0, 0, 0, 0, 1]
    agents = ["a", "b", "a", "b", "a"]
    trajs = [0, 0, 1, 1, 0]
    mo = adv(scores, tasks, agents, trajs, estimator="drmas_mean_only")
    torch.testing.assert_close(mo, torch.tensor([1.41421, 0.0, -1.41421, 0.0, 0.3 / (1 + EPS)]), atol=1e-4, rtol=0)
    so = adv(scores, tasks, agents, trajs, estimator="drmas_std_only")
    torch.testing.assert_close(so[[0, 2, 4]], torch.tensor([0.353553, -1.06066, 0.3 / (1 + EPS)]), atol=1e-4, rtol=0)
    assert so[1] == pytest.approx(0.25 / EPS, rel=1e-5)


def test_rloo_vectors():
    # Group [1, 0, 0, 0] (one step per trajectory): baseline of row 0 = 0 -> 1; rows 1-3: 0 - 1/3.
    got = adv([1, 0, 0, 0], [0] * 4, ["a"] * 4, [0, 1, 2, 3], estimator="rloo", scale_by_std=False)
    torch.testing.assert_close(got, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]), atol=1e-6, rtol=0)
    # scaled by std 0.5: [2, -2/3, ...]
    got = adv([1, 0, 0, 0], [0] * 4, ["a"] * 4, [0, 1, 2, 3], estimator="rloo")
    torch.testing.assert_close(got, torch.tensor([2.0, -2 / 3, -2 / 3, -2 / 3]), atol=1e-5, rtol=0)
    # agent-wise: agent a [1, 0] -> [1, -1]; agent b [0.5, 0.5] -> [0, 0]
    got = adv([1, 0.5, 0, 0.5], [0] * 4, ["a", "b"] * 2, [0, 0, 1, 1], estimator="rloo_agent", scale_by_std=False)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, -1.0, 0.0]), atol=1e-6, rtol=0)


# -------------------------------------------------------------------------------------- conventions
@pytest.mark.parametrize("estimator", ALL)
def test_singleton_rules(estimator):
    # one step, one trajectory, one agent: raw -> x / (1 + eps) (mean 0, std 1); zero -> 0
    raw = adv([0.8], ["t"], ["a"], [0], estimator=estimator)
    assert raw.item() == pytest.approx(0.8 / (1 + EPS), abs=1e-7)
    assert adv([0.8], ["t"], ["a"], [0], estimator=estimator, singleton="zero").item() == 0.0
    assert adv([0.8], ["t"], ["a"], [0], estimator=estimator, scale_by_std=False).item() == pytest.approx(0.8)


def test_ddof_zero_uses_population_std():
    # [1, 0]: population std 0.5 -> +-1; unbiased std 0.7071 -> +-0.7071
    torch.testing.assert_close(adv([1, 0], [0, 0], ["a", "a"], [0, 1], estimator="drmas", ddof=0),
                               torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(adv([1, 0], [0, 0], ["a", "a"], [0, 1], estimator="drmas", ddof=1),
                               torch.tensor([0.70711, -0.70711]), atol=1e-5, rtol=0)


def test_eps_is_added_to_std():
    got = adv([1, 0], [0, 0], ["a", "a"], [0, 1], estimator="drmas", ddof=0, eps=1.0)
    torch.testing.assert_close(got, torch.tensor([0.5 / 1.5, -0.5 / 1.5]), atol=1e-6, rtol=0)


def test_mean_only_drops_std():
    got = adv([1, 0, 0, 0], [0] * 4, ["a"] * 4, [0, 1, 2, 3], estimator="drmas", scale_by_std=False)
    torch.testing.assert_close(got, torch.tensor([0.75, -0.25, -0.25, -0.25]), atol=1e-6, rtol=0)


def test_trajectory_ids_are_scoped_by_task():
    # traj id 0 appears in two tasks: they are two different trajectories, not one.
    a = adv([1, 0, 1, 1], [0, 0, 1, 1], ["a"] * 4, [0, 1, 0, 1], estimator="trajectory_grpo")
    torch.testing.assert_close(a, torch.tensor([0.70711, -0.70711, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_stats_frame():
    res = compute_advantages(torch.tensor([1.0, 1.0, 0.0, 0.5]), ["x", "x", "x", "x"], ["s", "v", "s", "v"],
                             [0, 0, 1, 1], estimator="drmas")
    st_ = res.stats.set_index("agent_id")
    assert list(st_.index) == ["s", "v"]
    assert st_.loc["s", "n"] == 2 and st_.loc["s", "mean"] == pytest.approx(0.5)
    assert st_.loc["v", "std"] == pytest.approx(math.sqrt(0.125))
    # trajectory-level task stats: R = [1, 0.25] -> mean 0.625, std 0.53033
    assert st_.loc["s", "task_mean"] == pytest.approx(0.625) and st_.loc["s", "task_std"] == pytest.approx(0.530330, abs=1e-6)
    assert st_.loc["s", "task_step_mean"] == pytest.approx(0.625)
    assert res.group_index.tolist() == [0, 1, 0, 1]
    traj = compute_advantages(torch.tensor([1.0, 1.0, 0.0, 0.5]), ["x"] * 4, ["s", "v"] * 2, [0, 0, 1, 1],
                              estimator="trajectory_grpo")
    assert traj.stats.shape[0] == 1 and traj.stats.loc[0, "n"] == 2  # n counts trajectories


@pytest.mark.parametrize("bad, match", [
    (dict(scores=[1.0, float("nan")]), "non-finite"),
    (dict(scores=[1.0, float("inf")]), "non-finite"),
    (dict(task_ids=[0]), "task_ids has 1 entries"),
    (dict(estimator="nope"), "unknown advantage estimator 'nope'; registered"),
    (dict(ddof=2), "ddof"),
    (dict(singleton="drop"), "singleton"),
    (dict(eps=-1.0), "eps"),
])
def test_bad_input_names_the_problem(bad, match):
    kw = dict(scores=[1.0, 0.0], task_ids=[0, 0], agent_ids=["a", "a"], traj_ids=[0, 1])
    kw.update(bad)
    scores = torch.tensor(kw.pop("scores"))
    with pytest.raises(ValueError, match=match):
        compute_advantages(scores, kw.pop("task_ids"), kw.pop("agent_ids"), kw.pop("traj_ids"), **kw)


def test_scores_must_be_1d():
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(torch.zeros(2, 2), [0, 0], [0, 0], [0, 1])


def test_empty_batch():
    res = compute_advantages(torch.zeros(0), [], [], [])
    assert res.advantages.numel() == 0


# --------------------------------------------------------------------------------- random step tables
def random_table(rng: np.random.Generator, n_tasks=6, n_traj=5, n_agents=3, discrete=True):
    """A step table like the math/search systems produce: variable steps per trajectory, agents acting
    at different frequencies, binary rewards minus penalties; includes singleton and constant groups."""
    rows = []
    for t in range(n_tasks):
        trajs = int(rng.integers(1, n_traj + 1))
        for j in range(trajs):
            reward = float(rng.integers(0, 2)) if discrete else float(rng.normal())
            for _ in range(int(rng.integers(1, 5))):
                agent = int(rng.integers(0, n_agents))
                penalty = 0.1 * float(rng.random() < 0.2)
                rows.append((reward - penalty, f"task{t}", f"agent{agent}", j))
    scores, tasks, agents, trajs = map(list, zip(*rows))
    return scores, tasks, agents, trajs


@pytest.mark.parametrize("estimator", ALL)
@pytest.mark.parametrize("ddof, singleton, scale", [(1, "raw", True), (0, "zero", True), (1, "zero", False)])
def test_equivalence_with_slow_reference(estimator, ddof, singleton, scale):
    rng = np.random.default_rng(hash((estimator, ddof, singleton, scale)) % 2**32)
    for trial in range(8):
        scores, tasks, agents, trajs = random_table(rng, discrete=trial % 2 == 0)
        kw = dict(estimator=estimator, ddof=ddof, singleton=singleton, scale_by_std=scale)
        fast = compute_advantages(torch.tensor(scores, dtype=torch.float64), tasks, agents, trajs, **kw).advantages
        slow = torch.tensor(reference_advantages(scores, tasks, agents, trajs, **kw), dtype=torch.float32)
        # zero-variance groups under drmas_std_only produce (x - mu) / 1e-6 ~ 1e5: compare relatively there
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ properties
step_tables = st.integers(0, 2**32 - 1).map(lambda seed: random_table(np.random.default_rng(seed), discrete=False))


@settings(max_examples=60, deadline=None)
@given(table=step_tables, seed=st.integers(0, 2**32 - 1))
def test_random_tables_pass_check_estimator(table, seed):
    """check_estimator on random step tables (singleton and constant groups included): row permutation,
    finiteness and zero advantages on its constant task groups, under the reference conventions."""
    for est in ALL:
        check_estimator(est, table=table, seed=seed, conventions=(Conventions(),))


@settings(max_examples=60, deadline=None)
@given(table=step_tables, scale=st.floats(0.05, 20.0), shift=st.floats(-5.0, 5.0), seed=st.integers(0, 2**32 - 1))
def test_drmas_per_agent_affine_invariance(table, scale, shift, seed):
    """Rescaling and shifting one agent's scores (in every task) leaves drmas advantages unchanged
    (up to eps) for groups of size >= 2: agent-wise normalization removes per-agent reward scales."""
    scores, tasks, agents, trajs = table
    target = f"agent{np.random.default_rng(seed).integers(0, 3)}"
    x = np.asarray(scores)
    mask = np.asarray(agents) == target
    y = np.where(mask, scale * x + shift, x)
    kw = dict(estimator="drmas", eps=0.0)
    res = compute_advantages(torch.tensor(x), tasks, agents, trajs, **kw)
    a = res.advantages
    b = compute_advantages(torch.tensor(y), tasks, agents, trajs, **kw).advantages
    ok = ~res.stats["singleton"].to_numpy()[res.group_index.numpy()]  # singletons keep raw scores by design
    torch.testing.assert_close(a[ok], b[ok], atol=1e-4, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(table=step_tables)
def test_one_agent_drmas_equals_pooled(table):
    scores, tasks, _, trajs = table
    agents = ["solo"] * len(scores)
    for kw in (dict(), dict(ddof=0), dict(scale_by_std=False), dict(singleton="zero")):
        a = compute_advantages(torch.tensor(scores), tasks, agents, trajs, estimator="drmas", **kw).advantages
        b = compute_advantages(torch.tensor(scores), tasks, agents, trajs, estimator="pooled_grpo", **kw).advantages
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@settings(max_examples=60, deadline=None)
@given(table=step_tables)
def test_each_agent_group_has_mean_zero_and_unit_std(table):
    scores, tasks, agents, trajs = table
    res = compute_advantages(torch.tensor(scores, dtype=torch.float64), tasks, agents, trajs, estimator="drmas", eps=0.0)
    frame = pd.DataFrame({"adv": res.advantages.double().numpy(), "g": res.group_index.numpy()})
    per_group = frame.groupby("g")["adv"].agg(["mean", "std", "count"])
    multi = per_group[per_group["count"] >= 2]
    # non-degenerate groups: mean 0, unbiased std 1; constant groups: all zero (NaN-free by eps = 0?)
    stds = res.stats.loc[multi.index, "std"].to_numpy()
    nondeg = multi[stds > 1e-9]
    np.testing.assert_allclose(nondeg["mean"], 0.0, atol=1e-5)
    np.testing.assert_allclose(nondeg["std"], 1.0, atol=1e-4)


def test_constant_group_with_zero_eps_is_not_nan():
    # eps = 0 and a constant group: 0 / 0 must not leak NaN into training.
    got = compute_advantages(torch.tensor([1.0, 1.0]), [0, 0], ["a", "a"], [0, 1], estimator="drmas", eps=0.0)
    assert torch.isfinite(got.advantages).all()


# ------------------------------------------------------------- the official ablation branch's estimators
@pytest.mark.parametrize("ablation, known", [("agent_agent", "drmas"), ("agent_agent_uid", "pooled_grpo"),
                                             ("traj_traj_uid", "trajectory_grpo")])
def test_reference_ablations_that_are_known_estimators(ablation, known):
    """Three of the eight are estimators the suite already had: (uid_agent, steps, steps) is Dr. MAS, (uid,
    steps, steps) the pooled step baseline, (uid, trajectories, trajectories) trajectory GRPO."""
    rng = np.random.default_rng(7)
    for discrete in (True, False):
        table = random_table(rng, discrete=discrete)
        torch.testing.assert_close(adv(*table, estimator=ablation), adv(*table, estimator=known))


def test_agent_traj_vector():
    """The branch's default, by hand: one task, agent a acts twice in trajectory 0 and once in trajectory 1.
    Agent group a: step scores [1, 0, 0] (mean 1/3); per-trajectory means [0.5, 0] (std 0.3536)."""
    scores, tasks, agents, trajs = [1.0, 0.0, 0.0], ["t"] * 3, ["a"] * 3, [0, 0, 1]
    std_traj = float(np.std([0.5, 0.0], ddof=1))
    expected = [(x - 1 / 3) / (std_traj + EPS) for x in scores]
    torch.testing.assert_close(adv(scores, tasks, agents, trajs, estimator="agent_traj"),
                               torch.tensor(expected, dtype=torch.float32))
    # traj_agent: the trajectory means (0.5, 0.5, 0) minus their mean 0.25, over the step std
    std_step = float(np.std(scores, ddof=1))
    expected = [(m - 0.25) / (std_step + EPS) for m in (0.5, 0.5, 0.0)]
    torch.testing.assert_close(adv(scores, tasks, agents, trajs, estimator="traj_agent"),
                               torch.tensor(expected, dtype=torch.float32))
