"""The event rules the stability studies share (docs/stability.md; the constants are its numbers): rolling
windows over a run's step records, the non-finite and reward-collapse clauses, the abandonment of an agent, rule (g)
of the exploratory grids, and which runs of a grid count for a verdict.

Every rule reads one run's step records (:attr:`analysis.runs.GridData.steps` rows of the run) indexed or sorted by
step; a study composes its event from these clauses (the exploratory grids: :func:`collapse_of`; the confirmatory
round and the frontier round: :func:`collapse_event`, the non-finite and reward clauses plus the abandonment of
every agent the run's orchestra declares).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.run_records import run_manifest
from analysis.runs import GridData

ROLL = 10                # W: trailing window of the rolling means
EARLY = 10               # steps 0 .. EARLY-1: a run's own early range
PERSIST = 20             # M: consecutive steps a drop must last
REWARD_DROP = 0.5        # rolling reward at or below this share of its running peak
ABANDON_DROP = 0.25      # rolling calls per trajectory below this share of the early level
SEARCH_CALLS = "agent/search/calls_per_traj"


def first_sustained(flag: pd.Series, persist: int) -> int | None:
    """First step of the first run of ``persist`` consecutive True values of ``flag`` (indexed by step)."""
    run_id = (~flag).cumsum()
    length = flag.groupby(run_id).transform("sum")
    hits = flag & (length >= persist)
    return int(hits.idxmax()) if hits.any() else None


def calls_of(steps: pd.DataFrame, key: str) -> pd.Series:
    """An agent's calls per trajectory (the step records' column ``key``) of each step; a step in which it was never
    called (a run that logged no key for it then) counts 0 calls."""
    return steps[key].fillna(0.0)


def search_calls(steps: pd.DataFrame) -> pd.Series:
    """The Search agent's calls per trajectory of each step record (:func:`calls_of`)."""
    return calls_of(steps, SEARCH_CALLS)


def abandoned_at(calls: pd.Series, persist: int = PERSIST) -> int | None:
    """The abandonment clause on one agent's calls per trajectory indexed by step: the first step at which the
    rolling mean of ROLL steps stays below ABANDON_DROP of the mean of steps 0 .. EARLY-1 for ``persist`` steps."""
    early = calls.iloc[:EARLY].mean()
    roll = calls.rolling(ROLL, min_periods=ROLL).mean()
    return first_sustained((roll < ABANDON_DROP * early) & roll.notna(), persist)


def nonfinite_and_reward(s: pd.DataFrame, persist: int = PERSIST) -> dict[str, int]:
    """Rule (g)'s first two clauses on one run's step records indexed by step: the step at which each fired
    ("non-finite", "reward"), for those that did."""
    fired: dict[str, int] = {}
    # a worker group without rows in a step (an agent nobody called) logs no norm: that is no update, not a
    # non-finite one, so clause 1 reads the logged counts (train/nonfinite, wg/*/skipped), never a missing norm
    counts = s.filter(regex=r"^(wg/.*/skipped|train/nonfinite|train/skipped)$")
    bad = (counts.fillna(0).to_numpy(float) > 0).any(1) if counts.shape[1] else np.zeros(len(s), bool)
    if bad.any():
        fired["non-finite"] = int(s.index[np.argmax(bad)])
    if (t := first_sustained(reward_flag(s), persist)) is not None:
        fired["reward"] = t
    return fired


def reward_flag(s: pd.DataFrame) -> pd.Series:
    """The reward clause's flag per step (indexed by step): the rolling mean of ROLL steps at or below REWARD_DROP of
    its running peak. The clause fires where it holds for PERSIST consecutive steps."""
    roll = s["reward/mean"].rolling(ROLL, min_periods=ROLL).mean()
    return (roll <= REWARD_DROP * roll.cummax()) & roll.notna()


def longest_streak(flag: pd.Series) -> int:
    """The longest run of consecutive True values of ``flag`` (0 where it never holds)."""
    run_id = (~flag).cumsum()
    return int(flag.groupby(run_id).sum().max()) if flag.any() else 0


@dataclass(frozen=True)
class Collapse:
    """Rule (g) on one run: the step it fired at (None: never) and which clause fired first."""

    step: int | None
    reason: str  # "non-finite", "reward", "search", or "" when it never fired


def collapse_of(steps: pd.DataFrame, persist: int = PERSIST) -> Collapse:
    """Rule (g) (docs/stability.md) on one run's step records (columns: ``step``, ``reward/mean``,
    ``agent/search/calls_per_traj``, ``wg/*/grad_norm``, ``wg/*/skipped``): the earliest step at which a
    non-finite norm / skipped update (the logged counts; a missing norm is no update), a sustained reward collapse or
    a sustained abandonment of search fires."""
    s = steps.sort_values("step").set_index("step")
    fired = nonfinite_and_reward(s, persist)
    if SEARCH_CALLS in s and (t := abandoned_at(search_calls(s), persist)) is not None:
        fired["search"] = t
    if not fired:
        return Collapse(None, "")
    reason = min(fired, key=fired.get)
    return Collapse(fired[reason], reason)


# ---------------------------------------------------------------- the confirmatory event (also the frontier round's)
def declared_agents(run_path: Path) -> tuple[str, ...]:
    """The agents the run's orchestra declares (its ``slots``), from the run's ``manifest.json`` config."""
    from drmas.orchestra import ORCHESTRA_REGISTRY

    name = (run_manifest(Path(run_path))["config"].get("env") or {}).get("orchestra")
    return tuple(ORCHESTRA_REGISTRY.get(name).slots)


@dataclass(frozen=True)
class Event:
    """One run's collapse: its step (None: censored), the run's last step, the first clause, abandoned agents."""

    step: int | None
    last_step: int
    reason: str                     # "non-finite", "reward", "abandoned:<agent>", or "" (censored)
    abandoned: tuple[str, ...] = ()  # every agent whose abandonment clause fired, in any order of time


def collapse_event(steps: pd.DataFrame, agents: tuple[str, ...], persist: int = PERSIST) -> Event:
    """The confirmatory event (docs/stability.md, "The confirmatory round"; the frontier round's primary event) on one
    run's step records: the earliest of the non-finite clause, the reward clause and the abandonment of any agent of
    ``agents``; censored (``step`` None) where none fired."""
    s = steps.sort_values("step").set_index("step")
    fired = nonfinite_and_reward(s, persist)
    abandoned = []
    for agent in agents:
        key = f"agent/{agent}/calls_per_traj"
        if key in s and (t := abandoned_at(calls_of(s, key), persist)) is not None:
            fired[f"abandoned:{agent}"] = t
            abandoned.append(agent)
    last = int(s.index.max()) if len(s) else -1
    if not fired:
        return Event(None, last, "", ())
    reason = min(fired, key=fired.get)
    return Event(fired[reason], last, reason, tuple(abandoned))


def steps_of(data: GridData, run: str) -> pd.DataFrame:
    """One run's step records."""
    return data.steps[data.steps["run"] == run]


def finished(data: GridData) -> pd.Series:
    """Per run of ``data.runs``: whether it counts for the verdicts: done and usable (its folder there, its records
    without conflicts: :mod:`analysis.runs`), or stopped on non-finite gradients (``NonFiniteStop``: the grid marks it
    failed; rule g's first clause fired first)."""
    done = (data.runs["status"] == "done") & data.runs["usable"]
    failed = data.runs["status"] == "failed"
    if failed.any():
        nonfinite = {r for r in data.runs.loc[failed, "run"] if collapse_of(steps_of(data, r)).reason == "non-finite"}
        done |= data.runs["run"].isin(nonfinite)
    return done


def grid_status(data: GridData | None) -> tuple[int, int]:
    """(runs that count for the verdicts (:func:`finished`), runs the grid has): every other run of the index (not
    started, in progress, failed otherwise, its folder gone, its records in conflict) makes the verdicts incomplete."""
    if data is None:
        return 0, 0
    return int(finished(data).sum()), len(data.runs)
