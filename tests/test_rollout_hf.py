"""Rollout interface and the HF generate engine (random nano policy; EOS behaviour with a trained one
is in test_models_sft.py)."""
from __future__ import annotations

import logging

import pytest
import torch

from drmas.models import build_policy, train_bytelevel_bpe
from drmas.rollout import ENGINES, Generation, HFRolloutEngine, SamplingParams, make_engine, stop_positions


@pytest.fixture(autouse=True, scope="module")
def one_thread():  # tiny matmuls: intra-op threads only oversubscribe the shared cores (see test_models_sft.py)
    threads = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PROMPTS = ["step 1: x =", "step 22", "x = 3", "step 404: x = 4444 and step 5", "s"]


@pytest.fixture(scope="module")
def tok():
    return train_bytelevel_bpe([f"step {i}: x = {i * 11}" for i in range(200)], vocab_size=300)


@pytest.fixture()
def engine(tok):
    return make_engine("hf", model=build_policy("nano", tok, seed=0), tokenizer=tok, max_batch_size=2)


def test_sampling_params_validation():
    assert SamplingParams(temperature=0).greedy
    for bad, match in [(dict(temperature=-0.1), "temperature=-0.1"), (dict(top_p=0.0), "top_p=0.0"),
                       (dict(top_k=-1), "top_k=-1"), (dict(max_new_tokens=0), "max_new_tokens=0")]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)


def test_registry(tok):
    assert ENGINES["hf"] is HFRolloutEngine
    with pytest.raises(ValueError, match=r"registered: \['fast', 'hf'"):
        make_engine("vllm-nope")


def test_stop_positions_by_hand():
    tokens = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0], [5, 2, 0, 9]])
    lengths, truncated = stop_positions(tokens, torch.tensor([0, 2]))
    assert lengths.tolist() == [2, 4, 0, 1]
    assert truncated.tolist() == [False, True, False, False]


def test_response_ids_with_eos():
    gen = Generation(prompt_ids=[[1], [1]], response_ids=[[4, 5], [6]], texts=["", ""], truncated=[False, True])
    assert gen.response_ids_with_eos(0) == [[4, 5, 0], [6]]


def test_seeded_sampling_is_deterministic(engine):
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=6)
    a, b = (engine.generate(PROMPTS, sampling, seed=7) for _ in range(2))
    c = engine.generate(PROMPTS, sampling, seed=8)
    assert a.response_ids == b.response_ids and a.texts == b.texts
    assert a.response_ids != c.response_ids
    assert all(len(r) <= 6 for r in a.response_ids)
    assert a.prompt_ids == [engine.tokenizer.encode(p) for p in PROMPTS]
    assert a.texts == engine.tokenizer.batch_decode(a.response_ids, skip_special_tokens=True)
    assert all(t == (len(r) == 6) for t, r in zip(a.truncated, a.response_ids))


def test_seed_does_not_touch_global_rng(engine):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=3), seed=123)
    assert torch.equal(torch.rand(3), expected)


def test_greedy_equals_manual_argmax_loop(engine):
    model, tokenizer = engine.model, engine.tokenizer
    model.train()
    gen = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=7))
    assert model.training  # restored
    expected = []
    with torch.no_grad():
        model.eval()
        for prompt in PROMPTS:
            ids, out = tokenizer.encode(prompt), []
            for _ in range(7):
                token = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
                if token == tokenizer.eos_token_id:
                    break
                out.append(token)
            expected.append(out)
    assert gen.response_ids == expected


def test_prompt_truncation_is_counted_and_logged(tok, caplog):
    engine = HFRolloutEngine(build_policy("nano", tok, seed=0), tok, max_prompt_tokens=4)
    with caplog.at_level(logging.WARNING, logger="drmas.rollout.hf"):
        gen = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=2))
    too_long = sum(len(tok.encode(p)) > 4 for p in PROMPTS)
    assert engine.num_truncated_prompts == too_long > 0
    assert f"left-truncated {too_long} of {len(PROMPTS)}" in caplog.text
    assert gen.prompt_ids == [tok.encode(p)[-4:] for p in PROMPTS]


def test_load_weights(tok, engine):
    before = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=4)).response_ids
    engine.load_weights(None)  # shared module: nothing changes
    assert engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=4)).response_ids == before
    other = build_policy("nano", tok, seed=5)
    engine.load_weights(other.state_dict())
    assert torch.equal(engine.model.lm_head.weight, other.lm_head.weight)
    assert engine.model.lm_head.weight.data_ptr() != other.lm_head.weight.data_ptr()  # a copy
