"""The one environment interface shared by the math and search tasks.

An environment holds a *batch* of episodes (one per trajectory). The orchestra (drmas.orchestra)
decides which agent acts; the environment only knows tasks, tools and rewards:

    env = make_env("search", retriever=...)
    obs = env.reset(tasks)                    # one initial observation per episode
    out = env.step(actions, idx)              # act on the episodes `idx` (default: all)
    out.observations[i], out.rewards[i], out.dones[i], out.valid[i], out.infos[i]

Rules every environment keeps:
- deterministic given its seed and inputs;
- malformed action text never raises: it is an invalid action (``valid=False``), scored as such;
- rewards are the outcome reward R in [0, 1]; the invalid-action penalty is applied by the trainer
  (score = R - c * (1 - valid)), so that the step table keeps both.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from drmas.registry import Registry


@dataclass(frozen=True)
class Task:
    """One problem. ``answers`` holds every accepted gold answer (math: usually one)."""

    task_id: str
    question: str
    answers: tuple[str, ...]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class StepOutput:
    """Result of ``Env.step`` for the ``n`` episodes acted on (in the order of ``idx``)."""

    observations: list[str]  # text returned to the episode's history ("" when none)
    rewards: np.ndarray  # float32 [n], outcome reward (0 until the episode ends)
    dones: np.ndarray  # bool [n]
    valid: np.ndarray  # bool [n], the action text followed the required format
    infos: list[dict[str, Any]]


class Env(abc.ABC):
    """Batched environment over ``len(tasks)`` episodes."""

    name: str = "base"

    @abc.abstractmethod
    def reset(self, tasks: Sequence[Task], seed: int | None = None) -> list[str]:
        """Start one episode per task; return the initial observations. ``seed`` seeds the environment's own
        randomness for these episodes (environments without randomness ignore it)."""

    @abc.abstractmethod
    def step(self, actions: Sequence[str], idx: Sequence[int] | np.ndarray | None = None) -> StepOutput:
        """Apply ``actions[j]`` to episode ``idx[j]``; never raises on malformed text."""


@runtime_checkable
class HistoryEnv(Protocol):
    """An environment that renders an episode's interaction so far as text for the agents' prompts (the
    search environment's queries and <information> blocks); the search orchestras need one."""

    def history(self, i: int) -> str:
        ...


ENV_REGISTRY: Registry[Callable[..., Env]] = Registry("environment")
register_env = ENV_REGISTRY.register  # class decorator: make an environment constructible by name


def make_env(name: str, **kwargs: Any) -> Env:
    """Build a registered environment; an unknown name lists the registered ones."""
    return ENV_REGISTRY.build(name, **kwargs)


def registered_envs() -> list[str]:
    return ENV_REGISTRY.names()
