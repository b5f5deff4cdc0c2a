"""Rollout with HuggingFace ``generate`` (the CPU default; works on GPU too).

The engine generates on the device of its model; prompts are packed there directly, and ``precision``
(``train.precision``) sets the autocast of the forward passes (``fp32``: none).

Prompts are tokenized without special tokens, left-truncated to ``max_prompt_tokens``, sorted by length
and generated in chunks of ``max_batch_size`` with left padding and the KV cache. Generation stops at
the tokenizer's EOS or any EOS id of the model's generation config; those ids and the padding after
them are stripped from ``response_ids``.

Shared prompts (``shared_prefix``: ``algo.shared_prefix`` of the worker that owns the engine): when
rows of a chunk repeat a prompt (the G trajectories of a task group), each distinct prompt but its last
token is prefilled once and its KV cache gathered for every row that holds it; ``generate`` then starts
from that cache (:func:`drmas.models.logprobs.prefix_cache`). ``auto`` does so where the prefill's
padded token count falls to ``PREFIX_SHARING_PAYS`` of the plain one or less. The logits are the plain
prefill's up to float rounding (tests/test_shared_prefix.py compares the generated ids).

Only temperature, top-p and top-k shape the sampling distribution: every other logits processor a
checkpoint's ``generation_config.json`` may switch on (repetition penalty, min-p, ...) is turned off,
because PPO scores the responses with the plain tempered softmax (:func:`drmas.models.response_logprobs`).
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from drmas.devices import autocast, check_precision
from drmas.models.logprobs import cache_argument, pad_rows, prefix_cache, shared_prompt_groups
from drmas.rollout.base import (Generation, RolloutEngine, SamplingParams, register_engine, render_prompts,
                                stop_positions)

logger = logging.getLogger(__name__)

# generate() fills every option it is not given from the model's generation_config; where a checkpoint
# switches one of these on, it is passed back at its "off" value.
NEUTRAL_GENERATION_OPTIONS = dict(
    num_beams=1, num_return_sequences=1, repetition_penalty=1.0, no_repeat_ngram_size=0, min_p=0.0,
    typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, min_new_tokens=0, min_length=0,
)


@register_engine("hf")
class HFRolloutEngine(RolloutEngine):
    """``RolloutEngine`` over a transformers causal LM held in this process."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_size: int = 256,
        max_prompt_tokens: int | None = None,
        precision: str = "fp32",
        chat_template: bool = False,
        chat_template_kwargs: dict | None = None,
        shared_prefix: str = "off",
    ) -> None:
        if shared_prefix not in ("auto", "on", "off"):
            raise ValueError(f"shared_prefix={shared_prefix!r}; use auto, on or off")
        self.shared_prefix = shared_prefix
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens={max_prompt_tokens} must be >= 1 or None (no limit)")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.precision = check_precision(precision)
        self.chat_template, self.chat_template_kwargs = chat_template, dict(chat_template_kwargs or {})
        self.num_truncated_prompts = 0  # prompts left-truncated so far (all calls)
        eos = {tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)} - {None}
        if not eos:
            raise ValueError("neither the tokenizer nor the model's generation_config defines an EOS token id")
        self.stop_ids = sorted(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        if state_dict is not None:
            self.model.load_state_dict(state_dict)

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        prompt_ids = self._tokenize(prompts)
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # less padding per chunk
        response_ids: list[list[int] | None] = [None] * len(prompt_ids)
        truncated: list[bool] = [False] * len(prompt_ids)
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with _seeded(seed, device), torch.inference_mode(), autocast(device, self.precision):
                for start in range(0, len(order), self.max_batch_size):
                    rows = order[start:start + self.max_batch_size]
                    chunk_ids, chunk_cut = self._generate_chunk([prompt_ids[i] for i in rows], sampling, device)
                    for i, ids, cut in zip(rows, chunk_ids, chunk_cut):
                        response_ids[i], truncated[i] = ids, cut
        finally:
            self.model.train(was_training)
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        return Generation(prompt_ids=prompt_ids, response_ids=response_ids, texts=texts, truncated=truncated)

    def _tokenize(self, prompts: list[str]) -> list[list[int]]:
        texts = render_prompts(self.tokenizer, prompts, self.chat_template, self.chat_template_kwargs)
        prompt_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if prompts else []
        if any(len(ids) == 0 for ids in prompt_ids):
            raise ValueError("an empty prompt was passed; every prompt needs at least one token")
        limit = self.max_prompt_tokens
        if limit is not None:
            too_long = sum(len(ids) > limit for ids in prompt_ids)
            if too_long:
                self.num_truncated_prompts += too_long
                logger.warning("left-truncated %d of %d prompts to max_prompt_tokens=%d (%d so far)",
                               too_long, len(prompt_ids), limit, self.num_truncated_prompts)
                prompt_ids = [ids[-limit:] for ids in prompt_ids]
        return prompt_ids

    def _generate_chunk(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, device: torch.device
    ) -> tuple[list[list[int]], list[bool]]:
        width = max(len(ids) for ids in prompt_ids)
        input_ids, attention_mask = pad_rows(prompt_ids, width, self.pad_id, left=True, device=device)
        cache = self._prompt_cache(prompt_ids, input_ids, attention_mask)
        out = self.model.generate(
            **({} if cache is None else {cache_argument(self.model): cache}),
            input_ids=input_ids,
            attention_mask=attention_mask,
            **(dict(do_sample=False) if sampling.greedy else dict(
                do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
            **self._neutral_overrides(),
        )
        new_tokens = out[:, width:]
        lengths, truncated = stop_positions(new_tokens, torch.tensor(self.stop_ids, device=device))
        return [row[:n] for row, n in zip(new_tokens.tolist(), lengths.tolist())], truncated.tolist()

    def _prompt_cache(self, prompt_ids: list[list[int]], input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The rows' KV cache of all prompt positions but the last, each distinct prompt prefilled once
        (module docstring), or None where ``shared_prefix`` does not ask for it."""
        groups = shared_prompt_groups(self.shared_prefix, prompt_ids, np.zeros(len(prompt_ids)))
        if groups is None:
            return None
        index, leaders = groups
        rows = torch.as_tensor(leaders, device=input_ids.device)
        return prefix_cache(self.model, input_ids[rows, :-1], attention_mask[rows, :-1],
                            torch.as_tensor(index, device=input_ids.device))

    def _neutral_overrides(self) -> dict:
        """The options of NEUTRAL_GENERATION_OPTIONS that the model's generation_config sets otherwise."""
        config = self.model.generation_config
        return {k: v for k, v in NEUTRAL_GENERATION_OPTIONS.items() if getattr(config, k, None) not in (None, v)}


def _as_list(ids: int | list[int] | None) -> list[int]:
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Seed torch's RNG (CPU and the model's accelerator) for the block, restoring it afterwards."""
    if seed is None:
        yield
        return
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
