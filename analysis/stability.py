"""The stability grid's verdicts (docs/stability.md; the rules are written there first, and the constants
below are its numbers): collapse (rule g) with Fisher exact tests and the stability frontier, which signal
moved first in a collapsed run, spikes against the Dr. MAS twin (rule b revisited), accuracy over time
(Dr. MAS − GRPO area under the avg@k curve and at the last evaluation, paired by seed), the stress dial
read off the pilot, and the Figure-4 analogue.

    python -m analysis.stability --runs results/runs/stability [--pilot results/runs/stability_pilot]
    python -m analysis.stability --runs results/runs/stability_math --pilot results/runs/stability_math_pilot \
        --out results/stability_math

Inputs are :func:`analysis.runs.load_grid` frames; the learning rate of a run is its ``level`` tag (the grid's
index), its estimator the ``estimator`` tag, its system (search or math) the ``task`` tag. The search grid's
claims keep their short keys (b-revisited, g, accuracy-over-time); the math grid's are suffixed ``-math``.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.claims import (EXPLORATORY, INCONCLUSIVE, MIXED, NO_DIFFERENCE, NOT_REPRODUCED, NOT_RUN, REFUTED,
                             REPRODUCED, SUPPORTED, UNDERPOWERED, Judged, incomplete)
from analysis.integrity import problem_lines
from analysis.runs import GridData, GridLoadError, load_grid
from analysis.stats import N_BOOT, paired_test
from analysis.tables import markdown

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
TASKS = ("search", "math")
"""The systems with a stability grid (experiments/grids/stability.yaml, stability_math.yaml)."""


def task_of(data: GridData) -> str:
    """The system of a stability grid: its runs' one ``task`` tag."""
    tasks = sorted(set(data.runs["task"].dropna()))
    if len(tasks) != 1 or tasks[0] not in TASKS:
        raise ValueError(f"a stability grid holds one system of {TASKS}; its runs are tagged task={tasks}")
    return tasks[0]


def figure_stem(task: str) -> str:
    """The Figure-4 analogue's file stem in paper_figures/."""
    return f"stability_gradnorm_{task}_nonsharing"


# ------------------------------------------------------------------------------------------ rule (g)
def search_calls(steps: pd.DataFrame) -> pd.Series:
    """The Search agent's calls per trajectory of each step record; a step in which it was never called (a run
    that logged no key for it then) counts 0 calls."""
    return steps[SEARCH_CALLS].fillna(0.0)


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
    roll = s["reward/mean"].rolling(ROLL, min_periods=ROLL).mean()
    flag = (roll <= REWARD_DROP * roll.cummax()) & roll.notna()
    if (t := _first_sustained(flag, persist)) is not None:
        fired["reward"] = t
    return fired


def collapse_of(steps: pd.DataFrame, persist: int = PERSIST) -> Collapse:
    """Rule (g) (docs/stability.md) on one run's step records (columns: ``step``, ``reward/mean``,
    ``agent/search/calls_per_traj``, ``wg/*/grad_norm``, ``wg/*/skipped``): the earliest step at which a
    non-finite norm / skipped update (the logged counts; a missing norm is no update), a sustained reward collapse or a sustained abandonment of search fires."""
    s = steps.sort_values("step").set_index("step")
    fired = nonfinite_and_reward(s, persist)
    if SEARCH_CALLS in s:
        calls = search_calls(s)
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
                     "search_calls_first10": search_calls(st).iloc[:EARLY].mean() if SEARCH_CALLS in st else np.nan,
                     "search_calls_last10": search_calls(st).iloc[-EARLY:].mean() if SEARCH_CALLS in st else np.nan,
                     "collapse_step": c.step, "collapse_reason": c.reason, "unstable": pilot_unstable(st)})
    return pd.DataFrame(rows).sort_values("lr").reset_index(drop=True)


# -------------------------------------------------------------------------------------- grid status
def grid_status(data: GridData | None) -> tuple[int, int]:
    """(runs usable for the verdicts, runs the grid has): a run counts when it is done and usable (its folder there,
    its records without conflicts: :mod:`analysis.runs`), or when it stopped on non-finite gradients
    (``NonFiniteStop``: the grid marks it failed; rule g's first clause fired). Every other run of the index (not
    started, in progress, failed otherwise, its folder gone, its records in conflict) makes the verdicts incomplete."""
    if data is None:
        return 0, 0
    return int(_finished(data).sum()), len(data.runs)


def _finished(data: GridData) -> pd.Series:
    """Per run of ``data.runs``: whether it counts for the verdicts (:func:`grid_status`)."""
    done = (data.runs["status"] == "done") & data.runs["usable"]
    failed = data.runs["status"] == "failed"
    if failed.any():
        nonfinite = {r for r in data.runs.loc[failed, "run"] if collapse_of(_steps_of(data, r)).reason == "non-finite"}
        done |= data.runs["run"].isin(nonfinite)
    return done


def finished_runs(data: GridData) -> pd.DataFrame:
    table = run_table(data)
    return table[_finished(data).to_numpy()].reset_index(drop=True)


# -------------------------------------------------------------------------------------- rule (g) tests
def collapse_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (estimator, lr): seeds, collapsed seeds, and per lr the one-sided Fisher exact p (GRPO collapses
    more often than Dr. MAS), plus a pooled row (lr = NaN) over every learning rate."""
    rows = []
    for lr, g in [*runs.groupby("lr"), (np.nan, runs)]:
        counts = {e: (int(g.loc[g["estimator"] == e, "collapsed"].sum()), int((g["estimator"] == e).sum()))
                  for e in (GRPO, DRMAS)}
        (cg, ng), (cd, nd) = counts[GRPO], counts[DRMAS]
        p = float(sps.fisher_exact([[cg, ng - cg], [cd, nd - cd]], alternative="greater").pvalue) if ng and nd else np.nan
        rows.append({"lr": lr, "grpo_collapsed": cg, "grpo_n": ng, "drmas_collapsed": cd, "drmas_n": nd,
                     "fisher_p": p})
    return pd.DataFrame(rows)


POWER_EFFECT = (0.8, 0.2)  # collapse rates GRPO vs Dr. MAS: "GRPO collapses, Dr. MAS is stable"
POWER_NEEDED = 0.8


def fisher_power(n_grpo: int, n_drmas: int, rates: tuple[float, float] = POWER_EFFECT, alpha: float = ALPHA) -> float:
    """Exact power of the one-sided Fisher test with these arm sizes against collapse rates ``rates`` (GRPO,
    Dr. MAS): the probability, summed over every outcome, that it finds p < ``alpha``."""
    if not n_grpo or not n_drmas:
        return 0.0
    pg = sps.binom.pmf(np.arange(n_grpo + 1), n_grpo, rates[0])
    pd_ = sps.binom.pmf(np.arange(n_drmas + 1), n_drmas, rates[1])
    return float(sum(pg[a] * pd_[b] for a in range(n_grpo + 1) for b in range(n_drmas + 1)
                     if sps.fisher_exact([[a, n_grpo - a], [b, n_drmas - b]], alternative="greater").pvalue < alpha))


def frontier(runs: pd.DataFrame) -> dict[str, float | None]:
    """Per estimator, the largest learning rate at which none of its seeds collapsed and every lower level
    held (None: it collapses at the lowest level; only levels with finished runs count)."""
    out: dict[str, float | None] = {}
    for est, g in runs.groupby("estimator"):
        best = None
        for lr, cell in g.groupby("lr"):
            if cell["collapsed"].any():
                break
            best = float(lr)
        out[est] = best
    return out


SIGNALS = ("grad_norm", "control_prob", "search_calls", "entropy")


def moved_first(steps: pd.DataFrame, agents: pd.DataFrame) -> dict[str, int | None]:
    """For one run: the first step at which each signal left its own early range (docs/stability.md)."""
    s = steps.sort_values("step").set_index("step")
    a = agents.sort_values("step")
    out: dict[str, int | None] = {}

    def first(mask: pd.Series) -> int | None:
        mask = mask[mask.index >= EARLY]
        return int(mask.idxmax()) if mask.any() else None

    def per_agent(column: str, test) -> int | None:
        hits = []
        for _, g in a.groupby("agent"):
            if column not in g or g[column].notna().sum() == 0:
                continue
            g = g.set_index("step")
            series = g[column]
            early = series[series.index < EARLY]
            hits.append(first(test(series, early, g)))
        hits = [h for h in hits if h is not None]
        return min(hits) if hits else None

    # a missing value (the agent not called that step) is NaN and moves nothing; a logged non-finite norm is a
    # spike (``spike`` = 1) and moves the norm
    logged_nonfinite = lambda x, g: (g["spike"].fillna(0).astype(bool) if "spike" in g else False) & ~np.isfinite(x)
    out["grad_norm"] = per_agent("grad_norm", lambda x, e, g: (x > 3 * e.median()) | logged_nonfinite(x, g))
    out["control_prob"] = per_agent("control_prob", lambda x, e, g: (x - e.mean()).abs() > 0.2)
    out["entropy"] = per_agent("entropy", lambda x, e, g: (x < 0.5 * e.mean()) | (x > 2 * e.mean()))
    if SEARCH_CALLS in s:
        calls = search_calls(s)
        out["search_calls"] = first(calls < 0.5 * calls.iloc[:EARLY].mean())
    else:
        out["search_calls"] = None
    return out


def first_movers(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the first step of each signal and which moved first (ties joined by '+'); the runs that did
    not collapse (``collapsed`` False) are the control: a signal that leaves its early range there too at the same
    steps does not mark a collapse."""
    rows = []
    for r in runs.itertuples():
        steps = moved_first(_steps_of(data, r.run), data.agents[data.agents["run"] == r.run])
        seen = {k: v for k, v in steps.items() if v is not None}
        earliest = min(seen.values()) if seen else None
        rows.append({"run": r.run, "estimator": r.estimator, "lr": r.lr, "seed": r.seed, "collapsed": r.collapsed,
                     "collapse_step": r.collapse_step, "collapse_reason": r.collapse_reason,
                     **{f"first_{k}": v for k, v in steps.items()},
                     "moved_first": "+".join(k for k in SIGNALS if seen.get(k) == earliest) if seen else "never"})
    return pd.DataFrame(rows)


def zero_reward_signal(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """What still trains a run once no trajectory is rewarded (a finding, no verdict): per (estimator, lr), the
    share of steps whose training reward is 0, and over those steps the mean advantage second moment per agent
    (``agent/{k}/adv_m2``) and the mean step score. With every reward 0 the scores differ only by the invalid-action
    penalty, and both estimators divide by a std: trajectory GRPO by the group's, Dr. MAS by each agent's, so a
    penalty of 0.01 can become an advantage of order 1 (docs/stability.md)."""
    if runs.empty or "adv_m2" not in data.agents:
        return pd.DataFrame()
    steps = data.steps[data.steps["run"].isin(runs["run"])].reindex(columns=["run", "step", "reward/mean", "score/mean"])
    zero = steps[steps["reward/mean"] == 0]
    ag = data.agents.merge(zero[["run", "step"]], on=["run", "step"])
    per_run = pd.DataFrame({"zero_share": steps.groupby("run")["reward/mean"].apply(lambda r: float((r == 0).mean())),
                            "score_at_zero": zero.groupby("run")["score/mean"].mean()})
    m2 = ag.pivot_table(index="run", columns="agent", values="adv_m2", aggfunc="mean").add_prefix("adv_m2_")
    per_run = per_run.join(m2).join(runs.set_index("run")[["estimator", "lr"]])
    return per_run.groupby(["estimator", "lr"]).mean().reset_index()


# ------------------------------------------------------------------------------- rule (b) revisited
def twin_spikes(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (lr, seed, agent) with both twins finished: GRPO's twin spikes (spike in its own history and
    >= TWIN_RATIO x the Dr. MAS norm at the same step) and Dr. MAS's (the same the other way)."""
    ag = data.agents[["run", "step", "agent", "grad_norm", "spike"]]
    rows = []
    for (lr, seed), cell in runs.groupby(["lr", "seed"]):
        by_est = {e: cell.loc[cell["estimator"] == e, "run"] for e in (GRPO, DRMAS)}
        if any(len(v) != 1 for v in by_est.values()):
            continue
        g = ag[ag["run"] == by_est[GRPO].iloc[0]]
        d = ag[ag["run"] == by_est[DRMAS].iloc[0]]
        both = g.merge(d, on=["step", "agent"], suffixes=("_g", "_d"))
        for agent, b in both.groupby("agent"):
            ng, nd = b["grad_norm_g"].to_numpy(float), b["grad_norm_d"].to_numpy(float)
            # a missing norm (NaN: the agent not called) is no update: never a spike (its run logged no spike
            # flag) and never "far above" (NaN compares False); a logged inf is far above a finite twin
            with np.errstate(invalid="ignore", divide="ignore"):
                g_far = (np.isposinf(ng) & np.isfinite(nd)) | (ng >= TWIN_RATIO * nd)
                d_far = (np.isposinf(nd) & np.isfinite(ng)) | (nd >= TWIN_RATIO * ng)
            rows.append({"lr": lr, "seed": seed, "agent": agent, "steps": int((np.isfinite(ng) & np.isfinite(nd)).sum()),
                         "grpo": int((b["spike_g"].fillna(0).astype(bool).to_numpy() & g_far).sum()),
                         "drmas": int((b["spike_d"].fillna(0).astype(bool).to_numpy() & d_far).sum())})
    return pd.DataFrame(rows, columns=["lr", "seed", "agent", "steps", "grpo", "drmas"])


def spike_verdict(spikes: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """Per agent G, D, the two-sided binomial p of G ~ Bin(G + D, 1/2) and its Holm-adjusted value; the
    verdict of docs/stability.md (supported / refuted / inconclusive)."""
    per = spikes.groupby("agent")[["grpo", "drmas"]].sum().reset_index()
    if per.empty:
        return NOT_RUN, per
    per["p"] = [float(sps.binomtest(int(g), int(g + d), 0.5).pvalue) if g + d else 1.0
                for g, d in zip(per["grpo"], per["drmas"])]
    order = np.argsort(per["p"].to_numpy())
    m = len(per)
    holm = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * per["p"].iloc[i]))
        holm[i] = running
    per["p_holm"] = holm
    sig = per["p_holm"] < ALPHA
    grpo_more, drmas_more = (sig & (per["grpo"] > per["drmas"])).any(), (sig & (per["drmas"] > per["grpo"])).any()
    verdict = (SUPPORTED if grpo_more and not drmas_more else REFUTED if drmas_more and not grpo_more
               else INCONCLUSIVE)
    return verdict, per


# ------------------------------------------------------------------------------ accuracy over time
def _task_curves(data: GridData, run: str) -> tuple[np.ndarray, np.ndarray]:
    """(eval steps, per-step x per-task success share) of one run, steps sorted; one benchmark pooled."""
    ev = data.evals[data.evals["run"] == run].sort_values(["step", "benchmark"])
    steps = np.array(sorted(ev["step"].unique()))
    rows = [np.concatenate([np.asarray(s, float) / k for s, k in zip(g["successes"], g["k"])])
            for _, g in ev.groupby("step", sort=True)]
    return steps, np.vstack(rows) if rows else np.zeros((0, 0))


def accuracy_over_time(data: GridData, runs: pd.DataFrame, rng: np.random.Generator,
                       n_boot: int = N_BOOT) -> pd.DataFrame:
    """Per lr: Dr. MAS − GRPO of the area under the avg@k curve (trapezoid over the eval steps / their span:
    a time-averaged avg@k) and of the last evaluation, paired by seed and task (analysis.stats.paired_test),
    over the seeds whose two twins finished with the same eval steps."""
    rows = []
    for lr, cell in runs.groupby("lr"):
        auc = {GRPO: [], DRMAS: []}
        last = {GRPO: [], DRMAS: []}
        seeds = []
        for seed, pair in cell.groupby("seed"):
            if set(pair["estimator"]) != {GRPO, DRMAS}:
                continue
            curves = {e: _task_curves(data, pair.loc[pair["estimator"] == e, "run"].iloc[0]) for e in (GRPO, DRMAS)}
            (sg, cg), (sd, cd) = curves[GRPO], curves[DRMAS]
            if len(sg) < 2 or not np.array_equal(sg, sd) or cg.shape != cd.shape:
                continue
            span = sg[-1] - sg[0]
            for est, (st, c) in curves.items():
                auc[est].append(np.trapezoid(c, st, axis=0) / span)
                last[est].append(c[-1])
            seeds.append(int(seed))
        if not seeds:
            continue
        for name, values in (("auc", auc), ("last", last)):
            res = paired_test(np.vstack(values[DRMAS]), np.vstack(values[GRPO]), rng, n_boot)
            rows.append({"lr": lr, "measure": name, "seeds": len(seeds), "diff": res.diff.point,
                         "low": res.diff.low, "high": res.diff.high, "p_wilcoxon": res.p_value,
                         "drmas": float(np.mean(values[DRMAS])), "grpo": float(np.mean(values[GRPO]))})
    return pd.DataFrame(rows, columns=["lr", "measure", "seeds", "diff", "low", "high", "p_wilcoxon", "drmas", "grpo"])


# ------------------------------------------------------------------------------------------ the whole
@dataclass
class StabilityAnalysis:
    """Every number of the stability verdicts, from one grid folder (and the pilot's, for the dial)."""

    data: GridData | None
    finished: int
    total: int
    runs: pd.DataFrame
    collapses: pd.DataFrame
    frontier: dict[str, float | None]
    movers: pd.DataFrame
    spikes: pd.DataFrame
    spike_agents: pd.DataFrame
    spike_verdict: str
    accuracy: pd.DataFrame
    pilot: pd.DataFrame
    in_progress: pd.DataFrame
    """runs not finished yet: steps so far and rule (g) on them so far (listed, never in a verdict)"""
    zero_reward: pd.DataFrame = field(default_factory=pd.DataFrame)
    """:func:`zero_reward_signal` of the finished runs"""
    task: str = "search"
    """the system: search or math"""


def analyze_stability(data: GridData | None, pilot: GridData | None = None, seed: int = 0,
                      n_boot: int = N_BOOT, task: str = "search") -> StabilityAnalysis:
    """Every verdict's numbers from one stability grid (None: not run; ``task`` names the system then; with a grid
    it is the grid's own ``task`` tag)."""
    pilot_table = pilot_summary(pilot) if pilot is not None else pd.DataFrame()
    if data is None:
        empty = pd.DataFrame()
        return StabilityAnalysis(None, 0, 0, empty, empty, {}, empty, empty, empty, NOT_RUN, empty, pilot_table, empty,
                                 task=task)
    task = task_of(data)
    _require_levels(data)
    runs = finished_runs(data)
    finished, total = grid_status(data)
    everything = run_table(data)
    in_progress = everything[~_finished(data).to_numpy() & (everything["n_steps"] > 0)].reset_index(drop=True)
    spikes = twin_spikes(data, runs) if len(runs) else pd.DataFrame(columns=["lr", "seed", "agent", "steps", "grpo", "drmas"])
    verdict, per_agent = spike_verdict(spikes)
    rng = np.random.default_rng(seed)
    return StabilityAnalysis(
        data=data, finished=finished, total=total, runs=runs,
        collapses=collapse_counts(runs) if len(runs) else pd.DataFrame(), frontier=frontier(runs) if len(runs) else {},
        movers=first_movers(data, runs) if len(runs) else pd.DataFrame(), spikes=spikes, spike_agents=per_agent,
        spike_verdict=verdict, accuracy=accuracy_over_time(data, runs, rng, n_boot) if len(runs) else pd.DataFrame(),
        pilot=pilot_table, in_progress=in_progress, zero_reward=zero_reward_signal(data, runs), task=task)


def _require_levels(data: GridData) -> None:
    """Refuse (one line) a grid whose runs lack the ``level`` tag (their learning rate): it is only in index.json."""
    lacking = data.runs.loc[pd.to_numeric(data.runs["level"], errors="coerce").isna(), "run"].tolist()
    if lacking:
        raise GridLoadError(f"{data.root}: {len(lacking)} run(s) without a level tag (the learning rate), e.g. "
                            f"{lacking[0]}; a stability grid's levels are in its index.json: regenerate it with "
                            "`python -m experiments.grid run experiments/grids/<the grid>.yaml` (finished runs are "
                            "reused, not rerun)")


# ------------------------------------------------------------------------------------------ claims
RULE_B = ("per agent, GRPO steps that spike in their own history (3x the median of the previous 20) and are >= 2x "
          "the Dr. MAS twin's norm (same lr, seed, step) vs the same count the other way, over seeds and lrs; "
          "binomial test of G vs D, Holm over agents: supported if some agent G > D at p < 0.05, none D > G")
RULE_G = ("a run collapses at the first non-finite norm or skipped step, or when its 10-step mean reward stays <= half "
          "its running peak, or its 10-step mean Search calls per trajectory < 1/4 of steps 0-9, for 20 steps; "
          "one-sided Fisher exact test per lr and pooled; frontier = largest lr with no collapsed seed")
RULE_G_MATH = ("a run collapses at the first non-finite norm or skipped step, or when its 10-step mean reward stays <= "
               "half its running peak for 20 steps (the loop calls both agents every round: no agent can be "
               "abandoned); one-sided Fisher exact test per lr and pooled; frontier = largest lr with no collapsed seed")
RULE_ACC = ("Dr. MAS - GRPO of the time-averaged avg@k (area under the curve / step span) and of the last "
            "evaluation, paired by seed and task, 95 % bootstrap CI over tasks; a difference is called when the "
            "CI excludes 0")


def _status(an: StabilityAnalysis) -> str | None:
    """'not run' / 'incomplete (n of N runs)' when the grid is absent or unfinished, else None."""
    if an.data is None or an.total == 0:
        return NOT_RUN
    if an.finished < an.total:
        return incomplete(an.finished, an.total)
    return None


def _lr(x: float | None) -> str:
    return "none" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:g}"


SHORT = {"b-revisited": "GRPO's spikes against its Dr. MAS twin", "g": "collapse under GRPO, not Dr. MAS",
         "accuracy-over-time": "Dr. MAS - GRPO along the run"}
"""The claims in a few words (the terminal summary)."""

PAPER = {
    "search": {"b-revisited": "GRPO's Search agent spikes to > 80 and NaN; Dr. MAS smooth (Figures 4, 6)",
               "g": "search, Qwen2.5-7B non-sharing: GRPO collapses (28.0 vs 43.8 avg@16)",
               "accuracy-over-time": "search non-sharing: Dr. MAS above GRPO over training (Figure 8)"},
    "math": {"b-revisited": "the paper's spike-and-NaN example is the search system; none is reported for math",
             "g": "no collapse reported for math",
             "accuracy-over-time": "math: Dr. MAS above GRPO at the end of training (Table 1, +3.2 pts avg@16)"},
}
"""The paper's expectation per system and claim."""


def _system(an: StabilityAnalysis, claim: str, key: str) -> tuple[str, str, str]:
    """(claim, paper, short) with the system named where it is not the search grid (whose keys are the short ones)."""
    short = SHORT[key]
    if an.task != "search":
        claim, short = f"{claim} [{an.task} system]", f"{short} ({an.task})"
    return claim, PAPER[an.task][key], short


def _no_data(claim: str, paper: str, short: str, ours: str, status: str | None) -> Judged:
    """A claim with nothing to judge yet: "not run", or the grid's status when it has runs but none that count."""
    return Judged(claim, paper, ours, status or NOT_RUN, short=short, design=EXPLORATORY)


def judge_spikes(an: StabilityAnalysis) -> Judged:
    claim, paper, short = _system(an, "(b) revisited: under GRPO per-agent grad norms spike far above Dr. MAS's at the "
                                      "same step", "b-revisited")
    status = _status(an)
    if an.spike_agents.empty:
        return _no_data(claim, paper, short, "no twin pairs finished", status)
    parts = [f"{r.agent}: GRPO {r.grpo} vs Dr. MAS {r.drmas} (p_Holm {r.p_holm:.2g})" for r in an.spike_agents.itertuples()]
    pairs = an.spikes.groupby(["lr", "seed"]).ngroups
    verdict = an.spike_verdict if status is None else f"{status}; so far {an.spike_verdict}"
    headline = ", ".join(f"{r.agent} GRPO {r.grpo} vs Dr. MAS {r.drmas}" for r in an.spike_agents.itertuples())
    return Judged(claim, paper, f"twin spikes over {pairs} twin pair(s): " + "; ".join(parts), verdict, short=short,
                  headline=headline, figures=(figure_stem(an.task),), design=EXPLORATORY)


def judge_collapse(an: StabilityAnalysis) -> Judged:
    what = "the system stops calling the Search agent, NaN" if an.task == "search" else "reward collapse, NaN"
    claim, paper, short = _system(an, f"(g) collapse: GRPO runs collapse ({what}) where Dr. MAS's do not", "g")
    status = _status(an)
    if an.collapses.empty:
        return _no_data(claim, paper, short, "no run finished", status)
    cells = [f"lr {_lr(r.lr)}: GRPO {r.grpo_collapsed}/{r.grpo_n}, Dr. MAS {r.drmas_collapsed}/{r.drmas_n} "
             f"(Fisher p {r.fisher_p:.2g})" for r in an.collapses.itertuples() if not np.isnan(r.lr)]
    pooled = an.collapses[an.collapses["lr"].isna()].iloc[0]
    collapsed = an.movers[an.movers["collapsed"]] if len(an.movers) else an.movers
    stable = an.movers[~an.movers["collapsed"]] if len(an.movers) else an.movers
    movers = collapsed["moved_first"].value_counts().to_dict() if len(collapsed) else {}
    control = stable["moved_first"].value_counts().to_dict() if len(stable) else {}
    ours = ("; ".join(cells) + f"; pooled p {pooled.fisher_p:.2g}; frontier GRPO {_lr(an.frontier.get(GRPO))}, "
            f"Dr. MAS {_lr(an.frontier.get(DRMAS))}; moved first: "
            + (", ".join(f"{k} {v}" for k, v in movers.items()) or "no collapse")
            + (f" (in the runs that did not collapse, by the same rule: {', '.join(f'{k} {v}' for k, v in control.items())})"
               if movers and control else "") + _zero_reward_clause(an))
    power = fisher_power(int(pooled.grpo_n), int(pooled.drmas_n))
    ours += (f"; power of the pooled test against collapse rates {POWER_EFFECT[0]:g} vs {POWER_EFFECT[1]:g}: "
             f"{power:.2f} (the floor and ceiling levels dilute it further)")
    if status is not None:
        verdict = status
    elif pooled.fisher_p < ALPHA:
        verdict = REPRODUCED
    else:  # a test without the power to find the effect says nothing of its absence
        verdict = NOT_REPRODUCED if power >= POWER_NEEDED else UNDERPOWERED
    return Judged(claim, paper, ours, verdict, short=short, design=EXPLORATORY,
                  headline=f"collapsed GRPO {pooled.grpo_collapsed:.0f}/{pooled.grpo_n:.0f}, Dr. MAS "
                           f"{pooled.drmas_collapsed:.0f}/{pooled.drmas_n:.0f}; frontier GRPO "
                           f"{_lr(an.frontier.get(GRPO))}, Dr. MAS {_lr(an.frontier.get(DRMAS))}")


def _zero_reward_clause(an: StabilityAnalysis) -> str:
    """'; on steps with zero training reward, mean adv_m2 per agent GRPO ... vs Dr. MAS ...' (mean over the learning
    rates with such steps), or '' without them."""
    z = an.zero_reward
    cols = [c for c in z.columns if c.startswith("adv_m2_")] if len(z) else []
    if not cols or z["zero_share"].fillna(0).eq(0).all():
        return ""
    means = z[z["zero_share"] > 0].groupby("estimator")[cols].mean()
    fmt = lambda est: "/".join(f"{means.loc[est, c]:.2f}" for c in cols) if est in means.index else "none"  # noqa: E731
    return (f"; on steps with zero training reward the advantage second moment per agent ({'/'.join(c.removeprefix('adv_m2_') for c in cols)}) "
            f"is GRPO {fmt(GRPO)} vs Dr. MAS {fmt(DRMAS)}: each divides the invalid-action penalty by a std")


def judge_accuracy(an: StabilityAnalysis) -> Judged:
    claim, paper, short = _system(an, "Accuracy over time: Dr. MAS above GRPO along the run (area under avg@k, last "
                                      "evaluation)", "accuracy-over-time")
    status = _status(an)
    if an.accuracy.empty:
        return _no_data(claim, paper, short, "no twin pairs with evaluations", status)
    parts = [f"lr {_lr(r.lr)} {r.measure} {100 * r.diff:+.1f} pts [{100 * r.low:+.1f}, {100 * r.high:+.1f}] "
             f"({r.seeds} seeds)" for r in an.accuracy.itertuples()]
    auc = an.accuracy[an.accuracy["measure"] == "auc"]
    above = (auc["low"] > 0).sum()
    below = (auc["high"] < 0).sum()
    verdict = status or (REPRODUCED if above and not below else NOT_REPRODUCED if below and not above
                         else NO_DIFFERENCE if not above and not below else MIXED)
    decided = (f"decided by the {len(auc)} area cells alone, each on its own 95 % CI with no correction across the "
               "levels (exploratory; the last-evaluation cells are reported, not judged)")
    return Judged(claim, paper, "; ".join(parts) + "; " + decided, verdict, short=short, design=EXPLORATORY)


def judges(task: str) -> tuple[tuple[str, Callable[[StabilityAnalysis], Judged], str], ...]:
    """(key, judge, rule) of one system's stability claims; analysis/report.py registers them as
    :class:`analysis.claims.ClaimSpec`. The search grid's keys are b-revisited, g, accuracy-over-time; another
    system's carry its name (g-math, ...)."""
    suffix = "" if task == "search" else f"-{task}"
    return ((f"b-revisited{suffix}", judge_spikes, RULE_B), (f"g{suffix}", judge_collapse, RULE_G if task == "search" else RULE_G_MATH),
            (f"accuracy-over-time{suffix}", judge_accuracy, RULE_ACC))


JUDGES = judges("search")
"""The search grid's claims (the summary of ``python -m analysis.stability`` uses :func:`judges` of its grid)."""


# ------------------------------------------------------------------------------------------ Figure 4
def norm_marks(norms: np.ndarray, spikes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(not called, non-finite) masks of a (steps x seeds) array of one agent's logged pre-clip norms: a step with
    no norm logged (NaN, no spike flag) is an agent not called; a non-finite norm flagged as a spike is non-finite."""
    flagged = np.nan_to_num(spikes, nan=0.0) > 0 if spikes is not None else np.zeros(norms.shape, bool)
    nonfinite = ~np.isfinite(norms) & flagged
    return np.isnan(norms) & ~nonfinite, nonfinite


def fig_gradnorm_over_steps(data: GridData, runs: pd.DataFrame, in_progress: pd.DataFrame | None = None,
                            collapses: pd.DataFrame | None = None, window: int | None = None):
    """Figure-4 analogue: per-agent pre-clip grad norm over steps, one panel per agent (rows) x learning rate
    (columns). Per estimator (GRPO red, Dr. MAS blue) the median over the seeds that logged a finite norm at the
    step, zeros included, smoothed by a trailing rolling median of ROLL steps, with a band from those seeds' 25th to
    75th percentile. What feeds a point is stated, not hidden: the curve is drawn only at steps where at least half
    of the cell's seeds logged a norm (it stops where fewer do, and never bridges such steps); a median or band edge
    of exactly 0 and every zero norm are drawn at the panel's floor (a dot per seed), not dropped. Steps at which an
    agent was not called (no norm logged) are a grey tick per seed at the bottom, non-finite norms a triangle at the
    top. ``collapses`` (``run``, ``time``, ``event``) marks each run's collapse step with a notch at the top in its
    estimator's colour; ``window`` shades steps 0 .. window-1 (a claim's window, e.g. C3's). Runs not finished yet
    (``in_progress``) are drawn dashed, and only then does the legend say so. None without runs."""
    from analysis.figures import _figure
    from analysis.plotting import finish, seed_band

    partial = in_progress is not None and len(in_progress) > 0
    if partial:
        runs = pd.concat([runs.assign(partial=False), in_progress.assign(partial=True)], ignore_index=True)
    else:
        runs = runs.assign(partial=False)
    if runs.empty or data.agents.empty or "grad_norm" not in data.agents:
        return None
    ag = data.agents[data.agents["run"].isin(runs["run"])]
    agents = list(dict.fromkeys(ag["agent"]))
    lrs = sorted(runs["lr"].unique())
    fig = _figure(3.6 * len(lrs), 2.6 * len(agents))
    axes = fig.subplots(len(agents), len(lrs), squeeze=False)
    colors = {GRPO: "tab:red", DRMAS: "tab:blue"}
    names = {GRPO: "GRPO", DRMAS: "Dr. MAS"}
    shown: set[str] = set()
    steps_all = np.sort(data.steps.loc[data.steps["run"].isin(runs["run"]), "step"].unique())
    collapsed = (collapses[collapses["event"] == 1].set_index("run")["time"] if collapses is not None
                 else pd.Series(dtype=float))
    for i, agent in enumerate(agents):
        for j, lr in enumerate(lrs):
            ax = axes[i][j]
            cells = []
            for est, cell in runs[runs["lr"] == lr].groupby("estimator"):
                rows = ag[ag["run"].isin(cell["run"]) & (ag["agent"] == agent)]
                wide = (rows.pivot_table(index="step", columns="run", values="grad_norm", aggfunc="first", dropna=False)
                        .reindex(index=steps_all, columns=list(cell["run"])))
                spikes = (rows.pivot_table(index="step", columns="run", values="spike", aggfunc="first")
                          .reindex(index=steps_all, columns=wide.columns)) if "spike" in ag else None
                cells.append((est, cell, wide.to_numpy(float), spikes))
            positive = np.concatenate([y[np.isfinite(y) & (y > 0)] for _, _, y, _ in cells]) if cells else np.array([])
            floor = 10.0 ** math.floor(math.log10(positive.min())) if len(positive) else 1e-3
            for k, (est, cell, y, spikes) in enumerate(cells):
                color = colors.get(est, "k")
                not_called, nonfinite = norm_marks(y, spikes.to_numpy(float) if spikes is not None else None)
                finite = np.isfinite(y)
                need = math.ceil(y.shape[1] / 2)
                fed = finite.sum(axis=1) >= need
                with np.errstate(all="ignore"):
                    mid, lo, hi = (pd.Series(np.where(fed, v, np.nan), index=steps_all)
                                   .rolling(ROLL, min_periods=1).median().where(fed).to_numpy()
                                   for v in seed_band(np.where(finite, y, np.nan), "iqr"))
                dashed = bool(cell["partial"].any())
                label = (f"{names.get(est, est)}: median of the seeds with a norm (of {y.shape[1]}), drawn where "
                         f">= {need} have one; band 25-75 %" + (", dashed: runs in progress" if dashed else ""))
                at_floor = lambda v: np.where(v > 0, v, np.where(np.isnan(v), np.nan, floor))  # noqa: E731
                ax.plot(steps_all, at_floor(mid), "--" if dashed else "-", color=color, lw=1.0, label=label)
                ax.fill_between(steps_all, at_floor(lo), at_floor(hi), color=color, alpha=0.2, lw=0)
                zero_rows, _ = np.nonzero(finite & (y == 0))
                if len(zero_rows):
                    ax.scatter(steps_all[zero_rows], np.full(len(zero_rows), floor * (1.0 + 0.12 * k)), marker=".",
                               s=3, color=color, alpha=0.5, lw=0)
                    shown.add("zero")
                cells[k] = (est, cell, not_called, nonfinite)
            ax.set_yscale("log")
            bottom, top = ax.get_ylim()
            bottom = min(bottom, floor / 1.5)
            if window:
                ax.axvspan(0, window - 1, color="grey", alpha=0.08, lw=0)
            for k, (est, cell, not_called, nonfinite) in enumerate(cells):
                rows, _ = np.nonzero(not_called)
                if len(rows):
                    ax.scatter(steps_all[rows], np.full(len(rows), bottom * (1.15 + 0.25 * k)), marker="|", s=6,
                               color=colors.get(est, "k"), alpha=0.35, lw=0.6)
                    shown.add("not called")
                rows, _ = np.nonzero(nonfinite)
                if len(rows):
                    ax.scatter(steps_all[rows], np.full(len(rows), top / (1.15 + 0.25 * k)), marker="^", s=14,
                               color=colors.get(est, "k"))
                    shown.add("non-finite")
                times = collapsed.reindex(cell["run"]).dropna().to_numpy(float)
                if len(times):
                    ax.scatter(times, np.full(len(times), top / (1.6 + 0.4 * k)), marker="v", s=10,
                               color=colors.get(est, "k"), alpha=0.8, lw=0)
                    shown.add("collapse")
            ax.set_ylim(bottom, top)
            ax.set_title(f"{agent}, lr {lr:g}", fontsize=8)
            if i == len(agents) - 1:
                ax.set_xlabel("RL step")
            if j == 0:
                ax.set_ylabel("pre-clip grad norm")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = axes[0][0].get_legend_handles_labels()
    extra = {"not called": (Line2D([], [], marker="|", ls="", color="grey"),
                            "agent not called at that step (a tick per seed, at the bottom)"),
             "zero": (Line2D([], [], marker=".", ls="", color="grey"),
                      "norm exactly 0 (a dot per seed at the floor; a median or band edge of 0 sits there too)"),
             "non-finite": (Line2D([], [], marker="^", ls="", color="grey"), "non-finite norm (a logged spike, at the top)"),
             "collapse": (Line2D([], [], marker="v", ls="", color="grey"), "a run's collapse step (one notch per run)")}
    for key, (handle, text) in extra.items():
        if key in shown:
            handles.append(handle)
            labels.append(text)
    if window:
        handles.append(Patch(color="grey", alpha=0.15))
        labels.append(f"steps 0-{window - 1} (the window C3 reads)")
    task = task_of(data)
    fig.suptitle(f"{task.capitalize()} system, non-sharing: per-agent pre-clip gradient norm, GRPO vs Dr. MAS "
                 f"(rolling median of {ROLL} steps over seeds)", fontsize=9)
    finish(fig)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=6, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


# ------------------------------------------------------------------------------------------ writing
def summary_markdown(an: StabilityAnalysis, runs_dir: Path) -> str:
    lines = ["# Stability grid: collapse, twin spikes, accuracy over time", "",
             f"Generated by `python -m analysis.stability --runs {runs_dir}`; rules in docs/stability.md.", "",
             f"Runs finished: {an.finished} of {an.total}.", ""]
    for key, judge, rule in judges(an.task):
        j = judge(an)
        lines += [f"**{key}.** {j.claim}. Paper: {j.paper}. Ours: {j.ours}. **{j.verdict}**. Rule: {rule}.", ""]
    for title, frame in (("Pilot (stress dial)", an.pilot), ("Runs", an.runs), ("Collapses", an.collapses),
                         ("First movers (every run; the runs that did not collapse are the control)", an.movers), ("Twin spikes per agent", an.spike_agents),
                         ("Accuracy over time", an.accuracy),
                         ("Steps with zero training reward: share, and there the mean advantage second moment per agent "
                          "and the mean step score (what the invalid-action penalty leaves to train on)", an.zero_reward),
                         ("Runs in progress (steps so far; not in any verdict)", an.in_progress)):
        if frame is not None and len(frame):
            lines += [f"## {title}", "", markdown(frame, index=False), ""]
    if an.data is not None and (problems := problem_lines(an.data)):
        lines += ["## Data problems", "", *(f"- {item}" for item in problems), ""]
    return "\n".join(lines) + "\n"


def write_outputs(an: StabilityAnalysis, out: Path, figures: Path, runs_dir: Path) -> list[Path]:
    from analysis.figures import save
    from drmas.io import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.md"]
    atomic_write_text(paths[0], summary_markdown(an, runs_dir))
    for name, frame in (("runs", an.runs), ("collapses", an.collapses), ("movers", an.movers), ("zero_reward", an.zero_reward),
                        ("twin_spikes", an.spikes), ("accuracy", an.accuracy), ("pilot", an.pilot)):
        if frame is not None and len(frame):
            frame.to_csv(out / f"{name}.csv", index=False)
            paths.append(out / f"{name}.csv")
    if an.data is not None:
        paths += save(fig_gradnorm_over_steps(an.data, an.runs, an.in_progress), figures, figure_stem(an.task))
    return paths


def load_optional(path: Path | None) -> GridData | None:
    """The grid in ``path`` (with or without index.json: :func:`analysis.runs.load_grid`), or None where no path is
    given or nothing is there (the grid was not run: "not run"). The command lines refuse a path that does not
    exist before this (:func:`missing_paths`)."""
    if path is None or not Path(path).exists():
        return None
    return load_grid(path)


def missing_paths(**paths: Path | None) -> list[str]:
    """``--flag PATH does not exist`` for each given path that does not exist (flags named by the keywords)."""
    return [f"--{flag.replace('_', '-')} {path} does not exist" for flag, path in paths.items()
            if path is not None and not Path(path).exists()]


DEFAULT_RUNS = Path("results/runs/stability")
DEFAULT_PILOT = Path("results/runs/stability_pilot")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m analysis.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--pilot", type=Path, default=None, help=f"the pilot's grid (default: {DEFAULT_PILOT}, if there)")
    p.add_argument("--out", type=Path, default=Path("results/stability"))
    p.add_argument("--figures", type=Path, default=Path("paper_figures"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if missing := missing_paths(runs=args.runs, pilot=args.pilot):
        print(f"analysis.stability: {'; '.join(missing)}; pass a stability grid's out_dir (e.g. {DEFAULT_RUNS}, "
              "written by experiments/grids/stability.yaml); nothing was written", file=sys.stderr)
        return 2
    try:
        an = analyze_stability(load_grid(args.runs), load_optional(args.pilot or DEFAULT_PILOT), seed=args.seed)
    except (FileNotFoundError, ValueError) as exc:
        print(f"analysis.stability: {exc}; nothing was written", file=sys.stderr)
        return 2
    for path in write_outputs(an, args.out, args.figures, args.runs):
        logger.info("wrote %s", path)
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
