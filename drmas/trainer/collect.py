"""Collect: run an orchestra over B tasks x N trajectories and record the step table (the "rollout" phase
of a training step; ``drmas/rollout/`` holds the engines that generate, not this loop).

``call(slot, idx, views, turn)`` is the only way an orchestra reaches a model: it renders the agent's
prompts, generates for the whole batch of episodes ``idx`` in one call on the agent's worker group's
:class:`~drmas.workers.base.Generator` (with the agent's own sampling parameters), parses the outputs, and
appends one step-table row per episode.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from drmas.agents.base import Agent, AgentView, Parsed
from drmas.orchestra.base import Episodes, Orchestra
from drmas.rollout.base import SamplingParams
from drmas.step_table import StepTable
from drmas.workers.base import Generator
from envs.base import Env, Task

logger = logging.getLogger(__name__)


@dataclass
class AgentSlot:
    """An agent bound to its worker group and sampling parameters."""

    agent: Agent
    wg: str
    sampling: SamplingParams


@dataclass
class Collected:
    """What :func:`collect` returns: the step table and the trajectories' outcomes."""

    table: StepTable
    traj_reward: np.ndarray  # [B * N]
    traj_task: np.ndarray  # [B * N] task index of each trajectory
    infos: list[dict]
    step_infos: list[list[dict]] = field(default_factory=list)
    """each trajectory's environment ``infos``, one dict per ``env.step`` that acted on it, in order"""
    seconds_per_wg: dict[str, float] = field(default_factory=dict)
    tokens_per_agent: dict[str, int] = field(default_factory=dict)


def collect(
    tasks: Sequence[Task],
    group_size: int,
    orchestra: Orchestra,
    make_env: Callable[[], Env],
    slots: dict[str, AgentSlot],
    generators: dict[str, Generator],
    seed: int,
    on_call: Callable[[int], None] | None = None,
) -> Collected:
    """B tasks x ``group_size`` trajectories; trajectory t belongs to task t // group_size. ``on_call`` (a
    progress display) is called after each agent call with the number of episodes finished so far."""
    episode_tasks = [task for task in tasks for _ in range(group_size)]
    traj_task = np.repeat(np.arange(len(tasks)), group_size)
    episodes = Episodes(episode_tasks, make_env(), seed=seed)
    parts: list[StepTable] = []
    seconds: dict[str, float] = {}
    tokens: dict[str, int] = {}
    calls = 0

    def call(slot: str, idx: np.ndarray, views: Sequence[AgentView], turn: int) -> tuple[list[str], list[Parsed]]:
        nonlocal calls
        if slot not in slots:
            raise KeyError(f"orchestra asked for agent {slot!r}; configured agents: {sorted(slots)}")
        bound = slots[slot]
        idx = np.asarray(idx, np.int64)
        if idx.size == 0:
            return [], []
        prompts = [bound.agent.prompt(v) for v in views]
        t0 = time.perf_counter()
        gen = generators[bound.wg].generate(prompts, bound.sampling, seed=seed * 100_003 + calls)
        seconds[bound.wg] = seconds.get(bound.wg, 0.0) + time.perf_counter() - t0
        calls += 1
        parsed = [bound.agent.parse(text) for text in gen.texts]
        n = idx.size
        tokens[slot] = tokens.get(slot, 0) + sum(len(r) for r in gen.response_ids) + sum(len(p) for p in gen.prompt_ids)
        parts.append(StepTable(
            task=traj_task[idx], traj=idx, agent=np.full(n, slot, object), wg=np.full(n, bound.wg, object),
            turn=np.full(n, turn, np.int64), valid=np.array([p.valid for p in parsed], bool),
            truncated=np.asarray(gen.truncated, bool), reward=np.zeros(n), score=np.zeros(n),
            advantage=np.full(n, np.nan), action=np.array([p.action for p in parsed], object), prompt_ids=gen.prompt_ids, response_ids=gen.response_ids,
            texts=list(gen.texts)))
        if on_call is not None:
            on_call(int(episodes.done.sum()))
        return list(gen.texts), parsed

    orchestra.run(episodes, call)
    table = StepTable.concat(parts)
    return Collected(table, episodes.reward.copy(), traj_task, episodes.info, episodes.step_infos, seconds, tokens)
