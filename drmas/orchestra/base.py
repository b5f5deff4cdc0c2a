"""Orchestras: the workflow code that decides which agent acts, written to read like the paper's figure.

An orchestra runs a batch of episodes (``Episodes``: one per trajectory) and calls agents through one
function, ``call(slot, idx, views, turn)``, which generates for the episodes ``idx`` in one batch on the
agent's worker group, parses the outputs, records one step-table row per call, and returns
``(texts, parsed)``. The orchestra never sees models, tokens or rewards of individual steps; it ends
each episode through the environment, which sets ``episodes.reward``.

Each orchestra declares its agent ``slots`` (e.g. ``("solver", "verifier")``); a run config defines one
agent per slot (``AgentConfig.name`` = slot) and chooses its role class and model.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence

import numpy as np

from drmas.agents.base import AgentView, Parsed
from drmas.registry import Registry
from drmas.step_table import StepTable
from envs.base import Env, Task


class CallFn(Protocol):
    def __call__(self, slot: str, idx: np.ndarray, views: Sequence[AgentView], turn: int) -> tuple[list[str], list[Parsed]]:
        ...


@dataclass
class Episodes:
    """A batch of episodes: ``tasks[i]`` is episode i's task; the env holds their state; ``seed`` seeds the
    environment's randomness (e.g. retrieval misses) for this batch."""

    tasks: list[Task]
    env: Env
    seed: int | None = None
    reward: np.ndarray = field(init=False)
    done: np.ndarray = field(init=False)
    info: list[dict[str, Any]] = field(init=False)
    step_infos: list[list[dict[str, Any]]] = field(init=False)
    """per episode, the environment's info of every step that acted on it, in order (``info`` merges them)"""

    def __post_init__(self) -> None:
        n = len(self.tasks)
        self.reward = np.zeros(n, np.float64)
        self.done = np.zeros(n, bool)
        self.info = [{} for _ in range(n)]
        self.step_infos = [[] for _ in range(n)]
        self.env.reset(self.tasks, seed=self.seed)

    def __len__(self) -> int:
        return len(self.tasks)

    def act(self, idx: np.ndarray, actions: Sequence[str]) -> np.ndarray:
        """Hand actions of episodes ``idx`` to the environment (a final answer, a search query); returns ``dones``."""
        out = self.env.step(list(actions), idx)
        self.reward[idx] = np.where(out.dones, out.rewards, self.reward[idx])
        self.done[idx] |= out.dones
        for j, i in enumerate(idx):
            self.info[i].update(out.infos[j])
            self.step_infos[i].append(out.infos[j])
        return out.dones


class Orchestra(abc.ABC):
    slots: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def run(self, episodes: Episodes, call: CallFn) -> None:
        """Run all episodes to the end; set ``episodes.reward``."""

    def behavior_metrics(self, table: StepTable, n_traj: int, step_infos: list[list[dict[str, Any]]]) -> dict[str, float]:
        """Metrics of how this workflow's agents behaved in one batch (which agent acted how often, what it
        decided), from the step table and each trajectory's environment infos; logged every step
        (drmas/trainer/metrics.py lists each orchestra's keys). Default: none."""
        return {}


ORCHESTRA_REGISTRY: Registry[Callable[..., Orchestra]] = Registry("orchestra")
register_orchestra = ORCHESTRA_REGISTRY.register  # class decorator


def make_orchestra(name: str, **kwargs: Any) -> Orchestra:
    return ORCHESTRA_REGISTRY.build(name, **kwargs)
