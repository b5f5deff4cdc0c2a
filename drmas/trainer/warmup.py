"""SFT warm-up of tiny models from scratch (the CPU embedded default).

For every checkpoint ``path`` of a run that does not exist yet: train a byte-level BPE tokenizer on the
task source's role traces (one tokenizer per task source, cached), build a Qwen2-architecture policy of
the model's ``preset``, fine-tune it on the traces of its roles (``sft_roles``, default: the roles of
the agents mapped to it), each rendered with that role's own prompt (so RL sees exactly the formats SFT
taught), and save it to ``path``. Models naming the same path share one SFT run: the CPU grid gives
every agent of every setting one base checkpoint that knows all roles, as the paper starts every agent
from the same pre-trained model.

The SFT runs on ``train.device`` at ``train.precision`` (drmas/devices.py); the model is built on the CPU
from its seed and then moved, so a checkpoint's initial weights do not depend on the device.
"""
from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import signal
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from drmas.agents import AgentView, make_agent
from drmas.checkpoints import build_record, check_base_checkpoint, verify_artifact, write_manifest
from drmas.config import ConfigError, RunConfig
from drmas.plugins import init_worker, loaded_plugins
from drmas.shutdown import ctrl_c_left_to_me
from drmas.tasks import TASK_SOURCES, TaskSource, make_task_source
from envs.base import Task

logger = logging.getLogger(__name__)


def _task(obj: Any) -> Task:
    if isinstance(obj, Task):
        return obj
    return Task(task_id=str(obj["task_id"]), question=obj["question"], answers=tuple(obj["answers"]),
                source=obj.get("source", ""), meta=obj.get("meta", {}))


def model_roles(cfg: RunConfig, model_key: str) -> list[str]:
    """The agent roles a model's SFT warm-up teaches: its ``sft_roles``, else the roles of its agents."""
    roles = cfg.models[model_key].sft_roles
    return list(roles) if roles else list(dict.fromkeys(a.role for a in cfg.agents_of(model_key)))


def render_examples(records: list[dict[str, Any]], roles: list[str], source: TaskSource) -> list[tuple[str, str]]:
    """(prompt, target) pairs of the records whose agent role is in ``roles``, each prompt rendered by an
    agent of that role (so RL sees exactly the formats SFT taught)."""
    agents = {role: make_agent(role, role) for role in roles}
    examples = []
    for rec in records:
        role = source.agent_role_of(rec)
        if role not in agents:
            continue
        context = rec.get("context", {})
        team = {k: v for k, v in context.items() if isinstance(v, str) and k != "history_text"}
        view = AgentView(_task(rec["task"]), history=context.get("history_text", ""), team=team)
        examples.append((agents[role].prompt(view), rec["target"]))
    return examples


def trace_args(cfg: RunConfig) -> dict[str, Any]:
    """``TaskSource.trace_args`` of the run's task source (what shapes its SFT traces)."""
    return TASK_SOURCES.get(cfg.env.name).trace_args(**cfg.env.args)


def checkpoints_to_build(cfg: RunConfig) -> dict[str, tuple[str, list[str], list[str]]]:
    """Missing checkpoint path -> (preset, roles, model keys). Models naming one path share one SFT run
    and must agree on the preset and roles (a :class:`ConfigError` where they do not, or where a built base is not
    what the config asks: ``drmas train`` calls it before it claims the run folder)."""
    plan: dict[str, tuple[str, list[str], list[str]]] = {}
    traces = trace_args(cfg)  # what shapes the task source's SFT traces (one record for every base)
    for key, m in cfg.models.items():
        if m.path is None:
            raise ConfigError(f"models.{key}.path: set where the warmed-up checkpoint goes")
        if not m.preset:
            continue  # a pre-trained checkpoint (local folder or hub id) loaded as it is
        roles = model_roles(cfg, key)
        if (Path(m.path) / "config.json").exists():  # built already: from this sft block and traces, undamaged?
            check_base_checkpoint(m.path, build_record(m.preset, roles, cfg.sft.model_dump(), traces), key,
                                  required=cfg.train.verify_artifacts)
            continue
        if m.path in plan:
            preset, other_roles, keys = plan[m.path]
            if (preset, sorted(other_roles)) != (m.preset, sorted(roles)):
                raise ConfigError(f"models {keys[0]!r} and {key!r} share path {m.path} but would warm it up "
                                  f"differently (preset {preset} vs {m.preset}, roles {other_roles} vs {roles}); "
                                  "give them the same `preset` and `sft_roles`, or different paths")
            keys.append(key)
        else:
            plan[m.path] = (m.preset, roles, [key])
    return plan


def warmup(cfg: RunConfig, progress: bool = True) -> dict[str, Any]:
    """Build and SFT every missing checkpoint (once per path); returns per-checkpoint SFT metrics."""
    if not checkpoints_to_build(cfg):
        return {}
    # one warm-up at a time per task source (runs of a grid may start together): the second waits, then
    # finds the checkpoints built and returns
    with _exclusive(Path(cfg.sft.tokenizer_dir).parent / ".warmup.lock"):
        return _warmup_locked(cfg, progress)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _warmup_locked(cfg: RunConfig, progress: bool) -> dict[str, Any]:
    from drmas.models.factory import written_folder
    from drmas.models.sft import SFTConfig
    from drmas.models.tokenizer import save_tokenizer, train_bytelevel_bpe

    plan = checkpoints_to_build(cfg)
    if not plan:
        return {}
    source = make_task_source(cfg.env.name, **cfg.env.args)
    source.check_tools()  # traces drawn through a dead retrieval server would teach "search unavailable"
    sft = cfg.sft
    records = source.role_traces(sft.traces, seed=sft.seed)
    tok_dir = Path(sft.tokenizer_dir)
    if not (tok_dir / "tokenizer.json").exists():
        # every role of the task source: one tokenizer serves every checkpoint of the source
        all_roles = sorted({r for rec in records if (r := source.agent_role_of(rec))})
        texts = [p + t for p, t in render_examples(records, all_roles, source)]
        tokenizer = train_bytelevel_bpe(texts, vocab_size=sft.vocab_size)
        with written_folder(tok_dir) as tmp:  # an existing tok_dir is a crashed attempt's leftover (no tokenizer.json)
            save_tokenizer(tokenizer, tmp)
            write_manifest(tmp)
    else:
        verify_artifact(tok_dir, "sft.tokenizer_dir", required=cfg.train.verify_artifacts)
    traces = trace_args(cfg)
    jobs = []
    # every checkpoint gets the same seed: a checkpoint depends on its preset, roles and the sft block, not
    # on which config builds it or its position there (with seed + position, the search nano base came
    # out different when search_hetero.yaml built it than when search_base.yaml did: avg@4 0.18 vs 0.62)
    for path, (preset, roles, keys) in plan.items():
        examples = render_examples(records, roles, source)
        if not examples:
            raise ValueError(f"no SFT traces for roles {roles} (models {keys}) in task source {cfg.env.name!r}")
        jobs.append(_SFTJob("+".join(keys), preset, path, str(tok_dir), examples,
                            build_record(preset, roles, sft.model_dump(), traces),
                            SFTConfig(lr=sft.lr, steps=sft.steps, batch_size=sft.batch_size, seed=sft.seed,
                                      warmup_steps=sft.warmup_steps, precision=cfg.train.precision),
                            cfg.train.threads, cfg.train.device))
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return dict(_run_sft_job(job, progress) for job in jobs)
    # one process per checkpoint (1 torch thread each): two checkpoints on 2 cores take the time of one
    logger.info("SFT warm-up of %d checkpoints in %d parallel processes", len(jobs), workers)
    # a worker ends with the warm-up's process, even one killed by SIGKILL (no orphan keeps training), and imports
    # the plug-ins this process imported (their agent roles, task sources and classes are known there too)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker,
                             initargs=(os.getpid(), signal.SIGKILL, loaded_plugins(),
                                       logging.getLogger().getEffectiveLevel())) as pool:
        # progress as timed log lines (bar=False): the bars of parallel processes would overwrite each other;
        # the workers start (at the first submit) deaf to a terminal's Ctrl-C: this process ends them
        with ctrl_c_left_to_me():
            results = pool.map(_run_sft_job, jobs, [progress] * len(jobs), [False] * len(jobs))
        return dict(results)


@dataclass(frozen=True)
class _SFTJob:
    key: str
    preset: str
    path: str
    tokenizer_dir: str
    examples: list[tuple[str, str]]
    build: dict[str, Any]  # drmas.checkpoints.build_record, kept in the checkpoint's manifest
    sft: Any
    threads: int
    device: str = "cpu"


def _run_sft_job(job: _SFTJob, progress: bool, bar: bool | None = None) -> tuple[str, dict[str, Any]]:
    """Build, fine-tune and save one model (runs in a worker process when several models warm up); ``progress``
    and ``bar`` are :class:`drmas.progress.Progress`'s."""
    import torch

    from drmas.devices import describe, resolve_device
    from drmas.models.factory import build_policy, count_parameters, save_policy
    from drmas.models.sft import sft_train
    from drmas.models.tokenizer import load_tokenizer

    if job.threads:
        torch.set_num_threads(job.threads)
    tokenizer = load_tokenizer(job.tokenizer_dir)
    device = resolve_device(job.device)
    model = build_policy(job.preset, tokenizer, seed=job.sft.seed).to(device)
    logger.info("SFT warm-up of %s (%s, %d params) on %d examples, on %s", job.key, job.preset,
                count_parameters(model), len(job.examples), describe(device))
    metrics = sft_train(model, tokenizer, job.examples, job.sft, progress=progress, desc=f"sft {job.key}", bar=bar)
    save_policy(model, tokenizer, job.path, built_by=job.build)  # atomic (temporary folder, then rename)
    return job.key, {**metrics, "examples": len(job.examples), "params": count_parameters(model)}
