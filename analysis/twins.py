"""What the stability studies compare between a GRPO run and its Dr. MAS twin (the run of the same learning rate and
seed): the twin pairs, accuracy over time paired by seed and task, and the Figure-4 analogue (per-agent pre-clip
gradient norm over steps, GRPO vs Dr. MAS). The exploratory grids (:mod:`analysis.stability`) and the confirmatory
round (:mod:`analysis.confirm`) and the frontier round (:mod:`analysis.frontier`) read them; none owns them."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from drmas.algos.catalog import DRMAS, GRPO, estimator_label

from analysis.events import ROLL
from analysis.plotting import figure, finish, seed_band
from analysis.runs import GridData
from analysis.stats import N_BOOT, paired_test

TASKS = ("search", "math")
"""The systems with a stability grid (experiments/grids/stability.yaml, stability_math.yaml)."""


def task_of(data: GridData) -> str:
    """The system of a stability grid: its runs' one ``task`` tag."""
    tasks = sorted(set(data.runs["task"].dropna()))
    if len(tasks) != 1 or tasks[0] not in TASKS:
        raise ValueError(f"a stability grid holds one system of {TASKS}; its runs are tagged task={tasks}")
    return tasks[0]


# ------------------------------------------------------------------------------------------ twin pairs
def twin_pairs(events: pd.DataFrame) -> list[tuple[float, int, str, str]]:
    """(lr, seed, GRPO run, Dr. MAS run) of every finished twin pair."""
    pairs = []
    for (lr, seed), g in events.groupby(["lr", "seed"]):
        by = {e: g.loc[g["estimator"] == e, "run"] for e in (GRPO, DRMAS)}
        if all(len(v) == 1 for v in by.values()):
            pairs.append((float(lr), int(seed), by[GRPO].iloc[0], by[DRMAS].iloc[0]))
    return pairs



# ------------------------------------------------------------------------------------------ accuracy over time
def task_curves(data: GridData, run: str) -> tuple[np.ndarray, np.ndarray]:
    """(eval steps, per-step x per-question success share) of one run, steps sorted; the benchmarks' questions side
    by side."""
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
            curves = {e: task_curves(data, pair.loc[pair["estimator"] == e, "run"].iloc[0]) for e in (GRPO, DRMAS)}
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
    fig = figure(3.6 * len(lrs), 2.6 * len(agents))
    axes = fig.subplots(len(agents), len(lrs), squeeze=False)
    colors = {GRPO: "tab:red", DRMAS: "tab:blue"}
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
                label = (f"{estimator_label(est)}: median of the seeds with a norm (of {y.shape[1]}), drawn where "
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
