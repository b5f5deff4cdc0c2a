"""Is the training still training? The checks the trainer runs on every step, apart from the RL step itself:

- weights that became non-finite in an update stop the run before the step is recorded (:func:`nonfinite_models`,
  :class:`NonFiniteWeights`); too many steps in a row with a non-finite gradient stop it too (:class:`NonFiniteStop`);
- training that runs but cannot learn is *degenerate* (:class:`DegenerateWatch`): an agent whose gradient norm is
  exactly 0 for :data:`DEGENERATE_STEPS` steps in a row (a learning rate that destroyed the weights, rewards that
  never vary), or steps whose samples are identical in every task group for as many steps (temperature 0: every
  advantage is 0); a run shorter than that, for every one of its steps. The log warns once per cause; the ``DONE``
  marker lists the causes; the report lists the run.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEGENERATE_STEPS = 10
"""Steps in a row of a degenerate sign (an agent's gradient norm exactly 0; identical samples) before the run is
called degenerate."""


class NonFiniteStop(RuntimeError):
    """Raised after too many consecutive steps with a non-finite gradient (a checkpoint is written)."""


class NonFiniteWeights(NonFiniteStop):
    """A model's weights are non-finite after an update; the step is not recorded."""


class WorkerGroupLost(RuntimeError):
    """Raised when a worker group died again after ``Trainer.max_worker_restarts`` restarts; the run's
    records end at its last checkpoint, from which the same command resumes."""


def nonfinite_models(update: dict[str, dict[str, Any]]) -> list[str]:
    """The worker groups whose weights are non-finite after this step's update: their ``update_norm``
    (``||θ_after − θ_before||``, one reduction over the parameters the optimizer step already touched; local worker)
    is NaN or inf, or their ``weights_finite`` (every parameter checked on every rank; openrlhf backend) is 0."""
    return [wg for wg, m in update.items()
            if ("update_norm" in m and not math.isfinite(float(m["update_norm"])))
            or ("weights_finite" in m and not float(m["weights_finite"]))]


def identical_samples(task: np.ndarray, traj: np.ndarray, classes: np.ndarray) -> bool:
    """Whether every task group's trajectories made the same samples: each class of identical (agent, prompt,
    response) steps (``drmas.algos.step_classes``) holds steps of every trajectory of its task group. Then
    every score in a group is equal and every advantage 0 (temperature 0 does this)."""
    if len(classes) == 0:
        return False
    import pandas as pd  # here: the CLI imports this module's errors on every failure, and pandas costs 0.5 s

    frame = pd.DataFrame({"task": task, "traj": traj, "cls": classes})
    group_size = frame.groupby("task")["traj"].nunique()
    per_class = frame.groupby("cls").agg(task=("task", "first"), trajs=("traj", "nunique"))
    return bool((group_size.loc[per_class["task"]].to_numpy() > 1).all()
                and (per_class["trajs"].to_numpy() == group_size.loc[per_class["task"]].to_numpy()).all())


class DegenerateWatch:
    """Counts, per sign, the steps in a row that show it; past :data:`DEGENERATE_STEPS` the sign is a cause
    (warned once, listed in ``DONE``). Its state is part of the trainer's checkpoint, so a resumed run counts
    on where it stopped."""

    def __init__(self, steps: int = DEGENERATE_STEPS):
        self.steps = steps
        self.streaks: dict[str, list[int]] = {}  # sign -> [first step of the streak, its length]
        self.causes: dict[str, str] = {}

    @classmethod
    def for_run(cls, total_steps: int) -> "DegenerateWatch":
        """The watch of a run of ``total_steps`` steps: :data:`DEGENERATE_STEPS` in a row, or every step of a run
        shorter than that (else a short run could never be called degenerate)."""
        return cls(max(1, min(DEGENERATE_STEPS, total_steps)))

    def observe(self, step: int, metrics: dict[str, Any], identical: bool) -> None:
        """Advance every sign by step ``step`` (its metrics; whether its samples were identical)."""
        signs = {f"agent {k.split('/')[1]}: gradient norm exactly 0": metrics[k] == 0.0
                 for k in metrics if k.startswith("agent/") and k.endswith("/grad_norm")}
        signs["identical samples in every task group (every advantage 0)"] = identical
        for sign in [s for s in self.streaks if not signs.get(s)]:  # a sign absent or not shown ends its streak
            del self.streaks[sign]
        for sign in [s for s, present in signs.items() if present]:
            first, length = self.streaks.get(sign, [step, 0])
            self.streaks[sign] = [first, length + 1]
            if length + 1 == self.steps and sign not in self.causes:
                self.causes[sign] = f"{sign} for {self.steps} steps in a row (from step {first})"
                logger.warning("degenerate training: %s; the run will be marked degenerate in DONE (check the "
                               "learning rate, the sampling temperature and the rewards)", self.causes[sign])

    def state(self) -> dict[str, Any]:
        return {"streaks": self.streaks, "causes": self.causes}

    def load(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.streaks = {k: list(v) for k, v in state.get("streaks", {}).items()}
        self.causes = dict(state.get("causes", {}))
