"""``drmas export RUN [--out DIR]``: each model of a run's latest checkpoint as a Hugging Face model folder, which
transformers and vLLM load without drmas.

``DIR`` (default ``RUN/export``) gets one folder per worker group (``models.<key>``: one for a sharing run, one per
model otherwise, each at its own size), written by :func:`drmas.models.factory.save_policy` (the one way drmas saves
a model): ``model.safetensors``, ``config.json``, ``generation_config.json``, the run's tokenizer, a model card
(``README.md``: run, step, the agents that used the model, estimator, config hash, the evaluation at that step) and
the sha256 manifest; and ``drmas_export.json`` (what was exported, from which checkpoint).

What is refused, with one line and before anything is written: a folder that is not a run folder, a run in progress
(its lock is held), a checkpoint without a manifest (unverified), one that fails verification or holds a pickled
object (:meth:`RunCheckpoints.load`), one whose worker states point to files that differ from what they recorded
(openrlhf: the DeepSpeed checkpoint, checked before the backend starts), a run killed while checkpointing (``drmas
train`` recovers it on resume), and a ``--out`` folder that holds something other than an earlier export. ``DIR`` is
written in a temporary folder beside it and renamed into place (:func:`drmas.io.atomic_folder`): a reader sees the
whole export or the previous one.

The weights. A worker state of the local and ray backends holds its model's weights. One of the openrlhf backend
points to the group's DeepSpeed checkpoint instead: the backend, built without rollout engines, loads it into the
group's ranks with every file read weights-only (a file holding another pickled object, or one that does not load,
is refused with one line) and saves the model by OpenRLHF's own ``save_model``
(:meth:`~drmas.workers.openrlhf.backend.OpenRLHFBackend.save_checkpoint_models`), which transformers reads back; from
there both take the same path.

The tokenizer. ``AutoTokenizer`` on a folder whose ``config.json`` says ``qwen2`` builds ``Qwen2Tokenizer``, which
rebuilds its own pipeline with an NFC normalizer that drmas's tokenizer does not have (other ids for text not in
NFC form; :mod:`drmas.models.tokenizer`). A Qwen2 model with drmas's tokenizer is therefore exported as the equal
``LlamaForCausalLM`` (:func:`drmas.models.factory.llama_equivalent`), beside which ``AutoTokenizer`` reads
``tokenizer.json`` as written; every export is checked to tokenize :data:`PROBE_TEXTS` as the run does before it
is renamed into place.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from drmas.checkpoints import MANIFEST_NAME, CheckpointDamaged, verify_artifact, verify_checkpoint
from drmas.config import ConfigError, RunConfig, load_config
from drmas.config.identity import config_hash
from drmas.io import atomic_folder, read_json_object, read_jsonl
from drmas.locks import folder_lock
from drmas.trainer.run_folder import RunCheckpoints

logger = logging.getLogger(__name__)

EXPORT_RECORD = "drmas_export.json"
"""The record at the top of an export folder; an existing ``--out`` without it is not replaced."""
PROBE_TEXTS = ("Solve: 12 + 7 = ?", "caf\u00e9 vs cafe\u0301 (NFC and NFD)", "<|im_start|>user\nx<|im_end|><|endoftext|>",
               "\u212b \u00c5 A\u030a  tabs\tand\nnewlines")
"""Texts the exported tokenizer must encode as the run's does (non-NFC forms and special tokens included)."""


def default_out(run_dir: Path) -> Path:
    return run_dir / "export"


def run_config(run_dir: Path) -> RunConfig:
    """The config of the run folder ``run_dir``, with its place taken from where the folder is now."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.yaml); pass the folder `drmas train` wrote")
    return load_config(run_dir / "config.yaml", [f"out_dir={run_dir.parent}", f"name={run_dir.name}"])


def export_run(run_dir: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """Export every model of the run folder ``run_dir`` (module docstring); returns ``{model key: folder}``."""
    run_dir = Path(run_dir).resolve()
    cfg = run_config(run_dir)
    out = Path(out).resolve() if out is not None else default_out(run_dir)
    if out.exists() and not (out / EXPORT_RECORD).is_file():
        raise ConfigError(f"--out {out} exists and is not a drmas export (no {EXPORT_RECORD}); pass another --out, "
                          "or remove it")
    with folder_lock(run_dir, "run folder"):  # a run in progress holds it: refused at once
        checkpoints = RunCheckpoints(run_dir)
        step = _verified_step(checkpoints)
        _, states = checkpoints.load(list(cfg.models))
        check_backend_states(cfg, states)
        evals = _evaluations(run_dir, step)
        identity = (read_json_object(run_dir / "manifest.json") or {}).get("config_hash") or config_hash(cfg)
        with atomic_folder(out) as tmp:
            weights = trained_weights(cfg, states, tmp)
            folders = {key: _export_model(cfg, key, weights[key], tmp / key,
                                          lambda arch, key=key: model_card(cfg, key, step, identity, evals, arch))
                       for key in cfg.models}
            record = {"run_dir": str(run_dir), "step": step, "config_hash": identity,
                      "checkpoint_manifest": str(checkpoints.latest / MANIFEST_NAME),
                      "models": {key: {"folder": key, "architecture": arch} for key, arch in folders.items()}}
            (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    logger.info("exported step %d of %s -> %s (%s)", step, run_dir, out, ", ".join(cfg.models))
    return {key: out / key for key in cfg.models}


def check_backend_states(cfg: RunConfig, states: dict[str, Any]) -> None:
    """The files a worker state points to outside the checkpoint folder (openrlhf: its DeepSpeed checkpoint)
    checked against what the state recorded, before a backend starts
    (:meth:`drmas.backends.BackendEntry.check_states`)."""
    from drmas.backends import BACKENDS
    from drmas.trainer.trainer import worker_specs

    BACKENDS.get(cfg.train.backend).check_states(worker_specs(cfg), states)


def trained_weights(cfg: RunConfig, states: dict[str, Any], scratch: Path) -> dict[str, dict[str, Any]]:
    """Each model's trained weights (full names, CPU tensors) from the run's worker ``states``: their own, or
    where they point to the backend's checkpoints (openrlhf: DeepSpeed's), the models the backend saves from
    those, in a temporary folder under ``scratch`` (module docstring)."""
    if all("model" in state for state in states.values()):
        return {key: state["model"] for key, state in states.items()}
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from drmas.trainer.trainer import worker_specs
    from drmas.workers.base import make_backend

    backend = make_backend(cfg.train.backend, worker_specs(cfg), rollout=False)
    try:
        with tempfile.TemporaryDirectory(prefix=".backend-save-", dir=scratch) as saved:
            folders = backend.save_checkpoint_models(states, saved)
            return {key: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              trust_remote_code=cfg.models[key].trust_remote_code)
                    .state_dict() for key, folder in folders.items()}
    finally:
        backend.close()


def _verified_step(checkpoints: RunCheckpoints) -> int:
    """The step of ``checkpoints.latest`` once verified against its manifest; refused without one."""
    latest = checkpoints.latest
    if not latest.is_dir():
        partial = [p.name for p in (latest.with_name("latest.tmp"), latest.with_name("latest.old")) if p.exists()]
        if partial:
            raise CheckpointDamaged(f"{latest} is missing and {', '.join(partial)} is there (the run was killed while "
                                    "checkpointing); run the same `drmas train` command to recover and resume it, "
                                    "then export")
        raise CheckpointDamaged(f"{checkpoints.run_dir} has no checkpoint ({latest}); train it first")
    if not (latest / MANIFEST_NAME).is_file():
        raise CheckpointDamaged(f"{latest} has no {MANIFEST_NAME}, so it cannot be verified; drmas export writes "
                                "only verified checkpoints")
    return int(verify_checkpoint(latest)["step"])


def _export_model(cfg: RunConfig, key: str, weights: dict[str, Any], folder: Path,
                  card: Callable[[str], str]) -> str:
    """Model ``key``: its base (architecture, tokenizer) with the checkpoint's weights, saved as a Hugging Face
    folder at ``folder`` with the model card ``card(architecture)``; returns its architecture."""
    from drmas.models.factory import llama_equivalent, load_policy, save_policy
    from drmas.models.tokenizer import is_drmas_tokenizer

    base = cfg.models[key].path
    if base is None:
        raise ConfigError(f"models.{key}.path is not set in {cfg.run_dir / 'config.yaml'}: the run's base checkpoint "
                          "(architecture and tokenizer) is unknown")
    verify_artifact(base, f"models.{key}.path", required=cfg.train.verify_artifacts)
    try:
        model, tokenizer = load_policy(base)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"models.{key}.path={base}: the checkpoint the run started from (it gives the architecture "
                          f"and the tokenizer) does not load ({str(exc).splitlines()[0]}); restore it (`drmas sft "
                          "CONFIG` rebuilds an SFT'd base), or run drmas export from the folder the run's relative "
                          "paths start at") from None
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        detail = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise CheckpointDamaged(f"worker_{key}.pt does not fit models.{key}.path={base} ({detail[-1]}); the base was "
                                "replaced after the run: restore the one it was trained from") from None
    model.eval()
    trained = type(model).__name__
    if model.config.model_type == "qwen2" and is_drmas_tokenizer(tokenizer):
        model = llama_equivalent(model)
    arch = type(model).__name__ if trained == type(model).__name__ else f"{type(model).__name__} (trained as {trained})"
    save_policy(model, tokenizer, folder, extra_files={"README.md": card(arch)})
    _check_tokenizer(folder, tokenizer)
    return arch


def _check_tokenizer(folder: Path, tokenizer: Any) -> None:
    """``AutoTokenizer`` on the written folder must encode :data:`PROBE_TEXTS` as the run's tokenizer does."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(folder))
    bad = [t for t in PROBE_TEXTS if loaded.encode(t, add_special_tokens=False) != tokenizer.encode(t, add_special_tokens=False)]
    if bad:
        raise RuntimeError(f"{folder}: AutoTokenizer loads {type(loaded).__name__}, which encodes {bad[0]!r} other "
                           "than the run's tokenizer; the export would not tokenize as the run did")


def _evaluations(run_dir: Path, step: int) -> dict[str, dict[str, Any]]:
    """The run's evaluation records at ``step`` by benchmark (``eval.jsonl``; a later record replaces an earlier)."""
    path = run_dir / "eval.jsonl"
    records = read_jsonl(path) if path.exists() else []
    return {str(r["benchmark"]): r for r in records if int(r.get("step", -1)) == step}


def model_card(cfg: RunConfig, key: str, step: int, identity: str, evals: dict[str, dict[str, Any]],
               architecture: str) -> str:
    """The exported folder's ``README.md``: what the model is, where it comes from, how to load it."""
    agents = [a for a in cfg.agents if a.model == key]
    rows = [f"| {name} | {_fmt(r.get('avg'))} | {_fmt(r.get('pass'))} | {r.get('k', '')} | {r.get('n_tasks', '')} |"
            for name, r in sorted(evals.items())]
    scores = (["| benchmark | avg@k | pass@k | k | tasks |", "|---|---|---|---|---|", *rows] if rows
              else [f"No evaluation was recorded at step {step} (`drmas eval RUN` evaluates the checkpoint)."])
    return "\n".join([
        "---", "library_name: transformers", "tags: [drmas, multi-agent-rl]", "---", "",
        f"# {cfg.name} / {key}", "",
        f"Model `{key}` of the drmas run `{cfg.name}` (Dr. MAS: RL for multi-agent LLM systems), exported from its "
        f"checkpoint at step {step} by `drmas export`.", "",
        "| | |", "|---|---|",
        f"| run | `{cfg.run_dir}` |", f"| step | {step} of {cfg.train.steps} |",
        f"| agents | {', '.join(f'{a.name} ({a.role})' for a in agents)} |",
        f"| estimator | {cfg.algo.estimator} |", f"| config hash | `{identity}` |",
        f"| environment | {cfg.env.name} (orchestra {cfg.env.orchestra}) |",
        f"| architecture | {architecture} |", "",
        *(["A Qwen2 model with drmas's tokenizer is saved as the equal `LlamaForCausalLM` (zero output-projection "
           "bias): beside a `qwen2` config, `AutoTokenizer` would build `Qwen2Tokenizer`, whose NFC normalizer the "
           "run's tokenizer does not have.", ""] if "trained as" in architecture else []),
        f"## Evaluation at step {step}", "", *scores, "",
        "## Load", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'model = AutoModelForCausalLM.from_pretrained("{key}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{key}")', "```", "",
        "Serve it with vLLM: `vllm serve ./" + key + "`. The prompts each agent was trained on are rendered by its "
        "drmas agent class (`drmas.agents`).", ""])


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else ""
