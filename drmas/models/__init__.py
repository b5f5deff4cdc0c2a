"""Tiny Qwen2-architecture policies for CPU runs (and the same code path for real checkpoints).

- :mod:`~drmas.models.tokenizer`: byte-level BPE trained locally, Qwen2 special tokens, exact save/load;
- :mod:`~drmas.models.factory`: model presets, ``build_policy``, ``save_policy`` / ``load_policy``;
- :mod:`~drmas.models.logprobs`: prompt+response packing and per-token log-probs / entropies;
- :mod:`~drmas.models.sft`: supervised warm start on (prompt, target) pairs.
"""
from drmas.models.factory import (
    MODEL_PRESETS,
    TinyModelConfig,
    build_policy,
    count_parameters,
    load_policy,
    model_preset,
    save_policy,
)
from drmas.models.logprobs import PackedBatch, batch_logprobs, make_batch, response_logprobs, selective_log_softmax
from drmas.models.sft import SFTConfig, sft_train
from drmas.models.tokenizer import load_tokenizer, save_tokenizer, train_bytelevel_bpe

__all__ = [
    "MODEL_PRESETS", "TinyModelConfig", "build_policy", "count_parameters", "load_policy", "model_preset",
    "save_policy", "PackedBatch", "batch_logprobs", "make_batch", "response_logprobs", "selective_log_softmax",
    "SFTConfig", "sft_train", "load_tokenizer", "save_tokenizer", "train_bytelevel_bpe",
]
