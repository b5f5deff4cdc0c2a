"""Supervised fine-tuning on (prompt, target) pairs: the warm start of a tiny policy before RL.

The loss is the mean negative log-likelihood of the **target tokens only**, each target followed by
EOS (so the model learns to stop). Prompt and target are tokenized separately, exactly as a rollout
sees them (the prompt alone, then generated tokens), and packed with
:func:`drmas.models.logprobs.make_batch`, so SFT and the RL update score tokens with the same code.
Batches are length-bucketed: shuffled, sorted by length within pools of ``BUCKET_POOL`` batches, cut
into batches, and the batches shuffled.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from drmas.devices import autocast, check_precision
from drmas.models.logprobs import batch_logprobs, make_batch
from drmas.progress import Progress

logger = logging.getLogger(__name__)

BUCKET_POOL = 50  # batches sorted by length together (larger = less padding, less randomness)


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning run."""

    lr: float = 1e-3
    """Peak learning rate of AdamW (tiny models from scratch take 1e-3; real checkpoints ~1e-5)."""
    steps: int | None = 200
    """Optimizer steps; set exactly one of ``steps`` and ``epochs``."""
    epochs: float | None = None
    """Passes over the examples (fractions allowed); set exactly one of ``steps`` and ``epochs``."""
    batch_size: int = 64
    """Examples per optimizer step."""
    warmup_steps: int = 20
    """Linear warm-up from 0 to ``lr``."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warm-up, down to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    max_len: int = 512
    """Longest prompt + target (+ EOS) in tokens; longer examples lose prompt tokens on the left first."""
    seed: int = 0
    """Seed of the batch order (the run is deterministic given it)."""
    log_every: int = 50
    """Log the mean loss every this many steps."""
    precision: str = "fp32"
    """Forward-pass precision (:data:`drmas.devices.PRECISIONS`): ``fp32`` or ``bf16`` autocast; the model
    trains on the device it is on."""

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(f"set exactly one of steps ({self.steps}) and epochs ({self.epochs}); the other = None")
        if (self.steps is not None and self.steps < 1) or (self.epochs is not None and not self.epochs > 0):
            raise ValueError(f"steps must be >= 1 / epochs > 0, got steps={self.steps}, epochs={self.epochs}")
        if self.lr <= 0 or self.batch_size < 1 or self.max_len < 2 or self.log_every < 1:
            raise ValueError(f"need lr > 0, batch_size >= 1, max_len >= 2, log_every >= 1; got lr={self.lr}, "
                             f"batch_size={self.batch_size}, max_len={self.max_len}, log_every={self.log_every}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need warmup_steps, weight_decay, grad_clip >= 0 and min_lr_ratio in [0, 1]; got "
                             f"{self.warmup_steps}, {self.weight_decay}, {self.grad_clip}, {self.min_lr_ratio}")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"schedule={self.schedule!r}; use 'cosine', 'linear' or 'constant'")
        check_precision(self.precision)


def lr_factor(step: int, total: int, cfg: SFTConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based) of ``total``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay


def tokenize_examples(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[tuple[str, str]], max_len: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt ids and target ids (+ EOS) of each example, cut to ``max_len`` tokens in all (prompt
    tokens go first, from the left; a prompt keeps >= 1 token; then the target's tail)."""
    prompts = tokenizer([p for p, _ in examples], add_special_tokens=False)["input_ids"]
    targets = [ids + [tokenizer.eos_token_id] for ids in tokenizer([t for _, t in examples], add_special_tokens=False)["input_ids"]]
    cut = 0
    for i, (p, t) in enumerate(zip(prompts, targets)):
        if len(p) + len(t) > max_len:
            cut += 1
            keep_prompt = max(1, max_len - len(t))
            prompts[i], targets[i] = p[-keep_prompt:], t[:max_len - keep_prompt]
    if cut:
        logger.warning("cut %d of %d SFT examples to max_len=%d tokens", cut, len(examples), max_len)
    return prompts, targets


def length_bucketed_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of index batches, each of examples of similar length, in random order."""
    order = rng.permutation(len(lengths))
    pool = batch_size * BUCKET_POOL
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def sft_train(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, str]],
    cfg: SFTConfig,
    progress: bool = True,
    desc: str = "sft",
    bar: bool | None = None,
) -> dict:
    """Train ``model`` in place on the target tokens of ``examples``; ``progress``, ``desc`` and ``bar`` are
    those of its :class:`drmas.progress.Progress` (``bar=False``: timed log lines even on a terminal, as in a
    worker process of a parallel warm-up). Returns the run's metrics:
    ``loss`` (mean over the last ``log_every`` steps), ``first_loss``, ``steps``, ``target_tokens``,
    ``seconds``, ``tokens_per_s`` (target tokens per second)."""
    if not examples:
        raise ValueError("no SFT examples")
    prompts, targets = tokenize_examples(tokenizer, examples, cfg.max_len)
    lengths = np.array([len(p) + len(t) for p, t in zip(prompts, targets)])
    batches_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = cfg.steps if cfg.steps is not None else max(1, round(cfg.epochs * batches_per_epoch))
    rng = np.random.default_rng(cfg.seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, cfg))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    model.train()
    losses: list[float] = []
    tokens = 0
    batches: list[np.ndarray] = []
    bar = Progress(total, desc, enabled=progress, bar=bar, log=logger)
    start = time.perf_counter()
    for step in range(total):
        if not batches:
            batches = length_bucketed_batches(lengths, cfg.batch_size, rng)
        rows = batches.pop()
        batch = make_batch([prompts[i] for i in rows], [targets[i] for i in rows], pad_id, device=device)
        with autocast(device, cfg.precision):
            logprobs, _ = batch_logprobs(model, batch)
        n_tokens = batch.response_mask.sum()
        loss = -logprobs.sum() / n_tokens
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        tokens += int(n_tokens)
        if (step + 1) % cfg.log_every == 0 or step + 1 == total:
            recent = float(np.mean(losses[-cfg.log_every:]))
            bar.set_postfix(loss=f"{recent:.4f}")
            logger.info("sft step %d/%d loss %.4f lr %.2e", step + 1, total, recent, scheduler.get_last_lr()[0])
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    return {
        "loss": float(np.mean(losses[-cfg.log_every:])),
        "first_loss": losses[0],
        "steps": total,
        "target_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }
