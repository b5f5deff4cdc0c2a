"""Per-token log-probabilities (and entropies) of responses under a causal LM.

Layout (verl's): every row is ``[left pad | prompt | response | right pad]``; the prompts are
left-padded to a common width ``P`` and the responses right-padded to a common width ``R``, so the
response of every row starts at column ``P`` and

    logprobs[b, t] = log pi(input_ids[b, P + t] | input_ids[b, :P + t]) = log pi(response token t | prefix),

read from the logits at column ``P + t - 1``. ``response_mask`` [B, R] marks real response tokens;
``position_ids`` count real tokens only (``cumsum(attention_mask) - 1``), so a left-padded row is
scored exactly as the same row without padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from drmas.algos.loss import entropy_from_logits


@dataclass
class PackedBatch:
    """Prompt + response sequences in the layout of the module docstring (B rows, P + R columns)."""

    input_ids: torch.Tensor
    """int64 [B, P + R]: left pad, prompt, response, right pad (pads are ``pad_id``)."""
    attention_mask: torch.Tensor
    """int64 [B, P + R]: 1 on prompt and response tokens, 0 on pads."""
    position_ids: torch.Tensor
    """int64 [B, P + R]: position of each token among the real tokens of its row (0 on left pads)."""
    response_mask: torch.Tensor
    """float32 [B, R]: 1 where ``input_ids[:, P + t]`` is a response token."""
    prompt_lengths: torch.Tensor
    """int64 [B]: number of prompt tokens of each row."""
    response_lengths: torch.Tensor
    """int64 [B]: number of response tokens of each row."""

    @property
    def prompt_width(self) -> int:
        """P, the column where every response starts."""
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def pad_rows(rows: Sequence[Sequence[int]], width: int, pad_id: int, left: bool,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``rows`` into [len(rows), width] ids (padded with ``pad_id``) and the 0/1 mask of real tokens,
    both created on ``device``."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
    flat = torch.tensor([tok for r in rows for tok in r], dtype=torch.long, device=device)
    cols = torch.arange(width, device=device)
    mask = (cols >= width - lengths[:, None]) if left else (cols < lengths[:, None])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    ids[mask] = flat
    return ids, mask.long()


def make_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int,
               device: torch.device | str = "cpu") -> PackedBatch:
    """Pack token-id lists into a :class:`PackedBatch` (prompts left-padded, responses right-padded), its
    tensors created on ``device`` (the device of the model that scores them).

    A prompt must have at least one token (the first response token is predicted from it); a response
    may be empty (its row is all-masked).
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses; pass one response per prompt")
    if len(prompt_ids) == 0:
        raise ValueError("empty batch: pass at least one (prompt, response) pair")
    if min(len(p) for p in prompt_ids) == 0:
        raise ValueError("a prompt has no token; every prompt needs >= 1 token to predict the response from")
    prompt_width = max(len(p) for p in prompt_ids)
    response_width = max(1, max(len(r) for r in response_ids))
    prompts, prompt_mask = pad_rows(prompt_ids, prompt_width, pad_id, left=True, device=device)
    responses, response_mask = pad_rows(response_ids, response_width, pad_id, left=False, device=device)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return PackedBatch(
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        response_mask=response_mask.float(),
        prompt_lengths=prompt_mask.sum(1),
        response_lengths=response_mask.sum(1),
    )


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only: ``cumsum(mask) - 1``, 0 on left pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 8) -> torch.Tensor:
    """``log_softmax(logits, -1).gather(-1, index[..., None])[..., 0]`` computed as
    ``logit[index] - logsumexp(logits)``, ``chunk_rows`` rows at a time, so no second [B, T, V] tensor
    is materialized."""
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1).float()
    lse = torch.cat([torch.logsumexp(chunk.float(), dim=-1) for chunk in logits.split(chunk_rows)])
    return picked - lse


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token t | prefix) for the layout of the module docstring: ``[B, R]`` float32,
    0 where ``response_mask`` is 0, plus the per-token entropy (same shape) when ``with_entropy``.

    Logits are divided by ``temperature`` before the softmax: PPO's old and new log-probs must be those
    of the sampling distribution. Only the R + 1 last logit columns are computed (``logits_to_keep``).
    Gradients flow when called outside ``torch.no_grad``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature}: log-probs need temperature > 0 (greedy decoding, "
                         f"temperature 0, has no sampling distribution; score such responses at 1.0)")
    response_width = response_mask.shape[1]
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        logits_to_keep=response_width + 1, use_cache=False,
    ).logits[:, :-1]  # column P + t - 1 predicts response token t
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -response_width:]
    mask = response_mask.to(torch.float32)
    logprobs = selective_log_softmax(logits, targets) * mask
    entropy = None
    if with_entropy:
        entropy = torch.cat([entropy_from_logits(chunk) for chunk in logits.split(8)]) * mask
    return logprobs, entropy


def batch_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` of a :class:`PackedBatch` (uses its position ids)."""
    return response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                             temperature=temperature, with_entropy=with_entropy, position_ids=batch.position_ids)
