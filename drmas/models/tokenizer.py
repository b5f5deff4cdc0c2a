"""Byte-level BPE tokenizer trained locally, with Qwen2's special tokens and pre-tokenization.

The pipeline is Qwen2's, so that tiny CPU models see text the way the paper's Qwen models do:

- pre-tokenizer: Qwen2's regex split (every digit is its own pre-token, so numbers are spelled digit
  by digit, which arithmetic tasks need) followed by ``ByteLevel(add_prefix_space=False)``;
- model: BPE over the 256 byte symbols, no unknown token (every string is encodable);
- decoder: ``ByteLevel``;
- special tokens ``<|endoftext|>`` (end of sequence, also the padding token), ``<|im_start|>``,
  ``<|im_end|>``; no BOS, nothing is added around an encoded text.

Unlike Qwen2 there is **no NFC normalizer**: ``decode(encode(s)) == s`` holds exactly for every string
(Qwen2 maps e.g. ``"e\\u0301"`` to ``"\\u00e9"``).

Loading. :func:`load_tokenizer` builds ``PreTrainedTokenizerFast(tokenizer_file=...)`` and sets the
special tokens explicitly. Do not load our folders with ``AutoTokenizer``. What it does with
transformers 5.24 (recorded by ``tests/test_models_tokenizer.py::test_autotokenizer_on_saved_folder``):

- tokenizer files alone: a generic ``TokenizersBackend`` over the saved ``tokenizer.json``; same ids;
- tokenizer files beside a Qwen2 ``config.json`` (every policy folder ``save_policy`` writes): it
  resolves ``Qwen2Tokenizer``, which keeps only the vocabulary and merges and **rebuilds its own
  pipeline** (NFC normalizer, its own pre-tokenizer). Our pipeline is Qwen2's, so the ids agree on NFC
  text, but round trips of non-NFC text break; a tokenizer with any other pipeline (e.g. the plain GPT-2
  ``ByteLevel`` regex) is silently re-tokenized with Qwen2's pipeline: other ids for the same text.

:func:`drmas.models.factory.load_policy` therefore uses :func:`load_tokenizer` whenever a folder
carries :data:`MARKER_FILE`, and ``AutoTokenizer`` only for real (hub-format) checkpoints. ``drmas export``
(:mod:`drmas.trainer.export`), whose folders are read by ``AutoTokenizer`` and vLLM, writes such a model as the
equal Llama model, beside whose config ``AutoTokenizer`` reads ``tokenizer.json`` as written.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)
MARKER_FILE = "drmas_tokenizer.json"  # written by save_tokenizer; tells load_policy to use load_tokenizer
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1

# Qwen2's pre-tokenization regex (transformers/models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _wrap(**source) -> PreTrainedTokenizerFast:
    """The transformers view of a ``tokenizers`` pipeline (``tokenizer_object=`` or ``tokenizer_file=``),
    with our special tokens set explicitly."""
    return PreTrainedTokenizerFast(
        **source,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,  # the cleanup would drop the space in "a ." and break round trips
        padding_side="left",
        model_max_length=1_000_000,
    )


def train_bytelevel_bpe(
    texts: Iterable[str], vocab_size: int = 512, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (see the module docstring for the pipeline).

    ``vocab_size`` counts the 256 byte symbols and the 3 special tokens, so it must be >= 259; the
    result can be smaller when the corpus has fewer merges of frequency >= ``min_frequency``.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 bytes and {len(SPECIAL_TOKENS)} special "
                         f"tokens; use vocab_size >= {256 + len(SPECIAL_TOKENS)}")
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tok = _wrap(tokenizer_object=backend)
    logger.info("trained byte-level BPE tokenizer: %d tokens (asked for %d)", len(tok), vocab_size)
    return tok


def save_tokenizer(tok: PreTrainedTokenizerFast, folder: str | Path) -> None:
    """Write ``tokenizer.json`` (+ transformers' config files) and the drmas marker into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    marker = {"format": FORMAT_VERSION, "tokenizer_file": TOKENIZER_FILE, "special_tokens": list(SPECIAL_TOKENS),
              "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def is_drmas_tokenizer(tok: PreTrainedTokenizerBase) -> bool:
    """Whether ``tok`` has this module's pipeline and special tokens (i.e. :func:`load_tokenizer` can
    restore it exactly), as opposed to a real checkpoint's tokenizer."""
    backend = getattr(tok, "backend_tokenizer", None)
    return (backend is not None and backend.normalizer is None and tok.eos_token == EOS_TOKEN
            and tok.pad_token == EOS_TOKEN and set(SPECIAL_TOKENS) <= set(tok.all_special_tokens)
            and getattr(tok, "chat_template", None) is None)


def is_drmas_tokenizer_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer written by :func:`save_tokenizer`."""
    return (Path(folder) / MARKER_FILE).is_file()


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer written by :func:`save_tokenizer` (from its ``tokenizer.json``, not AutoTokenizer)."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {folder}; save one with drmas.models.save_tokenizer")
    return _wrap(tokenizer_file=str(path))
