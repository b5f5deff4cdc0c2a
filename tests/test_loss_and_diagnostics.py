"""Policy loss, aggregation modes, KL/entropy, per-agent gradient norms and the spike statistic."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drmas.algos import (
    AgentGradNorms,
    PolicyLossConfig,
    SpikeDetector,
    SpikeRule,
    aggregate_loss,
    entropy_from_logits,
    grad_norm,
    kl_k3,
    policy_loss,
    spike_ratios,
)


def test_aggregation_modes_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_loss(values, mask, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate_loss(values, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(values, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(values, mask, "bogus")  # type: ignore[arg-type]


def test_empty_sequences_are_left_out_of_sequence_means():
    values = torch.tensor([[1.0, 1.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(values, mask, "seq_mean_token_mean").item() == pytest.approx(1.0)


def test_ppo_clip_matches_hand_computation():
    # ratio = exp(logp - old): [1.5, 0.5]; A = [+1, -1]; clip 0.2
    # token 0: min(1.5 * 1, 1.2 * 1) = 1.2 -> loss -1.2 (clipped)
    # token 1: min(0.5 * -1, 0.8 * -1) = -0.8 -> loss 0.8 (clipped)
    old = torch.zeros(2, 1)
    logp = torch.log(torch.tensor([[1.5], [0.5]]))
    loss, m = policy_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert m["clip_frac"] == pytest.approx(1.0)
    # on-policy (ratio 1): loss = -mean(A), gradient = -A * grad logp
    logp = torch.zeros(2, 1, requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(2, 1), torch.tensor([2.0, -1.0]), torch.ones(2, 1))
    loss.backward()
    assert m["clip_frac"] == 0.0
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0], [0.5]]))


def test_clip_higher_is_asymmetric():
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    logp = torch.log(torch.tensor([[1.25]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.25)  # inside [0.8, 1.28]: not clipped


def test_kl_k3_and_entropy():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    ref = torch.log(torch.tensor([0.5, 0.4]))
    kl = kl_k3(logp, ref)
    assert kl[0].item() == pytest.approx(0.0)
    assert kl[1].item() == pytest.approx(2.0 - math.log(2.0) - 1.0)
    assert (kl >= 0).all()
    ent = entropy_from_logits(torch.zeros(3, 4))
    torch.testing.assert_close(ent, torch.full((3,), math.log(4)))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp[None], logp[None], torch.ones(1), torch.ones(1, 2), PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=1.5)


def test_kl_and_entropy_terms_enter_the_loss():
    logp = torch.log(torch.tensor([[0.2]]))
    ref = torch.log(torch.tensor([[0.4]]))
    ent = torch.tensor([[1.0]])
    base, _ = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1))
    with_terms, m = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1),
                                PolicyLossConfig(kl_coef=0.5, entropy_coef=0.1), ref_logprobs=ref, entropy=ent)
    assert with_terms.item() == pytest.approx(base.item() + 0.5 * (2 - math.log(2) - 1) - 0.1, rel=1e-5)
    assert m["entropy"] == pytest.approx(1.0)


def test_per_agent_grad_norms_under_sharing():
    """Two agents share one linear model; per-agent norms equal the norms of separately computed grads,
    and the model's total gradient is their sum."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    xa, xb = torch.randn(5, 4), torch.randn(3, 4)

    def loss_of(x):
        return model(x).pow(2).sum() / 8  # loss weights of the full 8-sample batch

    expected = {}
    for name, x in (("solver", xa), ("verifier", xb)):
        model.zero_grad()
        loss_of(x).backward()
        expected[name] = grad_norm(model.parameters())
    model.zero_grad()
    tracker = AgentGradNorms(model.parameters())
    loss_of(xa).backward()
    tracker.mark("solver")
    loss_of(xb).backward()
    tracker.mark("verifier")
    assert tracker.norms["solver"] == pytest.approx(expected["solver"], rel=1e-6)
    assert tracker.norms["verifier"] == pytest.approx(expected["verifier"], rel=1e-6)
    total = grad_norm(model.parameters())
    assert total <= expected["solver"] + expected["verifier"] + 1e-6
    with pytest.raises(ValueError, match="already marked"):
        tracker.mark("solver")


def test_agent_shares_and_cosines_equal_separate_backward_passes():
    """share_k = g_k·g/||g||² and cos_ab from one accumulated pass equal those of separate passes per agent."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    xs = {"verifier": torch.randn(5, 4), "search": torch.randn(3, 4), "answer": 3 * torch.randn(2, 4)}

    def loss_of(x):
        return model(x).pow(2).sum() / 10

    parts = {}
    for name, x in xs.items():
        model.zero_grad()
        loss_of(x).backward()
        parts[name] = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
    g = sum(parts.values())
    model.zero_grad()
    tracker = AgentGradNorms(model.parameters(), keep_parts=True)
    for name, x in xs.items():
        loss_of(x).backward()
        tracker.mark(name)
    share, cos = tracker.shares()
    for name, gk in parts.items():
        assert share[name] == pytest.approx(float(gk @ g / (g @ g)), rel=1e-5)
    assert sum(share.values()) == pytest.approx(1.0, abs=1e-9)
    assert set(cos) == {("verifier", "search"), ("verifier", "answer"), ("search", "answer")}
    for (a, b), c in cos.items():
        assert c == pytest.approx(float(parts[a] @ parts[b] / (parts[a].norm() * parts[b].norm())), rel=1e-5)
    with pytest.raises(ValueError, match="keep_parts"):
        AgentGradNorms(model.parameters()).shares()
    model.zero_grad()  # an agent whose contribution is exactly zero: its cosines are NaN, not a division error
    zero = AgentGradNorms(model.parameters(), keep_parts=True)
    zero.mark("idle")
    loss_of(xs["search"]).backward()
    zero.mark("search")
    share, cos = zero.shares()
    assert share == {"idle": 0.0, "search": 1.0} and math.isnan(cos[("idle", "search")])


def test_grad_norm_propagates_nan():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([float("nan"), 1.0])
    assert math.isnan(grad_norm([p]))


def test_spike_statistic_batch_and_streaming_agree():
    rng = np.random.default_rng(0)
    norms = list(1.0 + 0.1 * rng.random(60))
    norms[30] = 10.0  # a spike
    norms[45] = float("nan")  # non-finite counts as a spike
    rule = SpikeRule(window=10, threshold=3.0, min_history=5)
    frame = spike_ratios(norms, rule)
    det = SpikeDetector(rule)
    streamed = [det.update(v) for v in norms]
    np.testing.assert_allclose(frame["ratio"].to_numpy(), [r for r, _ in streamed], equal_nan=True)
    assert frame["spike"].tolist() == [s for _, s in streamed]
    assert set(np.flatnonzero(frame["spike"])) == {30, 45}
    assert det.count == 2
    assert frame["ratio"].iloc[:5].isna().all()  # no verdict before min_history steps


def test_spike_rule_validation():
    with pytest.raises(ValueError, match="spike rule"):
        SpikeRule(window=3, min_history=5)


def test_spike_rule_gives_no_verdict_on_a_near_zero_baseline():
    """A Verifier whose gradient is ~1e-5 most steps: its occasional 0.2 step is not a spike (ratio NaN), while
    the same jump over a real baseline is; batch and streaming forms agree."""
    rule = SpikeRule(window=10, threshold=3.0, min_history=5)
    tiny = [1e-5, 0.0, 2e-5, 1e-5, 3e-5, 0.2, 1e-5, 4e-4, 0.0, 2e-5]
    frame = spike_ratios(tiny, rule)
    assert not frame["spike"].any() and frame["ratio"].isna().all()
    det = SpikeDetector(rule)
    assert [det.update(v)[1] for v in tiny] == [False] * len(tiny)
    real = [0.1, 0.12, 0.09, 0.11, 0.1, 0.5]
    assert spike_ratios(real, rule)["spike"].tolist() == [False] * 5 + [True]
    assert spike_ratios(tiny, SpikeRule(window=10, threshold=3.0, min_history=5, min_baseline=0.0))["spike"].any()


def _slow_lemma_factor(score, task, agent, traj, baseline):
    """Per (task, agent): (σk² + (μk − μb)²)/σb² written from the Lemma's definitions, one group at a time."""
    out = {}
    for t in sorted(set(task)):
        rows = [i for i in range(len(score)) if task[i] == t]
        trajs = sorted({traj[i] for i in rows})
        traj_mean = {j: np.mean([score[i] for i in rows if traj[i] == j]) for j in trajs}
        for k in sorted({agent[i] for i in rows}):
            mine = [i for i in rows if agent[i] == k]
            if baseline == "trajectory_grpo":
                x = np.array([traj_mean[traj[i]] for i in mine])
                ref = np.array([traj_mean[j] for j in trajs])
            elif baseline == "pooled_grpo":
                x, ref = np.array([score[i] for i in mine]), np.array([score[i] for i in rows])
            else:  # drmas
                x = ref = np.array([score[i] for i in mine])
            mu, var = ref.mean(), ref.var()
            if var > 1e-12 and len(ref) > 1:
                out[(t, k)] = (x.var() + (x.mean() - mu) ** 2) / var
    return out


@pytest.mark.parametrize("baseline", ["trajectory_grpo", "pooled_grpo", "drmas"])
def test_lemma_factors_match_the_lemma_definition(baseline):
    from drmas.algos import lemma_factors

    rng = np.random.default_rng(1)
    n = 120
    task = rng.integers(0, 5, n)
    traj = task * 10 + rng.integers(0, 4, n)
    agent = rng.choice(np.array(["v", "s", "a"], object), n)
    score = rng.choice([0.0, 1.0, 0.9], n)
    got = lemma_factors(score, task, agent, traj, baseline)
    want = _slow_lemma_factor(score.tolist(), task.tolist(), agent.tolist(), traj.tolist(), baseline)
    assert len(got) == len(want) > 0
    for row in got.itertuples():
        assert row.factor == pytest.approx(want[(row.task, row.agent)], rel=1e-5)
    if baseline == "drmas":
        assert np.allclose(got["factor"], 1.0, atol=1e-5)  # agent-wise normalization: factor exactly 1


def test_lemma_factor_of_the_issue_worked_example():
    """8 trajectories, 7 succeed without searching, 1 fails after 4 searches: the Search agent's factor is
    (0 + 0.875²)/0.109 = 7 under trajectory GRPO; under Dr. MAS its constant group carries no gradient."""
    from drmas.algos import lemma_factors

    task, traj = [0] * 12, list(range(8)) + [7] * 4
    agent = np.array(["verifier"] * 8 + ["search"] * 4, object)
    score = np.array([1.0] * 7 + [0.0] * 5)
    f = lemma_factors(score, task, agent, traj, "trajectory_grpo").set_index("agent")["factor"]
    assert f["search"] == pytest.approx(7.0, rel=1e-6) and f["verifier"] == pytest.approx(1.0, rel=1e-6)
    assert "search" not in set(lemma_factors(score, task, agent, traj, "drmas")["agent"])


def _random_steps(rng, n=150, vocab=3):
    """A batch whose steps repeat: prompts and responses drawn from a few token sequences."""
    task = rng.integers(0, 4, n)
    traj = task * 10 + rng.integers(0, 6, n)
    agent = rng.choice(np.array(["v", "s", "a"], object), n)
    score = rng.choice([0.0, 1.0, 0.99], n)
    prompts = [[int(t), 7] for t in rng.integers(0, 2, n)]
    responses = [[int(t)] * int(m) for t, m in zip(rng.integers(0, vocab, n), rng.integers(1, 3, n))]
    return score, task, agent, traj, prompts, responses


def _slow_class_factors(score, task, agent, traj, prompts, responses, baseline):
    """Per agent: Σ over (task, agent, prompt, response) classes of (Σ A)², b over drmas, by a dict loop."""
    from drmas.algos import compute_advantages

    m2 = {}
    for name in (baseline, "drmas"):
        a = compute_advantages(score, task, agent, traj, estimator=name, ddof=0, eps=0.0, singleton="zero").advantages
        sums: dict = {}
        for i in range(len(score)):
            key = (task[i], agent[i], tuple(prompts[i]), tuple(responses[i]))
            sums[key] = sums.get(key, 0.0) + float(a[i])
        for key, s in sums.items():
            s = 0.0 if abs(s) < 1e-5 else s
            m2[(name, key[1])] = m2.get((name, key[1]), 0.0) + s * s
    return {k: m2[(baseline, k)] / m2[("drmas", k)] for k in set(agent) if m2[("drmas", k)] > 0}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_class_factors_match_a_slow_reference(seed):
    from drmas.algos import class_factors, step_classes

    score, task, agent, traj, prompts, responses = _random_steps(np.random.default_rng(seed))
    classes = step_classes(task, agent, prompts, responses)
    got = class_factors(score, task, agent, traj, classes, ("trajectory_grpo", "pooled_grpo"))
    for b in ("trajectory_grpo", "pooled_grpo"):
        want = _slow_class_factors(score, task, agent, traj, prompts, responses, b)
        assert len(want) > 0
        for k, value in want.items():
            assert got.loc[k, f"factor_{b}"] == pytest.approx(value, rel=1e-5)
    n_classes = {(t, k): set() for t, k in zip(task, agent)}
    for t, k, p, r in zip(task, agent, prompts, responses):
        n_classes[(t, k)].add((tuple(p), tuple(r)))
    share = {k: np.mean([len(c) / np.sum((task == t) & (agent == k)) for (t, kk), c in n_classes.items() if kk == k])
             for k in set(agent)}
    for k, value in share.items():
        assert got.loc[k, "distinct"] == pytest.approx(value)


def test_step_classes_key_on_task_agent_prompt_and_response():
    from drmas.algos import step_classes

    task, agent = [0, 0, 0, 0, 1, 0], np.array(["s", "s", "s", "a", "s", "s"], object)
    prompts = [[1, 2], [1, 2], [1, 3], [1, 2], [1, 2], [1, 2]]
    responses = [[5], [5], [5], [5], [5], [5, 6]]
    c = step_classes(task, agent, prompts, responses)
    assert c[0] == c[1] and len({c[1], c[2], c[3], c[4], c[5]}) == 5  # prompt, agent, task, response differ


@pytest.mark.parametrize("baseline", ["trajectory_grpo", "pooled_grpo"])
def test_class_factor_with_every_response_distinct_is_the_weighted_lemma_factor(baseline):
    from drmas.algos import class_factors, lemma_factors

    rng = np.random.default_rng(3)
    n = 160
    task = np.repeat(np.arange(4), 40)
    traj = task * 10 + rng.integers(0, 8, n)
    agent = rng.choice(np.array(["v", "s"], object), n)
    score = rng.normal(size=n)  # no constant group: every group's reference std > 0
    got = class_factors(score, task, agent, traj, np.arange(n), (baseline,))
    lf = lemma_factors(score, task, agent, traj, baseline)
    want = lf.groupby("agent").apply(lambda g: np.average(g["factor"], weights=g["n"]), include_groups=False)
    for k in ("v", "s"):
        assert got.loc[k, f"factor_{baseline}"] == pytest.approx(want[k], rel=1e-5)
        assert got.loc[k, "distinct"] == 1.0


def test_class_factor_of_a_fully_repeated_response():
    """The worked example, with the Search agent's 4 steps one (prompt, response): Dr. MAS's advantages cancel
    (M = 0, an infinite factor), trajectory GRPO leaves S = n (μk − μ)/σ = 4 · (0 − 0.875)/√0.109375."""
    from drmas.algos import class_factors, step_classes

    task, traj = [0] * 12, list(range(8)) + [7] * 4
    agent = np.array(["verifier"] * 8 + ["search"] * 4, object)
    score = np.array([1.0] * 7 + [0.0] * 5)
    prompts = [[1]] * 8 + [[2]] * 4
    responses = [[i] for i in range(8)] + [[9]] * 4
    classes = step_classes(task, agent, prompts, responses)
    got = class_factors(score, task, agent, traj, classes, ("trajectory_grpo",))
    assert got.loc["search", "m2_drmas"] == 0.0 and got.loc["search", "factor_trajectory_grpo"] == np.inf
    assert got.loc["search", "m2_trajectory_grpo"] == pytest.approx((4 * 0.875) ** 2 / 0.109375, rel=1e-6)
    assert got.loc["search", "distinct"] == 0.25
    # each step its own class: the paper's per-sample view, the Search agent's constant scores give M = 0 too
    assert got.loc["verifier", "factor_trajectory_grpo"] == pytest.approx(1.0, rel=1e-6)


def test_class_sums_drop_float32_rounding_only():
    from drmas.algos import class_sums

    a = np.array([0.1, 0.2, -0.3, 1e-3, 2.0], np.float32)
    s = class_sums(a, np.array([0, 0, 0, 1, 1]))
    assert s[0] == 0.0 and s[1] == pytest.approx(2.001, rel=1e-6)
