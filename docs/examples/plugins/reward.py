"""A reward: partial credit for math. The environment computes the outcome reward R of an episode; this one
gives 0.5 to a wrong answer within 10% of the gold number. A task source builds its environment, so the
reward comes with a task source: `math_generated` with this environment. Use it with
`env.name: math_generated_partial` (same `env.args` as math_generated)."""
from typing import Sequence

import numpy as np

from drmas.tasks import MathGenerated, register_task_source
from envs.base import Env, StepOutput, register_env
from envs.math.env import MathEnv

PARTIAL, TOLERANCE = 0.5, 0.1


def near(answer: str | None, golds: Sequence[str]) -> bool:
    """The answer and a gold answer are numbers within TOLERANCE of the gold (relative)."""
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return False
    for gold in golds:
        try:
            target = float(gold)
        except ValueError:
            continue
        if abs(value - target) <= TOLERANCE * abs(target):
            return True
    return False


@register_env("math_partial_credit")
class PartialCreditMathEnv(MathEnv):
    """The math environment; a wrong answer near the gold earns PARTIAL instead of 0."""

    name = "math_partial_credit"

    def step(self, actions: Sequence[str], idx: Sequence[int] | np.ndarray | None = None) -> StepOutput:
        out = super().step(actions, idx)
        episodes = np.arange(len(self.tasks)) if idx is None else np.asarray(idx, dtype=np.int64).reshape(-1)
        for j, i in enumerate(episodes):
            info = out.infos[j]
            if not info["correct"] and near(info["extracted_answer"], self.tasks[i].answers):
                out.rewards[j] = PARTIAL
                info["partial_credit"] = True
        return out


@register_task_source("math_generated_partial")
class MathGeneratedPartial(MathGenerated):
    """The generated math problems (and their SFT traces) of math_generated, graded with partial credit."""

    def make_env(self) -> Env:
        return PartialCreditMathEnv(grader=self.grader)
