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
