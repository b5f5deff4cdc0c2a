"""A worker group: one policy model, its optimizer and its rollout engine (one job: generate + update).

Each worker group is updated only on the samples of the agents mapped to it, with its own optimizer
config (paper §4). The same class runs in-process (``local`` backend) and as a Ray actor (``ray``
backend, drmas/workers/ray_backend.py).

Update (paper Eq. 3), per RL step, on the plan of drmas/workers/minibatch.py:
1. rows are shuffled (seeded) into ``mini_batches`` optimizer steps;
2. within a mini-batch, rows are ordered by agent, then by length (less padding; rows with one prompt
   together), and cut into micro-batches of ``micro_batch_size``;
   each micro-batch's loss is weighted by its share of the mini-batch (tokens for ``token_mean``,
   sequences otherwise), so gradient accumulation equals one big batch;
3. after each agent's micro-batches, ``AgentGradNorms.mark(agent)`` records that agent's contribution
   to the gradient (per-agent norms also under LLM sharing; where the batch holds several agents, each
   agent's share g_k·g/||g||² of the update and the cosines between the agents' contributions too);
4. the pre-clip norm is checked: a non-finite gradient skips the optimizer step (counted);
   otherwise clip to ``max_grad_norm`` and step.
Shared prompts (``algo.shared_prefix``): in a micro-batch, rows with the same prompt (the G trajectories
of a task group) run it through the model once (drmas/models/logprobs.py, "Shared prompts"); the
loss and every gradient equal the plain forward's. ``auto`` does so where the padded token count falls to
``PREFIX_SHARING_PAYS`` of the plain layout's or less; the same holds for the old-log-prob and reference
passes and for the rollout engine's prefill (drmas/rollout/hf.py).
On-policy with one mini-batch, the old log-probs equal the current ones (ratio 1): they are taken from
the same forward pass (detached) instead of a second pass.

Device and precision (``train.device`` / ``train.precision``, drmas/devices.py): the policy, its reference
model and its rollout engine live on ``WorkerSpec.device``; every batch is packed directly on that
device; forward passes run under the precision's autocast. ``get_state`` returns CPU tensors, so a
checkpoint loads on any device.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drmas.algos import AgentGradNorms, ControlTokens, PolicyLossConfig, first_nonfinite, policy_loss
from drmas.checkpoints import CheckpointDamaged
from drmas.devices import autocast, resolve_device
from drmas.models.logprobs import (batch_logprobs, group_prompts, make_batch, make_shared_prefix_batch,
                                   shared_prefix_logprobs, shared_prompt_groups)
from drmas.rollout.base import Generation, SamplingParams, make_engine
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.minibatch import MicroBatch, agent_behavior_metrics, plan_minibatches, reduce_step_metrics

logger = logging.getLogger(__name__)


def _update_norm(params, before: list[torch.Tensor]) -> float:
    """||theta_after - theta_before||_2 of one optimizer step: how far the weights moved, whatever the gradient's
    scale (AdamW divides a constant one out; the clip bounds the gradient, not the step)."""
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach() - b)
                                                       for p, b in zip(params, before)])))


def _lr_lambda(warmup_steps: int):
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


class PolicyWorker:
    def __init__(self, spec: WorkerSpec):
        from drmas.models.factory import load_policy

        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.spec = spec
        torch.manual_seed(spec.seed)
        if spec.model.path is None or not Path(spec.model.path).exists():
            raise ValueError(f"model {spec.key!r}: path {spec.model.path!r} is not a checkpoint folder; run the "
                             "SFT warm-up first (`drmas sft`, or `drmas train` does it for a missing path)")
        self.device = resolve_device(spec.device)
        self.model, self.tokenizer = load_policy(spec.model.path, device=self.device,
                                                 trust_remote_code=spec.model.trust_remote_code)
        self.control_tokens = ControlTokens(self.tokenizer)
        bad = first_nonfinite(self.model.state_dict())
        if bad is not None:  # a NaN would surface later as a raw sampling error naming no file
            raise CheckpointDamaged(f"{spec.model.path}: parameter {bad} of model {spec.key!r} holds non-finite values "
                                    f"(NaN/inf); use another checkpoint (models.{spec.key}.path), or delete it so the "
                                    "SFT warm-up makes it again")
        self.model.train()
        o = spec.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(o.warmup_steps))
        r = spec.model.rollout  # prompt handling of real checkpoints (the tiny CPU models use the defaults)
        self.engine = make_engine(r.engine, model=self.model, tokenizer=self.tokenizer, precision=spec.precision,
                                  max_prompt_tokens=r.max_prompt_tokens, chat_template=r.chat_template,
                                  chat_template_kwargs=r.chat_template_kwargs, shared_prefix=spec.algo.shared_prefix)
        self.loss_cfg = PolicyLossConfig(clip_low=spec.algo.clip_low, clip_high=spec.algo.clip_high,
                                         aggregation=spec.algo.aggregation, kl_coef=spec.algo.kl_coef,
                                         entropy_coef=spec.algo.entropy_coef)
        self.nonfinite_skips = 0
        self.ref_model = None
        if spec.algo.kl_coef > 0:
            self.ref_model, _ = load_policy(spec.model.path, device=self.device,
                                            trust_remote_code=spec.model.trust_remote_code)
            self.ref_model.eval().requires_grad_(False)

    # ------------------------------------------------------------------------------------ rollout
    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        """Responses for the step table: token ids keep the EOS where the model stopped by itself, so
        that the policy gradient also reaches the decision to stop."""
        gen = self.engine.generate(prompts, sampling, seed=seed)
        return replace(gen, response_ids=gen.response_ids_with_eos(int(self.tokenizer.eos_token_id)))

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    # ------------------------------------------------------------------------------------- update
    def _forward(self, rows: np.ndarray, batch: UpdateBatch, model: torch.nn.Module,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(response_mask, logprobs, entropy)`` of ``rows`` (one agent) under ``model``, through the shared-
        prompt layout where ``algo.shared_prefix`` asks for it (:meth:`prompt_groups`), else the plain one."""
        prompts, responses = [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows]
        temperature = float(batch.temperature[rows[0]])  # rows of one agent share a temperature
        temperature = temperature if temperature > 0 else 1.0
        groups = self.prompt_groups(prompts, responses)
        with autocast(self.device, self.spec.precision):
            if groups is not None:
                packed = make_shared_prefix_batch(prompts, responses, self.pad_id, device=self.device, groups=groups)
                logp, entropy = shared_prefix_logprobs(model, packed, temperature=temperature,
                                                       with_entropy=with_entropy)
            else:
                packed = make_batch(prompts, responses, self.pad_id, device=self.device)
                logp, entropy = batch_logprobs(model, packed, temperature=temperature, with_entropy=with_entropy)
        return packed.response_mask, logp, entropy

    def prompt_groups(self, prompts: list[list[int]],
                      responses: list[list[int]]) -> tuple[np.ndarray, np.ndarray] | None:
        """The prompt groups when these rows run in the shared-prompt layout (:func:`shared_prompt_groups`
        under ``algo.shared_prefix``), else None."""
        return shared_prompt_groups(self.spec.algo.shared_prefix, prompts, [len(r) for r in responses])

    def update_plan(self, batch: UpdateBatch, mini_batches: int, step_seed: int) -> list[list[list[MicroBatch]]]:
        """The update's plan (drmas/workers/minibatch.py): by agent, then prompt length, prompt, response
        length; rows with one prompt stay together, so they share it."""
        prompt_group, _ = group_prompts(batch.prompt_ids)
        keys = [np.array([len(p) for p in batch.prompt_ids]), prompt_group,
                np.array([len(r) for r in batch.response_ids])]
        return plan_minibatches(len(batch.response_ids), mini_batches, self.spec.optim.micro_batch_size, step_seed,
                                sort_keys=keys, agents=batch.agents)

    def update(self, batch: UpdateBatch, step_seed: int) -> dict[str, Any]:
        """One RL step of this worker group; returns metrics (per model and per agent)."""
        n = len(batch.response_ids)
        o = self.spec.optim
        metrics: dict[str, Any] = {"samples": n}
        if n == 0:
            return metrics
        plan = self.update_plan(batch, o.mini_batches, step_seed)
        behavior = _AgentBehavior(self._control_positions(batch), n)
        old_logp = self._old_logprobs(batch, behavior) if len(plan) > 1 else None
        agg = self.spec.algo.aggregation
        shared = len(set(batch.agents)) > 1  # several agents on this model: their shares of its update
        per_step: list[dict[str, float]] = []
        for (micro_batches,) in plan:  # one rank
            rows_of_mini = np.concatenate([mb.rows for mb in micro_batches])
            total = sum(len(batch.response_ids[i]) for i in rows_of_mini) if agg == "token_mean" else len(rows_of_mini)
            self.optimizer.zero_grad(set_to_none=True)
            tracker = AgentGradNorms(self.model.parameters(), keep_parts=shared)
            sums: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "entropy": 0.0, "approx_kl_old": 0.0}
            for mb in micro_batches:
                rows = mb.rows
                mask, logp, entropy = self._forward(rows, batch, self.model, with_entropy=True)
                old = logp.detach() if old_logp is None else _pad_stack([old_logp[i] for i in rows], logp.shape)
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        _, ref, _ = self._forward(rows, batch, self.ref_model, with_entropy=False)
                if old_logp is None:  # one optimizer step: these are the pre-update weights
                    behavior.add(str(mb.agent), rows, old, mask, entropy)
                adv = torch.as_tensor(batch.advantages[rows], dtype=logp.dtype, device=logp.device)
                loss, m = policy_loss(logp, old, adv, mask, self.loss_cfg, ref_logprobs=ref, entropy=entropy)
                share = (float(mask.sum()) if agg == "token_mean" else len(rows)) / max(total, 1)
                (loss * share).backward()
                sums["loss"] += float(loss.detach()) * share
                for k in ("clip_frac", "entropy", "approx_kl_old"):
                    sums[k] += m.get(k, 0.0) * share
                if mb.last_of_agent:
                    tracker.mark(str(mb.agent))
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.max_grad_norm))
            finite = math.isfinite(grad_norm)
            update_norm = 0.0
            if finite:
                before = [p.detach().clone() for p in self.model.parameters()]
                self.optimizer.step()
                update_norm = _update_norm(self.model.parameters(), before)
            else:
                self.optimizer.zero_grad(set_to_none=True)
                self.nonfinite_skips += 1
                logger.warning("worker %s: non-finite gradient norm (%s); optimizer step skipped", self.spec.key, grad_norm)
            per_step.append({**sums, "grad_norm": grad_norm, "skipped": float(not finite), "update_norm": update_norm,
                             **{f"agent_grad_norm/{a}": v for a, v in tracker.norms.items()},
                             **(_share_metrics(tracker) if shared else {})})
        if any(not d["skipped"] for d in per_step):
            self.scheduler.step()  # the warm-up counts RL steps that updated the weights
        metrics.update(reduce_step_metrics(per_step))
        metrics.update(behavior.metrics(batch.agents))
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

    def _control_positions(self, batch: UpdateBatch) -> np.ndarray:
        """Each row's control-token index in its response (-1: none; :func:`drmas.algos.control_positions`)."""
        return self.control_tokens(batch.response_ids, batch.control_tags)

    def _old_logprobs(self, batch: UpdateBatch, behavior: _AgentBehavior) -> list[torch.Tensor]:
        """Log-probs of every row under the policy before this step's first optimizer step (the update's
        micro-batches, all in one pass); the agents' behaviour statistics are taken in the same pass."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(batch.response_ids)
        with torch.no_grad():
            for (micro_batches,) in self.update_plan(batch, 1, 0):
                for mb in micro_batches:
                    mask, logp, entropy = self._forward(mb.rows, batch, self.model, with_entropy=True)
                    behavior.add(str(mb.agent), mb.rows, logp, mask, entropy)
                    lengths = mask.sum(1).long().tolist()
                    for j, i in enumerate(mb.rows.tolist()):
                        out[i] = logp[j, : lengths[j]]
        return out

    # --------------------------------------------------------------------------------- checkpoints
    def get_state(self) -> dict[str, Any]:
        """Model, optimizer and scheduler states with every tensor on the CPU (a no-op for a CPU run), so a
        checkpoint written on a GPU loads anywhere; ``set_state`` puts them back on this worker's device."""
        return _on_cpu({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(), "nonfinite_skips": self.nonfinite_skips})

    def set_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite_skips = int(state["nonfinite_skips"])
        self.engine.load_weights(None)

    def save_model(self, folder: str) -> str:
        from drmas.models.factory import save_policy

        return str(save_policy(self.model, self.tokenizer, folder))


class _AgentBehavior:
    """Per-agent behaviour statistics of one RL step (:func:`~drmas.workers.minibatch.agent_behavior_metrics`),
    gathered in the forward passes under the pre-update weights: the update's own with one mini-batch, the
    old-log-prob pass with more."""

    def __init__(self, positions: np.ndarray, n: int):
        self.positions = positions
        self.control_logp = np.full(n, np.nan)
        self.entropy: dict[str, list[float]] = {}

    def add(self, agent: str, rows: np.ndarray, old_logp: torch.Tensor, mask: torch.Tensor,
            entropy: torch.Tensor | None) -> None:
        pos = self.positions[rows]
        has = np.flatnonzero((pos >= 0) & (pos < old_logp.shape[1]))
        if has.size:
            picked = old_logp[torch.as_tensor(has, device=old_logp.device), torch.as_tensor(pos[has], device=old_logp.device)]
            self.control_logp[rows[has]] = picked.detach().double().cpu().numpy()
        if entropy is not None:
            total = self.entropy.setdefault(agent, [0.0, 0.0])
            total[0] += float((entropy.detach() * mask).sum())
            total[1] += float(mask.sum())

    def metrics(self, agents: np.ndarray) -> dict[str, float]:
        return agent_behavior_metrics(agents, self.entropy, self.control_logp)


def _share_metrics(tracker: AgentGradNorms) -> dict[str, float]:
    """``agent_grad_share/{k}`` and ``grad_cos/{a}~{b}`` of one optimizer step (drmas/algos/diagnostics.py)."""
    share, cos = tracker.shares()
    return {**{f"agent_grad_share/{k}": v for k, v in share.items()},
            **{f"grad_cos/{a}~{b}": v for (a, b), v in cos.items()}}


def _pad_stack(rows: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    out = torch.zeros(shape, device=rows[0].device)
    for j, r in enumerate(rows):
        out[j, : r.numel()] = r
    return out


def _on_cpu(state: Any) -> Any:
    """``state`` (nested dicts / lists of tensors and plain values) with every tensor moved to the CPU."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _on_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_on_cpu(v) for v in state)
    return state
