"""Policy loss for the per-worker-group update (paper Eq. 3): PPO clipped ratio objective, optional
KL penalty (k3 estimator) and entropy bonus, with explicit loss aggregation.

All tensors are [batch, response_len] with a 0/1 ``mask`` over response tokens; advantages are one
value per sample (agent step), broadcast over its tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


def aggregate_loss(values: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token_mean") -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    - ``token_mean``: sum over all valid tokens / number of valid tokens (every token weighs the same,
      so long responses weigh more; DAPO, the reference default);
    - ``seq_mean_token_mean``: mean over tokens within each sequence, then mean over sequences (every
      sample weighs the same; the original GRPO);
    - ``seq_mean_token_sum``: sum over tokens within each sequence, then mean over sequences.
    Sequences with no valid token are left out of the sequence means.
    """
    mask = mask.to(values.dtype)
    if mode == "token_mean":
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    tokens = mask.sum(-1)
    seq_sum = (values * mask).sum(-1)
    per_seq = seq_sum / tokens.clamp_min(1.0) if mode == "seq_mean_token_mean" else seq_sum
    has_tokens = (tokens > 0).to(values.dtype)
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; use token_mean, seq_mean_token_mean or seq_mean_token_sum")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = log pi_ref - log pi (>= 0)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` [..., vocab]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass(frozen=True)
class PolicyLossConfig:
    clip_low: float = 0.2  # epsilon of the lower clip bound 1 - clip_low
    clip_high: float = 0.2  # epsilon of the upper bound 1 + clip_high (DAPO "clip-higher" uses 0.28)
    aggregation: Aggregation = "token_mean"
    kl_coef: float = 0.0  # weight of the k3 KL penalty against the reference policy (0 = off)
    entropy_coef: float = 0.0  # weight of the entropy bonus (0 = off)

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig = PolicyLossConfig(),
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (paper Eq. 3) + kl_coef * KL_k3 - entropy_coef * H, aggregated by mode.

    loss_t = -min(rho_t * A, clip(rho_t, 1 - clip_low, 1 + clip_high) * A),  rho_t = exp(logp_t - old_t).
    Returns the scalar loss and detached metrics (clip fraction, approximate KL to the old policy,
    KL to the reference, entropy).
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * advantages
    per_token = -torch.minimum(surr1, surr2)
    metrics: dict[str, float] = {}
    with torch.no_grad():
        m = mask.to(per_token.dtype)
        denom = m.sum().clamp_min(1.0)
        metrics["clip_frac"] = float(((surr2 < surr1).to(m.dtype) * m).sum() / denom)
        metrics["approx_kl_old"] = float(((ratio - 1) - log_ratio).mul(m).sum() / denom)
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (log-probs of the reference policy)")
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + cfg.kl_coef * kl
        metrics["kl_ref"] = float(aggregate_loss(kl.detach(), mask, "token_mean"))
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy (see entropy_from_logits)")
        per_token = per_token - cfg.entropy_coef * entropy
    if entropy is not None:
        metrics["entropy"] = float(aggregate_loss(entropy.detach(), mask, "token_mean"))
    return aggregate_loss(per_token, mask, cfg.aggregation), metrics
