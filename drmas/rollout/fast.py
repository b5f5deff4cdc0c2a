"""Rollout with a decode loop built for small Qwen2 models (``rollout.engine=fast``, the CPU default).

Why not HF ``generate``: at the presets' sizes (0.3-4 M parameters) a decode step is a few hundred tiny ops, so
its cost is per-op overhead, not arithmetic: the module calls, the ``DynamicCache`` concatenation, RMSNorm in six
ops, the logits processors and stopping criteria around each step. This engine keeps everything that decides
*which* tokens come out identical to :class:`~drmas.rollout.hf.HFRolloutEngine` and replaces only the loop:

- **the same inputs**: tokenization, left truncation, length-sorted chunks, left padding and the seeded RNG are
  the HF engine's (this class is a subclass; only ``_generate_chunk`` differs);
- **the same prefill**: the prompt runs through the transformers model itself, through the shared-prompt prefix
  cache where ``algo.shared_prefix`` asks for it, so the first token's logits are HF's;
- **a preallocated static KV cache**: the prefill's keys and values are copied once into ``[B, kv_heads,
  prompt + max_new_tokens, head_dim]`` per layer; each step writes one column (no ``torch.cat``);
- **one fused step**: per layer one RMSNorm op, one matmul for q, k, v *and* their rotate-half copies (RoPE's
  ``rotate_half`` is a signed permutation of the projection's rows, so it folds into the weights), one
  ``addcmul`` for RoPE, GQA attention over the cache as two batched matmuls with a padding bias, one matmul
  each for the output projection (residual added in it), gate/up and down;
- **the same sampler**: temperature, then top-k, then top-p exactly as transformers' warpers compute them,
  ``softmax`` and one ``torch.multinomial`` over the whole batch per step (finished rows included, as in
  ``generate``), so the same generator state draws the same tokens; greedy is ``argmax``. Finished rows are fed
  the pad token and stop at the first EOS, as in ``generate``.

The weights are read from the live module at every call (no copy to go stale after an update), fused per chunk.
Log-probs for PPO are not taken from here: the trainer scores the responses with the plain tempered softmax
(:func:`drmas.models.response_logprobs`), whichever engine generated them.

Runs: float32 Qwen2 decoders on the CPU with full attention and default RoPE (every preset). Anything else (another
architecture, bf16, a GPU, a sliding window, scaled RoPE) generates with the HF loop instead, and the engine says
so once. ``tests/test_fast_rollout.py`` compares it with the HF engine row for row.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drmas.models.logprobs import cache_argument, output_cache, pad_rows, positions_from_mask
from drmas.rollout.base import SamplingParams, register_engine, stop_positions
from drmas.rollout.hf import HFRolloutEngine

logger = logging.getLogger(__name__)


def unsupported_reason(model: torch.nn.Module, precision: str) -> str | None:
    """Why the fused loop cannot run ``model`` (None: it can)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen2":
        return f"model type {getattr(config, 'model_type', type(model).__name__)!r} is not qwen2"
    if precision != "fp32":
        return f"precision {precision!r} (the fused loop runs float32 only)"
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return f"weights are {param.dtype} on {param.device} (the fused loop runs float32 on the CPU)"
    if getattr(config, "use_sliding_window", False):
        return "a sliding attention window"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    return None


@dataclass
class _Layer:
    norm_in: torch.Tensor     # [D]
    qkv_w: torch.Tensor       # [QK + V + QK, D]: q, k, v, then rotate_half(q), rotate_half(k) rows
    qkv_b: torch.Tensor       # [QK + V + QK]
    o_w: torch.Tensor         # [D, H * d]
    norm_post: torch.Tensor   # [D]
    gate_up_w: torch.Tensor   # [2 I, D]
    down_w: torch.Tensor      # [D, I]


def _rotated_rows(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows of ``rotate_half(w @ x)`` as a weight (or bias) of their own: per head, ``cat(-second half, first)``."""
    blocks = w.reshape(heads, head_dim, *w.shape[1:])
    half = head_dim // 2
    return torch.cat((-blocks[:, half:], blocks[:, :half]), dim=1).reshape(w.shape)


class FusedQwen2:
    """The weights of a Qwen2 decoder in the fused layout of the module docstring (built per call)."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.intermediate = config.intermediate_size
        base = model.model
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.lm_head = model.lm_head.weight
        self.rotary = base.rotary_emb
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        self.layers = []
        for block in base.layers:
            a, m = block.self_attn, block.mlp
            w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight,
                           _rotated_rows(a.q_proj.weight, h, d), _rotated_rows(a.k_proj.weight, kv, d)])
            b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias,
                           _rotated_rows(a.q_proj.bias, h, d), _rotated_rows(a.k_proj.bias, kv, d)])
            self.layers.append(_Layer(
                norm_in=block.input_layernorm.weight, qkv_w=w, qkv_b=b, o_w=a.o_proj.weight,
                norm_post=block.post_attention_layernorm.weight,
                gate_up_w=torch.cat([m.gate_proj.weight, m.up_proj.weight]), down_w=m.down_proj.weight))

    def rope_table(self, length: int) -> torch.Tensor:
        """``[length, 2, QK]``: per position the cos and sin factors of every q and k column (q's scaled by
        ``head_dim ** -0.5``, the attention scale), from the model's own rotary module."""
        device = self.embed.device  # every tensor on the model's device (never the default one)
        positions = torch.arange(length, device=device)[None]
        cos, sin = self.rotary(self.embed, positions)  # [1, length, d] each, as the model computes them
        h, kv = self.heads, self.kv_heads
        scale = torch.cat([torch.full((h,), self.head_dim ** -0.5, device=device),
                           torch.ones(kv, device=device)])[:, None]  # [h + kv, 1]
        cos = (cos[0][:, None, :] * scale).reshape(length, -1)
        sin = (sin[0][:, None, :] * scale).reshape(length, -1)
        return torch.stack([cos, sin], dim=1)

    def step(self, tokens: torch.Tensor, rope: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
             bias: torch.Tensor, column: int) -> torch.Tensor:
        """Logits ``[B, V]`` of one new token per row at cache column ``column``, whose keys and values it writes.

        ``rope`` [B, 2, QK]: the rows' cos/sin at their positions; ``keys``/``values``: per layer ``[B, kv, T, d]``;
        ``bias`` [B, 1, 1, >= column + 1]: 0 where a row attends, -inf on its left padding."""
        b = tokens.shape[0]
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qk, v_width = (h + kv) * d, kv * d
        cos, sin = rope[:, 0], rope[:, 1]
        attend = bias[..., :column + 1]
        x = F.embedding(tokens, self.embed)
        for layer, key_cache, value_cache in zip(self.layers, keys, values):
            a = F.rms_norm(x, (self.hidden,), layer.norm_in, self.eps)
            qkv = torch.addmm(layer.qkv_b, a, layer.qkv_w.t())
            rotated = torch.addcmul(qkv[:, :qk] * cos, qkv[:, qk + v_width:], sin)  # RoPE on q and k at once
            key_cache[:, :, column].copy_(rotated[:, h * d:].view(b, kv, d))
            value_cache[:, :, column].copy_(qkv[:, qk:qk + v_width].view(b, kv, d))
            q = rotated[:, :h * d].view(b, kv, h // kv, d)  # head j reads kv head j // (h / kv), as repeat_kv
            scores = torch.matmul(q, key_cache[:, :, :column + 1].transpose(-1, -2)) + attend
            attn = torch.matmul(scores.softmax(-1), value_cache[:, :, :column + 1])
            x = torch.addmm(x, attn.view(b, h * d), layer.o_w.t())
            a = F.rms_norm(x, (self.hidden,), layer.norm_post, self.eps)
            gate_up = torch.mm(a, layer.gate_up_w.t())
            x = torch.addmm(x, F.silu(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:], layer.down_w.t())
        return torch.mm(F.rms_norm(x, (self.hidden,), self.final_norm, self.eps), self.lm_head.t())


def process_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """transformers' sampling warpers in its order (temperature, top-k, top-p; ``generate`` with
    ``min_tokens_to_keep=1``), computed as they compute them."""
    scores = logits
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if sampling.top_k:
        top_k = min(sampling.top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, top_k)[0][..., -1, None], -float("inf"))
    if sampling.top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - sampling.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))
    return scores


@register_engine("fast")
class FastRolloutEngine(HFRolloutEngine):
    """``RolloutEngine`` with the fused decode loop of the module docstring; the HF loop where it cannot run."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fallback_logged = False

    def _generate_chunk(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                        device: torch.device) -> tuple[list[list[int]], list[bool]]:
        reason = unsupported_reason(self.model, self.precision)
        if reason is not None:
            if not self._fallback_logged:
                logger.warning("rollout.engine=fast: %s; generating with the hf loop instead", reason)
                self._fallback_logged = True
            return super()._generate_chunk(prompt_ids, sampling, device)
        fused = FusedQwen2(self.model)
        width = max(len(ids) for ids in prompt_ids)
        total = width + sampling.max_new_tokens
        input_ids, attention_mask = pad_rows(prompt_ids, width, self.pad_id, left=True, device=device)
        logits, keys, values = self._prefill(input_ids, attention_mask, prompt_ids, total)
        rows = len(prompt_ids)
        bias = torch.zeros(rows, 1, 1, total, device=device)
        bias[:, 0, 0, :width].masked_fill_(attention_mask == 0, -float("inf"))
        rope = fused.rope_table(total)
        positions = attention_mask.sum(1)  # the first response token's position in each row
        stop_ids = torch.tensor(self.stop_ids, device=device)
        unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        new_tokens = torch.full((rows, sampling.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        for i in range(sampling.max_new_tokens):
            if sampling.greedy:  # generate(do_sample=False): argmax of the raw logits, no warper
                tokens = logits.argmax(-1)
            else:
                tokens = torch.multinomial(process_logits(logits, sampling).softmax(-1), 1)[:, 0]
            tokens = tokens.masked_fill(~unfinished, self.pad_id)
            new_tokens[:, i] = tokens
            unfinished &= ~torch.isin(tokens, stop_ids)
            if i + 1 == sampling.max_new_tokens or not bool(unfinished.any()):
                new_tokens = new_tokens[:, :i + 1]
                break
            logits = fused.step(tokens, rope[positions + i], keys, values, bias, width + i)
        lengths, truncated = stop_positions(new_tokens, stop_ids)
        return [row[:n] for row, n in zip(new_tokens.tolist(), lengths.tolist())], truncated.tolist()

    def _prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_ids: list[list[int]],
                 total: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The prompt through the transformers model (HF's own prefill, through the shared-prompt prefix cache where
        it applies): the last position's float32 logits and the static per-layer key/value caches of ``total``
        columns holding the prompt's."""
        cache = self._prompt_cache(prompt_ids, input_ids, attention_mask)
        position_ids = positions_from_mask(attention_mask)
        if cache is None:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, logits_to_keep=1)
        else:  # the cache holds every column but the last
            out = self.model(input_ids=input_ids[:, -1:], attention_mask=attention_mask,
                             position_ids=position_ids[:, -1:], use_cache=True, logits_to_keep=1,
                             **{cache_argument(self.model): cache})
        keys, values = [], []
        for layer in output_cache(out).layers:
            b, kv, width, d = layer.keys.shape
            k = layer.keys.new_empty(b, kv, total, d)
            v = layer.values.new_empty(b, kv, total, d)
            k[:, :, :width] = layer.keys
            v[:, :, :width] = layer.values
            keys.append(k)
            values.append(v)
        return out.logits[:, -1].float(), keys, values
