"""The seam between drmas and OpenRLHF: what drmas hands OpenRLHF, computed without OpenRLHF (pure, tested on
CPU). What drmas takes from OpenRLHF, and its check against an installed OpenRLHF, is the API contract
(:mod:`drmas.workers.openrlhf.api`).

drmas keeps the parts that make Dr. MAS what it is: the rollout (orchestra, agents), the step table, the
rewards and the advantages (``drmas.algos.compute_advantages``: agent-wise grouping by explicit
(task, agent) keys, never by position). OpenRLHF (pinned: :data:`drmas.workers.openrlhf.api.OPENRLHF_VERSION`)
supplies the GPU training machinery: one DeepSpeed actor group per worker group, its PPO-clip ``training_step``,
and its vLLM Ray actors with the DeepSpeed -> vLLM weight sync. This module holds

1. **conversion**: a worker group's step-table rows -> OpenRLHF ``Experience`` fields with drmas's per-sample
   advantage broadcast over the response tokens (:func:`sample_fields`, :func:`collate`), cut into
   mini-batches x ranks x micro-batches (:func:`plan_minibatches`, :func:`rank_payloads`);
2. **placement**: which bundle of the one shared placement group holds each training rank and
   each vLLM engine of every worker group, and what GPU share each gets (:func:`plan_placement`);
3. **arguments**: the OpenRLHF options of a worker group, read from its
   :class:`~drmas.workers.base.WorkerSpec` (:func:`openrlhf_overrides`: each setting under its config name,
   ``optim.lr``, on the line that gives its OpenRLHF name, ``actor.adam.lr``).

``tests/test_gpu_seam.py`` runs these tests everywhere.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from drmas.checkpoints import verify_files
from drmas.workers import minibatch
from drmas.workers.base import WorkerSpec

logger = logging.getLogger(__name__)

PADDING_ROW = -1  # row index of a padding sample in a mini-batch plan


# ============================================================================= 1. conversion (pure)
#: The ``Experience`` fields drmas fills (on the driver: all but ``action_log_probs``, which each rank
#: computes with the policy before the step's first optimizer step; ``info`` is an empty dict).
EXPERIENCE_FIELDS = ("sequences", "attention_mask", "action_mask", "action_log_probs", "advantages", "returns",
                     "response_length", "total_length", "info")


def sample_fields(prompt_ids: Sequence[int], response_ids: Sequence[int], advantage: float) -> dict[str, torch.Tensor]:
    """One agent step as OpenRLHF's per-sample tensors (layout of OpenRLHF 0.11.2's samples generator).

    ``sequences`` = prompt + response (T tokens), ``attention_mask`` = ones(T). ``action_mask`` has
    T - 1 entries, one per next-token prediction: entry i is 1 when token i + 1 is a response token,
    i.e. entries P - 1 ... T - 2 for a prompt of P tokens. ``advantages`` (and ``returns``, which the
    policy loss does not read) carry the step's scalar advantage on those entries and 0 elsewhere: every
    token of an agent's response shares the advantage drmas computed for that step (paper Eq. 3/5)."""
    p, r = len(prompt_ids), len(response_ids)
    if p < 1 or r < 1:
        raise ValueError(f"a sample needs at least one prompt and one response token (got {p} and {r})")
    if not math.isfinite(advantage):
        raise ValueError(f"advantage {advantage} is not finite")
    seq = torch.tensor(list(prompt_ids) + list(response_ids), dtype=torch.long)
    action_mask = torch.zeros(p + r - 1, dtype=torch.bool)
    action_mask[p - 1:] = True
    adv = action_mask.float() * float(advantage)
    return {"sequences": seq, "attention_mask": torch.ones(p + r, dtype=torch.long), "action_mask": action_mask,
            "advantages": adv, "returns": adv.clone(), "response_length": torch.tensor(float(r)),
            "total_length": torch.tensor(float(p + r))}


def padding_fields(pad_id: int) -> dict[str, torch.Tensor]:
    """A neutral sample for ranks with fewer rows: two tokens, no action token. It adds nothing to the
    loss or to its normalizers (OpenRLHF counts tokens and samples through ``action_mask``); it only
    keeps every rank's number of micro-batches equal, as DeepSpeed's collectives require."""
    seq = torch.full((2,), int(pad_id), dtype=torch.long)
    return {"sequences": seq, "attention_mask": torch.ones(2, dtype=torch.long),
            "action_mask": torch.zeros(1, dtype=torch.bool), "advantages": torch.zeros(1),
            "returns": torch.zeros(1), "response_length": torch.tensor(0.0), "total_length": torch.tensor(2.0)}


def collate(samples: Sequence[Mapping[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Stack per-sample fields into a micro-batch, right-padded (``sequences`` with ``pad_id``, masks and
    advantages with 0), as OpenRLHF's ``Experience.concat_experiences`` does."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    out: dict[str, torch.Tensor] = {}
    for name in samples[0]:
        values = [s[name] for s in samples]
        if values[0].dim() == 0:
            out[name] = torch.stack(values)
            continue
        width = max(v.shape[0] for v in values)
        fill = int(pad_id) if name == "sequences" else 0
        batch = torch.full((len(values), width), fill, dtype=values[0].dtype)
        for i, v in enumerate(values):
            batch[i, : v.shape[0]] = v
        out[name] = batch
    return out


def plan_minibatches(lengths: Sequence[int], mini_batches: int, world_size: int, micro_batch_size: int,
                     seed: int) -> list[list[list[list[int]]]]:
    """``plan[m][r]``: the micro-batches (lists of row indices; :data:`PADDING_ROW` = padding sample) of
    DeepSpeed rank ``r`` in optimizer step (mini-batch) ``m``.

    The local worker's plan (:func:`drmas.workers.minibatch.plan_minibatches`: seeded shuffle into
    ``min(mini_batches, n)`` mini-batches, rows round-robin to the ranks) with each rank's rows longest
    first (less padding per micro-batch) and no agent grouping (OpenRLHF measures no per-agent norm).
    Every rank runs the same number of micro-batches in a mini-batch: a rank short of rows runs one
    padding sample in that slot."""
    if mini_batches < 1 or world_size < 1 or micro_batch_size < 1:
        raise ValueError(f"mini_batches={mini_batches}, world_size={world_size}, micro_batch_size="
                         f"{micro_batch_size}: all must be >= 1")
    n = len(lengths)
    longest_first = [-np.asarray(lengths, dtype=np.int64), np.arange(n)]
    plan = []
    for mini in minibatch.plan_minibatches(n, mini_batches, micro_batch_size, seed, sort_keys=longest_first,
                                           world_size=world_size):
        n_micro = max(1, *(len(rank) for rank in mini))
        plan.append([[rank[k].rows.tolist() if k < len(rank) else [PADDING_ROW] for k in range(n_micro)]
                     for rank in mini])
    return plan


def rank_payloads(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                  advantages: Sequence[float], plan: list[list[list[list[int]]]], pad_id: int,
                  world_size: int) -> list[list[list[dict[str, torch.Tensor]]]]:
    """``payload[r][m][k]``: the collated micro-batch ``k`` of mini-batch ``m`` for rank ``r`` (what
    each DeepSpeed rank receives; OpenRLHF's ``async_run_method_batch`` sends each rank only its own)."""
    if not len(prompt_ids) == len(response_ids) == len(advantages):
        raise ValueError(f"rows disagree: {len(prompt_ids)} prompts, {len(response_ids)} responses, "
                         f"{len(advantages)} advantages")
    pad = padding_fields(pad_id)

    def one(i: int) -> dict[str, torch.Tensor]:
        return pad if i == PADDING_ROW else sample_fields(prompt_ids[i], response_ids[i], float(advantages[i]))

    return [[[collate([one(i) for i in micro], pad_id) for micro in mini[r]] for mini in plan] for r in range(world_size)]


def loss_counts(action_masks: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Response tokens and non-empty samples of a rank's micro-batches: summed over ranks, these are the
    normalizers of OpenRLHF's token-mean / sequence-mean loss for one optimizer step (``aggregate_loss``'s
    ``batch_num_tokens`` / ``global_batch_size``; padding samples count for neither)."""
    tokens = sum(float(m.sum()) for m in action_masks)
    samples = sum(float((m.reshape(m.shape[0], -1).sum(-1) > 0).sum()) for m in action_masks)
    return tokens, samples


@dataclass
class RankFit:
    """What ``DrmasActorMixin.drmas_fit`` returns from one DeepSpeed rank for one RL step."""

    steps: list[dict[str, float]]
    """Per optimizer step: pre-clip gradient norm, loss, clip fraction, learning rate (the same on every rank)."""
    rows: list[list[dict[str, torch.Tensor]]]
    """``rows[m][k]``: micro-batch k of mini-batch m (this rank's payload) under the pre-update policy:
    ``entropy_sum`` [B] (Σ of the response tokens' entropies), ``tokens`` [B] (response tokens) and
    ``old_logp`` [B, T - 1] (the old log-probs, in ``action_mask``'s layout)."""
    weights_finite: bool = True
    """Whether every parameter this rank holds (its ZeRO-3 partition, or the whole model) is finite after the step."""


def behavior_metrics(plan: list[list[list[list[int]]]], rank_rows: Sequence[list[list[dict[str, torch.Tensor]]]],
                     prompt_lengths: Sequence[int], agents: np.ndarray, positions: np.ndarray) -> dict[str, float]:
    """The local worker's per-agent behaviour statistics (:func:`drmas.workers.minibatch.agent_behavior_metrics`)
    from the ranks' :attr:`RankFit.rows`: ``rank_rows[r][m][k]`` holds the rows ``plan[m][r][k]``
    (:data:`PADDING_ROW`: a padding sample, skipped). ``positions[i]`` is row i's control-token index in its
    response (-1: none); with a prompt of P tokens, response token j is column P - 1 + j of ``old_logp``."""
    n = len(agents)
    entropy_sum, tokens, control_logp = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    lengths = np.asarray(prompt_lengths, np.int64)
    for m, mini in enumerate(plan):
        for r, micros in enumerate(mini):
            for k, micro in enumerate(micros):
                got = rank_rows[r][m][k]
                slots = np.asarray(micro, np.int64)
                real = np.flatnonzero(slots != PADDING_ROW)
                rows = slots[real]
                entropy_sum[rows] = got["entropy_sum"].double().numpy()[real]
                tokens[rows] = got["tokens"].double().numpy()[real]
                has = positions[rows] >= 0
                columns = lengths[rows[has]] - 1 + positions[rows[has]]
                picked = got["old_logp"][torch.as_tensor(real[has]), torch.as_tensor(columns)]
                control_logp[rows[has]] = picked.double().numpy()
    entropy = {a: (float(entropy_sum[agents == a].sum()), float(tokens[agents == a].sum()))
               for a in sorted(set(np.asarray(agents).tolist()))}  # the local plan's agent order
    return minibatch.agent_behavior_metrics(agents, entropy, control_logp)


def fit_metrics(per_step: Sequence[Mapping[str, float]], agents: Sequence[str], n_rows: int) -> dict[str, Any]:
    """drmas's worker-group metrics (``wg/{m}/...`` keys, docs in drmas/trainer/metrics.py) from one
    OpenRLHF update, reduced as the local worker's (:func:`drmas.workers.minibatch.reduce_step_metrics`:
    gradient norms the max, NaN when one is not finite; the rest the mean; ``lr`` the last). ``skipped``
    counts the optimizer steps with a non-finite norm: DeepSpeed (bf16) does not skip them, but counting
    them lets the trainer's rule (stop after train.max_nonfinite_skips such steps in a row, with a
    checkpoint) apply. OpenRLHF exposes only the model's gradient norm, so a per-agent norm is reported
    when the model serves one agent (non-sharing: exact); under sharing only the model's norm is logged."""
    out: dict[str, Any] = {"samples": int(n_rows)}
    if not per_step:
        return out
    steps = [{"grad_norm": float(d["grad_norm"]), "skipped": float(not math.isfinite(float(d["grad_norm"]))),
              "loss": float(d["loss"]), "clip_frac": float(d["clip_frac"]), "lr": float(d["lr"])} for d in per_step]
    out.update(minibatch.reduce_step_metrics(steps))
    unique = sorted(set(agents))
    if len(unique) == 1:
        out[f"agent_grad_norm/{unique[0]}"] = out["grad_norm"]
    return out


# ============================================================================== 2. placement (pure)
@dataclass(frozen=True)
class GroupPlacement:
    """Where one worker group runs in the shared pool (bundle = one GPU)."""

    key: str
    train_bundles: tuple[int, ...]
    """Bundle of each DeepSpeed rank (OpenRLHF's ``RayActorGroup`` puts rank r on bundle r)."""
    engine_bundles: tuple[tuple[int, ...], ...]
    """Bundles of each vLLM engine replica (tensor_parallel_size consecutive bundles)."""


@dataclass(frozen=True)
class PlacementPlan:
    """One Ray placement group shared by every worker group (the paper's shared resource pool): each GPU
    holds a training rank and an engine worker of every group that reaches it; they time-share it."""

    pool_gpus: int
    groups: dict[str, GroupPlacement]
    gpu_fraction: float
    """Ray GPU share of every training rank and every vLLM worker (so that all of them fit on one GPU)."""
    engines_per_gpu: int
    """Most vLLM workers on one GPU (all of them are awake together during a rollout)."""
    gpu_memory_utilization: float
    """Default vLLM memory budget per engine: the pool budget split among ``engines_per_gpu``."""

    def bundles(self) -> list[dict[str, float]]:
        return [{"GPU": 1.0, "CPU": 1.0} for _ in range(self.pool_gpus)]

    def occupancy(self) -> list[int]:
        """Actors (training ranks + vLLM workers) on each bundle."""
        count = [0] * self.pool_gpus
        for g in self.groups.values():
            for b in g.train_bundles + tuple(b for replica in g.engine_bundles for b in replica):
                count[b] += 1
        return count


def plan_placement(groups: Mapping[str, tuple[int, int]], pool_gpus: int | None = None,
                   memory_budget: float = 0.85) -> PlacementPlan:
    """Placement of worker groups ``{key: (num_gpus, tensor_parallel_size)}`` in one pool of
    ``pool_gpus`` GPUs (default: the largest group's ``num_gpus``).

    Group k's training ranks take bundles 0 .. num_gpus-1 and its ``num_gpus / tp`` engine replicas cover
    the same bundles, tp at a time, so each engine shares its GPUs with the ranks whose weights it
    receives (OpenRLHF's colocated CUDA-IPC weight sync needs that). Every actor gets the same GPU
    share, 1 / (most actors on one GPU), rounded down to Ray's 1e-4 granularity."""
    if not groups:
        raise ValueError("no worker groups to place")
    for key, (gpus, tp) in groups.items():
        if gpus < 1 or tp < 1:
            raise ValueError(f"worker group {key!r}: num_gpus={gpus} and tensor_parallel_size={tp} must be >= 1")
        if gpus % tp:
            raise ValueError(f"worker group {key!r}: tensor_parallel_size={tp} does not divide num_gpus={gpus}")
    pool = pool_gpus if pool_gpus is not None else max(g for g, _ in groups.values())
    too_big = {k: g for k, (g, _) in groups.items() if g > pool}
    if too_big:
        raise ValueError(f"worker groups {too_big} need more GPUs than the pool has ({pool}); enlarge the pool "
                         "or lower resources.num_gpus")
    if not 0 < memory_budget <= 1:
        raise ValueError(f"memory_budget={memory_budget} must be in (0, 1]")
    placed = {key: GroupPlacement(key, tuple(range(gpus)), tuple(tuple(range(e * tp, (e + 1) * tp))
                                                                 for e in range(gpus // tp)))
              for key, (gpus, tp) in groups.items()}
    engines = [0] * pool
    for g in placed.values():
        for replica in g.engine_bundles:
            for b in replica:
                engines[b] += 1
    plan = PlacementPlan(pool, placed, 0.0, max(engines), memory_budget / max(engines))
    fraction = math.floor(1e4 / max(plan.occupancy())) / 1e4
    return PlacementPlan(pool, placed, fraction, plan.engines_per_gpu, plan.gpu_memory_utilization)


# ============================================================================== 3. arguments (pure)
def check_spec(spec: WorkerSpec) -> WorkerSpec:
    """``spec``, once it is known to give an OpenRLHF actor group what it needs: a checkpoint to load
    (``model.path``) and a folder for its DeepSpeed checkpoints (``resources.checkpoint_dir``)."""
    if spec.model.path is None:
        raise ValueError(f"models.{spec.key}.path: the openrlhf backend loads a checkpoint (folder or hub id)")
    if spec.model.resources.checkpoint_dir is None:
        raise ValueError(f"models.{spec.key}.resources.checkpoint_dir is unset (RunConfig sets it to the run directory)")
    return spec


def num_engines(spec: WorkerSpec) -> int:
    """The worker group's vLLM engine replicas: ``resources.num_gpus / rollout.tensor_parallel_size``."""
    return spec.model.resources.num_gpus // spec.model.rollout.tensor_parallel_size


def warmup_optimizer_steps(spec: WorkerSpec) -> int:
    """``optim.warmup_steps`` in optimizer steps: drmas counts warm-up in RL steps, DeepSpeed's scheduler steps
    once per mini-batch."""
    return spec.optim.warmup_steps * spec.optim.mini_batches


CHECKPOINT_TAGS = ("drmas_a", "drmas_b")
"""The DeepSpeed tags a group's checkpoints are written under, in turn: a write never overwrites the states the run's
latest checkpoint points to, so a run stopped between the DeepSpeed save and its own checkpoint's rotation resumes
from that checkpoint whole (:meth:`~drmas.workers.openrlhf.backend.OpenRLHFBackend.get_states`). OpenRLHF deletes
the oldest tag before a save that would make ``ckpt.max_num`` of them, so :func:`openrlhf_overrides` sets one more
than these."""


def deepspeed_dir(spec: WorkerSpec) -> Path:
    """Where worker group ``spec``'s DeepSpeed checkpoints are: OpenRLHF's ``ckpt.path`` (:func:`openrlhf_overrides`)
    and its ``_actor``."""
    return Path(f"{spec.model.resources.checkpoint_dir}/{spec.key}/_actor")


def check_state(spec: WorkerSpec, state: Mapping[str, Any]) -> None:
    """Worker group ``spec``'s DeepSpeed checkpoint against the sha256 and size of each file its worker ``state``
    recorded (:meth:`~drmas.workers.openrlhf.backend.OpenRLHFBackend.get_states`): one that differs (damaged, or
    overwritten by a later write) or is missing is :class:`~drmas.checkpoints.CheckpointDamaged`, with one line
    naming it. A state without the record (written before the backend recorded one) is loaded unverified, with a
    warning. Reads the files only: no DeepSpeed rank, no Ray (``drmas export`` checks before it starts either, the
    backend's ``set_states`` before it loads any group)."""
    where = deepspeed_dir(spec) / state["tag"]
    if "files" not in state:
        logger.warning("model %s: the run's checkpoint records no sha256 of its DeepSpeed checkpoint %r under %s; "
                       "loaded unverified", spec.key, state["tag"], where.parent)
        return
    verify_files(where, state["files"], "the run's checkpoint",
                 why="not the DeepSpeed state the run's checkpoint was written with: damaged or overwritten since; "
                     "restore the files DeepSpeed wrote, or delete the run's checkpoints to start from step 0")


def check_states(specs: Mapping[str, WorkerSpec], states: Mapping[str, Mapping[str, Any]]) -> None:
    """:func:`check_state` for every worker group of ``states`` (the openrlhf backend's registered states check,
    :attr:`drmas.backends.BackendEntry.states_check`)."""
    for key, state in states.items():
        check_state(specs[key], state)


#: drmas ``algo.aggregation`` -> OpenRLHF ``--actor.loss_agg_mode``.
LOSS_AGG_MODES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}


def openrlhf_overrides(spec: WorkerSpec, gpu_memory_utilization: float) -> dict[str, Any]:
    """OpenRLHF CLI options (dotted names of ``train_ppo_ray.py``) for worker group ``spec``: each setting is read
    under its config name (``optim.lr``) on the line that gives OpenRLHF's (``actor.adam.lr``).

    Colocated (``train.colocate_all``) with CUDA-IPC weight sync, no reference model (KL off, as the
    paper), no dynamic batching. DeepSpeed's gradient accumulation is 1 (``train.batch_size`` =
    micro-batch x ranks): drmas marks the accumulation boundary itself at the end of each mini-batch,
    whose size varies with how often the agents acted. The scheduler is constant after drmas's linear
    warm-up; the rollout temperature is set per update (the sampling temperature of the rows)."""
    model, optim, algo = spec.model, spec.optim, spec.algo
    resources, rollout = model.resources, model.rollout
    if algo.aggregation not in LOSS_AGG_MODES:
        raise ValueError(f"algo.aggregation={algo.aggregation!r} has no OpenRLHF equivalent; use one of "
                         f"{sorted(LOSS_AGG_MODES)}")
    warm = warmup_optimizer_steps(spec)
    ckpt = f"{resources.checkpoint_dir}/{spec.key}"
    return {
        "actor.model_name_or_path": model.path,
        "actor.num_nodes": 1, "actor.num_gpus_per_node": resources.num_gpus,
        "ref.num_nodes": 1, "ref.num_gpus_per_node": resources.num_gpus,
        "vllm.num_engines": num_engines(spec), "vllm.tensor_parallel_size": rollout.tensor_parallel_size,
        "vllm.gpu_memory_utilization": gpu_memory_utilization, "vllm.enable_sleep": rollout.enable_sleep,
        "vllm.enforce_eager": rollout.enforce_eager, "vllm.enable_prefix_caching": rollout.enable_prefix_caching,
        "vllm.sync_backend": "nccl",
        "ds.zero_stage": resources.zero_stage, "ds.enable_sleep": rollout.enable_sleep,
        "ds.adam_offload": resources.adam_offload, "ds.packing_samples": False, "ds.param_dtype": "bf16",
        "actor.gradient_checkpointing_enable": resources.gradient_checkpointing,
        "train.colocate_all": True, "train.async_enable": False, "train.dynamic_batch_enable": False,
        "train.micro_batch_size": optim.micro_batch_size,
        "train.batch_size": optim.micro_batch_size * resources.num_gpus,
        "rollout.micro_batch_size": optim.micro_batch_size, "rollout.temperature": 1.0, "train.seed": spec.seed,
        "actor.adam.lr": optim.lr, "actor.adam.betas": tuple(optim.betas),
        "actor.adam.weight_decay": optim.weight_decay,
        "actor.max_norm": optim.max_grad_norm,
        "actor.lr_scheduler": "constant_with_warmup" if warm else "constant",
        "actor.lr_warmup_ratio": 1.0 if warm else 0.0,
        "actor.eps_clip_low_high": (algo.clip_low, algo.clip_high),
        "actor.loss_agg_mode": LOSS_AGG_MODES[algo.aggregation],
        "actor.entropy_coef": algo.entropy_coef if algo.entropy_coef > 0 else None, "actor.policy_loss_type": "ppo",
        "algo.kl.init_coef": 0.0, "algo.kl.use_loss": False, "algo.advantage.is_correction_level": "off",
        "ckpt.path": ckpt, "ckpt.output_dir": f"{ckpt}/hf", "ckpt.load_enable": False, "ckpt.save_hf": False,
        "ckpt.disable_ds": False, "ckpt.max_num": len(CHECKPOINT_TAGS) + 1,
    }


def scheduler_steps(spec: WorkerSpec) -> int:
    """``max_steps`` for OpenRLHF's scheduler: with ``lr_warmup_ratio`` 1 (or 0) the warm-up lasts exactly
    drmas's warm-up, and the constant schedules ignore the total."""
    return max(1, warmup_optimizer_steps(spec))
