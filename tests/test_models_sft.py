"""SFT: config, schedule, batching, and a smoke test that the tokenizer -> model -> SFT -> generate path
learns (copy a 3-digit number); the trained model then checks EOS handling of the rollout engine."""
from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from drmas.models import SFTConfig, build_policy, sft_train, train_bytelevel_bpe
from drmas.models.sft import length_bucketed_batches, lr_factor, tokenize_examples
from drmas.rollout import HFRolloutEngine, SamplingParams


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls gain nothing from intra-op threads, and with other processes on the 2 cores two threads
    oversubscribe them: this SFT run took 153 s with 2 threads under load, 10 s with 1 (same losses)."""
    threads = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def copy_examples(n: int, rng: random.Random) -> list[tuple[str, str]]:
    numbers = ("".join(rng.choice("0123456789") for _ in range(3)) for _ in range(n))
    return [(f"copy {x} =", f" {x}") for x in numbers]


@pytest.fixture(scope="module")
def trained():
    """A nano policy trained on 2000 copy examples for 150 steps (~10 s on one core)."""
    rng = random.Random(0)
    train, test = copy_examples(2000, rng), copy_examples(200, rng)
    tok = train_bytelevel_bpe([p + t for p, t in train], vocab_size=512)
    model = build_policy("nano", tok, seed=0)
    start = time.perf_counter()
    metrics = sft_train(model, tok, train, SFTConfig(lr=3e-3, steps=150, batch_size=64, warmup_steps=10),
                        progress=False)
    return model, tok, test, metrics, time.perf_counter() - start


def test_config_validation():
    with pytest.raises(ValueError, match="exactly one of steps"):
        SFTConfig(steps=None, epochs=None)
    with pytest.raises(ValueError, match="exactly one of steps"):
        SFTConfig(steps=10, epochs=1.0)
    with pytest.raises(ValueError, match="lr=0"):
        SFTConfig(lr=0)
    with pytest.raises(ValueError, match="schedule='step'"):
        SFTConfig(schedule="step")


def test_lr_schedule_by_hand():
    cfg = SFTConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, 110, cfg) == pytest.approx(0.1)  # warm-up: (0 + 1) / 10
    assert lr_factor(9, 110, cfg) == pytest.approx(1.0)
    assert lr_factor(10, 110, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr_factor(60, 110, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(pi/2) = 0
    linear = SFTConfig(steps=110, warmup_steps=10, schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(85, 110, linear) == pytest.approx(0.25)  # 75 of 100 decay steps done


def test_length_buckets_cover_each_example_once():
    lengths = np.random.default_rng(0).integers(1, 50, size=1000)
    batches = length_bucketed_batches(lengths, batch_size=16, rng=np.random.default_rng(1))
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 5  # sorted within pools of 800: neighbours have similar lengths


def test_tokenize_examples_appends_eos_and_cuts(trained):
    _, tok, _, _, _ = trained
    # "copy 123 =" is 6 tokens (copy, space, 3 digits, " ="), " 123" + EOS is 5: 11 <= 12 stays whole
    prompts, targets = tokenize_examples(tok, [("copy 123 =", " 123"), ("copy 4567890 =", " 4567890")], max_len=12)
    assert prompts[0] == tok.encode("copy 123 =") and targets[0] == tok.encode(" 123") + [tok.eos_token_id]
    assert len(prompts[1]) + len(targets[1]) == 12 and targets[1][-1] == tok.eos_token_id  # prompt cut on the left


def test_sft_is_deterministic(trained):
    _, tok, test, _, _ = trained
    runs = [sft_train(build_policy("nano", tok, seed=1), tok, test, SFTConfig(steps=3, batch_size=16), progress=False)
            for _ in range(2)]
    assert runs[0]["loss"] == runs[1]["loss"] and runs[0]["first_loss"] == runs[1]["first_loss"]


def test_sft_smoke_learns_to_copy(trained):
    model, tok, test, metrics, seconds = trained
    engine = HFRolloutEngine(model, tok)
    gen = engine.generate([p for p, _ in test], SamplingParams(temperature=0, max_new_tokens=8))
    accuracy = np.mean([text == target for text, (_, target) in zip(gen.texts, test)])
    print(f"copy accuracy {accuracy:.3f}, final loss {metrics['loss']:.4f}, SFT {seconds:.1f} s, "
          f"{metrics['tokens_per_s']:.0f} target tokens/s")
    assert metrics["steps"] == 150 and metrics["loss"] < metrics["first_loss"] / 10
    assert accuracy >= 0.9


def test_engine_strips_eos_and_flags_truncation(trained):
    model, tok, test, _, _ = trained
    engine = HFRolloutEngine(model, tok, max_batch_size=16)
    prompts = [p for p, _ in test[:40]]
    full = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=8))
    stopped = [not cut for cut in full.truncated]
    assert sum(stopped) >= 36  # the trained model ends its answers with EOS
    for ids, cut in zip(full.response_ids, full.truncated):
        assert tok.eos_token_id not in ids
        assert cut == (len(ids) == 8)
    cut_short = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=2))
    assert all(cut_short.truncated) and all(len(ids) == 2 for ids in cut_short.response_ids)
    assert [ids[:2] for ids in full.response_ids] == cut_short.response_ids
    sampled = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8), seed=0)
    assert all(tok.eos_token_id not in ids for ids in sampled.response_ids)
