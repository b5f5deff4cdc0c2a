"""The fused decode loop (``rollout.engine=fast``) against the HF ``generate`` engine it replaces: the same tokens
row for row, greedy and sampled under the same generator, for tied and untied models, batch sizes 1 to 64, prompts
of different lengths, shared prompts, several stop ids, top-k / top-p; and the fallback to the HF loop."""
from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter

import pytest
import torch

from drmas.models import build_policy, model_preset, train_bytelevel_bpe
from drmas.rollout import ENGINES, FastRolloutEngine, SamplingParams, make_engine
from drmas.rollout.fast import FusedQwen2, process_logits, unsupported_reason


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


WORDS = ["step", "x", "=", "3", "solve", "for", "the", "answer", "is", "42", "verify", "yes", "no"]


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    return train_bytelevel_bpe([" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)], vocab_size=300)


def _model(tok, tied: bool, seed: int = 0, stop_words: int = 2):
    """A random nano policy whose generation config adds its ``stop_words`` most frequent sampled tokens to EOS, so
    that rows stop at different steps (a random policy alone almost never samples EOS)."""
    cfg = dataclasses.replace(model_preset("nano"), tie_word_embeddings=tied)
    model = build_policy(cfg, tok, seed=seed).eval()
    probe = make_engine("hf", model=model, tokenizer=tok).generate(
        _prompts(8, 1, seed=seed), SamplingParams(temperature=1.0, max_new_tokens=16), seed=0)
    counts = Counter(t for ids in probe.response_ids for t in ids)
    model.generation_config.eos_token_id = [tok.eos_token_id, *[t for t, _ in counts.most_common(stop_words)]]
    return model


def _prompts(n: int, shared: int, seed: int) -> list[str]:
    """``n`` prompts of 1 to 40 words; each distinct prompt repeated ``shared`` times (a task group)."""
    rng = random.Random(seed)
    distinct = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(-(-n // shared))]
    return [p for p in distinct for _ in range(shared)][:n]


def _both(tok, model, prompts, sampling, seed=7, **kw):
    hf = make_engine("hf", model=model, tokenizer=tok, **kw).generate(prompts, sampling, seed=seed)
    fast = make_engine("fast", model=model, tokenizer=tok, **kw).generate(prompts, sampling, seed=seed)
    return hf, fast


def test_registered_and_default():
    from drmas.config.schema import RolloutEngineConfig

    assert ENGINES["fast"] is FastRolloutEngine
    assert RolloutEngineConfig().engine == "fast"


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("batch,shared", [(1, 1), (5, 1), (16, 16), (64, 8), (64, 1)])
@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0, max_new_tokens=24),
    SamplingParams(temperature=0.6, max_new_tokens=24),
    SamplingParams(temperature=1.0, top_k=20, top_p=0.9, max_new_tokens=24),
], ids=["greedy", "T0.6", "topk-topp"])
def test_same_tokens_as_hf(tok, tied, batch, shared, sampling):
    model = _model(tok, tied, seed=batch)
    prompts = _prompts(batch, shared, seed=batch + shared)
    for shared_prefix in (["off", "on"] if shared > 1 else ["off"]):
        hf, fast = _both(tok, model, prompts, sampling, shared_prefix=shared_prefix, max_batch_size=32)
        assert fast.response_ids == hf.response_ids, shared_prefix
        assert fast.truncated == hf.truncated and fast.texts == hf.texts and fast.prompt_ids == hf.prompt_ids


def test_rows_stopping_at_different_steps(tok):
    model = _model(tok, tied=False, seed=5, stop_words=3)
    hf, fast = _both(tok, model, _prompts(64, 1, seed=4), SamplingParams(temperature=1.0, max_new_tokens=24))
    assert fast.response_ids == hf.response_ids and fast.truncated == hf.truncated
    lengths = [len(r) for r in hf.response_ids]
    assert len(set(lengths)) > 3 and 0 < sum(hf.truncated) < 64, "stopping at stop ids is exercised"


def test_stops_like_hf_when_every_row_finishes_early(tok):
    """All rows stop long before max_new_tokens: both loops end at the same step."""
    model = _model(tok, tied=True, seed=3, stop_words=12)
    prompts = _prompts(12, 3, seed=1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=200)
    hf, fast = _both(tok, model, prompts, sampling)
    assert fast.response_ids == hf.response_ids
    assert max(len(r) for r in hf.response_ids) < 200 and not any(hf.truncated)


def test_reads_the_live_weights(tok):
    """The engine fuses the module's current weights at each call: an update (here: new weights loaded in place)
    changes its samples exactly as it changes HF's."""
    model = _model(tok, tied=True, seed=0)
    prompts = _prompts(8, 1, seed=2)
    sampling = SamplingParams(temperature=0, max_new_tokens=16)
    fast = make_engine("fast", model=model, tokenizer=tok)
    before = fast.generate(prompts, sampling).response_ids
    fast.load_weights(_model(tok, tied=True, seed=99).state_dict())
    after = fast.generate(prompts, sampling).response_ids
    assert after != before
    assert after == make_engine("hf", model=model, tokenizer=tok).generate(prompts, sampling).response_ids


def test_fused_step_logits_equal_the_model(tok):
    """One fused decode step against the transformers forward of the same sequence (float32 rounding)."""
    model = _model(tok, tied=False, seed=1)
    ids = torch.tensor([tok("solve for x = 3")["input_ids"]])
    full = model(input_ids=ids).logits[0, -1]
    out = model(input_ids=ids[:, :-1], use_cache=True)
    fused = FusedQwen2(model)
    total = ids.shape[1] + 4
    keys, values = [], []
    for layer in out.past_key_values.layers:
        k = layer.keys.new_zeros(1, layer.keys.shape[1], total, layer.keys.shape[3]); k[:, :, :ids.shape[1] - 1] = layer.keys
        v = torch.zeros_like(k); v[:, :, :ids.shape[1] - 1] = layer.values
        keys.append(k); values.append(v)
    column = ids.shape[1] - 1
    rope = fused.rope_table(total)[torch.tensor([column])]
    logits = fused.step(ids[:, -1], rope, keys, values, torch.zeros(1, 1, 1, total), column)[0]
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_process_logits_equals_transformers_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    sampling = SamplingParams(temperature=0.7, top_k=12, top_p=0.8)
    expected = scores
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(12), TopPLogitsWarper(0.8)):
        expected = warper(None, expected)
    assert torch.equal(process_logits(scores, sampling), expected)


def test_falls_back_to_hf_and_says_so_once(tok, caplog):
    model = _model(tok, tied=True)
    assert unsupported_reason(model, "fp32") is None
    assert "precision" in unsupported_reason(model, "bf16")
    engine = make_engine("fast", model=model, tokenizer=tok)
    engine.precision = "bf16"  # what a bf16 run asks for; the fused loop runs float32 only
    sampling = SamplingParams(temperature=0, max_new_tokens=4)
    with caplog.at_level(logging.WARNING, logger="drmas.rollout.fast"):
        engine.generate(_prompts(3, 1, seed=0), sampling)
        engine.generate(_prompts(3, 1, seed=1), sampling)
    notes = [r for r in caplog.records if "generating with the hf loop" in r.getMessage()]
    assert len(notes) == 1 and "bf16" in notes[0].getMessage()


def test_engine_is_not_part_of_a_runs_identity():
    """A run made with ``hf`` (every committed grid) is the same run under the ``fast`` default, for ``drmas train``
    and for the grid runner alike (both decide with drmas/config/identity.py)."""
    from drmas.config import load_config
    from drmas.config.identity import config_changes, config_hash

    config = "experiments/configs/cpu/math_base.yaml"
    fast = load_config(config, [])
    hf = load_config(config, [f"models.{m}.rollout.engine=hf" for m in fast.models])
    assert {m.rollout.engine for m in fast.models.values()} == {"fast"}
    assert config_changes(hf, fast) == [] and config_hash(hf) == config_hash(fast)
    other = load_config(config, ["algo.estimator=trajectory_grpo"])
    assert config_changes(fast, other) != []
