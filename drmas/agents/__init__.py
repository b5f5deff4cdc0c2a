"""Agent registry and the paper's agents (importing this package registers them)."""
from drmas.agents import roles  # noqa: F401  (registers the built-in roles)
from drmas.agents.base import AGENT_REGISTRY, Agent, AgentView, Parsed, make_agent, register_agent

__all__ = ["AGENT_REGISTRY", "Agent", "AgentView", "Parsed", "make_agent", "register_agent"]
