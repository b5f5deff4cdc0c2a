"""Agents: a role that turns (task, history, team context) into a prompt and projects its output.

An agent knows nothing of models or training. It has two jobs:

- ``prompt(view)``: render the text the LLM sees = the task (+ the environment history) + what its
  teammates wrote in this step + its role instruction (docs/paper.md §4);
- ``parse(text)``: project the raw output onto an action: ``Parsed(valid, action)``. Malformed output
  never raises: it is an invalid action (the trainer applies the invalid-action penalty).

Agents are registered by role name (``@register_agent("math_solver")``); configs refer to that name.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from drmas.registry import Registry
from envs.base import Task


@dataclass(frozen=True)
class AgentView:
    """What one agent sees at one call: the task, the environment history (e.g. search results),
    and the team context (teammates' outputs of this step, keyed by what they are)."""

    task: Task
    history: str = ""
    team: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    """Projection of one output: ``valid`` (followed the format) and the extracted ``action``."""

    valid: bool
    action: str = ""


class Agent(abc.ABC):
    """Base agent. Subclasses set ``role`` and implement ``render`` (the whole prompt, role instruction
    included) and ``parse``."""

    role: ClassVar[str] = "agent"
    control_tag: ClassVar[str] = ""
    """The text after which the agent's decision begins (``<verify>``: the verdict word; ``<search>``: the
    query): the response token holding its first non-blank character is the agent's *control token*, whose
    sampled probability is logged (``agent/{k}/control_prob``). "" = none."""

    def __init__(self, name: str):
        self.name = name

    def prompt(self, view: AgentView) -> str:
        """Prompt = task (+ history) + team context + role instruction, as the subclass renders it."""
        return self.render(view)

    @abc.abstractmethod
    def render(self, view: AgentView) -> str:
        """The prompt text for this view."""

    @abc.abstractmethod
    def parse(self, text: str) -> Parsed:
        """Project raw output onto an action; never raises."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


AGENT_REGISTRY: Registry[type[Agent]] = Registry("agent role")


def register_agent(role: str) -> Callable[[type[Agent]], type[Agent]]:
    """Class decorator: register an agent class under a role name (duplicates are rejected)."""

    def deco(cls: type[Agent]) -> type[Agent]:
        AGENT_REGISTRY.register(role)(cls)
        cls.role = role
        return cls

    return deco


def make_agent(role: str, name: str) -> Agent:
    return AGENT_REGISTRY.get(role)(name)
