"""Shared prompts in the update (drmas/models/logprobs.py "Shared prompts", ``algo.shared_prefix``): the
shared-prompt layout must give the plain layout's log-probs, loss, every parameter gradient and the
per-agent gradient norms, for both loss aggregations, with and without LLM sharing, in the update, the
old-log-prob pass (several mini-batches) and the reference pass (KL); and generation from a shared
prompt cache must give the plain prefill's responses."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import drmas.rollout.hf as hf_module
import drmas.workers.policy as policy_module
from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.models import build_policy, model_preset, save_policy, train_bytelevel_bpe
from drmas.models.logprobs import (batch_logprobs, group_prompts, make_batch, make_shared_prefix_batch,
                                   shared_prefix_logprobs, shared_prefix_tokens)
from drmas.rollout import HFRolloutEngine, SamplingParams
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker


@pytest.fixture(scope="module")
def tok():
    return train_bytelevel_bpe([f"question {i} answer {i * 7} done" for i in range(300)], vocab_size=320)


@pytest.fixture(scope="module")
def checkpoint(tok, tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy") / "nano"
    save_policy(build_policy("nano", tok, seed=0), tok, folder)
    return str(folder)


def grouped_rows(seed: int, tasks: int, group: int, singletons: int = 2):
    """``tasks`` prompts of 2-30 tokens (ids below the 320-token vocabulary), each answered ``group``
    times (1-10 tokens), plus ``singletons`` rows whose prompt appears once; rows shuffled."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(2, 30))] for _ in range(tasks)]
    rows = [(p, [rng.randrange(3, 250) for _ in range(rng.randint(1, 10))]) for p in prompts for _ in range(group)]
    rows += [([rng.randrange(3, 250) for _ in range(rng.randint(2, 30))], [rng.randrange(3, 250)])
             for _ in range(singletons)]
    rng.shuffle(rows)
    return [p for p, _ in rows], [r for _, r in rows]


# ======================================================================================= packing
def test_group_prompts_and_token_counts_by_hand():
    prompts = [[5, 6, 7], [8, 9], [5, 6, 7], [5, 6], [8, 9]]
    index, leaders = group_prompts(prompts)
    # distinct prompts in lexicographic order of their (-1)-padded ids: [5,6,-1] < [5,6,7] < [8,9,-1]
    assert index.tolist() == [1, 2, 1, 0, 2] and leaders.tolist() == [3, 0, 1]
    assert all(prompts[leaders[index[i]]] == prompts[i] for i in range(len(prompts)))
    # plain: 5 rows x (3 + 4); shared: 3 prefixes x (3 - 1) + 5 rows x (1 + 4)
    assert shared_prefix_tokens(np.array([3, 2, 3, 2, 2]), np.array([4, 1, 2, 1, 1]), leaders) == (35, 31)


def test_shared_prefix_layout_by_hand():
    b = make_shared_prefix_batch([[5, 6, 7], [8, 9], [5, 6, 7]], [[1], [2, 3], []], pad_id=0)
    assert b.prefix_ids.tolist() == [[5, 6], [0, 8]] and b.prefix_mask.tolist() == [[1, 1], [0, 1]]
    assert b.prefix_positions.tolist() == [[0, 1], [0, 0]]
    assert b.prefix_index.tolist() == [0, 1, 0]
    # [last prompt token | response | right pad], positions continuing the prefix
    assert b.input_ids.tolist() == [[7, 1, 0], [9, 2, 3], [7, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert b.position_ids.tolist() == [[2, 3, 4], [1, 2, 3], [2, 3, 4]]
    assert b.response_mask.tolist() == [[1, 0], [1, 1], [0, 0]]
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        make_shared_prefix_batch([[5]], [[1]], pad_id=0)


@pytest.mark.parametrize("attn,temperature", [("sdpa", 1.0), ("eager", 0.7)])
def test_shared_prefix_logprobs_and_gradients_equal_the_plain_forward(tok, attn, temperature):
    model = build_policy(dataclasses.replace(model_preset("nano"), attn_implementation=attn), tok, seed=1)
    prompts, responses = grouped_rows(seed=3, tasks=4, group=3)
    weights = torch.randn(len(prompts), 10)

    def run(fn, batch):
        model.zero_grad(set_to_none=True)
        logp, entropy = fn(model, batch, temperature=temperature, with_entropy=True)
        width = logp.shape[1]
        ((logp + 0.1 * entropy) * weights[:, :width]).sum().backward()
        return logp.detach(), entropy.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    plain = run(batch_logprobs, make_batch(prompts, responses, tok.pad_token_id))
    shared = run(shared_prefix_logprobs, make_shared_prefix_batch(prompts, responses, tok.pad_token_id))
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
    assert max(float(g.abs().max()) for g in plain[2].values()) > 1e-3  # a real gradient
    for k, g in plain[2].items():
        torch.testing.assert_close(shared[2][k], g, atol=1e-5, rtol=1e-4, msg=k)


# ============================================================================== the worker update
def _update(checkpoint, batch, mode, aggregation, mini_batches, kl_coef, micro_batch_size, monkeypatch):
    """Gradients of every optimizer step (the step itself is replaced by a recorder, so every mini-batch
    starts from the same weights in both runs), the metrics, and how often the shared layout ran."""
    spec = WorkerSpec("wg", ModelConfig(preset="nano", path=checkpoint),
                      OptimConfig(lr=1e-3, micro_batch_size=micro_batch_size, mini_batches=mini_batches),
                      AlgoConfig(aggregation=aggregation, kl_coef=kl_coef, entropy_coef=0.01, shared_prefix=mode),
                      seed=0)
    worker = PolicyWorker(spec)
    grads: list[dict[str, torch.Tensor]] = []
    worker.optimizer.step = lambda: grads.append({k: p.grad.clone() for k, p in worker.model.named_parameters()})
    calls = []
    real = policy_module.shared_prefix_logprobs
    monkeypatch.setattr(policy_module, "shared_prefix_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    metrics = worker.update(batch, step_seed=5)
    monkeypatch.setattr(policy_module, "shared_prefix_logprobs", real)
    return grads, metrics, len(calls)


def _batch(agents: list[str], seed: int) -> UpdateBatch:
    prompts, responses = grouped_rows(seed, tasks=5, group=4)
    n = len(prompts)
    rng = np.random.default_rng(seed)
    agent = np.array([agents[i % len(agents)] for i in range(n)])
    temperature = np.where(agent == agents[0], 1.0, 0.7)
    return UpdateBatch(prompts, responses, rng.normal(size=n).astype(np.float32), agent, temperature)


@pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")
@pytest.mark.parametrize("aggregation,agents,mini_batches,kl_coef,micro_batch_size", [
    ("token_mean", ["solver", "verifier"], 1, 0.0, 64),        # LLM sharing: two agents on one model
    ("seq_mean_token_mean", ["solver"], 2, 0.1, 64),           # non-sharing; old-log-prob and reference passes
    ("seq_mean_token_mean", ["solver", "verifier"], 2, 0.1, 5),  # prompt groups cut across micro-batches
])
def test_update_with_shared_prompts_equals_the_plain_update(checkpoint, monkeypatch, aggregation, agents,
                                                            mini_batches, kl_coef, micro_batch_size):
    batch = _batch(agents, seed=len(agents) + mini_batches)
    args = (aggregation, mini_batches, kl_coef, micro_batch_size, monkeypatch)
    plain, m_plain, plain_calls = _update(checkpoint, batch, "off", *args)
    shared, m_shared, shared_calls = _update(checkpoint, batch, "on", *args)
    assert plain_calls == 0 and shared_calls > 0
    assert len(plain) == len(shared) == mini_batches
    for g_plain, g_shared in zip(plain, shared):
        assert max(float(g.abs().max()) for g in g_plain.values()) > 1e-4  # a real gradient
        for k in g_plain:
            torch.testing.assert_close(g_shared[k], g_plain[k], atol=1e-5, rtol=1e-4, msg=k)
    keys = ["loss", "grad_norm", "clip_frac", "entropy", "approx_kl_old"] + [f"agent_grad_norm/{a}" for a in agents]
    assert set(keys) <= set(m_plain)
    for key in keys:
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-5, abs=1e-7), key


@pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")
def test_auto_shares_repeated_prompts_only(checkpoint, monkeypatch):
    repeated = _batch(["solver"], seed=1)
    _, _, calls = _update(checkpoint, repeated, "auto", "token_mean", 1, 0.0, 64, monkeypatch)
    assert calls == 1
    prompts, responses = grouped_rows(seed=2, tasks=0, group=1, singletons=12)  # every prompt once
    distinct = UpdateBatch(prompts, responses, np.ones(12, np.float32), np.array(["solver"] * 12), np.ones(12))
    _, _, calls = _update(checkpoint, distinct, "auto", "token_mean", 1, 0.0, 64, monkeypatch)
    assert calls == 0


# ================================================================================ generation prefill
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0, max_new_tokens=8),
                                      SamplingParams(temperature=1.0, max_new_tokens=8)])
def test_generation_from_a_shared_prompt_cache_equals_the_plain_prefill(tok, monkeypatch, sampling):
    model = build_policy("nano", tok, seed=4)
    prompts = [f"question {i} answer" for i in (3, 41, 3, 7, 41, 3)] + ["question 5 answer"] * 4
    prefills = []
    real = hf_module.prefix_cache
    monkeypatch.setattr(hf_module, "prefix_cache", lambda *a, **k: prefills.append(a[1].shape[0]) or real(*a, **k))
    out = {mode: HFRolloutEngine(model, tok, shared_prefix=mode, max_batch_size=7).generate(prompts, sampling, seed=11)
           for mode in ("off", "on")}
    # one prefill per chunk (7 + 3 rows), of its distinct prompts only (4 distinct prompts in all)
    assert len(prefills) == 2 and sum(prefills) <= 5
    assert out["on"].response_ids == out["off"].response_ids
    assert sum(len(r) for r in out["off"].response_ids) > len(prompts)  # real responses
