"""Model presets, parameter counts, and save/load round trips."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import Qwen2ForCausalLM

from drmas.models import (
    MODEL_PRESETS,
    TinyModelConfig,
    build_policy,
    count_parameters,
    load_policy,
    model_preset,
    save_policy,
    train_bytelevel_bpe,
)
from drmas.models.tokenizer import MARKER_FILE


@pytest.fixture(scope="module")
def tok():
    return train_bytelevel_bpe([f"value {i} is {i * 3}; the end." for i in range(200)], vocab_size=300)


# parameters at a 512-token vocabulary (tied embeddings):
#   per layer = attention (h*h q + 2 * h*h_kv k,v + h*h o + biases h + 2 h_kv) + SwiGLU 3*h*ffn + 2 norms * h
#   nano:  h=64,  h_kv=32,  ffn=256: 4 * (12288 + 128 + 49152 + 128) + 512*64 (emb) + 64 (final norm) = 279,616
#   base:  h=384, h_kv=128, ffn=1024: 8 * (147840 + 2 * 49280 + 147456 + 1179648 + 768) + 512*384 + 384 = 12,791,168
#   medium: h=512, h_kv=256, ffn=1536: 12 * (262656 + 2 * 131328 + 262144 + 2359296 + 1024) + 512*512 + 512
#           = 38,035,968  (the GPU presets, 10-50 M)
@pytest.mark.parametrize("name,expected", [("nano", 279_616), ("tiny", 1_051_264), ("small", 3_676_416),
                                           ("base", 12_791_168), ("medium", 38_035_968)])
def test_preset_parameter_counts(tok, name, expected):
    cfg = dataclasses.replace(model_preset(name), vocab_size=512)
    model = build_policy(cfg, tok, seed=0)
    assert isinstance(model, Qwen2ForCausalLM)
    assert count_parameters(model) == expected
    assert model.dtype == torch.float32 and model.training
    assert model.config.vocab_size == 512 and model.config.eos_token_id == tok.eos_token_id


def test_vocab_from_tokenizer_and_seed(tok):
    a, b, c = (build_policy("nano", tok, seed=s) for s in (0, 0, 1))
    assert a.config.vocab_size == len(tok)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_config_validation(tok):
    with pytest.raises(ValueError, match="not a multiple of num_heads"):
        TinyModelConfig(hidden_size=60, num_heads=8)
    with pytest.raises(ValueError, match="must divide num_heads"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="registered: \\['base', 'medium', 'nano', 'small', 'tiny'\\]"):
        model_preset("huge")
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_policy(TinyModelConfig(vocab_size=10), tok, seed=0)
    assert set(MODEL_PRESETS) == {"nano", "tiny", "small", "base", "medium"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_save_load_same_logits(tok, tmp_path, attn):
    model = build_policy(dataclasses.replace(model_preset("nano"), attn_implementation=attn), tok, seed=3)
    folder = save_policy(model, tok, tmp_path / "ckpt")
    assert (folder / "model.safetensors").is_file() and (folder / MARKER_FILE).is_file()
    loaded, loaded_tok = load_policy(folder, attn_implementation=attn)
    ids = torch.tensor([tok.encode("value 12 is 36; the end.")])
    model.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded_tok.encode("value 7") == tok.encode("value 7")


def test_save_is_atomic_replace(tok, tmp_path):
    first, second = build_policy("nano", tok, seed=0), build_policy("nano", tok, seed=1)
    save_policy(first, tok, tmp_path / "ckpt")
    save_policy(second, tok, tmp_path / "ckpt")  # replaces the folder
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary folder left behind
    loaded, _ = load_policy(tmp_path / "ckpt")
    assert torch.equal(loaded.lm_head.weight, second.lm_head.weight)


def test_load_folder_without_marker_uses_autotokenizer(tok, tmp_path):
    """A hub-format checkpoint (no drmas marker) loads its tokenizer with AutoTokenizer."""
    model = build_policy("nano", tok, seed=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(tmp_path)
    assert type(loaded_tok).__name__ == "Qwen2Tokenizer"
    assert loaded_tok.encode("value 12") == tok.encode("value 12")
