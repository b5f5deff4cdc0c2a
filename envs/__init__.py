"""Environments: tasks, rewards and tools for the math and search systems (know nothing of training)."""
from envs.base import Env, StepOutput, Task, make_env, register_env, registered_envs

__all__ = ["Env", "StepOutput", "Task", "make_env", "register_env", "registered_envs"]
