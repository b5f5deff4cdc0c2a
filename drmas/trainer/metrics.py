"""Metrics of one RL step and of an evaluation, and the sink that writes them (JSONL, always; the loggers of
``train.loggers``: TensorBoard, W&B).

Logged keys (every step; ``{k}`` = agent name, ``{m}`` = worker group / model key):

==================================== ==========================================================================
key                                  definition
==================================== ==========================================================================
reward/mean, reward/std              outcome reward R over trajectories
score/mean                           score = R − c·(1 − valid) over steps
agent/{k}/reward_mean, _std          μk, σk: mean/std (ddof=1) of agent k's step scores, averaged over task groups
task/mu, task/sigma                  μ, σ: trajectory-level task statistics of Eq. 2, averaged over task groups
agent/{k}/lemma_factor               Lemma 4.2 factor F_k = (σk² + (μk − μb)²) / σb² of agent k under the baseline
                                     (μb, σb) of the run's own estimator, on the values that estimator normalizes
                                     (trajectory GRPO: trajectory-mean scores; penalties included), per task group
                                     (population moments, groups with σb > 0), averaged over groups
                                     (``drmas.algos.lemma_factors``); _max: the largest group's; = 1 under Dr. MAS
agent/{k}/lemma_factor_{b}           the same under the global baselines b = trajectory_grpo, pooled_grpo
                                     (what a global baseline would do to this batch, whatever the run uses)
agent/{k}/distinct_share              share of distinct (prompt, response) token-id pairs among agent k's steps in a task
                                     group (identical pairs share one per-sample gradient), averaged over groups
agent/{k}/class_factor_{b}           class-aware factor Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(drmas)², S_c = Σ_{i∈c} A_i over a
                                     class c of identical (prompt, response) pairs, for b = trajectory_grpo,
                                     pooled_grpo: the predicted squared grad-norm ratio b / Dr. MAS with orthogonal,
                                     equal-norm class gradients (``drmas.algos.class_factors``; docs/theory.md)
agent/{k}/adv_mean, _std, _m2        moments of agent k's advantages (_m2 = realized E_k[A²] of the run's estimator
                                     over the batch); _absmax: max |A|
agent/{k}/steps                      |Yk| summed over the batch; /invalid_rate, /truncated_rate, /response_len
agent/{k}/calls_per_traj             agent k's calls per trajectory (|Yk| / trajectories; 0 in a step it was not called; the paper's collapse: the
                                     Search agent no longer called)
agent/{k}/entropy                    token-mean entropy of agent k's responses under the policy being updated
agent/{k}/control_prob, _min         mean (min) probability of the sampled control token of agent k's responses
                                     under the policy that sampled them: the token holding the first non-blank
                                     character after ``Agent.control_tag`` (<verify>: the verdict; <search>: the
                                     query's start; <answer>; \\boxed{}); rows without the tag left out
agent/{k}/grad_norm                  pre-clip norm of agent k's contribution to its model's gradient (max over
                                     mini-batches); /spike_ratio, /spike: the spike statistic (docs/algorithms.md)
wg/{m}/grad_norm                     pre-clip gradient norm of model m (max over mini-batches); /spike
wg/{m}/loss, clip_frac, entropy,     policy loss terms (mean over mini-batches); approx_kl_old = E[(r − 1) − log r]
  approx_kl_old, lr, skipped         skipped: optimizer steps skipped for a non-finite gradient
wg/{m}/update_norm                   ||θ_after − θ_before|| of model m's optimizer step (mean over mini-batches; 0 when
                                     skipped): how far the weights moved, after the clip and AdamW's normalisation
timing/rollout, rewards, advantages,  seconds per phase; timing/step = their sum; timing/generate/{m}: generation
  update, step                       seconds per model
tokens/{k}                           prompt + response tokens of agent k's calls (cost accounting)
tools/{tool}/calls                   calls of a tool during the step (tool = retrieval: queries sent to the retrieval
                                     server; grader: answers graded); logged when the task source has the tool
tools/{tool}/failures                of those, the calls that failed after the tool's own retries (retrieval: no
                                     answer, 5xx, malformed; grader: workers that died or did not start): scored 0 /
                                     "search unavailable", so a step with failures has degraded rewards
actor/{m}/grad_norm, pg_loss, ...    W&B only: the reference code's names of wg/{m}/grad_norm, loss, clip_frac
                                     (pg_clipfrac), entropy, approx_kl_old (ppo_kl), lr (``reference_names``)
train/nonfinite, train/skipped       worker groups whose pre-clip gradient norm is non-finite / whose optimizer
                                     step was skipped (sum of wg/{m}/skipped) this step
search/answered_without_search       search orchestras: share of trajectories answered with no search step;
search/unanswered                    share that ended without an answer (the turn budget used up)
search/verifier_yes_turn{t}          search hierarchy: the Verifier's yes rate at turn t; _after_miss, _after_hit:
search/verifier_yes_after_miss, _hit at a turn whose preceding search missed (ranks k+1..2k) / retrieved the top k
math/reject_rate, math/solver_rounds math loop: share of Verifier calls that rejected; Solver calls per trajectory
==================================== ==========================================================================

The ``search/*`` and ``math/*`` keys come from the run's orchestra (``Orchestra.behavior_metrics``), the others
from every run.
"""
from __future__ import annotations

import logging
import math
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pandas as pd

from drmas.algos import SpikeDetector, class_factors, lemma_factors, step_classes
from drmas.io import append_jsonl, atomic_write_text, read_jsonl_lines, write_jsonl
from drmas.registry import Registry
from drmas.step_table import StepTable
from drmas.trainer.collect import Collected

if TYPE_CHECKING:  # the type only: the metrics do not depend on the orchestras
    from drmas.orchestra.base import Orchestra

logger = logging.getLogger(__name__)


GLOBAL_BASELINES = ("trajectory_grpo", "pooled_grpo")
"""Estimators whose baseline is logged as ``lemma_factor_{b}`` in every run, for comparison."""


def _agent_reward_stats(table: StepTable, traj_reward: np.ndarray, traj_task: np.ndarray) -> dict[str, float]:
    """μk, σk (agent k's step scores) and μ, σ (trajectory outcomes), per task group, averaged over groups."""
    steps = pd.DataFrame({"task": table.task, "agent": table.agent, "score": table.score})
    trajs = pd.DataFrame({"task": traj_task, "R": traj_reward})
    task = trajs.groupby("task")["R"].agg(mu="mean", sigma="std")
    agent = steps.groupby(["task", "agent"])["score"].agg(mu_k="mean", sigma_k="std")
    out: dict[str, float] = {"task/mu": float(task["mu"].mean()), "task/sigma": float(task["sigma"].mean(skipna=True))}
    for name, g in agent.groupby(level="agent"):
        out[f"agent/{name}/reward_mean"] = float(g["mu_k"].mean())
        out[f"agent/{name}/reward_std"] = float(g["sigma_k"].mean(skipna=True))
    return out


def _lemma_factor_stats(table: StepTable, estimator: str) -> dict[str, float]:
    """``lemma_factor`` (mean over task groups, and ``_max``) under the run's estimator, and
    ``lemma_factor_{b}`` under each global baseline b (see the module table)."""
    out: dict[str, float] = {}
    for baseline in dict.fromkeys([estimator, *GLOBAL_BASELINES]):
        per_group = lemma_factors(table.score, table.task, table.agent, table.traj, baseline)
        by_agent = per_group.groupby("agent")["factor"]
        means, maxes = by_agent.mean(), by_agent.max()
        for name in dict.fromkeys(table.agent):
            mean = float(means.get(name, np.nan))
            if baseline == estimator:
                out[f"agent/{name}/lemma_factor"] = mean
                out[f"agent/{name}/lemma_factor_max"] = float(maxes.get(name, np.nan))
            if baseline in GLOBAL_BASELINES:
                out[f"agent/{name}/lemma_factor_{baseline}"] = mean
    return out


def _class_stats(table: StepTable) -> dict[str, float]:
    """``distinct_share`` and ``class_factor_{b}`` of every agent (see the module table)."""
    classes = step_classes(table.task, table.agent, table.prompt_ids, table.response_ids)
    per_agent = class_factors(table.score, table.task, table.agent, table.traj, classes, GLOBAL_BASELINES)
    out: dict[str, float] = {}
    for name, row in per_agent.iterrows():
        out[f"agent/{name}/distinct_share"] = float(row["distinct"])
        out.update({f"agent/{name}/class_factor_{b}": float(row[f"factor_{b}"]) for b in GLOBAL_BASELINES})
    return out


def step_metrics(table: StepTable, rollout: Collected, update: dict[str, dict[str, Any]],
                 timings: dict[str, float], spikes: dict[str, SpikeDetector], estimator: str,
                 orchestra: Orchestra | None = None) -> dict[str, Any]:
    n_traj = len(rollout.traj_reward)
    m: dict[str, Any] = {
        "reward/mean": float(rollout.traj_reward.mean()), "reward/std": float(rollout.traj_reward.std()),
        "score/mean": float(table.score.mean()) if len(table) else float("nan"),
        "steps": len(table),
    }
    m.update(_agent_reward_stats(table, rollout.traj_reward, rollout.traj_task))
    if len(table):
        m.update(_lemma_factor_stats(table, estimator))
        m.update(_class_stats(table))
    resp_len = table.response_len
    for name in dict.fromkeys(table.agent):
        rows = table.agent == name
        a = table.advantage[rows]
        m[f"agent/{name}/steps"] = int(rows.sum())
        m[f"agent/{name}/adv_mean"] = float(a.mean())
        m[f"agent/{name}/adv_std"] = float(a.std())
        m[f"agent/{name}/adv_m2"] = float((a ** 2).mean())
        m[f"agent/{name}/adv_absmax"] = float(np.abs(a).max())
        m[f"agent/{name}/invalid_rate"] = float(1.0 - table.valid[rows].mean())
        m[f"agent/{name}/truncated_rate"] = float(table.truncated[rows].mean())
        m[f"agent/{name}/response_len"] = float(resp_len[rows].mean())
        m[f"agent/{name}/calls_per_traj"] = float(rows.sum() / max(n_traj, 1))
        m[f"tokens/{name}"] = int(rollout.tokens_per_agent.get(name, 0))
    for wg, metrics in update.items():
        for key, value in metrics.items():
            if key.startswith("agent_") and "/" in key:  # agent_grad_norm/{k} -> agent/{k}/grad_norm, ...
                stat, name = key.split("/", 1)
                m[f"agent/{name}/{stat.removeprefix('agent_')}"] = value
            else:
                m[f"wg/{wg}/{key}"] = value
    for name, det in spikes.items():
        key = f"agent/{name}/grad_norm" if f"agent/{name}/grad_norm" in m else f"wg/{name}/grad_norm"
        if key in m:
            ratio, spike = det.update(float(m[key]))
            prefix = key.rsplit("/", 1)[0]
            m[f"{prefix}/spike_ratio"] = ratio
            m[f"{prefix}/spike"] = int(spike)
    if orchestra is not None:  # a slot nobody called this step: 0 calls (its other keys are absent)
        for name in orchestra.slots:
            m.setdefault(f"agent/{name}/calls_per_traj", 0.0)
    norms = [float(v) for wg in update for k, v in update[wg].items() if k == "grad_norm"]
    m["train/nonfinite"] = int(sum(not math.isfinite(v) for v in norms))
    m["train/skipped"] = int(sum(float(update[wg].get("skipped", 0.0)) for wg in update))
    if orchestra is not None:
        m.update(orchestra.behavior_metrics(table, n_traj, rollout.step_infos))
    for wg, secs in rollout.seconds_per_wg.items():
        m[f"timing/generate/{wg}"] = secs
    m.update({f"timing/{k}": v for k, v in timings.items()})
    m["timing/step"] = sum(timings.values())
    return m


def evaluation_metrics(traj_reward: np.ndarray, k: int) -> dict[str, Any]:
    """avg@k (mean success over the k samples of each task, averaged over tasks) and pass@k (any
    success among the k), with the per-task success counts for bootstrap CIs. ``traj_reward`` is
    task-major: the k samples of a task are adjacent. A NaN/inf reward raises (``> 0.5`` would count it
    as a silent failure)."""
    reward = np.asarray(traj_reward, np.float64)
    if not np.isfinite(reward).all():
        raise ValueError(f"evaluation rewards contain {int((~np.isfinite(reward)).sum())} non-finite value(s) "
                         "(NaN/inf); check the environment's reward function")
    success = (reward > 0.5).reshape(-1, k)
    per_task = success.sum(1)
    return {"avg": float(success.mean()), "pass": float((per_task > 0).mean()), "k": k,
            "n_tasks": int(success.shape[0]), "successes": per_task.tolist()}


def tool_metrics(counts: dict[str, tuple[int, int]]) -> dict[str, int]:
    """``tools/{tool}/calls`` and ``tools/{tool}/failures`` of one step from (calls, failures) per tool."""
    return {f"tools/{tool}/{what}": int(n) for tool, (calls, failures) in counts.items()
            for what, n in (("calls", calls), ("failures", failures))}


REFERENCE_ACTOR_KEYS = {"grad_norm": "grad_norm", "loss": "pg_loss", "clip_frac": "pg_clipfrac", "entropy": "entropy",
                        "approx_kl_old": "ppo_kl", "lr": "lr"}
"""drmas's ``wg/{m}/{key}`` -> the reference code's (verl) ``actor/{m}/{name}``, logged beside drmas's keys to W&B."""


def reference_names(metrics: dict[str, Any]) -> dict[str, Any]:
    """The reference code's per-model names of ``metrics``' worker-group keys: ``wg/{m}/grad_norm`` ->
    ``actor/{m}/grad_norm``, ``wg/{m}/loss`` -> ``actor/{m}/pg_loss``, ... (:data:`REFERENCE_ACTOR_KEYS`)."""
    out = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "wg" and parts[2] in REFERENCE_ACTOR_KEYS:
            out[f"actor/{parts[1]}/{REFERENCE_ACTOR_KEYS[parts[2]]}"] = value
    return out


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (what a scalar logger can plot)."""
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _eval_scalars(record: dict[str, Any]) -> dict[str, float]:
    return {f"eval/{record['benchmark']}/avg@{record['k']}": record["avg"],
            f"eval/{record['benchmark']}/pass@{record['k']}": record["pass"]}


LOGGERS: Registry[Callable[..., Any]] = Registry("metrics logger")
"""Loggers a run writes to beside metrics.jsonl / eval.jsonl (``train.loggers``). Each is built as
``factory(run_dir=, run_name=, config=)`` and has ``log_step(step, metrics)``, ``log_eval(record)`` and ``close()``."""


@LOGGERS.register("tensorboard")
class TensorBoardLogger:
    """TensorBoard events in ``<run>/tb`` (nothing when tensorboard is not installed)."""

    def __init__(self, run_dir: Path, run_name: str = "", config: dict[str, Any] | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self._tb = None
            return
        self._tb = SummaryWriter(str(Path(run_dir) / "tb"))

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in _scalars(metrics).items() if self._tb else ():
            self._tb.add_scalar(key, value, step)

    def log_eval(self, record: dict[str, Any]) -> None:
        for key, value in _eval_scalars(record).items() if self._tb else ():
            self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self._tb:
            self._tb.close()


@LOGGERS.register("wandb")
class WandbLogger:
    """A Weights & Biases run in ``<run>/wandb`` (``pip install drmas[wandb]``): offline unless ``WANDB_MODE``
    says otherwise (``WANDB_MODE=online`` with ``wandb login``; ``wandb sync <run>/wandb/offline-run-*``
    uploads an offline run later). Project ``WANDB_PROJECT`` (default ``drmas``), run name = the config's
    ``name`` (``run_name``). Logs drmas's keys and the reference code's ``actor/{m}/...`` names (:func:`reference_names`).
    A resumed run continues the same W&B run: its id is kept in ``<run>/wandb/run_id`` (``resume="allow"``)."""

    def __init__(self, run_dir: Path, run_name: str = "", config: dict[str, Any] | None = None):
        import wandb

        id_file = Path(run_dir) / "wandb" / "run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)  # W&B ids: [a-z0-9]
        id_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(id_file, run_id + "\n")
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "drmas"), name=run_name or None,
                               dir=str(run_dir), config=config or {}, mode=os.environ.get("WANDB_MODE", "offline"),
                               id=run_id, resume="allow", reinit="create_new")

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(_scalars({**metrics, **reference_names(metrics)}), step=step)

    def log_eval(self, record: dict[str, Any]) -> None:
        self._run.log(_eval_scalars(record), step=record["step"])

    def close(self) -> None:
        self._run.finish()


class MetricsSink:
    """``metrics.jsonl`` (one line per step) and ``eval.jsonl`` in the run dir, always; and every logger of
    ``loggers`` (:data:`LOGGERS`: TensorBoard, W&B), built on first use."""

    def __init__(self, run_dir: Path, loggers: Sequence[str] = ("tensorboard",), name: str = "",
                 config: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.eval_path = self.run_dir / "eval.jsonl"
        self._names = [n for n in loggers if n != "jsonl"]  # JSONL is always written
        self._kwargs = {"run_dir": self.run_dir, "run_name": name, "config": config}
        self._loggers: list[Any] | None = None

    def _open(self) -> list[Any]:
        if self._loggers is None:
            self._loggers = [LOGGERS.build(n, **self._kwargs) for n in self._names]
        return self._loggers

    def write_step(self, step: int, metrics: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        for lg in self._open():
            lg.log_step(step, metrics)

    def write_eval(self, record: dict[str, Any]) -> None:
        append_jsonl(self.eval_path, record)
        for lg in self._open():
            lg.log_eval(record)

    def truncate(self, after_step: int) -> None:
        """Drop records a resumed run rewrites, atomically (write a copy, then rename it over the file):
        step records of steps > ``after_step``, and evaluation records after the checkpoint the run resumes
        from (the checkpoint at step s = after_step + 1 follows the evaluation at s; a run resumed from no
        checkpoint, s = 0, evaluates step 0 again). A torn last line (a killed append) is dropped."""
        limits = ((self.metrics_path, after_step), (self.eval_path, after_step + 1 if after_step >= 0 else -1))
        for path, limit in limits:
            if not path.exists():
                continue
            write_jsonl(path, [line for line, rec in read_jsonl_lines(path) if rec.get("step", -1) <= limit])

    def close(self) -> None:
        for lg in self._loggers or []:
            lg.close()
        self._loggers = None
