"""The seam between drmas and OpenRLHF: everything drmas knows about OpenRLHF lives in this module.

drmas keeps the parts that make Dr. MAS what it is: the rollout (orchestra, agents), the step table, the
rewards and the advantages (``drmas.algos.compute_advantages``: agent-wise grouping by explicit
(task, agent) keys, never by position). OpenRLHF (pinned: :data:`OPENRLHF_VERSION`) supplies the GPU
training machinery: one DeepSpeed actor group per worker group, its PPO-clip ``training_step``, and its
vLLM Ray actors with the DeepSpeed -> vLLM weight sync. This module holds

1. **conversion** (pure, tested on CPU): a worker group's step-table rows -> OpenRLHF ``Experience``
   fields with drmas's per-sample advantage broadcast over the response tokens
   (:func:`sample_fields`, :func:`collate`), cut into mini-batches x ranks x micro-batches
   (:func:`plan_minibatches`, :func:`rank_payloads`);
2. **placement** (pure): which bundle of the one shared placement group holds each training rank and
   each vLLM engine of every worker group, and what GPU share each gets (:func:`plan_placement`);
3. **arguments** (pure given OpenRLHF's CLI defaults): the hierarchical ``args`` OpenRLHF's strategy and
   actor read, built from a drmas :class:`~drmas.workers.base.WorkerSpec` (:func:`openrlhf_overrides`,
   :func:`build_args`);
4. **the API contract** (:data:`OPENRLHF_API`): every OpenRLHF class, method, parameter, dataclass field
   and CLI option drmas uses. :func:`check_openrlhf_api` verifies it against an installed OpenRLHF by
   reading its source (no import, so it runs without a GPU, DeepSpeed or vLLM) and
   :func:`openrlhf_attr` is the only way the backend (``drmas.workers.openrlhf.backend``) obtains an
   OpenRLHF object, so nothing can be used that the check does not cover.

``tests/test_gpu_seam.py`` runs the conversion and placement tests everywhere and the API check where
OpenRLHF is installed (skipped with a message otherwise).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from drmas.workers import minibatch

#: The OpenRLHF release this seam is written against (``pip install openrlhf==0.11.2``).
OPENRLHF_VERSION = "0.11.2"
#: The GPU stack OpenRLHF 0.11.2 pins (its ``Requires-Dist``; requirements/gpu.txt installs these).
GPU_STACK_PINS = {"openrlhf": "0.11.2", "vllm": "0.29.0", "deepspeed": "0.19.6", "flash-attn": "2.8.3",
                  "ray": "2.55.0", "transformers": "5.15.0"}

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
@dataclass(frozen=True)
class GroupSettings:
    """Everything one OpenRLHF actor group and its vLLM engines need, from a drmas WorkerSpec."""

    key: str
    path: str
    seed: int
    num_gpus: int
    tensor_parallel_size: int
    zero_stage: int
    gradient_checkpointing: bool
    adam_offload: bool
    checkpoint_dir: str
    micro_batch_size: int
    mini_batches: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    max_grad_norm: float
    warmup_steps: int
    clip_low: float
    clip_high: float
    aggregation: str
    entropy_coef: float
    gpu_memory_utilization: float | None
    max_model_len: int | None
    enable_sleep: bool
    enforce_eager: bool
    enable_prefix_caching: bool
    max_prompt_tokens: int | None
    truncation: str
    chat_template: bool
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    engine: str = "vllm"
    """``rollout.engine``: vllm (OpenRLHF's vLLM actors, GPU), or fast / hf (drmas's engines in the driver)."""

    @property
    def num_engines(self) -> int:
        return self.num_gpus // self.tensor_parallel_size

    @property
    def warmup_optimizer_steps(self) -> int:
        """drmas counts warm-up in RL steps; DeepSpeed's scheduler steps once per mini-batch."""
        return self.warmup_steps * self.mini_batches


def group_settings(spec: Any) -> GroupSettings:
    """The settings of worker group ``spec`` (a :class:`drmas.workers.base.WorkerSpec`)."""
    m, o, a = spec.model, spec.optim, spec.algo
    if m.path is None:
        raise ValueError(f"models.{spec.key}.path: the openrlhf backend loads a checkpoint (folder or hub id)")
    r, res = m.rollout, m.resources
    if res.checkpoint_dir is None:
        raise ValueError(f"models.{spec.key}.resources.checkpoint_dir is unset (RunConfig sets it to the run directory)")
    return GroupSettings(
        key=spec.key, path=m.path, seed=spec.seed, num_gpus=res.num_gpus, tensor_parallel_size=r.tensor_parallel_size,
        zero_stage=res.zero_stage, gradient_checkpointing=res.gradient_checkpointing, adam_offload=res.adam_offload,
        checkpoint_dir=res.checkpoint_dir, micro_batch_size=o.micro_batch_size, mini_batches=o.mini_batches, lr=o.lr,
        betas=tuple(o.betas), weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm, warmup_steps=o.warmup_steps,
        clip_low=a.clip_low, clip_high=a.clip_high, aggregation=a.aggregation, entropy_coef=a.entropy_coef,
        gpu_memory_utilization=r.gpu_memory_utilization, max_model_len=r.max_model_len, enable_sleep=r.enable_sleep,
        enforce_eager=r.enforce_eager, enable_prefix_caching=r.enable_prefix_caching,
        max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, chat_template=r.chat_template,
        chat_template_kwargs=dict(r.chat_template_kwargs), engine=r.engine)


#: drmas ``algo.aggregation`` -> OpenRLHF ``--actor.loss_agg_mode``.
LOSS_AGG_MODES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}


def openrlhf_overrides(s: GroupSettings, gpu_memory_utilization: float) -> dict[str, Any]:
    """OpenRLHF CLI options (dotted names of ``train_ppo_ray.py``) for worker group ``s``.

    Colocated (``train.colocate_all``) with CUDA-IPC weight sync, no reference model (KL off, as the
    paper), no dynamic batching. DeepSpeed's gradient accumulation is 1 (``train.batch_size`` =
    micro-batch x ranks): drmas marks the accumulation boundary itself at the end of each mini-batch,
    whose size varies with how often the agents acted. The scheduler is constant after drmas's linear
    warm-up; the rollout temperature is set per update (the sampling temperature of the rows)."""
    if s.aggregation not in LOSS_AGG_MODES:
        raise ValueError(f"algo.aggregation={s.aggregation!r} has no OpenRLHF equivalent; use one of "
                         f"{sorted(LOSS_AGG_MODES)}")
    warm = s.warmup_optimizer_steps
    ckpt = f"{s.checkpoint_dir}/{s.key}"
    return {
        "actor.model_name_or_path": s.path,
        "actor.num_nodes": 1, "actor.num_gpus_per_node": s.num_gpus,
        "ref.num_nodes": 1, "ref.num_gpus_per_node": s.num_gpus,
        "vllm.num_engines": s.num_engines, "vllm.tensor_parallel_size": s.tensor_parallel_size,
        "vllm.gpu_memory_utilization": gpu_memory_utilization, "vllm.enable_sleep": s.enable_sleep,
        "vllm.enforce_eager": s.enforce_eager, "vllm.enable_prefix_caching": s.enable_prefix_caching,
        "vllm.sync_backend": "nccl",
        "ds.zero_stage": s.zero_stage, "ds.enable_sleep": s.enable_sleep, "ds.adam_offload": s.adam_offload,
        "ds.packing_samples": False, "ds.param_dtype": "bf16",
        "actor.gradient_checkpointing_enable": s.gradient_checkpointing,
        "train.colocate_all": True, "train.async_enable": False, "train.dynamic_batch_enable": False,
        "train.micro_batch_size": s.micro_batch_size, "train.batch_size": s.micro_batch_size * s.num_gpus,
        "rollout.micro_batch_size": s.micro_batch_size, "rollout.temperature": 1.0, "train.seed": s.seed,
        "actor.adam.lr": s.lr, "actor.adam.betas": tuple(s.betas), "actor.adam.weight_decay": s.weight_decay,
        "actor.max_norm": s.max_grad_norm,
        "actor.lr_scheduler": "constant_with_warmup" if warm else "constant",
        "actor.lr_warmup_ratio": 1.0 if warm else 0.0,
        "actor.eps_clip_low_high": (s.clip_low, s.clip_high), "actor.loss_agg_mode": LOSS_AGG_MODES[s.aggregation],
        "actor.entropy_coef": s.entropy_coef if s.entropy_coef > 0 else None, "actor.policy_loss_type": "ppo",
        "algo.kl.init_coef": 0.0, "algo.kl.use_loss": False, "algo.advantage.is_correction_level": "off",
        "ckpt.path": ckpt, "ckpt.output_dir": f"{ckpt}/hf", "ckpt.load_enable": False, "ckpt.save_hf": False,
        "ckpt.disable_ds": False,
    }


def scheduler_steps(s: GroupSettings) -> int:
    """``max_steps`` for OpenRLHF's scheduler: with ``lr_warmup_ratio`` 1 (or 0) the warm-up lasts exactly
    drmas's warm-up, and the constant schedules ignore the total."""
    return max(1, s.warmup_optimizer_steps)


def hierarchize(flat: Mapping[str, Any]) -> SimpleNamespace:
    """``{"a.b": 1, "c": 2}`` -> ``namespace(a=namespace(b=1), c=2)`` (OpenRLHF's ``utils.config.hierarchize``)."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def build(x: Any) -> Any:
        return SimpleNamespace(**{k: build(v) for k, v in x.items()}) if isinstance(x, dict) else x

    return build(root)


def build_args(overrides: Mapping[str, Any], defaults: Mapping[str, Any]) -> SimpleNamespace:
    """OpenRLHF's hierarchical ``args``: its CLI defaults with drmas's ``overrides``. An override that is
    not an option of the installed OpenRLHF is API drift and stops here, naming it."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise RuntimeError(f"OpenRLHF's train_ppo_ray has no options {unknown} (API drift: drmas is written for "
                           f"openrlhf=={OPENRLHF_VERSION}); update drmas/workers/openrlhf/seam.py")
    return hierarchize({**defaults, **overrides})


def openrlhf_root() -> Path | None:
    """Source folder of the installed ``openrlhf`` package (found without importing it), or None."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def cli_defaults(root: Path | None = None) -> dict[str, Any]:
    """Defaults of every ``train_ppo_ray.py`` option, as flat dotted names.

    OpenRLHF builds its parser inside ``if __name__ == "__main__"``; the statements of that block up to
    ``parse_args`` (only ``parser.add_argument`` calls) are run here with the file's standard-library
    imports, so the defaults are exactly the installed version's."""
    root = root or openrlhf_root()
    if root is None:
        raise ModuleNotFoundError("openrlhf is not installed (pip install -r requirements/gpu.txt)")
    path = root / "cli" / "train_ppo_ray.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    main = next((n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)), None)
    if main is None:
        raise RuntimeError(f"{path}: no `if __name__ == '__main__'` block (API drift)")
    body = []
    for stmt in main.body:
        if isinstance(stmt, ast.Assign) and "parse_args" in ast.unparse(stmt.value):
            break
        body.append(stmt)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and _stdlib_import(n)]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=imports + body, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    parser = namespace.get("parser")
    if not isinstance(parser, argparse.ArgumentParser):
        raise RuntimeError(f"{path}: the __main__ block does not build `parser` (API drift)")
    return dict(vars(parser.parse_args([])))


def _stdlib_import(node: ast.Import | ast.ImportFrom) -> bool:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return all(n.split(".")[0] in sys.stdlib_module_names for n in names)


# ============================================================================ 4. the API contract
@dataclass(frozen=True)
class ApiItem:
    """One OpenRLHF object drmas uses, and what drmas relies on about it."""

    module: str
    attr: str
    methods: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Method (``__init__`` for the constructor, ``()`` for a function) -> parameters drmas passes."""
    fields: tuple[str, ...] = ()
    """Dataclass fields drmas fills."""
    attributes: tuple[str, ...] = ()
    """Instance attributes (``self.x = ...``) drmas reads."""


#: Everything the openrlhf backend takes from OpenRLHF; :func:`openrlhf_attr` hands out only these.
OPENRLHF_API: dict[str, ApiItem] = {
    "Experience": ApiItem("openrlhf.trainer.ppo_utils.experience", "Experience", {"to_device": ("device",)},
                          fields=EXPERIENCE_FIELDS),
    "RayActorGroup": ApiItem("openrlhf.trainer.ray.launcher", "RayActorGroup", {
        "__init__": ("num_nodes", "num_gpus_per_node", "ray_actor_type", "pg", "num_gpus_per_actor",
                     "duplicate_actors"),
        "async_run_method": ("method_name",), "async_run_method_batch": ("method_name",),
        "async_init_model_from_pretrained": ()}),
    "BaseModelActor": ApiItem("openrlhf.trainer.ray.launcher", "BaseModelActor", {
        "execute_batch": ("method_name", "all_data", "start_idx", "end_idx"), "_setup_distributed": ("strategy",)},
        attributes=("strategy",)),
    "PolicyModelActor": ApiItem("openrlhf.trainer.ray.ppo_actor", "PolicyModelActor", {
        "init_model_from_pretrained": ("strategy", "pretrain", "max_steps", "vllm_engines"),
        "broadcast_to_vllm": (),
        "reload_states": (), "offload_states": (), "save_checkpoint": ("tag",)},
        attributes=("actor", "trainer", "tokenizer")),
    "ActorPPOTrainer": ApiItem("openrlhf.trainer.ray.ppo_actor", "ActorPPOTrainer", {
        "training_step": ("experience", "kl_ctl", "step", "loss_batch_info"), "broadcast_to_vllm": (),
        "_init_vllm_sync_group": ("backend",)}, attributes=("actor_scheduler", "vllm_engines")),
    "Actor": ApiItem("openrlhf.models.actor", "Actor", {"forward": ("sequences", "action_mask", "attention_mask",
                                                                   "return_output", "ring_attn_group")},
                     attributes=("temperature", "model", "packing_samples")),
    "aggregate_loss": ApiItem("openrlhf.models.loss", "aggregate_loss", {
        "()": ("loss", "loss_mask", "dp_size", "batch_num_tokens", "global_batch_size")}),
    "DeepspeedStrategy": ApiItem("openrlhf.utils.deepspeed.deepspeed", "DeepspeedStrategy", {
        "get_grad_norm": ("model",), "save_model": ("model", "tokenizer", "output_dir"),
        "load_ckpt": ("model", "load_dir", "tag"), "ring_attn_group": ()},  # the last: a property
        attributes=("ds_device_mesh",)),
    "get_strategy": ApiItem("openrlhf.utils.utils", "get_strategy", {"()": ("args",)}),
    "RolloutRayActor": ApiItem("openrlhf.trainer.ray.vllm_engine", "RolloutRayActor", {
        "__init__": ("bundle_indices",), "generate": ("prompt_token_ids", "sampling_params"), "sleep": ("level",),
        "wake_up": ("tags",), "reset_prefix_cache": ()}),
    "WorkerWrap": ApiItem("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap", {
        "update_weight_cuda_ipc": ("name", "dtype", "shape", "ipc_handles"),
        # the RPCs drmas's CPU worker extension answers in its place (cpu_compat measure 12)
        "init_process_group": ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend",
                               "use_ray"),
        "update_weight": ("name", "dtype", "shape", "empty_cache")}),
    "stateless_init_process_group": ApiItem("openrlhf.utils.distributed_util", "stateless_init_process_group", {
        "()": ("master_address", "master_port", "rank", "world_size", "device")}),  # cpu_compat measure 11
    "get_bundle_indices": ApiItem("openrlhf.trainer.ray.utils", "get_bundle_indices", {
        "()": ("placement_group", "index", "length")}),
}

#: Keyword arguments drmas passes to ``RolloutRayActor`` (OpenRLHF's own ``create_vllm_engines`` passes
#: the same; checked against it).
ROLLOUT_ACTOR_KWARGS = ("model", "enforce_eager", "worker_extension_cls", "tensor_parallel_size", "seed",
                        "distributed_executor_backend", "max_model_len", "enable_prefix_caching", "dtype",
                        "trust_remote_code", "full_determinism", "gpu_memory_utilization", "bundle_indices",
                        "num_gpus", "enable_sleep_mode")


def openrlhf_attr(name: str) -> Any:
    """The OpenRLHF object registered as ``name`` in :data:`OPENRLHF_API` (imported on first use)."""
    if name not in OPENRLHF_API:
        raise KeyError(f"{name!r} is not part of the OpenRLHF API drmas uses ({sorted(OPENRLHF_API)}); add it to "
                       "OPENRLHF_API so that check_openrlhf_api covers it")
    item = OPENRLHF_API[name]
    return getattr(importlib.import_module(item.module), item.attr)


def _module_file(root: Path, module: str) -> Path:
    parts = module.split(".")[1:]
    path = root.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def _class_defs(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _check_item(name: str, item: ApiItem, root: Path, trees: dict[str, ast.Module]) -> list[str]:
    path = _module_file(root, item.module)
    if not path.is_file():
        return [f"{name}: module {item.module} not found ({path})"]
    tree = trees.setdefault(item.module, ast.parse(path.read_text(), filename=str(path)))
    if "()" in item.methods:  # a function
        fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name == item.attr), None)
        if fn is None:
            return [f"{name}: function {item.module}.{item.attr} not found"]
        missing = sorted(set(item.methods["()"]) - _params(fn))
        return [f"{name}: {item.attr}() lacks parameters {missing}"] if missing else []
    classes = _class_defs(tree)
    cls = classes.get(item.attr)
    if cls is None:
        return [f"{name}: class {item.module}.{item.attr} not found"]
    # methods and attributes of the class and of its bases defined in the same module
    chain, seen = [cls], {cls.name}
    while True:
        bases = [classes[b.id] for c in chain for b in c.bases if isinstance(b, ast.Name) and b.id in classes
                 and b.id not in seen]
        if not bases:
            break
        chain += bases
        seen |= {b.name for b in bases}
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    assigned: set[str] = set()
    for c in reversed(chain):
        for node in c.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs[node.name] = node
        for node in ast.walk(c):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                assigned.add(node.attr)
    problems = []
    for method, params in item.methods.items():
        if method not in funcs:
            problems.append(f"{name}: method {item.attr}.{method} not found")
            continue
        missing = sorted(set(params) - _params(funcs[method]))
        if missing:
            problems.append(f"{name}: {item.attr}.{method}() lacks parameters {missing}")
    if item.fields:
        declared = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        missing = sorted(set(item.fields) - declared)
        if missing:
            problems.append(f"{name}: dataclass {item.attr} lacks fields {missing}")
    missing = sorted(set(item.attributes) - assigned)
    if missing:
        problems.append(f"{name}: {item.attr} never sets attributes {missing}")
    return problems


def _rollout_kwargs_problems(root: Path, trees: dict[str, ast.Module]) -> list[str]:
    module = "openrlhf.trainer.ray.vllm_engine"
    tree = trees.get(module) or ast.parse(_module_file(root, module).read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_vllm_engines"), None)
    if fn is None:
        return ["create_vllm_engines not found (the reference for RolloutRayActor's arguments)"]
    keys = {k.value for node in ast.walk(fn) if isinstance(node, ast.Dict) for k in node.keys
            if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    missing = sorted(set(ROLLOUT_ACTOR_KWARGS) - keys)
    return [f"RolloutRayActor: create_vllm_engines no longer passes {missing}"] if missing else []


def installed_openrlhf_version() -> str | None:
    try:
        return importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_openrlhf_api(root: Path | None = None, strict_version: bool = True) -> list[str]:
    """Problems between :data:`OPENRLHF_API` (+ the CLI options drmas sets) and the OpenRLHF at ``root``
    (default: the installed one). An empty list means the seam matches. Reads source only."""
    root = root or openrlhf_root()
    if root is None:
        return ["openrlhf is not installed"]
    problems: list[str] = []
    version = installed_openrlhf_version()
    if strict_version and version != OPENRLHF_VERSION:
        problems.append(f"openrlhf {version} is installed; drmas pins {OPENRLHF_VERSION} (check the API, then "
                        "update OPENRLHF_VERSION and requirements/gpu.txt)")
    trees: dict[str, ast.Module] = {}
    for name, item in OPENRLHF_API.items():
        problems += _check_item(name, item, root, trees)
    problems += _rollout_kwargs_problems(root, trees)
    try:
        defaults = cli_defaults(root)
    except (OSError, SyntaxError, RuntimeError) as exc:
        problems.append(f"train_ppo_ray CLI: {exc}")
    else:
        probe = GroupSettings(
            key="probe", path="probe", seed=0, num_gpus=1, tensor_parallel_size=1, zero_stage=2,
            gradient_checkpointing=False, adam_offload=False, checkpoint_dir="x", micro_batch_size=1, mini_batches=1,
            lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0, clip_low=0.2,
            clip_high=0.28, aggregation="token_mean", entropy_coef=0.0, gpu_memory_utilization=None,
            max_model_len=None, enable_sleep=True, enforce_eager=False, enable_prefix_caching=False,
            max_prompt_tokens=None, truncation="left", chat_template=False)
        missing = sorted(set(openrlhf_overrides(probe, 0.5)) - set(defaults))
        if missing:
            problems.append(f"train_ppo_ray CLI lacks options {missing}")
    return problems


def require_openrlhf_api(strict_version: bool = False) -> None:
    """Raise, listing every problem, unless the installed OpenRLHF matches the seam (backend start-up)."""
    problems = check_openrlhf_api(strict_version=strict_version)
    if problems:
        raise RuntimeError("the installed OpenRLHF does not match drmas's seam (drmas/workers/openrlhf/seam.py, "
                           f"written for openrlhf=={OPENRLHF_VERSION}):\n  - " + "\n  - ".join(problems))
