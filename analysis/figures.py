"""Figures of the paper from run directories (matplotlib object API on the Agg canvas: no pyplot state, no
display needed). Each ``fig_*`` function returns a :class:`matplotlib.figure.Figure`, or ``None`` when the runs it
needs are missing; :func:`save` writes PNG and PDF.

============================== ===================================================================================
file (``paper_figures/``)      content
============================== ===================================================================================
gradnorm_{task}_{assignment}   per-agent pre-clip gradient norm, GRPO vs Dr. MAS, one panel per agent, per estimator
                               the median over seeds with a min-max band; ✕ = a seed's spike under the documented
                               rule, ▲ at the top = non-finite norm (paper Figures 4, 6, 7)
train_{task}                   training reward (reward/mean, rolling mean) and eval Average avg@k (%, 95 % CI) per
                               setting
ablation_{task}                the same for the Table 3 variants, plus the largest agent gradient norm (median over
                               seeds, min-max band) (Figure 8)
reward_stats_{task}            μk, σk per agent against μ, σ over training (top) and the Lemma 4.2 factor
                               (σk² + (μk − μ)²)/σ² (bottom), one column per multi-agent setting (first seed)
hetero_{task}                  heterogeneous vs homogeneous non-sharing Dr. MAS: tokens per agent, generation
                               seconds, inference cost per step, Average accuracy (Figure 5)
mechanism                      the mechanism sweep: per (level, seed, agent), the grad-norm ratio global baseline /
                               Dr. MAS (left) and the realized E_k[A²] ratio (right) against the agent's Lemma 4.2
                               factor, with the Lemma's prediction (√factor, factor) drawn in
============================== ===================================================================================

The drawing rules every figure shares (median and band, log axes, no offset labels, constant series, eval points,
legends) are in :mod:`analysis.plotting`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from drmas.algos import SpikeRule, spike_ratios
from drmas.algos.catalog import GRPO

from analysis.plotting import (BAND_LABELS, dodge, finish, flat_series, legend_below, legend_outside, mark_constant,
                               min_span, plot_median_band, plot_points, save, scale_from_span, unique_handles)
from analysis.plotting import figure as _figure
from analysis.runs import GridData
from analysis.tables import ABLATION, ABLATION_ONLY, PAIRS, SETTINGS

logger = logging.getLogger(__name__)

SMOOTH = 10  # rolling-mean window (steps) of the training curves
COLORS = {"single_agent_grpo": "0.45", "sharing_grpo": "tab:orange", "sharing_drmas": "tab:cyan",
          "nonsharing_grpo": "tab:red", "nonsharing_drmas": "tab:blue", "hetero_drmas": "tab:green", "homogeneous_drmas": "tab:purple",
          "nonsharing:(mu_k,sigma)": "tab:purple", "nonsharing:(mu,sigma_k)": "tab:olive",
          "nonsharing:pooled_step": "tab:brown", "nonsharing:agent_traj": "tab:pink", "nonsharing:traj_agent": "tab:gray",
          "nonsharing:traj_traj": "tab:cyan"}
SEED_STYLES = ("-", "--", ":", "-.")
GRADNORM_FIGURES = tuple(f"gradnorm_{t}_{a}" for t in ("search", "math") for a in ("nonsharing", "sharing"))
"""The stems of :func:`fig_gradnorm` per (task, assignment), as :func:`write_figures` writes them."""


def _runs(data: GridData, task: str, settings: Sequence[str]) -> pd.DataFrame:
    r = data.runs[(data.runs["task"] == task) & data.runs["setting"].isin(settings) & data.runs["usable"]]
    return r.sort_values(["setting", "seed"])


def _label(setting: str) -> str:
    """``nonsharing:(mu_k,sigma)`` -> ``(mu_k,sigma)``; ``sharing_drmas`` -> ``sharing drmas``."""
    return setting.split(":", 1)[1] if ":" in setting else setting.replace("_", " ")


# ------------------------------------------------------------------------------------------ gradient norms
def _wide(frame: pd.DataFrame, runs: Sequence[str], column: str, steps: np.ndarray) -> np.ndarray:
    """``(steps, runs)`` array of ``column`` (NaN where a run logged nothing at a step)."""
    wide = frame.pivot_table(index="step", columns="run", values=column, aggfunc="first", dropna=False)
    return wide.reindex(index=steps, columns=list(runs)).to_numpy(float)


def fig_gradnorm(data: GridData, task: str, assignment: str, rule: SpikeRule = SpikeRule(),
                 band: str = "minmax") -> Figure | None:
    """Per agent (panel) and estimator (colour): the median over seeds of the pre-clip grad norm with a band
    (:func:`analysis.plotting.seed_band`); ✕ a seed's spike under ``rule`` at its own value, ▲ at the top a seed's
    non-finite norm. Log y where the panel's norms span decades; there a zero norm is a tick at the bottom, left out
    of median and band. None without norms."""
    dr, gr = PAIRS[assignment]
    runs = _runs(data, task, (gr, dr))
    ag = data.agents[data.agents["run"].isin(runs["run"])] if "grad_norm" in data.agents else pd.DataFrame()
    if ag.empty or ag["grad_norm"].notna().sum() == 0 or runs["setting"].nunique() < 1:
        return None
    agents = list(dict.fromkeys(ag["agent"]))
    steps = np.sort(ag["step"].unique())
    fig = _figure(4.2 * len(agents), 3.3)
    axes = fig.subplots(1, len(agents), squeeze=False)[0]
    nonfinite = zero = False
    for ax, agent in zip(axes, agents):
        cells = []
        for setting in (gr, dr):
            cell = runs[runs["setting"] == setting]
            a = ag[(ag["agent"] == agent) & ag["run"].isin(cell["run"])]
            if not cell.empty and not a["grad_norm"].isna().all():
                cells.append((setting, cell, a, _wide(a, cell["run"], "grad_norm", steps)))
        # the scale from the seeds' norms; on a log axis a zero norm (all advantages 0) cannot be drawn: it is
        # left out of the median and band and ticked at the bottom instead
        log = scale_from_span(ax, [y for *_, y in cells])
        drawn, marks, zeros = [], [], []
        for setting, cell, a, y in cells:
            color = COLORS.get(setting, "k")
            shown = np.where(np.isfinite(y) & ((y > 0) if log else True), y, np.nan)
            drawn += list(plot_median_band(ax, steps, shown, color, f"{_label(setting)} (median of {y.shape[1]} "
                                                                    f"seed(s))", band))
            if log:
                zeros.append((color, steps[np.nonzero(y == 0)[0]]))
            for _, g in a.groupby("run", sort=True):
                g = g.sort_values("step")
                x, norm = g["step"].to_numpy(), g["grad_norm"].to_numpy(float)
                fin = np.isfinite(norm)
                spike = spike_ratios(norm, rule)["spike"].to_numpy() & fin
                marks.append((color, x[spike], norm[spike], x[~fin]))
                nonfinite |= bool((~fin).any())
        top = max((float(np.nanmax(v)) for v in drawn if np.isfinite(v).any()), default=1.0)
        for color, xs, ys, bad in marks:
            ax.scatter(xs, ys, marker="x", color=color, s=24, lw=1.0, zorder=3)
            if len(bad):
                ax.scatter(bad, np.full(len(bad), top * (1.5 if log else 1.08)), marker="^", color=color, s=30, zorder=3)
        if any(len(xs) for _, xs in zeros):
            bottom, upper = ax.get_ylim()
            for k, (color, xs) in enumerate(zeros):
                ax.scatter(xs, np.full(len(xs), bottom * (1.2 + 0.3 * k)), marker="|", color=color, s=12, lw=0.8)
            ax.set_ylim(bottom, upper)
            zero = True
        ax.set(title=agent, xlabel="RL step",
               ylabel=f"pre-clip grad norm{' (log)' if log else ''}")
    finish(fig)
    handles, labels = unique_handles(*axes)
    handles.append(Line2D([], [], marker="x", ls="", color="0.3"))
    labels.append(f"spike of a seed (g_t > {rule.threshold:g} x median of its previous {rule.window})")
    if nonfinite:
        handles.append(Line2D([], [], marker="^", ls="", color="0.3"))
        labels.append("non-finite norm of a seed (at the top)")
    if zero:
        handles.append(Line2D([], [], marker="|", ls="", color="0.3"))
        labels.append("norm 0 of a seed (a tick at the bottom of a log axis)")
    fig.suptitle(f"Per-agent gradient norm, {task}, {assignment}: GRPO vs Dr. MAS "
                 f"(line: median over seeds, {BAND_LABELS[band]})", fontsize=9)
    fig.tight_layout()
    legend_below(fig, handles, labels, ncol=3)
    return fig


# ------------------------------------------------------------------------------------------ training curves
EVAL_BOOT = 1000  # bootstrap replicates of an eval point's interval in the figures
EVAL_MIN_SPAN = 20.0  # percentage points: the eval axis never spans less (a 1-point gap stays small)


def _mean_curve(data: GridData, runs: pd.DataFrame, column: str, smooth: int = SMOOTH) -> pd.DataFrame:
    """Per step: mean, min, max over the runs of the rolling-mean-smoothed ``column``."""
    st = data.steps[data.steps["run"].isin(runs["run"])]
    if column not in st:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    curves = {r: g.sort_values("step").set_index("step")[column].rolling(smooth, min_periods=1).mean()
              for r, g in st.groupby("run")}
    wide = pd.DataFrame(curves)
    return pd.DataFrame({"step": wide.index, "mean": wide.mean(axis=1), "min": wide.min(axis=1),
                         "max": wide.max(axis=1)}).reset_index(drop=True)


def _eval_curve(data: GridData, runs: pd.DataFrame, metric: str = "avg", n_boot: int = EVAL_BOOT,
                seed: int = 0) -> pd.DataFrame:
    """Per eval step: the Average ``metric`` (mean over seeds and benchmarks, as in the tables) with its 95 %
    bootstrap interval over tasks (:func:`analysis.tables.accuracy_long`, ``default_rng(seed)``: the same runs give
    the same interval)."""
    from analysis.tables import accuracy_long

    ev = data.tagged(data.evals[data.evals["run"].isin(runs["run"])])
    rows = []
    rng = np.random.default_rng(seed)
    for step, at in ev.groupby("step", sort=True):
        acc = accuracy_long(at, str(at["task"].iloc[0]), rng, n_boot)
        av = acc[(acc["benchmark"] == "average") & (acc["metric"] == metric)]
        if len(av):
            rows.append({"step": step, metric: av["mean"].mean(), "low": av["low"].mean(), "high": av["high"].mean()})
    return pd.DataFrame(rows, columns=["step", metric, "low", "high"])


def _curves_panel(ax_train, ax_eval, data: GridData, task: str, settings: Sequence[str], seeds=None) -> int:
    """Training reward (mean over seeds, min-max band) and eval Average avg@k (%, 95 % CI) per setting."""
    shown = []
    for s in settings:
        runs = _runs(data, task, (s,))
        if seeds is not None:
            runs = runs[runs["seed"].isin(seeds)]
        if not runs.empty:
            shown.append((s, runs))
    evals = [(s, runs, _eval_curve(data, runs)) for s, runs in shown]
    steps = np.concatenate([e["step"].to_numpy(float) for _, _, e in evals]) if evals else np.zeros(0)
    grid = np.unique(steps)
    width = min(0.15 * (grid[-1] - grid[0]), 0.6 * float(np.diff(grid).min())) if len(grid) > 1 else 0.0
    for i, (s, runs, e) in enumerate(evals):
        c = _mean_curve(data, runs, "reward/mean")
        color = COLORS.get(s, None)
        ax_train.plot(c["step"], c["mean"], color=color, lw=1.2, label=f"{_label(s)} ({len(runs)} seed(s))")
        if len(runs) > 1:
            ax_train.fill_between(c["step"], c["min"], c["max"], color=color, alpha=0.12, lw=0)
        if len(e):
            plot_points(ax_eval, e["step"] + dodge(i, len(evals), width), e["avg"] * 100, e["low"] * 100,
                        e["high"] * 100, color=color)
    ax_train.set(xlabel="RL step", ylabel=f"training reward (rolling mean {SMOOTH})")
    ax_eval.set(xlabel="RL step (points of a step side by side)", ylabel="eval Average avg@k (%, 95 % CI)")
    if evals:
        ax_eval.set_xticks(sorted(set(steps.tolist())))
        min_span(ax_eval, EVAL_MIN_SPAN, (0.0, 100.0))
    return len(shown)


def fig_training(data: GridData, task: str, settings: Sequence[str] = (*SETTINGS, "hetero_drmas")) -> Figure | None:
    fig = _figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    if not _curves_panel(ax1, ax2, data, task, settings):
        return None
    finish(fig)
    fig.suptitle(f"Training accuracy, {task} (training: mean over seeds, band: min-max over seeds; eval: mean over "
                 f"seeds, 95 % bootstrap CI over tasks)", fontsize=9)
    fig.tight_layout()
    legend_below(fig, *unique_handles(ax1), ncol=3)
    return fig


def fig_ablation(data: GridData, task: str, seeds: Sequence[int] | None = None) -> Figure | None:
    ran = set(data.runs.loc[data.runs["task"] == task, "setting"])
    settings = [v.ours for v in ABLATION if v.paper is not None or v.ours in ran]
    if not any(s in set(data.runs.loc[data.runs["task"] == task, "setting"]) for s in ABLATION_ONLY):
        return None
    fig = _figure(14, 3.6)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    if not _curves_panel(ax1, ax2, data, task, settings, seeds):
        return None
    drawn = []
    for s in settings:
        runs = _runs(data, task, (s,))
        if seeds is not None:
            runs = runs[runs["seed"].isin(seeds)]
        ag = data.agents[data.agents["run"].isin(runs["run"])]
        if ag.empty or "grad_norm" not in ag:
            continue
        mx = ag.groupby(["run", "step"])["grad_norm"].max().reset_index()
        steps = np.sort(mx["step"].unique())
        drawn += list(plot_median_band(ax3, steps, _wide(mx, sorted(mx["run"].unique()), "grad_norm", steps),
                                       COLORS.get(s), _label(s), lw=0.9, alpha=0.12))
    log = scale_from_span(ax3, drawn)
    ax3.set(xlabel="RL step", ylabel=f"max over agents of grad norm{' (log)' if log else ''}")
    ax3.set_title(f"median over seeds, {BAND_LABELS['minmax']}", fontsize=8)
    finish(fig)
    fig.suptitle(f"Normalization ablation (Table 3 variants + pooled step-level baseline), {task}", fontsize=10)
    fig.tight_layout()
    legend_below(fig, *unique_handles(ax1), ncol=3)
    return fig


# ------------------------------------------------------------------------------------------ reward statistics
def fig_reward_stats(data: GridData, task: str) -> Figure | None:
    """Top: μ, σ of the task reward (black) and μk, σk per agent (colour; solid mean, dashed std); bottom: the
    Lemma 4.2 factor per agent, on one y-range per row. A factor constant up to float noise (Dr. MAS: 1 by
    construction) is written as such instead of drawn magnified."""
    settings = [s for a in PAIRS.values() for s in reversed(a)]
    runs = _runs(data, task, settings)
    runs = runs[runs.groupby("setting")["seed"].transform("min") == runs["seed"]]
    runs = runs.sort_values("setting", key=lambda s: s.map(settings.index))
    if runs.empty or data.agents.empty or "reward_mean" not in data.agents:
        return None
    fig = _figure(3.6 * len(runs), 6)
    axes = fig.subplots(2, len(runs), squeeze=False, sharex=True)
    roll = lambda s: s.rolling(5, min_periods=1).mean()  # noqa: E731
    factors = []
    for j, r in enumerate(runs.itertuples()):
        st = data.steps[data.steps["run"] == r.run].sort_values("step").set_index("step")
        ag = data.agents[data.agents["run"] == r.run]
        top, bot = axes[0, j], axes[1, j]
        if "task/mu" in st:
            top.plot(st.index, roll(st["task/mu"]), "k-", lw=1.4, label="μ, σ of the task reward (solid, dashed)")
        if "task/sigma" in st:
            top.plot(st.index, roll(st["task/sigma"]), "k--", lw=1.4)
        col = []
        for i, (agent, g) in enumerate(ag.groupby("agent", sort=False)):
            g = g.sort_values("step").set_index("step")
            color = f"C{i}"
            top.plot(g.index, roll(g["reward_mean"]), "-", color=color, lw=1, label=f"{agent}: μk, σk (solid, dashed)")
            if "reward_std" in g:
                top.plot(g.index, roll(g["reward_std"]), "--", color=color, lw=1)
            if "lemma_factor" in g:
                y = roll(g["lemma_factor"])
                bot.plot(g.index, y, color=color, lw=1)
                col.append(y.to_numpy(float))
        factors.append(col)
        top.set(title=f"{_label(r.setting)} (seed {r.seed})", ylabel="reward statistics")
        bot.set(xlabel="RL step", ylabel="(σk² + (μk − μ)²) / σ²")
    varying = [v for col in factors for v in col if not flat_series(v)[0]]
    finite = np.concatenate([v[np.isfinite(v)] for v in varying]) if varying else np.zeros(0)
    lo, hi = (min(0.0, float(finite.min())), max(2.0, float(finite.max()))) if len(finite) else (0.0, 2.0)
    for j, col in enumerate(factors):
        bot = axes[1, j]
        bot.axhline(1.0, color="k", lw=0.8, ls=":")
        if not (col and mark_constant(bot, col, ylim=(lo, hi + 0.05 * (hi - lo)), name="factor constant")):
            bot.set_ylim(lo, hi + 0.05 * (hi - lo))
    finish(fig)
    fig.suptitle(f"Per-agent reward statistics and the Lemma 4.2 factor, {task} (rolling mean 5; dotted: factor 1)",
                 fontsize=10)
    fig.tight_layout()
    legend_below(fig, *unique_handles(*axes[0]), ncol=4)
    return fig


# ------------------------------------------------------------------------------------------ heterogeneous
def fig_hetero(eff: pd.DataFrame, summary: pd.DataFrame, task: str = "search") -> Figure | None:
    """``eff``/``summary`` from :func:`analysis.tables.efficiency_long` / :func:`efficiency_summary`."""
    if summary.empty or summary["setting"].nunique() < 2:
        return None
    settings = list(summary["setting"])
    fig = _figure(14, 3.4)
    ax1, ax2, ax3, ax4 = fig.subplots(1, 4)
    agents = list(dict.fromkeys(eff["agent"]))
    width = 0.8 / len(settings)
    for i, s in enumerate(settings):
        e = eff[eff["setting"] == s].groupby("agent", sort=False).agg(tokens=("tokens", "mean"), cost=("cost", "mean"),
                                                                      preset=("preset", "first")).reindex(agents)
        x = np.arange(len(agents)) + i * width
        ax1.bar(x, e["tokens"], width, color=COLORS.get(s), label=_label(s))
        for xi, (tok, pre) in zip(x, zip(e["tokens"], e["preset"])):
            if np.isfinite(tok):
                ax1.text(xi, tok, str(pre), ha="center", va="bottom", fontsize=6)
        bottom = 0.0
        for j, agent in enumerate(agents):
            c = e.loc[agent, "cost"] * 1e6 if np.isfinite(e.loc[agent, "cost"]) else 0.0
            ax3.bar(i, c, 0.6, bottom=bottom, color=f"C{j}", label=agent if i == 0 else None)
            bottom += c
    ax1.set_xticks(np.arange(len(agents)) + 0.4 - width / 2, agents)
    ax1.set(ylabel="tokens per step (prompt + response)", title="tokens per agent")
    ax1.legend(fontsize=7)
    ax2.bar(range(len(settings)), summary["generate_s"], color=[COLORS.get(s) for s in settings])
    ax2.set_xticks(range(len(settings)), [_label(s) for s in settings], fontsize=7)
    ax2.set(ylabel="generation seconds per step", title="latency (sum of timing/generate)")
    ax3.set_xticks(range(len(settings)), [_label(s) for s in settings], fontsize=7)
    ax3.set(ylabel="cost per step (USD per million steps)", title="inference cost (tokens x price)")
    ax3.legend(fontsize=7)
    for j, m in enumerate(("avg", "pass")):
        err = np.vstack([summary[m] - summary[f"{m}_low"], summary[f"{m}_high"] - summary[m]]) * 100
        ax4.bar(np.arange(len(settings)) + j * 0.4, summary[m] * 100, 0.4, yerr=err, capsize=3,
                color=[COLORS.get(s) for s in settings], alpha=1.0 if m == "avg" else 0.5, label=f"{m}@k")
    ax4.set_xticks(np.arange(len(settings)) + 0.2, [_label(s) for s in settings], fontsize=7)
    ax4.set(ylabel="eval Average (%)", title="accuracy (95 % CI)")
    ax4.legend(fontsize=7)
    finish(fig)
    fig.suptitle(f"Heterogeneous model assignment, {task} (paper Figure 5)", fontsize=10)
    fig.tight_layout()
    return fig


AGENT_MARKERS = ("o", "s", "^", "D", "v")


def fig_mechanism(points: pd.DataFrame) -> Figure | None:
    """Ratio vs factor per (level, seed, agent) of the mechanism sweep, one colour per level, one marker per
    agent, filled for trajectory GRPO and open for pooled GRPO (see analysis/mechanism.py)."""
    if points.empty:
        return None
    fig = _figure(10, 4.2)
    ax_n, ax_a = fig.subplots(1, 2)
    levels = sorted(points["level"].unique())
    cmap = [f"C{i}" for i in range(len(levels))]
    agents = sorted(points["agent"].unique())
    for (baseline, level, agent), g in points.groupby(["baseline", "level", "agent"]):
        color = cmap[levels.index(level)]
        marker = AGENT_MARKERS[agents.index(agent) % len(AGENT_MARKERS)]
        face = color if baseline == GRPO else "none"
        for ax, col in ((ax_n, "ratio"), (ax_a, "a2_ratio")):
            ax.scatter(g["factor"], g[col], marker=marker, facecolors=face, edgecolors=color, s=28, zorder=3)
    top = max(float(points["factor"].max()), 1.5) * 1.15
    x = np.linspace(0.05, top, 200)
    (prediction,) = ax_n.plot(x, np.sqrt(x), "k--", lw=1, label="Lemma 4.2: √factor (left)")
    (factor_line,) = ax_a.plot(x, x, "k--", lw=1, label="Lemma 4.2: factor (right)")
    for ax, title in ((ax_n, "grad-norm ratio (mean over steps)"), (ax_a, "E_k[A²] ratio")):
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel("Lemma 4.2 factor of the global baseline (mean over steps)")
        ax.set_ylabel(f"{title}:\nglobal baseline / Dr. MAS")
        ax.set_xscale("log")
        ax.set_yscale("log")
    handles = [ax_n.scatter([], [], color=cmap[i], marker="o", s=28, label=f"miss rate {lv:g}") for i, lv in enumerate(levels)]
    handles += [ax_n.scatter([], [], color="0.3", marker=AGENT_MARKERS[i % len(AGENT_MARKERS)], s=28, label=a)
                for i, a in enumerate(agents)]
    finish(fig)
    fig.suptitle("Mechanism sweep (search): filled = trajectory GRPO, open = pooled step-level GRPO", fontsize=10)
    fig.tight_layout()
    legend_outside(ax_a, [*handles, prediction, factor_line], [h.get_label() for h in (*handles, prediction, factor_line)])
    return fig


def fig_class_aware(points: pd.DataFrame) -> Figure | None:
    """Measured grad-norm ratio trajectory GRPO / Dr. MAS against its two predictions, per (level, seed, agent)
    of the mechanism sweep: the paper's √F (left) and the class-aware √(class factor) (right); one marker per
    agent, one colour per level (see analysis/class_aware.py). None without the class-aware metrics."""
    p = points[points["baseline"] == GRPO] if len(points) else points
    if p.empty or "pred_class" not in p or not np.isfinite(p["pred_class"].astype(float)).any():
        return None
    fig = _figure(10, 4.2)
    axes = fig.subplots(1, 2, sharey=True)
    levels = sorted(p["level"].unique())
    agents = sorted(p["agent"].unique())
    for (level, agent), g in p.groupby(["level", "agent"]):
        color, marker = f"C{levels.index(level)}", AGENT_MARKERS[agents.index(agent) % len(AGENT_MARKERS)]
        for ax, col in zip(axes, ("pred_paper", "pred_class")):
            ax.scatter(g[col], g["ratio"], marker=marker, color=color, s=28, zorder=3)
    finite = np.concatenate([p[c].astype(float).to_numpy() for c in ("pred_paper", "pred_class", "ratio")])
    finite = finite[np.isfinite(finite) & (finite > 0)]
    lo, hi = finite.min() / 1.5, finite.max() * 1.5
    for ax, label in zip(axes, ("paper: √F (Lemma 4.2 factor)", "class-aware: √(class factor)")):
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"predicted ratio, {label}")
    axes[0].set_ylabel("measured grad-norm ratio trajectory GRPO / Dr. MAS")
    handles = [axes[0].scatter([], [], color=f"C{i}", marker="o", s=28, label=f"miss rate {lv:g}") for i, lv in enumerate(levels)]
    handles += [axes[0].scatter([], [], color="0.3", marker=AGENT_MARKERS[i % len(AGENT_MARKERS)], s=28, label=a)
                for i, a in enumerate(agents)]
    axes[0].legend(handles=handles, fontsize=7, loc="lower right")
    axes[1].legend(fontsize=7, loc="lower right")
    finish(fig)
    fig.suptitle("Mechanism sweep (search): measured ratio against both predictions (mean over steps)", fontsize=10)
    fig.tight_layout()
    return fig


def write_figures(data: GridData, out_dir: Path, eff: pd.DataFrame | None = None, eff_summary: pd.DataFrame | None = None,
                  ablation_seeds: Sequence[int] | None = None) -> list[Path]:
    """Every figure the runs allow; returns the written paths."""
    paths: list[Path] = []
    tasks = [t for t in dict.fromkeys(data.runs["task"].dropna())]
    for task in tasks:
        for assignment in PAIRS:
            paths += save(fig_gradnorm(data, task, assignment), out_dir, f"gradnorm_{task}_{assignment}")
        paths += save(fig_training(data, task), out_dir, f"train_{task}")
        paths += save(fig_ablation(data, task, ablation_seeds), out_dir, f"ablation_{task}")
        paths += save(fig_reward_stats(data, task), out_dir, f"reward_stats_{task}")
    if eff is not None and eff_summary is not None:
        paths += save(fig_hetero(eff, eff_summary), out_dir, "hetero_search")
    return paths
