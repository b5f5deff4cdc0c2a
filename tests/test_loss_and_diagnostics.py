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
