"""Rollout throughput on CPU: HF ``generate`` tokens/s (and log-prob scoring tokens/s) for a preset.

    python -m drmas.rollout.bench                     # tiny preset, batch 128, 64 new tokens
    python -m drmas.rollout.bench --preset nano --threads 2

A measurement, not a test: a random-init policy samples at temperature 1 (it rarely emits EOS, so
nearly every response is ``max_new_tokens`` long).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass

import torch

from drmas.models import build_policy, make_batch, model_preset, response_logprobs, train_bytelevel_bpe
from drmas.rollout import HFRolloutEngine, SamplingParams


@dataclass
class BenchArgs:
    """Benchmark settings."""

    preset: str = "tiny"
    """Model preset (drmas.models.MODEL_PRESETS)."""
    batch: int = 128
    """Prompts per generate call."""
    max_new_tokens: int = 64
    """Response length."""
    prompt_words: int = 12
    """Words per synthetic prompt (about 2 tokens each)."""
    repeats: int = 3
    """Timed generate calls (after one warm-up call)."""
    threads: int = 1
    """torch intra-op threads (1 is best on 2 shared cores: more threads oversubscribe them)."""
    attn: str = "sdpa"
    """Attention implementation: sdpa or eager."""


def parse_args() -> BenchArgs:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(BenchArgs):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return BenchArgs(**vars(parser.parse_args()))


def main(args: BenchArgs) -> None:
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    words = ["solve", "the", "equation", "for", "x", "answer", "verify", "search", "step", "=", "+", "7", "42"]
    prompts = [" ".join(rng.choice(words) for _ in range(args.prompt_words)) for _ in range(args.batch)]
    tok = train_bytelevel_bpe(prompts * 4, vocab_size=512)
    cfg = dataclasses.replace(model_preset(args.preset), attn_implementation=args.attn)
    model = build_policy(cfg, tok, seed=0)
    engine = HFRolloutEngine(model, tok, max_batch_size=args.batch)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    engine.generate(prompts[:8], sampling, seed=0)  # warm-up

    generated, seconds = 0, 0.0
    for repeat in range(args.repeats):
        start = time.perf_counter()
        gen = engine.generate(prompts, sampling, seed=repeat)
        seconds += time.perf_counter() - start
        generated += sum(len(ids) for ids in gen.response_ids)
    prompt_tokens = sum(len(ids) for ids in gen.prompt_ids) / args.batch

    batch = make_batch(gen.prompt_ids, gen.response_ids, tok.pad_token_id)
    start = time.perf_counter()
    with torch.no_grad():
        response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    score_seconds = time.perf_counter() - start
    scored = int(batch.response_mask.sum())

    params = sum(p.numel() for p in model.parameters())
    print(f"preset={args.preset} ({params / 1e6:.2f} M params) attn={args.attn} threads={args.threads} "
          f"batch={args.batch} prompt~{prompt_tokens:.0f} tok, max_new_tokens={args.max_new_tokens}")
    print(f"generate: {generated / seconds:,.0f} new tokens/s ({seconds / args.repeats:.2f} s per batch)")
    print(f"score (response_logprobs, no grad): {scored / score_seconds:,.0f} response tokens/s")


if __name__ == "__main__":
    main(parse_args())
