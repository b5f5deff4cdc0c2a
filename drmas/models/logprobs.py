"""Per-token log-probabilities (and entropies) of responses under a causal LM.

Layout (verl's): every row is ``[left pad | prompt | response | right pad]``; the prompts are
left-padded to a common width ``P`` and the responses right-padded to a common width ``R``, so the
response of every row starts at column ``P`` and

    logprobs[b, t] = log pi(input_ids[b, P + t] | input_ids[b, :P + t]) = log pi(response token t | prefix),

read from the logits at column ``P + t - 1``. ``response_mask`` [B, R] marks real response tokens;
``position_ids`` count real tokens only (``cumsum(attention_mask) - 1``), so a left-padded row is
scored exactly as the same row without padding.

Shared prompts (:class:`SharedPrefixBatch`, :func:`shared_prefix_logprobs`): rows whose prompts are
identical (the G trajectories of a task group start from one task prompt) run that prompt through the
model once. Each distinct prompt but its last token is a *prefix* row ``[left pad | prompt[:-1]]``
(forward with the KV cache kept in the autograd graph); every row then runs only
``[prompt[-1] | response | right pad]`` against its prefix's cached keys and values, gathered per row
(``index_select``, whose backward sums the rows' gradients into the shared prefix). Attention,
positions and logits are those of the plain layout, so log-probs and every gradient equal the plain
forward's to float rounding (tests/test_shared_prefix.py).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
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
    cache: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token t | prefix) for the layout of the module docstring: ``[B, R]`` float32,
    0 where ``response_mask`` is 0, plus the per-token entropy (same shape) when ``with_entropy``.

    Logits are divided by ``temperature`` before the softmax: PPO's old and new log-probs must be those
    of the sampling distribution. Only the R + 1 last logit columns are computed (``logits_to_keep``).
    Gradients flow when called outside ``torch.no_grad``. With ``cache`` (a transformers ``Cache`` of
    C earlier positions per row), ``input_ids`` continues those positions and ``attention_mask`` covers
    C + its width (:func:`shared_prefix_logprobs`).
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature}: log-probs need temperature > 0 (greedy decoding, "
                         f"temperature 0, has no sampling distribution; score such responses at 1.0)")
    response_width = response_mask.shape[1]
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    extra = {} if cache is None else {cache_argument(model): cache}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        logits_to_keep=response_width + 1, use_cache=False, **extra,
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


# ==================================================================================== shared prompts
PREFIX_SHARING_PAYS = 0.8
"""``algo.shared_prefix: auto`` shares prompts in a micro-batch when its estimated padded token count
(:func:`shared_prefix_tokens`) is at most this fraction of the plain layout's. Without repeated prompts
the shared layout processes B more tokens and runs two forwards instead of one, so it must save enough
tokens to pay for that (benchmarks/bench_update.py measures both paths)."""


def group_prompts(prompt_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows with identical prompts: ``(prefix_index [B], leaders [U])``, where ``leaders[u]`` is the first
    row holding distinct prompt ``u`` and ``prefix_index[i]`` the distinct prompt of row ``i``
    (``prompt_ids[leaders[prefix_index[i]]] == prompt_ids[i]``). Distinct prompts are numbered in
    lexicographic order of their right-padded ids (``torch.unique(dim=0)``)."""
    if len(prompt_ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # on the CPU whatever the default device (host-side bookkeeping); -1 is never a token
    ids, _ = pad_rows(prompt_ids, max(len(p) for p in prompt_ids), -1, left=False, device="cpu")
    _, inverse = torch.unique(ids, dim=0, return_inverse=True)
    rows = torch.arange(len(prompt_ids), device="cpu")
    first = torch.full((int(inverse.max()) + 1,), len(prompt_ids), device="cpu")
    leaders = first.scatter_reduce(0, inverse, rows, "amin")
    return inverse.numpy(), leaders.numpy()


def shared_prefix_tokens(prompt_lengths: np.ndarray, response_lengths: np.ndarray,
                         leaders: np.ndarray) -> tuple[int, int]:
    """Padded token positions one forward processes: ``(plain, shared)``.

    plain  = B (max prompt + max response), the :func:`make_batch` layout;
    shared = U (max prefix) + B (1 + max response), the :class:`SharedPrefixBatch` layout with U
    distinct prompts (``leaders``), each prefix one token shorter than its prompt."""
    b, r = len(prompt_lengths), max(1, int(np.max(response_lengths, initial=0)))
    plain = b * (int(np.max(prompt_lengths, initial=0)) + r)
    shared = len(leaders) * (int(np.max(prompt_lengths[leaders], initial=1)) - 1) + b * (1 + r)
    return plain, shared


def shared_prompt_groups(mode: str, prompt_ids: Sequence[Sequence[int]],
                         response_lengths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The prompt groups (:func:`group_prompts`) when rows run in the shared-prompt layout under
    ``algo.shared_prefix = mode``: ``on`` always (prompts of >= 2 tokens), ``auto`` when its padded token
    count (:func:`shared_prefix_tokens`) is at most :data:`PREFIX_SHARING_PAYS` of the plain layout's,
    ``off`` never; else None. The one rule for training forwards and generation prefills."""
    if mode == "off" or min(len(p) for p in prompt_ids) < 2:
        return None
    groups = group_prompts(prompt_ids)
    if mode == "auto":
        plain, shared = shared_prefix_tokens(np.array([len(p) for p in prompt_ids]), np.asarray(response_lengths),
                                             groups[1])
        if shared > PREFIX_SHARING_PAYS * plain:
            return None
    return groups


@dataclass
class SharedPrefixBatch:
    """Rows with shared prompts, in the layout of the module docstring's "Shared prompts" (U distinct
    prompts, B rows, prefix width L, response width R)."""

    prefix_ids: torch.Tensor
    """int64 [U, L]: left pad, the distinct prompt but its last token."""
    prefix_mask: torch.Tensor
    """int64 [U, L]: 1 on prefix tokens."""
    prefix_positions: torch.Tensor
    """int64 [U, L]: positions of the prefix tokens (0 on left pads)."""
    prefix_index: torch.Tensor
    """int64 [B]: the prefix row of each row."""
    input_ids: torch.Tensor
    """int64 [B, 1 + R]: the last prompt token, the response, right pad."""
    attention_mask: torch.Tensor
    """int64 [B, L + 1 + R]: the row's prefix mask followed by its own mask."""
    position_ids: torch.Tensor
    """int64 [B, 1 + R]: positions continuing the prefix (prompt length - 1, prompt length, ...)."""
    response_mask: torch.Tensor
    """float32 [B, R]: 1 where ``input_ids[:, 1 + t]`` is a response token."""


def make_shared_prefix_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int,
                             device: torch.device | str = "cpu",
                             groups: tuple[np.ndarray, np.ndarray] | None = None) -> SharedPrefixBatch:
    """Pack rows into a :class:`SharedPrefixBatch` on ``device``; ``groups`` is :func:`group_prompts`'s
    result when the caller has it already. Every prompt needs >= 2 tokens (the prefix is not empty)."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses; pass one response per prompt")
    if len(prompt_ids) == 0:
        raise ValueError("empty batch: pass at least one (prompt, response) pair")
    if min(len(p) for p in prompt_ids) < 2:
        raise ValueError("a prompt has fewer than 2 tokens; shared prompts need >= 2 (use make_batch for such rows)")
    prefix_index, leaders = groups if groups is not None else group_prompts(prompt_ids)
    prefixes = [prompt_ids[i][:-1] for i in leaders.tolist()]
    prefix_ids, prefix_mask = pad_rows(prefixes, max(len(p) for p in prefixes), pad_id, left=True, device=device)
    response_width = max(1, max(len(r) for r in response_ids))
    rows, row_mask = pad_rows([[p[-1], *r] for p, r in zip(prompt_ids, response_ids)], response_width + 1, pad_id,
                              left=False, device=device)
    index = torch.as_tensor(prefix_index, dtype=torch.long, device=device)
    return SharedPrefixBatch(
        prefix_ids=prefix_ids, prefix_mask=prefix_mask, prefix_positions=positions_from_mask(prefix_mask),
        prefix_index=index, input_ids=rows, attention_mask=torch.cat([prefix_mask[index], row_mask], dim=1),
        position_ids=prefix_mask.sum(1)[index, None] + torch.arange(response_width + 1, device=device),
        response_mask=row_mask[:, 1:].float(),
    )


def shared_prefix_logprobs(
    model: torch.nn.Module, batch: SharedPrefixBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` of the rows of a :class:`SharedPrefixBatch`: one forward of the U prefixes
    keeping their per-layer keys and values (in the autograd graph outside ``torch.no_grad``), the rows'
    caches gathered from them, then one forward of the B rows' ``[last prompt token | response]``
    against their cache. Equal to :func:`batch_logprobs` of the same rows (tested)."""
    rows_cache = prefix_cache(model, batch.prefix_ids, batch.prefix_mask, batch.prefix_index,
                              position_ids=batch.prefix_positions)
    return response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                             temperature=temperature, with_entropy=with_entropy, position_ids=batch.position_ids,
                             cache=rows_cache)


def prefix_cache(model: torch.nn.Module, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, index: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> Any:
    """The KV cache of ``len(index)`` rows whose first positions are the left-padded prefixes ``prefix_ids``
    [U, L]: one forward of the U prefixes (the decoder only, no logits; in the autograd graph unless
    called under ``torch.no_grad``), then each layer's keys and values gathered by ``index`` [B] (row ->
    prefix). Continue it with ``attention_mask = cat(prefix_mask[index], the rows' own mask)``."""
    if position_ids is None:
        position_ids = positions_from_mask(prefix_mask)
    out = model.base_model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=position_ids, use_cache=True)
    cache = output_cache(out)
    return type(cache)(ddp_cache_data=[(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                                       for layer in cache.layers])


def cache_argument(model: torch.nn.Module) -> str:
    """The name transformers gives the KV-cache argument of ``model.forward``: ``cache`` from 5.2x on,
    ``past_key_values`` before (the GPU stack pins transformers 5.15)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values
