"""The multi-agent RL trainer. One training step, as data (DESIGN.md):

    tasks ─► rollout (orchestra, batched agent calls: trainer/collect.py) ─► step table ─► rewards (team reward − penalty)
          ─► advantages (drmas.algos.compute_advantages) ─► per-worker-group clipped policy update

``Trainer.train_step`` is exactly that pipeline, one call per phase, each timed (``timing/*``).
Everything else (metrics, evaluation, checkpoints) lives around it.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from drmas.about import git_commit
from drmas.agents import make_agent
from drmas.algos import SpikeDetector, compute_advantages, step_classes
from drmas.checkpoints import verify_artifact
from drmas.config import RunConfig, config_record, dump_config
from drmas.config.identity import identity_record
from drmas.io import atomic_write_json, atomic_write_text, read_json_object
from drmas.devices import cpu_identity, describe, resolve_device
from drmas.orchestra import make_orchestra
from drmas.preflight import model_shapes
from drmas.rollout.base import SamplingParams
from drmas.loggers import MetricsSink
from drmas.progress import Progress
from drmas.trainer.metrics import closing_metrics, evaluation_metrics, spike_metrics, step_metrics, tool_metrics
from drmas.trainer.collect import AgentSlot, Collected, collect
from drmas.trainer.health import (DegenerateWatch, NonFiniteStop, NonFiniteWeights, WorkerGroupLost, identical_samples,
                                  nonfinite_models)
from drmas.trainer.run_folder import RunCheckpoints, claim_run_folder
from drmas.tasks import ToolFailure, make_task_source
from drmas.workers.base import WorkerDied, make_backend
from drmas.backends import BACKENDS
from drmas.workers.base import UpdateBatch, WorkerSpec

logger = logging.getLogger(__name__)


def worker_specs(cfg: RunConfig) -> dict[str, WorkerSpec]:
    """The run's worker groups (one per model key) as its backend builds them."""
    return {key: WorkerSpec(key, m, cfg.effective_optim(key), cfg.algo, seed=cfg.train.seed + i,
                            threads=cfg.train.threads, device=cfg.train.device, precision=cfg.train.precision)
            for i, (key, m) in enumerate(cfg.models.items())}


def _sampling(cfg) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens)


class Trainer:
    max_worker_restarts: int = 1
    """How often a run replaces its workers after one died (a Ray actor: ``WorkerDied``) and goes on from
    its last checkpoint; one more death stops it with ``WorkerGroupLost``."""

    def __init__(self, cfg: RunConfig, stale: str = "error"):
        """``stale``: what :meth:`train` does with a run folder made with another config
        (:func:`drmas.config.identity.check_run_folder`: error, rerun or keep)."""
        self.cfg = cfg
        self.stale = stale
        self.run_dir = cfg.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.source = make_task_source(cfg.env.name, **cfg.env.args)
        self.orchestra = make_orchestra(cfg.env.orchestra, **cfg.env.orchestra_args)
        agent_names = [a.name for a in cfg.agents]  # config order: the order of the logged spike keys
        if set(agent_names) != set(self.orchestra.slots):
            raise ValueError(f"orchestra {cfg.env.orchestra!r} needs agents named {list(self.orchestra.slots)}, "
                             f"the config defines {sorted(agent_names)}; rename or add agents")
        self.slots = {a.name: AgentSlot(make_agent(a.role, a.name), a.model, _sampling(a.sampling)) for a in cfg.agents}
        ev = cfg.train.eval_sampling
        self.eval_slots = {k: replace(s, sampling=replace(s.sampling, temperature=ev.temperature, top_p=ev.top_p,
                                                          top_k=ev.top_k)) for k, s in self.slots.items()}
        for path, key in {m.path: key for key, m in reversed(cfg.models.items()) if m.path}.items():
            verify_artifact(path, f"models.{key}.path", required=cfg.train.verify_artifacts)  # before any is loaded
        self.backend = make_backend(cfg.train.backend, worker_specs(cfg))
        self.capabilities = BACKENDS.get(cfg.train.backend).capabilities
        self.checkpoints = RunCheckpoints(self.run_dir, verify=cfg.train.verify_artifacts,
                                          keep_previous=cfg.train.keep_previous_checkpoint)
        self.sink = MetricsSink(self.run_dir, cfg.train.loggers, name=cfg.name, config=config_record(cfg))
        self.spikes = {name: SpikeDetector() for name in [*cfg.models, *agent_names]}
        self.invalid_penalties = cfg.invalid_penalties()
        self.consecutive_nonfinite = 0
        self.degenerate = DegenerateWatch.for_run(cfg.train.steps)
        self.step = 0
        self.progress = True
        """Progress of the steps and evaluations (:class:`drmas.progress.Progress`); :meth:`train` sets it."""

    # -------------------------------------------------------------------------------- one RL step
    def rollout(self, step: int, make_env: Callable[[], Any] | None = None) -> Collected:
        """Step ``step``'s training rollout: its task batch and rollout seed (``make_env`` defaults to the
        task source's; experiments/probe_search.py passes one that keeps the environments)."""
        cfg = self.cfg
        tasks = self.source.train_tasks(step, cfg.train.batch_tasks, seed=cfg.train.seed)
        return collect(tasks, cfg.train.group_size, self.orchestra, make_env or self.source.make_env, self.slots,
                       self.backend.generators(), seed=cfg.train.seed * 1_000_003 + step)

    def train_step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        timings: dict[str, float] = {}
        before = self.source.tool_counts()
        with _timed(timings, "rollout"):
            rollout = self.rollout(step)
            table = rollout.table
        tools = self._tool_check(before, f"step {step}")  # before the update: failed tools are not learnt from
        with _timed(timings, "rewards"):
            table.assign_rewards(rollout.traj_reward, self.invalid_penalties)
        with _timed(timings, "advantages"):
            adv = compute_advantages(table.score, table.task, table.agent, table.traj, estimator=cfg.algo.estimator,
                                     **asdict(cfg.algo.conventions()))
            table.advantage = adv.advantages.double().numpy()
        with _timed(timings, "update"):
            update = self.backend.update({wg: self._update_batch(table, wg) for wg in cfg.models},
                                         step_seed=cfg.train.seed * 7919 + step)
        self._check_weights(update, step)
        classes = step_classes(table.task, table.agent, table.prompt_ids, table.response_ids)
        metrics = step_metrics(rollout, update, cfg.algo.estimator, classes)
        metrics.update(spike_metrics(self.spikes, metrics))  # advances the spike detectors by this step
        metrics.update(closing_metrics(rollout, update, timings, metrics, self.orchestra))
        self.degenerate.observe(step, metrics, identical_samples(table.task, table.traj, classes))
        return {**metrics, **tool_metrics(tools)}

    def _check_weights(self, update: dict[str, dict[str, Any]], step: int) -> None:
        """Stop before step ``step`` is recorded when an update left a model's weights non-finite."""
        bad = nonfinite_models(update)
        if bad:
            last = self.checkpoints.last_step()
            where = (f"the last checkpoint is {self.ckpt_dir} (step {last})" if last is not None
                     else "there is no checkpoint yet")
            lrs = ", ".join(f"{wg} lr={self.cfg.effective_optim(wg).lr:g}" for wg in bad)
            raise NonFiniteWeights(f"model {', '.join(bad)}: the weights are non-finite (NaN/inf) after the update of "
                                   f"step {step} ({lrs}); stopped before recording step {step}: the records in "
                                   f"{self.run_dir / 'metrics.jsonl'} end at step {step - 1} and {where}. Lower the "
                                   "learning rate, or check the rewards and the checkpoint the run started from")

    def _tool_check(self, before: dict[str, Any], what: str) -> dict[str, tuple[int, int]]:
        """(calls, failures) per tool since ``before``; raises :class:`ToolFailure` when a tool's failure
        share passes ``train.max_tool_failure_rate``."""
        limit = self.cfg.train.max_tool_failure_rate
        out = {}
        for tool, now in self.source.tool_counts().items():
            calls = now.calls - (before[tool].calls if tool in before else 0)
            failures = now.failures - (before[tool].failures if tool in before else 0)
            out[tool] = (calls, failures)
            if calls and failures / calls > limit:
                last = self.checkpoints.last_step()
                where = f"the last checkpoint is step {last}" if last is not None else "there is no checkpoint yet"
                raise ToolFailure(f"{what}: {tool} failed on {failures} of {calls} calls ({failures / calls:.0%} > "
                                  f"train.max_tool_failure_rate={limit:g}; last error: {now.last_error}); stopped "
                                  f"before recording or learning from it ({where}); fix the tool and run the same "
                                  "command again to resume")
        return out

    def _update_batch(self, table, wg: str) -> UpdateBatch:
        rows = np.flatnonzero(table.wg == wg)
        temps = np.array([self.slots[a].sampling.temperature for a in table.agent[rows]], np.float64)
        tags = np.array([self.slots[a].agent.control_tag for a in table.agent[rows]], object)
        return UpdateBatch([table.prompt_ids[i] for i in rows], [table.response_ids[i] for i in rows],
                           table.advantage[rows].astype(np.float32), table.agent[rows], temps, tags)

    # ------------------------------------------------------------------------------- evaluation
    def evaluate(self, step: int, record: bool = True) -> dict[str, Any]:
        """avg@k / pass@k on every evaluation set; ``record`` appends them to eval.jsonl."""
        cfg = self.cfg
        t0 = time.perf_counter()
        k = cfg.train.eval_samples
        sets = self.source.eval_sets(cfg.train.eval_tasks)
        tasks = [t for ts in sets.values() for t in ts]  # one batched rollout for every benchmark
        before = self.source.tool_counts()
        with Progress(len(tasks) * k, f"eval step {step}", unit="episode", enabled=self.progress, log=logger,
                      leave=False) as bar:
            rollout = collect(tasks, k, self.orchestra, self.source.make_env, self.eval_slots,
                              self.backend.generators(), seed=10_000_019 + step, on_call=bar.advance_to)
            bar.advance_to(len(tasks) * k)
        tools = {t: n for t, n in self._tool_check(before, f"evaluation at step {step}").items() if n[1]}
        bounds = np.cumsum([0] + [len(ts) for ts in sets.values()]) * k  # trajectories are task-major
        records = {name: evaluation_metrics(rollout.traj_reward[lo:hi], k)
                   for name, lo, hi in zip(sets, bounds[:-1], bounds[1:])}
        for name, rec in records.items():
            if record:
                self.sink.write_eval({"step": step, "benchmark": name, **rec,
                                      **({"tool_failures": {t: n[1] for t, n in tools.items()}} if tools else {})})
        if record:
            self.sink.write_eval_average(step, records.values())
        logger.info("eval step %d: %s (%.1fs)", step,
                    ", ".join(f"{k} avg@{cfg.train.eval_samples}={v['avg']:.3f} pass={v['pass']:.3f}" for k, v in records.items()),
                    time.perf_counter() - t0)
        return records

    # ------------------------------------------------------------------------------ the run
    def train(self, progress: bool = True) -> dict[str, Any]:
        """Resume (or start), run the remaining steps, evaluate and checkpoint at the end, write ``DONE``.
        A dead worker group is replaced and the run goes on from its last checkpoint (deterministic, so
        the records are those of an uninterrupted run), at most ``max_worker_restarts`` times."""
        self.progress = progress
        with claim_run_folder(self.cfg, self.stale) as kept:  # one writer; records of another config are not relabelled
            self.source.check_tools()  # a retrieval server that does not answer stops the run before step 0
            self.sink.open()  # so does a logger that cannot start
            self._write_manifest(kept)
            restarts = 0
            while True:
                try:
                    last = self._run(self._resume(), progress)
                    break
                except WorkerDied as exc:
                    restarts += 1
                    self._replace_workers(exc, restarts)
            causes = list(self.degenerate.causes.values())
            atomic_write_json(self.run_dir / "DONE", {"steps": self.cfg.train.steps, "time": time.time(),
                                                      **({"degenerate": causes} if causes else {})})
        self.sink.close()
        return last

    def _replace_workers(self, exc: WorkerDied, restarts: int) -> None:
        """After a worker group died: fresh workers and trainer state, to be resumed from the last
        checkpoint; or, past the restart budget (or on a backend that cannot restart), stop."""
        ckpt = self.checkpoints.recover()
        where = f"its last checkpoint (step {ckpt}) is {self.ckpt_dir}" if ckpt else "it has no checkpoint yet"
        if restarts > self.max_worker_restarts or not self.capabilities.restart:
            self.sink.close()
            raise WorkerGroupLost(f"{exc} (during step {self.step}); the run stopped after {restarts - 1} worker "
                                  f"restart(s): {where}. Check the worker's log (memory, GPU), then start the same "
                                  "command again to resume from it") from exc
        logger.warning("%s (during step %d); replacing the workers and resuming from the last checkpoint (step %d)",
                       exc, self.step, ckpt)
        self.backend.restart()
        self.spikes = {name: SpikeDetector() for name in self.spikes}
        self.consecutive_nonfinite = 0
        self.degenerate = DegenerateWatch.for_run(self.cfg.train.steps)

    def _run(self, start: int, progress: bool) -> dict[str, Any]:
        """Steps ``start`` .. ``train.steps`` - 1 with their evaluations and checkpoints, then the final
        evaluation and checkpoint; returns the last step's metrics."""
        cfg = self.cfg
        evaluating = cfg.train.evaluate
        if start == 0 and evaluating:
            self.evaluate(0)
        bar = Progress(cfg.train.steps, "rl", enabled=progress, initial=start, log=logger)
        last: dict[str, Any] = {}
        for step in bar.iterate(range(start, cfg.train.steps)):
            self.step = step
            metrics = self.train_step(step)
            self.sink.write_step(step, metrics)
            last = metrics
            self._check_nonfinite(metrics, step)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
            done = step + 1
            if evaluating and cfg.train.eval_every and done % cfg.train.eval_every == 0 and done < cfg.train.steps:
                self.evaluate(done)
            if cfg.train.save_every and done % cfg.train.save_every == 0 and done < cfg.train.steps:
                self._checkpoint(done)
        if start < cfg.train.steps or (evaluating and not (self.run_dir / "eval.jsonl").exists()):
            if evaluating:
                self.evaluate(cfg.train.steps)
            self._checkpoint(cfg.train.steps)
        return last

    def _check_nonfinite(self, metrics: dict[str, Any], step: int) -> None:
        skipped = any(v > 0 for k, v in metrics.items() if k.endswith("/skipped"))
        self.consecutive_nonfinite = self.consecutive_nonfinite + 1 if skipped else 0
        if self.consecutive_nonfinite >= self.cfg.train.max_nonfinite_skips:
            self._checkpoint(step + 1)
            raise NonFiniteStop(f"{self.consecutive_nonfinite} consecutive steps with a non-finite gradient "
                                f"norm (last at step {step}); stopped with a checkpoint in {self.run_dir}. "
                                "Lower the learning rate or check the rewards.")

    # ------------------------------------------------------------------------------ checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.checkpoints.latest

    def _checkpoint(self, step: int) -> None:
        """Checkpoint the worker groups and the trainer's own state (step, non-finite streak, spike
        detectors) at ``step`` (:meth:`RunCheckpoints.write`)."""
        trainer_state = {"step": step, "consecutive_nonfinite": self.consecutive_nonfinite,
                         "spikes": {k: (list(d.history), d.count) for k, d in self.spikes.items()},
                         "degenerate": self.degenerate.state()}
        states = self.backend.get_states()  # before writing: a worker that died is WorkerDied, not a write error
        self.checkpoints.write(step, states, trainer_state)

    def load_checkpoint(self) -> int:
        """Restore workers and trainer state from ``checkpoints/latest`` after verifying it against its
        manifest (:meth:`RunCheckpoints.recover`); returns its step (0 if none)."""
        if not self.checkpoints.recover():
            return 0
        state, worker_states = self.checkpoints.load(list(self.cfg.models))
        self.backend.set_states(worker_states)
        self.consecutive_nonfinite = state["consecutive_nonfinite"]
        self.degenerate.load(state.get("degenerate"))
        for k, (hist, count) in state["spikes"].items():
            self.spikes[k].history.extend(hist)
            self.spikes[k].count = count
        logger.info("loaded %s (step %d)", self.ckpt_dir, state["step"])
        return int(state["step"])

    def _resume(self) -> int:
        """Continue from the latest checkpoint: records written after it (by a killed run) are dropped."""
        step = self.load_checkpoint()
        self.sink.truncate(after_step=step - 1)
        return step

    def _write_manifest(self, kept_changes: list[str] = ()) -> None:
        import platform

        import transformers

        before = read_json_object(self.run_dir / "manifest.json") or {}
        previous = before.get("config_changes_kept", [])
        # every CPU the run has trained on, the first one drew step 0 (twins are compared by it)
        machines = list(before.get("machines", []))
        if (cpu := cpu_identity()) not in machines:
            machines.append(cpu)
        manifest = {
            **identity_record(self.cfg, [*previous, *kept_changes]),
            "name": self.cfg.name, "config": json.loads(self.cfg.model_dump_json()),
            "effective_agents": self.cfg.effective_agents(),
            "effective_optim": {k: self.cfg.effective_optim(k).model_dump() for k in self.cfg.models},
            "model_shapes": model_shapes(self.cfg),  # what `drmas eval` checks before it loads a checkpoint
            "seeds": {"train": self.cfg.train.seed},
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__, "numpy": np.__version__},
            "git_commit": git_commit(), "argv": sys.argv, "device": describe(resolve_device(self.cfg.train.device)),
            "machines": machines,
        }
        atomic_write_json(self.run_dir / "manifest.json", manifest, indent=2, default=str)
        atomic_write_text(self.run_dir / "config.yaml", dump_config(self.cfg))

    def close(self) -> None:
        self.backend.close()
        self.source.close()


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0

