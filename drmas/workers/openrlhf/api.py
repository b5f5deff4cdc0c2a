"""OpenRLHF's API as drmas uses it: the pinned release, every OpenRLHF object drmas takes and what it relies on
about it (:data:`OPENRLHF_API`), and OpenRLHF's command line (the installed version's option defaults, and
OpenRLHF's hierarchical ``args`` built from them and drmas's options).

:func:`check_openrlhf_api` verifies the contract against an installed OpenRLHF by reading its source (no import,
so it runs without a GPU, DeepSpeed or vLLM): every class, method, parameter, dataclass field and attribute of
:data:`OPENRLHF_API`, the keyword arguments of the vLLM actors, and every option
:func:`drmas.workers.openrlhf.seam.openrlhf_overrides` sets. :func:`openrlhf_attr` is the only way the backend
(:mod:`drmas.workers.openrlhf.backend`) obtains an OpenRLHF object, so nothing can be used that the check does not
cover. ``tests/test_gpu_seam.py`` runs the check where OpenRLHF is installed (skipped with a message otherwise).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.config.schema import ResourcesConfig
from drmas.workers.base import WorkerSpec
from drmas.workers.openrlhf.seam import EXPERIENCE_FIELDS, openrlhf_overrides

#: The OpenRLHF release drmas is written against (``pip install openrlhf==0.11.2``).
OPENRLHF_VERSION = "0.11.2"
#: The GPU stack OpenRLHF 0.11.2 pins (its ``Requires-Dist``; requirements/gpu.txt installs these).
GPU_STACK_PINS = {"openrlhf": "0.11.2", "vllm": "0.29.0", "deepspeed": "0.19.6", "flash-attn": "2.8.3",
                  "ray": "2.55.0", "transformers": "5.15.0"}


# ============================================================================ the command line
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
                           f"openrlhf=={OPENRLHF_VERSION}); update drmas/workers/openrlhf/api.py")
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


# ============================================================================ the API contract
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


def drmas_cli_options() -> set[str]:
    """Every ``train_ppo_ray`` option drmas sets: the keys of
    :func:`~drmas.workers.openrlhf.seam.openrlhf_overrides` for a worker group of default settings (the keys are
    the same for every worker group)."""
    model = ModelConfig(preset=None, path="probe", resources=ResourcesConfig(checkpoint_dir="probe"))
    probe = WorkerSpec("probe", model, OptimConfig(), AlgoConfig(), seed=0)
    return set(openrlhf_overrides(probe, 0.5))


def check_openrlhf_api(root: Path | None = None, strict_version: bool = True) -> list[str]:
    """Problems between :data:`OPENRLHF_API` (+ the CLI options drmas sets) and the OpenRLHF at ``root``
    (default: the installed one). An empty list means the contract holds. Reads source only."""
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
        missing = sorted(drmas_cli_options() - set(defaults))
        if missing:
            problems.append(f"train_ppo_ray CLI lacks options {missing}")
    return problems


def require_openrlhf_api(strict_version: bool = False) -> None:
    """Raise, listing every problem, unless the installed OpenRLHF keeps the contract (backend start-up)."""
    problems = check_openrlhf_api(strict_version=strict_version)
    if problems:
        raise RuntimeError("the installed OpenRLHF does not match drmas's contract (drmas/workers/openrlhf/api.py, "
                           f"written for openrlhf=={OPENRLHF_VERSION}):\n  - " + "\n  - ".join(problems))
