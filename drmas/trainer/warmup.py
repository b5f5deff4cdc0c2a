"""SFT warm-up of tiny models from scratch (the CPU embedded default).

For every model of a run whose checkpoint ``path`` does not exist yet: train a byte-level BPE tokenizer
on the task source's role traces (one tokenizer per task source, cached), build a Qwen2-architecture
policy of the model's ``preset``, fine-tune it on the traces of the agents mapped to it, rendered with
those agents' own prompts (so RL sees exactly the formats SFT taught), and save it to ``path``.
Sharing: one model learns every role; non-sharing: each model learns its agent's role.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas.agents import AgentView, make_agent
from drmas.config import RunConfig
from drmas.trainer.tasks import TaskSource, make_task_source
from envs.base import Task

logger = logging.getLogger(__name__)


def _task(obj: Any) -> Task:
    if isinstance(obj, Task):
        return obj
    return Task(task_id=str(obj["task_id"]), question=obj["question"], answers=tuple(obj["answers"]),
                source=obj.get("source", ""), meta=obj.get("meta", {}))


def render_examples(records: list[dict[str, Any]], cfg: RunConfig, source: TaskSource, model_key: str) -> list[tuple[str, str]]:
    """(prompt, target) pairs for the agents of ``model_key``, prompts rendered by those agents."""
    agents = {a.name: make_agent(a.role, a.name) for a in cfg.agents_of(model_key)}
    examples = []
    for rec in records:
        slot = source.trace_slots.get(rec["role"], rec["role"])
        if slot not in agents:
            continue
        context = rec.get("context", {})
        team = {k: v for k, v in context.items() if isinstance(v, str) and k != "history_text"}
        view = AgentView(_task(rec["task"]), history=context.get("history_text", ""), team=team)
        examples.append((agents[slot].prompt(view), rec["target"]))
    return examples


def warmup(cfg: RunConfig, progress: bool = True) -> dict[str, Any]:
    """Build and SFT every model whose ``path`` is missing; returns per-model SFT metrics."""
    from drmas.models.sft import SFTConfig
    from drmas.models.tokenizer import load_tokenizer, save_tokenizer, train_bytelevel_bpe

    missing = [k for k, m in cfg.models.items() if m.path is None or not (Path(m.path) / "config.json").exists()]
    if not missing:
        return {}
    source = make_task_source(cfg.env.name, **cfg.env.args)
    sft = cfg.sft
    records = source.role_traces(sft.traces, seed=sft.seed)
    tok_dir = Path(sft.tokenizer_dir)
    if not (tok_dir / "tokenizer.json").exists():
        texts = []
        for key in cfg.models:
            texts += [p + t for p, t in render_examples(records, cfg, source, key)]
        tokenizer = train_bytelevel_bpe(texts, vocab_size=sft.vocab_size)
        save_tokenizer(tokenizer, tok_dir)
    jobs = []
    for i, key in enumerate(missing):
        model_cfg = cfg.models[key]
        if model_cfg.path is None:
            raise ValueError(f"models.{key}.path: set where the warmed-up checkpoint goes")
        if not model_cfg.preset:
            raise ValueError(f"models.{key}: checkpoint {model_cfg.path} is missing and no `preset` is set to build one")
        examples = render_examples(records, cfg, source, key)
        if not examples:
            raise ValueError(f"no SFT traces for the agents of model {key!r} "
                             f"({[a.name for a in cfg.agents_of(key)]}) in task source {cfg.env.name!r}")
        jobs.append(_SFTJob(key, model_cfg.preset, model_cfg.path, str(tok_dir), examples,
                            SFTConfig(lr=sft.lr, steps=sft.steps, batch_size=sft.batch_size, seed=sft.seed + i,
                                      warmup_steps=sft.warmup_steps), cfg.train.threads))
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return dict(_run_sft_job(job, progress) for job in jobs)
    # one process per model (1 torch thread each): two models on 2 cores take the time of one
    logger.info("SFT warm-up of %d models in %d parallel processes", len(jobs), workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(pool.map(_run_sft_job, jobs, [False] * len(jobs)))


@dataclass(frozen=True)
class _SFTJob:
    key: str
    preset: str
    path: str
    tokenizer_dir: str
    examples: list[tuple[str, str]]
    sft: Any
    threads: int


def _run_sft_job(job: _SFTJob, progress: bool) -> tuple[str, dict[str, Any]]:
    """Build, fine-tune and save one model (runs in a worker process when several models warm up)."""
    import torch

    from drmas.models.factory import build_policy, count_parameters, save_policy
    from drmas.models.sft import sft_train
    from drmas.models.tokenizer import load_tokenizer

    if job.threads:
        torch.set_num_threads(job.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    tokenizer = load_tokenizer(job.tokenizer_dir)
    model = build_policy(job.preset, tokenizer, seed=job.sft.seed)
    logger.info("SFT warm-up of %s (%s, %d params) on %d examples", job.key, job.preset, count_parameters(model),
                len(job.examples))
    metrics = sft_train(model, tokenizer, job.examples, job.sft, progress=progress)
    save_policy(model, tokenizer, job.path)
    return job.key, {**metrics, "examples": len(job.examples), "params": count_parameters(model)}
