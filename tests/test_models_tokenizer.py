"""Byte-level BPE tokenizer: exact round trips, special tokens, save/load, and what AutoTokenizer does."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from drmas.models import build_policy, load_policy, load_tokenizer, save_policy, save_tokenizer, train_bytelevel_bpe
from drmas.models.tokenizer import EOS_TOKEN, IM_END, IM_START, MARKER_FILE, is_drmas_tokenizer

CORPUS = [
    f"Problem {i}: what is {i} + {i * 7 % 13}? Solution: the sum is \\boxed{{{i + i * 7 % 13}}}.\n"
    f"<verify>approve</verify> <search>who wrote book {i}</search> <answer>Jane Doe</answer>"
    for i in range(300)
]
TEXTS = [
    "hello  world",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "digits 0123456789 and 3.14159, -42",
    r"The answer is \boxed{12}. Also $\frac{a}{b} = \sqrt{2}$",
    "<verify>approve</verify>",
    "<think>hmm</think><search>q</search>",
    "<information>Doc 1: Paris is the capital.</information>",
    "unicode: café naïve 日本語 😀 e\u0301 Ω",
    "",
    " ",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def tok():
    return train_bytelevel_bpe(CORPUS, vocab_size=400)


def test_special_tokens(tok):
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == EOS_TOKEN
    assert tok.eos_token_id == tok.pad_token_id == 0
    assert tok.convert_tokens_to_ids([IM_START, IM_END]) == [1, 2]
    assert tok.encode(f"{IM_START}x{IM_END}") == [1, tok.convert_tokens_to_ids("x"), 2]
    assert tok("abc")["input_ids"] == tok.encode("abc")  # nothing added around a text
    assert 259 < len(tok) <= 400
    assert is_drmas_tokenizer(tok)


def test_digits_are_single_tokens(tok):
    assert tok.tokenize("12345") == list("12345")


@pytest.mark.parametrize("text", TEXTS)
def test_exact_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
def test_round_trip_arbitrary_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_save_load_identical_ids(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    assert (tmp_path / MARKER_FILE).is_file()
    loaded = load_tokenizer(tmp_path)
    for text in TEXTS:
        assert loaded.encode(text) == tok.encode(text)
        assert loaded.decode(loaded.encode(text)) == text
    assert (loaded.eos_token_id, loaded.pad_token_id, len(loaded)) == (tok.eos_token_id, tok.pad_token_id, len(tok))


def test_vocab_too_small():
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bytelevel_bpe(CORPUS, vocab_size=100)


def test_autotokenizer_on_saved_folder(tok, tmp_path):
    """Records what AutoTokenizer (transformers 5.x) does with our folders; see the tokenizer module docstring."""
    non_nfc = "e\u0301"  # 'e' + combining acute accent, which NFC folds into one code point
    # tokenizer files alone: a generic fast tokenizer over our tokenizer.json, same ids
    save_tokenizer(tok, tmp_path / "tok")
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert type(auto) is PreTrainedTokenizerFast
    assert auto.encode(non_nfc) == tok.encode(non_nfc)
    # beside a Qwen2 config.json (a policy folder): Qwen2Tokenizer, which rebuilds its own pipeline
    save_policy(build_policy("nano", tok, seed=0), tok, tmp_path / "policy")
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "policy"))
    assert type(auto).__name__ == "Qwen2Tokenizer"
    assert auto.backend_tokenizer.normalizer is not None  # NFC, which ours does not have
    assert auto.decode(auto.encode(non_nfc)) != non_nfc
    _, loaded = load_policy(tmp_path / "policy")  # goes through load_tokenizer: exact
    assert loaded.decode(loaded.encode(non_nfc)) == non_nfc
    assert all(loaded.encode(t) == tok.encode(t) for t in TEXTS)
