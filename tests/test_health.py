"""The trainer's health checks as pure functions: degenerate streaks and identical samples (numeric vectors),
non-finite weights and tensors."""
from __future__ import annotations

import math

import numpy as np
import torch

from drmas.algos import first_nonfinite
from drmas.trainer.health import DegenerateWatch, identical_samples, nonfinite_models


def test_identical_samples_needs_every_class_in_every_trajectory_of_its_group():
    task = np.array([0, 0, 0, 0, 1, 1])
    traj = np.array([0, 0, 1, 1, 2, 3])
    assert identical_samples(task, traj, np.array([5, 6, 5, 6, 7, 7]))  # two turns, the same in both trajectories
    assert not identical_samples(task, traj, np.array([5, 6, 5, 8, 7, 7]))  # task 0's second turn differs
    assert not identical_samples(task, traj, np.array([5, 6, 5, 6, 7, 9]))
    assert not identical_samples(np.array([0]), np.array([0]), np.array([0]))  # one trajectory: nothing to compare
    assert not identical_samples(np.array([], int), np.array([], int), np.array([], int))


def test_a_sign_becomes_a_cause_after_its_streak_and_a_break_restarts_the_count():
    watch = DegenerateWatch(steps=3)
    zero = {"agent/a/grad_norm": 0.0, "agent/b/grad_norm": 0.5}
    for step in range(2):
        watch.observe(step, zero, identical=False)
    watch.observe(2, {"agent/b/grad_norm": 0.5}, identical=False)  # agent a not called: its streak ends
    for step in range(3, 6):
        watch.observe(step, zero, identical=step >= 4)
    assert watch.causes == {"agent a: gradient norm exactly 0":
                            "agent a: gradient norm exactly 0 for 3 steps in a row (from step 3)"}
    resumed = DegenerateWatch(steps=3)
    resumed.load(watch.state())
    resumed.observe(6, zero, identical=True)
    assert "identical samples in every task group (every advantage 0)" in resumed.causes
    assert resumed.causes["identical samples in every task group (every advantage 0)"].endswith("(from step 4)")


def test_non_finite_models_and_tensors_are_named():
    assert nonfinite_models({"m": {"update_norm": 0.3}, "n": {"update_norm": math.nan}, "o": {}}) == ["n"]
    # the openrlhf backend's report (DeepSpeed steps on a non-finite gradient): its ranks' parameters checked
    assert nonfinite_models({"a": {"weights_finite": 1.0}, "b": {"weights_finite": 0.0, "grad_norm": 1.0}}) == ["b"]
    state = {"model": {"w": torch.zeros(3), "steps": torch.tensor([1, 2])},
             "optimizer": {"state": {0: {"exp_avg": torch.tensor([0.0, math.inf])}}}}
    assert first_nonfinite(state) == "optimizer.state.0.exp_avg"
    state["optimizer"]["state"][0]["exp_avg"][1] = 0.0
    assert first_nonfinite(state) is None
    assert first_nonfinite([torch.ones(2), (torch.tensor([math.nan]),)]) == "1.0"
