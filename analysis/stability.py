"""The stability grid's verdicts (docs/stability.md; the rules are written there first, and the constants
below are its numbers): collapse (rule g) with Fisher exact tests and the stability frontier, which signal
moved first in a collapsed run, spikes against the Dr. MAS twin (rule b revisited), accuracy over time
(Dr. MAS − GRPO area under the avg@k curve and at the last evaluation, paired by seed), the stress dial
read off the pilot, and the Figure-4 analogue.

    python -m analysis.stability --runs results/runs/stability [--pilot results/runs/stability_pilot]

Inputs are :func:`analysis.runs.load_grid` frames; the learning rate of a run is its ``lr`` tag (the grid's
index), its estimator the ``estimator`` tag.
"""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.runs import GridData, load_grid
from analysis.stats import N_BOOT, Interval, paired_test

logger = logging.getLogger(__name__)

GRPO, DRMAS = "trajectory_grpo", "drmas"
ROLL = 10                # W: trailing window of the rolling means
EARLY = 10               # steps 0 .. EARLY-1: a run's own early range
PERSIST = 20             # M: consecutive steps a drop must last (the pilot: PILOT_PERSIST)
PILOT_PERSIST = 10
REWARD_DROP = 0.5        # rolling reward at or below this share of its running peak
SEARCH_DROP = 0.25       # rolling Search calls per trajectory below this share of the early level
TWIN_RATIO = 2.0         # a twin spike: at least this many times the twin's norm at the same step
ALPHA = 0.05
PILOT_BASE_LR = 5.0e-5
PILOT_LEVELS = tuple(PILOT_BASE_LR * 4 ** i for i in range(4))
SEARCH_CALLS = "agent/search/calls_per_traj"


# ------------------------------------------------------------------------------------------ rule (g)
def _first_sustained(flag: pd.Series, persist: int) -> int | None:
    """First step of the first run of ``persist`` consecutive True values of ``flag`` (indexed by step)."""
    run_id = (~flag).cumsum()
    length = flag.groupby(run_id).transform("sum")
    hits = flag & (length >= persist)
    return int(hits.idxmax()) if hits.any() else None


@dataclass(frozen=True)
class Collapse:
    """Rule (g) on one run: the step it fired at (None: never) and which clause fired first."""

    step: int | None
    reason: str  # "non-finite", "reward", "search", or "" when it never fired


def collapse_of(steps: pd.DataFrame, persist: int = PERSIST) -> Collapse:
    """Rule (g) (docs/stability.md) on one run's step records (columns: ``step``, ``reward/mean``,
    ``agent/search/calls_per_traj``, ``wg/*/grad_norm``, ``wg/*/skipped``): the earliest step at which a
    non-finite norm / skipped update, a sustained reward collapse or a sustained abandonment of search fires."""
    s = steps.sort_values("step").set_index("step")
    fired: dict[str, int] = {}
    norms = s.filter(regex=r"^wg/.*/grad_norm$")
    skipped = s.filter(regex=r"^wg/.*/skipped$")
    bad = (~np.isfinite(norms.to_numpy(float))).any(1) if norms.shape[1] else np.zeros(len(s), bool)
    if skipped.shape[1]:
        bad |= (skipped.fillna(0).to_numpy(float) > 0).any(1)
    if bad.any():
        fired["non-finite"] = int(s.index[np.argmax(bad)])
    roll = s["reward/mean"].rolling(ROLL, min_periods=ROLL).mean()
    flag = (roll <= REWARD_DROP * roll.cummax()) & roll.notna()
    if (t := _first_sustained(flag, persist)) is not None:
        fired["reward"] = t
    if SEARCH_CALLS in s:
        calls = s[SEARCH_CALLS]
        early = calls.iloc[:EARLY].mean()
        roll = calls.rolling(ROLL, min_periods=ROLL).mean()
        flag = (roll < SEARCH_DROP * early) & roll.notna()
        if (t := _first_sustained(flag, persist)) is not None:
            fired["search"] = t
    if not fired:
        return Collapse(None, "")
    reason = min(fired, key=fired.get)
    return Collapse(fired[reason], reason)


def _steps_of(data: GridData, run: str) -> pd.DataFrame:
    return data.steps[data.steps["run"] == run]


def run_table(data: GridData) -> pd.DataFrame:
    """One row per run of the grid: estimator, lr, seed, status, steps done, collapse step and reason."""
    rows = []
    for r in data.runs.itertuples():
        st = _steps_of(data, r.run)
        c = collapse_of(st) if len(st) else Collapse(None, "")
        rows.append({"run": r.run, "estimator": r.estimator, "lr": float(r.level), "seed": r.seed,
                     "done": r.status == "done", "n_steps": len(st), "collapse_step": c.step,
                     "collapse_reason": c.reason, "collapsed": c.step is not None})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ the dial
def pilot_unstable(steps: pd.DataFrame) -> bool:
    """The pilot's instability rule: rule (g) with M = PILOT_PERSIST, or the mean reward of the last 10
    steps at most REWARD_DROP of the first 10's."""
    s = steps.sort_values("step")
    r = s["reward/mean"].to_numpy(float)
    late_drop = len(r) >= 2 * EARLY and r[-EARLY:].mean() <= REWARD_DROP * r[:EARLY].mean()
    return collapse_of(s, persist=PILOT_PERSIST).step is not None or bool(late_drop)


def dial_levels(unstable: dict[float, bool]) -> tuple[list[float], str]:
    """The grid's learning rates from the pilot's verdict per level (docs/stability.md, "The stress dial")."""
    levels = sorted(unstable)
    bad = [i for i, lr in enumerate(levels) if unstable[lr]]
    if not bad:
        return [levels[0], levels[2], levels[3]], "no pilot level was unstable"
    i = bad[0]
    if i == 0:
        return [levels[0]], "the default learning rate is already unstable"
    if i == 1:
        return [levels[0], 1.0e-4, levels[1]], f"smallest unstable level {levels[1]:g}"
    return [levels[0], levels[i - 1], levels[i]], f"smallest unstable level {levels[i]:g}"


def pilot_summary(pilot: GridData) -> pd.DataFrame:
    rows = []
    for r in pilot.runs.itertuples():
        st = _steps_of(pilot, r.run).sort_values("step")
        rew = st["reward/mean"].to_numpy(float)
        c = collapse_of(st, persist=PILOT_PERSIST)
        rows.append({"lr": float(r.level), "steps": len(st), "reward_first10": rew[:EARLY].mean(),
                     "reward_last10": rew[-EARLY:].mean(),
                     "search_calls_first10": st[SEARCH_CALLS].iloc[:EARLY].mean() if SEARCH_CALLS in st else np.nan,
                     "search_calls_last10": st[SEARCH_CALLS].iloc[-EARLY:].mean() if SEARCH_CALLS in st else np.nan,
                     "collapse_step": c.step, "collapse_reason": c.reason, "unstable": pilot_unstable(st)})
    return pd.DataFrame(rows).sort_values("lr").reset_index(drop=True)
