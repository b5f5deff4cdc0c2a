"""The frontier round's per-run rules and estimates (docs/frontier.md; the constants are its numbers): each run's
primary event and "learned" test, collapse by each horizon, the rule's false-alarm rate, the arms' frontiers with
the interaction, the log-normal AFT model of the onset, and the agents' shares of a shared update.

A run's part of the design comes from its seed, as the pre-registration fixed them: 3000-3005 the round (both arms),
3100-3105 "where both learn" (non-sharing, 5e-5); its arm is its assignment (``nonsharing`` / ``sharing``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from drmas.algos.catalog import DRMAS, GRPO, estimator_label

from analysis.events import PERSIST, collapse_event, declared_agents, finished, longest_streak, reward_flag, steps_of
from analysis.frontier_design import Frontier, bootstrap_p, frontier
from analysis.run_records import run_manifest
from analysis.runs import GridData
from analysis.stats import ALPHA, holm, lognormal_aft
from analysis.twins import task_curves, twin_pairs

HORIZONS = (100, 150, 200)
PRIMARY = 200
"""H: the verdict is read at 200 steps; 100 and 150 are reported."""
ROUND_SEEDS = tuple(range(3000, 3006))
LEARN_SEEDS = tuple(range(3100, 3106))
"""The seeds of "where both learn" (non-sharing, 5e-5, 200 steps, no early stop)."""
ARMS = ("nonsharing", "sharing")
LEARNED_Z = 2.50
"""A run has learned at eval step t when z_t = mean(d) / (sd(d) / √n) >= 2.50 over the n questions (d_i: question
i's success share at t minus at step 0): one-sided α = 0.05 / 8, Bonferroni over the eight evaluations."""
SHARE_WINDOW = 40
"""Shares and cosines of a shared update: each run's mean over steps 0 .. 39."""


def part_of(seed: int) -> str:
    """"round", "learn" (where both learn) or "other" (a seed the design does not name: a data problem)."""
    return "round" if seed in ROUND_SEEDS else "learn" if seed in LEARN_SEEDS else "other"


def collapsed_by(onset: float, horizon: int) -> bool:
    """The primary event by ``horizon``: an onset no later than horizon − PERSIST (confirmed by the horizon)."""
    return bool(np.isfinite(onset) and onset <= horizon - PERSIST)


def learned_z(successes: np.ndarray) -> np.ndarray:
    """z_t of :data:`LEARNED_Z` for every eval step after the first, from (eval steps x questions) success shares.
    Where every d_i is equal the statistic is ±inf (0 when all are 0)."""
    d = successes[1:] - successes[0]
    if not len(d):
        return np.zeros(0)
    mean, sd = d.mean(axis=1), d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = mean / (sd / math.sqrt(d.shape[1]))
        flat = np.where(mean > 0, np.inf, np.where(mean < 0, -np.inf, 0.0))
    return np.where(sd > 0, z, flat)


def first_learned(steps: np.ndarray, successes: np.ndarray) -> float:
    """The first eval step at which the run has learned (NaN: never)."""
    hit = learned_z(successes) >= LEARNED_Z
    return float(steps[1:][hit][0]) if hit.any() else math.nan


def event_table(data: GridData) -> pd.DataFrame:
    """One row per finished run: arm, estimator, lr, seed, part; the onset of the primary event (NaN: none) and its
    clause; collapse by each horizon; the first eval step it learned (NaN: never) and whether it learned, then broke
    (by :data:`PRIMARY`); the longest streak of the reward clause; the code commit."""
    rows = []
    for r, done in zip(data.runs.itertuples(), finished(data)):
        if not done:
            continue
        ev = collapse_event(steps_of(data, r.run), declared_agents(Path(r.path)))
        s = steps_of(data, r.run).sort_values("step").set_index("step")
        eval_steps, shares = task_curves(data, r.run)
        onset = float(ev.step) if ev.step is not None else math.nan
        learned = first_learned(eval_steps, shares)
        row = {"run": r.run, "arm": r.assignment, "estimator": r.estimator, "lr": float(r.level), "seed": int(r.seed),
               "part": part_of(int(r.seed)), "onset": onset, "reason": ev.reason, "last_step": ev.last_step}
        row.update({f"collapsed_{h}": int(collapsed_by(onset, h)) for h in HORIZONS})
        row.update({"learned": learned, "learned_then_broke": int(np.isfinite(learned) and collapsed_by(onset, PRIMARY)
                                                                  and onset > learned),
                    "reward_streak": longest_streak(reward_flag(s)),
                    "git_commit": run_manifest(Path(r.path)).get("git_commit")})
        rows.append(row)
    cols = ["run", "arm", "estimator", "lr", "seed", "part", "onset", "reason", "last_step",
            *(f"collapsed_{h}" for h in HORIZONS), "learned", "learned_then_broke", "reward_streak", "git_commit"]
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------------------------ the frontiers
def arm_frontiers(events: pd.DataFrame, streams: dict[tuple[str, int], np.random.Generator],
                  draws: int) -> dict[tuple[str, int], Frontier]:
    """Per (arm, horizon) with runs of both estimators: :func:`analysis.frontier_design.frontier` of "collapsed by
    the horizon" on log2(lr), each on its own bootstrap stream."""
    out = {}
    for (arm, h), rng in streams.items():
        runs = events[(events["part"] == "round") & (events["arm"] == arm)]
        by = {e: runs[runs["estimator"] == e] for e in (GRPO, DRMAS)}
        if any(not len(v) for v in by.values()):
            continue
        xy = [(np.log2(by[e]["lr"].to_numpy()), by[e][f"collapsed_{h}"].to_numpy()) for e in (GRPO, DRMAS)]
        out[(arm, h)] = frontier(*xy[0], *xy[1], rng, draws)
    return out


def interaction(shared: Frontier, nonsharing: Frontier) -> dict[str, float]:
    """I = Δ(shared) − Δ(non-sharing) with the 95 % interval of the difference of the arms' independent draws (paired
    by index) and the two-sided p = 2 · min(P(I* <= 0), P(I* >= 0)), at most 1, each P counted as C6-n's one-sided p
    is, (1 + #) / (B + 1), so that B draws never give p = 0."""
    d = shared.draws - nonsharing.draws
    p = min(1.0, 2 * min(bootstrap_p(int((d <= 0).sum()), len(d)), bootstrap_p(int((d >= 0).sum()), len(d))))
    return {"estimate": shared.delta - nonsharing.delta, "low": float(np.quantile(d, 0.025)),
            "high": float(np.quantile(d, 0.975)), "p": p}


def primary_tests(fronts: dict[tuple[str, int], Frontier]) -> dict[str, float]:
    """The two primary tests at :data:`PRIMARY`, Holm-adjusted together: C6-n's one-sided p of Δ > 0 and C6-s's
    interaction p (each NaN where its arms have not run; Holm then over the tests there are)."""
    raw = {}
    if (n := fronts.get(("nonsharing", PRIMARY))) is not None:
        raw["C6-n"] = n.p_above_zero()
        if (s := fronts.get(("sharing", PRIMARY))) is not None:
            raw["C6-s"] = interaction(s, n)["p"]
    adjusted = dict(zip(raw, holm(list(raw.values()))))
    return {**{f"p_{k}": v for k, v in raw.items()}, **{f"p_holm_{k}": float(v) for k, v in adjusted.items()}}


def differs(p_holm: float) -> bool:
    """C6-s's reading: the estimator's effect differs with a shared model where the Holm-adjusted interaction p is
    below α (which puts 0 outside the interaction's 95 % interval)."""
    return bool(p_holm < ALPHA)


# ------------------------------------------------------------------------------------------ time to collapse
def aft_time_ratio(events: pd.DataFrame, arm: str, horizon: int = PRIMARY) -> dict[str, float | str]:
    """Per arm, the log-normal AFT model of the onset on centred log2(lr) and [GRPO]: the time ratio GRPO / Dr. MAS
    e^β2 with its Wald interval. T counts the steps through the onset (onset + 1; a step-0 onset is one step), a run
    without an onset by horizon − PERSIST is censored there (+1). Where one estimator has no collapse the likelihood
    has no maximum (β2 → ±∞) and the note says so, with each estimator's count, instead of a number; so it does
    where the maximiser does not converge."""
    runs = events[(events["part"] == "round") & (events["arm"] == arm)]
    if runs.empty or runs["estimator"].nunique() < 2:
        return {"note": "no runs of both estimators"}
    limit = horizon - PERSIST
    event = runs["onset"].le(limit).to_numpy()
    if not event.any():
        return {"note": "no collapse by the horizon: no time ratio"}
    of = {est: (runs["estimator"] == est).to_numpy() for est in (GRPO, DRMAS)}
    counts = {est: f"{int(event[m].sum())} of {int(m.sum())}" for est, m in of.items()}
    for est, other, side in ((GRPO, DRMAS, "above"), (DRMAS, GRPO, "below")):
        if not event[of[est]].any():  # β2 → ±∞: the likelihood has no maximum
            return {"events": int(event.sum()), "runs": len(runs),
                    "note": f"no finite time ratio: no {estimator_label(est)} run collapsed by step {limit} "
                            f"({counts[est]}; {estimator_label(other)} {counts[other]}), so the ratio is unbounded "
                            f"{side} 1"}
    time = np.where(event, runs["onset"].fillna(limit).to_numpy() + 1, limit + 1)
    x = np.log2(runs["lr"].to_numpy())
    fit = lognormal_aft(time, event, np.column_stack([x - x.mean(), of[GRPO]]))
    if not (fit.converged and np.isfinite(fit.params).all() and np.isfinite(fit.bse).all()):
        return {"events": int(event.sum()), "runs": len(runs),
                "note": "no finite time ratio: the likelihood's maximiser did not converge"}
    ratio, low, high = fit.time_ratio(2)
    return {"ratio": ratio, "low": low, "high": high, "sigma": fit.sigma, "converged": fit.converged,
            "events": int(event.sum()), "runs": len(runs), "note": ""}


# ------------------------------------------------------------------------------------------ shares
SHARE_COLUMNS = {"by_estimator": ["measure", "lr", "agent", "estimator", "runs", "median"],
                 "paired": ["measure", "lr", "agent", "pairs", "median_diff"],
                 "pooled": ["measure", "agent", "estimator", "runs", "median", "pairs", "median_diff"]}
"""The columns of the three tables :func:`shares` returns."""


def _paired_diffs(values: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per twin pair, measure and agent: Dr. MAS − GRPO of the per-run values, with the pair's lr."""
    diffs = []
    for lr, _seed, g_run, d_run in twin_pairs(runs):
        pair = values[values["run"].isin([g_run, d_run])].pivot_table(index=["measure", "agent"], columns="run",
                                                                        values="value")
        if {g_run, d_run} <= set(pair.columns):
            diffs.append((pair[d_run] - pair[g_run]).rename("diff").reset_index().assign(lr=lr))
    return pd.concat(diffs) if diffs else pd.DataFrame(columns=["measure", "agent", "diff", "lr"])


def shares(data: GridData, events: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The agents' shares of the shared update over steps 0 .. SHARE_WINDOW-1 (shared arm), three tables
    (:data:`SHARE_COLUMNS`): ``by_estimator``, per (estimator, lr, agent) the median over runs of each run's mean
    share; ``paired``, per (lr, agent) the median of the twin pairs' Dr. MAS − GRPO with the pair count; ``pooled``,
    both over every level (descriptive: the share an agent takes of the shared update, per estimator). The cosines
    between agents' contributions are summarised the same way (agent = the pair ``a~b``)."""
    empty = {k: pd.DataFrame(columns=cols) for k, cols in SHARE_COLUMNS.items()}
    runs = events[(events["part"] == "round") & (events["arm"] == "sharing")]
    early_a = data.agents[data.agents["run"].isin(runs["run"]) & (data.agents["step"] < SHARE_WINDOW)]
    per_run = []
    if "grad_share" in early_a:
        per_run.append(early_a.groupby(["run", "agent"])["grad_share"].mean().rename("value").reset_index())
    groups = data.groups[data.groups["run"].isin(runs["run"]) & (data.groups["step"] < SHARE_WINDOW)]
    cos_cols = [c for c in groups.columns if c.startswith("grad_cos/")]
    if cos_cols:
        cos = groups.groupby("run")[cos_cols].mean().reset_index().melt("run", var_name="agent", value_name="value")
        cos["agent"] = cos["agent"].str.removeprefix("grad_cos/")
        per_run.append(cos)
    if not per_run:
        return empty
    values = pd.concat(per_run).merge(runs[["run", "estimator", "lr", "seed"]], on="run")
    values["measure"] = np.where(values["agent"].str.contains("~"), "cosine", "share")
    diffs = _paired_diffs(values, runs)

    def summary(by: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
        est = (values.groupby([*by, "estimator"])["value"].agg(["count", "median"]).reset_index()
               .rename(columns={"count": "runs"}))
        pair = (diffs.groupby(by)["diff"].agg(["count", "median"]).reset_index()
                .rename(columns={"count": "pairs", "median": "median_diff"}) if len(diffs) else
                pd.DataFrame(columns=[*by, "pairs", "median_diff"]))
        return est, pair

    by_est, paired = summary(["measure", "lr", "agent"])
    pooled_est, pooled_pair = summary(["measure", "agent"])
    pooled = pooled_est.merge(pooled_pair, on=["measure", "agent"], how="left")
    return {"by_estimator": by_est[SHARE_COLUMNS["by_estimator"]], "paired": paired[SHARE_COLUMNS["paired"]],
            "pooled": pooled[SHARE_COLUMNS["pooled"]]}


def false_alarms(events: pd.DataFrame) -> dict[str, float | int | list]:
    """The primary rule on the runs of "where both learn": how many fired by :data:`PRIMARY`, with the exact
    (Clopper-Pearson) 95 % interval of the share, and per run the longest reward-clause streak (PERSIST needed)."""
    from scipy.stats import binomtest

    runs = events[events["part"] == "learn"]
    if runs.empty:
        return {}
    fired = int(runs[f"collapsed_{PRIMARY}"].sum())
    ci = binomtest(fired, len(runs)).proportion_ci(method="exact")
    return {"fired": fired, "runs": len(runs), "low": float(ci.low), "high": float(ci.high),
            "streaks": sorted(int(v) for v in runs["reward_streak"])}


def learned_counts(events: pd.DataFrame) -> pd.DataFrame:
    """Per (arm, estimator, lr) of the round: runs, runs that learned at all, collapsed by :data:`PRIMARY`, and
    learned, then broke."""
    runs = events[events["part"] == "round"].assign(learned_any=lambda f: f["learned"].notna().astype(int))
    return (runs.groupby(["arm", "estimator", "lr"])
            .agg(runs=("run", "size"), learned=("learned_any", "sum"), collapsed=(f"collapsed_{PRIMARY}", "sum"),
                 learned_then_broke=("learned_then_broke", "sum")).reset_index())


def time_averaged_accuracy(data: GridData, events: pd.DataFrame) -> pd.DataFrame:
    """Each finished run's time-averaged avg@k (the area under its eval curve over its span, questions pooled), with
    its arm, estimator, lr and part: the accuracy-against-lr figure's points."""
    rows = []
    for r in events.itertuples():
        steps, c = task_curves(data, r.run)
        if len(steps) >= 2:
            rows.append({"run": r.run, "arm": r.arm, "estimator": r.estimator, "lr": r.lr, "part": r.part,
                         "auc": float(np.trapezoid(c.mean(axis=1), steps) / (steps[-1] - steps[0]))})
    return pd.DataFrame(rows, columns=["run", "arm", "estimator", "lr", "part", "auc"])
