"""The worker-group update (drmas/workers/policy.py): micro-batching is gradient accumulation, so the
gradient of one RL step does not depend on the micro-batch size or on the order rows arrive in.

Gradients are compared, not the weights after the step: Adam's first step is ~lr * sign(g), so a
parameter whose gradient is ~0 could flip on float noise alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.models import build_policy, save_policy, train_bytelevel_bpe
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tok = train_bytelevel_bpe([f"question {i} answer {i * 7} done" for i in range(300)], vocab_size=320)
    folder = tmp_path_factory.mktemp("policy") / "nano"
    save_policy(build_policy("nano", tok, seed=0), tok, folder)
    return str(folder)


def _batch(seed: int, n: int = 23) -> UpdateBatch:
    """Rows of two agents with very different prompt and response lengths (as search prompts are)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 250, size=int(rng.integers(2, 40))).tolist() for _ in range(n)]
    responses = [rng.integers(3, 250, size=int(rng.integers(1, 12))).tolist() for _ in range(n)]
    agents = np.array(["solver" if i % 3 else "verifier" for i in range(n)])
    return UpdateBatch(prompts, responses, rng.normal(size=n).astype(np.float32), agents, np.ones(n))


def _updated(checkpoint, batch, micro_batch_size, mini_batches=1, aggregation="token_mean"):
    spec = WorkerSpec("wg", ModelConfig(preset="nano", path=checkpoint),
                      OptimConfig(lr=1e-2, micro_batch_size=micro_batch_size, mini_batches=mini_batches),
                      AlgoConfig(aggregation=aggregation), seed=0)
    worker = PolicyWorker(spec)
    metrics = worker.update(batch, step_seed=5)  # the gradient stays in .grad after the step
    return {k: p.grad.detach().clone() for k, p in worker.model.named_parameters()}, metrics


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_size_does_not_change_the_update(checkpoint, aggregation):
    batch = _batch(0)
    whole, m_whole = _updated(checkpoint, batch, micro_batch_size=64, aggregation=aggregation)
    split, m_split = _updated(checkpoint, batch, micro_batch_size=2, aggregation=aggregation)
    assert max(float(g.abs().max()) for g in whole.values()) > 1e-4  # a real gradient
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-7)
    for key in ("grad_norm", "agent_grad_norm/solver", "agent_grad_norm/verifier", "loss"):
        assert m_split[key] == pytest.approx(m_whole[key], rel=1e-4), key


def test_row_order_does_not_change_the_update(checkpoint):
    batch = _batch(1)
    perm = np.random.default_rng(3).permutation(len(batch.response_ids))
    shuffled = UpdateBatch([batch.prompt_ids[i] for i in perm], [batch.response_ids[i] for i in perm],
                           batch.advantages[perm], batch.agents[perm], batch.temperature[perm])
    a, _ = _updated(checkpoint, batch, micro_batch_size=4)
    b, _ = _updated(checkpoint, shuffled, micro_batch_size=4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-7)


def test_behaviour_statistics_are_those_of_the_pre_update_policy(checkpoint, monkeypatch):
    """agent/{k}/entropy and control_prob describe the policy that sampled the rows, whatever the number of
    optimizer steps: with 3 mini-batches (lr 1e-2, the weights move between them) they equal a direct
    computation under the weights before the update, and the same with one mini-batch."""
    from drmas.models.logprobs import batch_logprobs, make_batch

    batch = _batch(2)
    n = len(batch.response_ids)
    positions = np.array([(i % 4) - 1 if len(r) > 2 else -1 for i, r in enumerate(batch.response_ids)])
    monkeypatch.setattr(PolicyWorker, "_control_positions", lambda self, b: positions)
    spec = WorkerSpec("wg", ModelConfig(preset="nano", path=checkpoint), OptimConfig(lr=1e-2, micro_batch_size=4),
                      AlgoConfig(), seed=0)
    reference = PolicyWorker(spec).model
    with torch.no_grad():  # the slow reference: one row at a time, before any optimizer step
        rows = [batch_logprobs(reference, make_batch([batch.prompt_ids[i]], [batch.response_ids[i]], 0, "cpu"),
                               with_entropy=True) for i in range(n)]
    for mini_batches in (1, 3):
        _, m = _updated(checkpoint, batch, micro_batch_size=4, mini_batches=mini_batches)
        for agent in ("solver", "verifier"):
            mine = [i for i in range(n) if batch.agents[i] == agent]
            entropy = sum(float(rows[i][1].sum()) for i in mine) / sum(len(batch.response_ids[i]) for i in mine)
            probs = [float(rows[i][0][0, positions[i]].exp()) for i in mine if positions[i] >= 0]
            assert m[f"agent_entropy/{agent}"] == pytest.approx(entropy, rel=1e-5), (mini_batches, agent)
            assert m[f"agent_control_prob/{agent}"] == pytest.approx(np.mean(probs), rel=1e-5), (mini_batches, agent)
            assert m[f"agent_control_prob_min/{agent}"] == pytest.approx(min(probs), rel=1e-5), (mini_batches, agent)
