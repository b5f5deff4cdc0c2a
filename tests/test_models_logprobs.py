"""Packing and per-token log-probs against a slow reference that scores each prefix separately."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from drmas.algos import entropy_from_logits
from drmas.models import (
    batch_logprobs,
    build_policy,
    make_batch,
    model_preset,
    response_logprobs,
    selective_log_softmax,
    train_bytelevel_bpe,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():  # tiny matmuls: intra-op threads only oversubscribe the shared cores (see test_models_sft.py)
    threads = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return train_bytelevel_bpe([f"step {i}: x = {i * 11}" for i in range(200)], vocab_size=300)


def reference_logprobs(model, prompts, responses, temperature):
    """log pi(r_t | p + r_<t) and its entropy, one unpadded forward per prefix (the slow definition)."""
    width = max(1, max(len(r) for r in responses))
    logprobs, entropy = torch.zeros(len(prompts), width), torch.zeros(len(prompts), width)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        for t, token in enumerate(response):
            logits = model(torch.tensor([prompt + response[:t]])).logits[0, -1] / temperature
            logprobs[i, t] = torch.log_softmax(logits, -1)[token]
            entropy[i, t] = entropy_from_logits(logits)
    return logprobs, entropy


def random_rows(rng, vocab, n, lo, hi):
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_make_batch_layout_by_hand():
    b = make_batch([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
    # P = 2, R = 3: [left pad | prompt | response | right pad]
    assert b.input_ids.tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 11]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3]]
    assert b.response_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert b.prompt_lengths.tolist() == [2, 1] and b.response_lengths.tolist() == [1, 3]
    assert b.prompt_width == 2
    with pytest.raises(ValueError, match="every prompt needs >= 1 token"):
        make_batch([[]], [[1]], pad_id=0)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        make_batch([[1], [2]], [[1]], pad_id=0)


@pytest.mark.parametrize("attn,batch_size,temperature", [("sdpa", 1, 1.0), ("sdpa", 5, 0.7), ("eager", 4, 1.3)])
def test_logprobs_match_reference(tok, attn, batch_size, temperature):
    model = build_policy(dataclasses.replace(model_preset("nano"), attn_implementation=attn), tok, seed=1).eval()
    rng = random.Random(batch_size)
    prompts = random_rows(rng, len(tok), batch_size, 1, 9)
    responses = random_rows(rng, len(tok), batch_size, 0, 7)
    responses[0] = responses[0] or [3]
    batch = make_batch(prompts, responses, tok.pad_token_id)
    with torch.no_grad():
        logprobs, entropy = batch_logprobs(model, batch, temperature=temperature, with_entropy=True)
        ref_logprobs, ref_entropy = reference_logprobs(model, prompts, responses, temperature)
    assert logprobs.shape == ref_logprobs.shape == batch.response_mask.shape
    torch.testing.assert_close(logprobs, ref_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    assert torch.all(logprobs[batch.response_mask == 0] == 0)


def test_default_positions_and_gradients(tok):
    model = build_policy("nano", tok, seed=2)
    batch = make_batch([[4, 5, 6], [7]], [[8, 9], [10]], tok.pad_token_id)
    logprobs, entropy = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    assert entropy is None
    torch.testing.assert_close(logprobs, batch_logprobs(model, batch)[0])  # positions derived from the mask
    logprobs.sum().backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="temperature > 0"):
        response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature=0.0)


def test_selective_log_softmax_equals_naive():
    logits = torch.randn(11, 5, 40)
    index = torch.randint(0, 40, (11, 5))
    naive = torch.log_softmax(logits, -1).gather(-1, index[..., None])[..., 0]
    torch.testing.assert_close(selective_log_softmax(logits, index, chunk_rows=3), naive)
