"""The execution layer's contract: what the trainer asks of a backend (:class:`Backend`), what it hands each
worker group (:class:`WorkerSpec` to build it, :class:`UpdateBatch` to update it), the one thing that generates
for an agent call (:class:`Generator`), :class:`WorkerDied`, and :func:`make_backend`.

A backend runs the worker groups (one policy model + its optimizer each, :mod:`drmas.workers.policy`): it
generates for the orchestra's agent calls and updates each group on its own rows. Which backends exist and
what each can do is :mod:`drmas.backends`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from drmas.backends import BACKENDS

if TYPE_CHECKING:  # annotations only
    from drmas.config import AlgoConfig, ModelConfig, OptimConfig
    from drmas.rollout.base import Generation, SamplingParams


@dataclass
class UpdateBatch:
    """The rows of one worker group for one RL step (from the step table)."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    advantages: np.ndarray  # float [n]
    agents: np.ndarray  # str [n]
    temperature: np.ndarray  # float [n]: the sampling temperature each row was generated with
    control_tags: np.ndarray | None = None  # str [n]: each row's agent's control tag (Agent.control_tag); None: none


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build itself (picklable, so a Ray actor can build it remotely)."""

    key: str
    model: ModelConfig
    optim: OptimConfig
    algo: AlgoConfig
    seed: int
    threads: int = 0
    device: str = "cpu"
    """``train.device``: auto, cpu, cuda or cuda:<i>, resolved in the worker's own process"""
    precision: str = "fp32"
    """``train.precision``: fp32 or bf16 (autocast of the forward passes)"""


class WorkerDied(RuntimeError):
    """A worker group's process (a Ray actor) died; ``key`` names the worker group. The trainer replaces
    the workers (``restart``, where the backend can) and resumes from its last checkpoint, or stops with a
    clear message."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"worker group {key!r} died: {detail}")
        self.key = key


class Generator(Protocol):
    """The one thing that generates for an agent call: a worker group's ``generate`` (the orchestra's
    calls go through :func:`drmas.trainer.collect.collect`). Responses keep the stop token the model
    emitted, so that the policy gradient also reaches the decision to stop."""

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        ...


class Backend(Protocol):
    """What the trainer asks of the worker groups, keyed by model key (``cfg.models``), and nothing else."""

    def generators(self) -> dict[str, Generator]:
        """Each worker group's generator for this step's rollout (after the last update's weights)."""
        ...

    def update(self, batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        """One RL update of every worker group on its own rows; returns each group's metrics
        (``wg/{key}/...`` and per-agent keys, documented in drmas/trainer/metrics.py)."""
        ...

    def get_states(self) -> dict[str, dict]:
        """Everything a checkpoint needs to resume each worker group (weights, optimizer, scheduler)."""
        ...

    def set_states(self, states: dict[str, dict]) -> None:
        """Restore what :meth:`get_states` returned."""
        ...

    def restart(self) -> None:
        """Fresh workers after one died (only where ``capabilities.restart``); the trainer then loads the
        last checkpoint into them."""
        ...

    def close(self) -> None:
        """Release processes, placement groups and GPUs."""
        ...


def make_backend(name: str, specs: dict[str, WorkerSpec], **options: Any) -> Backend:
    """Build the registered backend ``name`` for the worker groups ``specs`` (``options``: its class's keywords)."""
    return BACKENDS.get(name).build(specs, **options)


def ray_get(key: str, refs: Any) -> Any:
    """``ray.get`` of worker group ``key``'s calls; a dead actor becomes :class:`WorkerDied` naming it."""
    import ray

    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError as exc:  # ActorDiedError, ActorUnavailableError
        raise WorkerDied(key, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
