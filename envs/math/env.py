"""The math environment: one episode per problem, the action is the final solution text.

    env = make_env("math")                       # or MathEnv(grader=MathGrader(timeout_s=2))
    questions = env.reset(tasks)
    out = env.step(solutions)                    # reward 1.0 iff the last \\boxed{} answer is right

``valid`` is False when the solution has no (closed, non-empty) ``\\boxed{}`` answer. Stepping an episode
again re-grades the new text (the orchestra submits the last Solver round).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from envs.base import Env, StepOutput, Task, register_env
from envs.math.answers import extract_boxed
from envs.math.grader import MathGrader, default_grader


@register_env("math")
class MathEnv(Env):
    """Batched math episodes graded by ``MathGrader`` (one step; done after it)."""

    name = "math"

    def __init__(self, grader: MathGrader | None = None):
        self.grader = grader
        self.tasks: list[Task] = []

    def reset(self, tasks: Sequence[Task], seed: int | None = None) -> list[str]:
        """Start one episode per task; the observations are the problem texts (no randomness: ``seed`` is unused)."""
        self.tasks = list(tasks)
        return [task.question for task in self.tasks]

    def step(self, actions: Sequence[str], idx: Sequence[int] | np.ndarray | None = None) -> StepOutput:
        """Grade ``actions[j]`` as the final solution of episode ``idx[j]``; never raises on the text."""
        episodes = np.arange(len(self.tasks)) if idx is None else np.asarray(idx, dtype=np.int64).reshape(-1)
        if len(actions) != len(episodes):
            raise ValueError(f"{len(actions)} actions for {len(episodes)} episodes; pass one action per index in idx")
        if len(episodes) and (episodes.min() < 0 or episodes.max() >= len(self.tasks)):
            raise IndexError(f"episode indices {episodes.tolist()} out of range for {len(self.tasks)} episodes "
                             "(call reset(tasks) first)")
        tasks = [self.tasks[i] for i in episodes]
        answers = [extract_boxed(a) if isinstance(a, str) else None for a in actions]
        grader = self.grader or default_grader()
        rewards, outcomes = grader.grade_answers_with_outcomes(answers, [t.answers for t in tasks])
        valid = np.array([a is not None and a.strip() != "" for a in answers], dtype=bool)
        infos: list[dict[str, Any]] = [
            {"task_id": t.task_id, "extracted_answer": a, "correct": bool(r), "grade": o}
            for t, a, r, o in zip(tasks, answers, rewards, outcomes)
        ]
        return StepOutput(observations=[""] * len(tasks), rewards=rewards.astype(np.float32),
                          dones=np.ones(len(tasks), dtype=bool), valid=valid, infos=infos)
