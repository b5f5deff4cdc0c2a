"""Tiny-LM study: Lemma 4.2 on real per-sample gradients of small causal transformers.

A solver-verifier system in the shape of the paper's math system, on random tokens (no tokenizer):

- each task has a random prompt and an *answer set* (a random share of the vocabulary); the Solver
  acts once per trajectory and solves the task when the last token of its response is in the answer
  set: team reward R in {0, 1};
- the Verifier reads the task and the Solver's response and acts once; its output is *invalid* when
  the first token id is below ``valid_from``, and an invalid output is retried once, so it acts 1 or 2
  times per trajectory; its step score is R - penalty * (1 - valid) (paper math: penalty 0.1).

Each agent is a ``transformers`` Qwen2ForCausalLM built from a config (one model per agent, or one
shared model with ``sharing=True``); responses are sampled from the model at temperature 1, so
z = grad_theta log pi(response | prompt) at theta = theta_old is an exact score function. Per-sample
gradients come from ``torch.func`` (functional_call + grad + vmap, in chunks); only ||z||^2 and the
per-batch weighted sums sum_y w_y z_y are kept. The task groups are split in two halves: the first
estimates factor, E||z||^2 and Delta_k (the prediction), the second is measured.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from analysis.theory.lemma import SampleTable, batch_index, batch_weights, lemma_terms
from analysis.theory.records import GradStats, Prediction, Record, make_records

log = logging.getLogger(__name__)

AGENTS = ("solver", "verifier")
ESTIMATORS = ("trajectory_grpo", "pooled_grpo", "drmas")
"""Global = ``trajectory_grpo`` (paper Eq. 2: R = trajectory mean score, mu, sigma over trajectories)
and ``pooled_grpo`` (mu, sigma over all steps); agent-wise = ``drmas``."""


@dataclass(frozen=True)
class TinyLMConfig:
    """Tiny-LM study (sizes chosen for a 2-core CPU)."""

    n_groups: int = 256  # task groups; the first half calibrates, the second half is measured
    group_size: int = 8  # trajectories per task (paper math: 8)
    batch_groups: int = 8  # task groups per batch for the batch-gradient norm
    vocab_size: int = 64  # random tokens, no tokenizer
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    init_std: float = 0.1  # Qwen's default 0.02 gives a near-uniform policy; 0.1 makes ||z||^2 vary more
    prompt_len: int = 8
    response_len: int = 6
    penalty: float = 0.1  # the verifier's invalid-output penalty (paper math: c = 0.1)
    valid_from: int = 24  # a verifier output is valid iff its first token id >= valid_from
    answer_share: tuple[float, float] = (0.1, 0.6)  # range of the answer set's share of the vocabulary
    sharing: bool = False  # one model for both agents (LLM sharing) instead of one per agent
    chunk_size: int = 64  # samples per vmap chunk (bounds the memory of per-sample gradients)
    seed: int = 0

    def __post_init__(self) -> None:
        half = self.n_groups // 2
        if self.n_groups % 2 or half % self.batch_groups:
            raise ValueError(f"n_groups={self.n_groups} must be even and its half a multiple of batch_groups="
                             f"{self.batch_groups}, so that batches never mix calibration and measured groups")
        if not 0 < self.valid_from < self.vocab_size or self.prompt_len < 5 or self.response_len < self.prompt_len - 4:
            raise ValueError(f"need 0 < valid_from < vocab_size, prompt_len >= 5 and response_len >= prompt_len - 4 "
                             f"(the verifier reads that much of the solver's response), got {self.valid_from}, "
                             f"{self.prompt_len}, {self.response_len}")


def build_models(cfg: TinyLMConfig) -> list[torch.nn.Module]:
    """One Qwen2ForCausalLM per agent (the same object twice with ``sharing``), seeded, eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM  # heavy import, only for this study

    conf = Qwen2Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.prompt_len + cfg.response_len,
                       initializer_range=cfg.init_std, tie_word_embeddings=False, attn_implementation="eager")
    models = []
    for k in range(1 if cfg.sharing else len(AGENTS)):
        torch.manual_seed(cfg.seed * 1000 + k)
        models.append(Qwen2ForCausalLM(conf).eval())
    return models * len(AGENTS) if cfg.sharing else models


@torch.no_grad()
def sample_responses(model: torch.nn.Module, prompts: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    """Sample ``length`` tokens per prompt at temperature 1 (batched over prompts, a loop over tokens)."""
    ids = prompts
    for _ in range(length):
        logits = model(ids, use_cache=False).logits[:, -1].float()
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
    return ids[:, prompts.shape[1]:]


@dataclass(frozen=True)
class Rollout:
    """The step table of the solver-verifier batch and each step's token ids (prompt + response)."""

    table: SampleTable
    tokens: torch.Tensor  # int64 [n, prompt_len + response_len]


def rollout(models: list[torch.nn.Module], cfg: TinyLMConfig, gen: torch.Generator) -> Rollout:
    """Sample the solver-verifier trajectories of ``n_groups`` tasks (module docstring)."""
    g, n, v, p, t = cfg.n_groups, cfg.group_size, cfg.vocab_size, cfg.prompt_len, cfg.response_len
    task_tokens = torch.randint(2, v, (g, p - 1), generator=gen)  # ids 0 and 1 are the role tokens
    share = cfg.answer_share[0] + (cfg.answer_share[1] - cfg.answer_share[0]) * torch.rand(g, 1, generator=gen)
    answer = torch.rand(g, v, generator=gen).argsort(1).argsort(1) < (share * v).round()  # [g, v] answer sets
    task = torch.arange(g).repeat_interleave(n)
    solver_prompt = torch.cat([torch.zeros(g * n, 1, dtype=torch.int64), task_tokens[task]], 1)
    solver = sample_responses(models[0], solver_prompt, t, gen)
    reward = answer[task, solver[:, -1]].to(torch.float64)
    verifier_prompt = torch.cat([torch.ones(g * n, 1, dtype=torch.int64), task_tokens[task, :3],
                                 solver[:, : p - 4]], 1)
    first = sample_responses(models[1], verifier_prompt, t, gen)
    retry = torch.nonzero(first[:, 0] < cfg.valid_from).flatten()
    second = sample_responses(models[1], verifier_prompt[retry], t, gen)
    traj = torch.arange(g * n)
    valid = torch.cat([first[:, 0], second[:, 0]]) >= cfg.valid_from
    scores = torch.cat([reward, reward, reward[retry]])
    scores[g * n:] -= cfg.penalty * (~valid).to(torch.float64)
    traj_col = torch.cat([traj, traj, traj[retry]])
    agent = torch.cat([torch.zeros(g * n, dtype=torch.int64), torch.ones(g * n + len(retry), dtype=torch.int64)])
    table = SampleTable(scores=scores, task=traj_col // n, agent=agent, traj=traj_col,
                        sq_norm=torch.zeros_like(scores), n_agents=len(AGENTS))  # ||z||^2 filled in later
    tokens = torch.cat([torch.cat([solver_prompt, solver], 1), torch.cat([verifier_prompt, first], 1),
                        torch.cat([verifier_prompt[retry], second], 1)])
    return Rollout(table, tokens)


def per_sample_scores(model: torch.nn.Module, tokens: torch.Tensor, prompt_len: int, weights: torch.Tensor,
                      batch: torch.Tensor, n_batches: int, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """||z_y||^2 and sum_y weights[e, y] z_y per batch, z_y = grad_theta log pi(response_y | prompt_y).

    Per-sample gradients by ``torch.func.vmap(grad(log_prob))`` over chunks of ``chunk_size`` samples;
    a chunk's gradients are flattened to [chunk, n_params], reduced and dropped. Returns float64
    ``sq_norm`` [n] and float64 ``sums`` [n_batches, n_weights, n_params].
    """
    from torch.func import functional_call, grad, vmap

    params = {k: p.detach() for k, p in model.named_parameters()}

    def log_prob(prm: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, prm, (ids[None],), kwargs={"use_cache": False}).logits[0]
        logp = torch.log_softmax(logits[prompt_len - 1 : -1].float(), -1)
        return logp.gather(-1, ids[prompt_len:, None]).sum()

    per_sample = vmap(grad(log_prob), in_dims=(None, 0))
    n_params = sum(p.numel() for p in params.values())
    sq_norm = torch.zeros(tokens.shape[0], dtype=torch.float64)
    sums = torch.zeros(n_batches, weights.shape[0], n_params, dtype=torch.float64)
    for start in range(0, tokens.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        g = per_sample(params, tokens[rows])
        flat = torch.cat([g[k].flatten(1) for k in params], 1).to(torch.float64)
        sq_norm[rows] = flat.pow(2).sum(1)
        for e in range(weights.shape[0]):
            sums[:, e].index_add_(0, batch[rows], weights[e, rows, None] * flat)
    return sq_norm, sums


def run_tiny_lm(cfg: TinyLMConfig) -> list[Record]:
    """Lemma 4.2 on the tiny-LM batch: prediction from the first half of the task groups, measurement
    (E||A z||^2, in-sample identity, batch-gradient norms) on the second half."""
    gen = torch.Generator().manual_seed(cfg.seed)
    models = build_models(cfg)
    roll = rollout(models, cfg, gen)
    tab = roll.table
    log.info("tiny_lm: %d task groups, %d steps (%d verifier retries); per-sample gradients ...", cfg.n_groups,
             tab.scores.numel(), int((tab.agent == 1).sum()) - cfg.n_groups * cfg.group_size)
    # Advantages are per task group, so computing them on the whole table equals computing them per half.
    adv = {e: lemma_terms(tab, e).advantages for e in ESTIMATORS}
    batch = batch_index(tab.task, cfg.batch_groups)
    n_batches = int(batch.max()) + 1
    weights = torch.stack([batch_weights(adv[e], tab.agent, batch, len(AGENTS)) for e in ESTIMATORS])
    sq_norm = torch.zeros_like(tab.scores)
    grad_sq = np.zeros((len(ESTIMATORS), len(AGENTS)))
    grad_norm = np.zeros_like(grad_sq)
    measured_batches = slice(n_batches // 2, None)
    for k in range(len(AGENTS)):
        rows = torch.nonzero(tab.agent == k).flatten()
        sq, sums = per_sample_scores(models[k], roll.tokens[rows], cfg.prompt_len, weights[:, rows], batch[rows],
                                     n_batches, cfg.chunk_size)
        sq_norm[rows] = sq
        norms = torch.linalg.vector_norm(sums[measured_batches], dim=-1)  # [batches, estimators]
        grad_sq[:, k], grad_norm[:, k] = norms.pow(2).mean(0).numpy(), norms.mean(0).numpy()
        log.info("tiny_lm: per-sample gradients of %s done (%d samples)", AGENTS[k], rows.numel())
    full = SampleTable(tab.scores, tab.task, tab.agent, tab.traj, sq_norm, tab.n_agents)
    first = full.task < cfg.n_groups // 2
    calib, measured = full.select(first), full.select(~first)
    predicted = {e: Prediction.from_terms(lemma_terms(calib, e)) for e in ESTIMATORS}
    terms = {e: lemma_terms(measured, e) for e in ESTIMATORS}
    grads = {e: GradStats(grad_sq[i], grad_norm[i], cfg.batch_groups) for i, e in enumerate(ESTIMATORS)}
    setting = "solver_verifier_" + ("sharing" if cfg.sharing else "non_sharing")
    return make_records("tiny_lm", setting, AGENTS, terms, predicted, grads)

