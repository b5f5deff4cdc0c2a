"""Figures of the paper from run directories (matplotlib object API on the Agg canvas: no pyplot state, no
display needed). Each ``fig_*`` function returns a :class:`matplotlib.figure.Figure`, or ``None`` when the runs it
needs are missing; :func:`save` writes PNG and PDF.

============================== ===================================================================================
file (``paper_figures/``)      content
============================== ===================================================================================
gradnorm_{task}_{assignment}   per-agent pre-clip gradient norm, GRPO vs Dr. MAS, one panel per agent, one line per
                               seed; ✕ = spike under the documented rule, ▲ at the top = non-finite norm
                               (paper Figures 4, 6, 7)
train_{task}                   training reward (reward/mean, rolling mean) and eval Average avg@k per setting
ablation_{task}                the same for the Table 3 variants, plus the largest agent gradient norm (Figure 8)
reward_stats_{task}            μk, σk per agent against μ, σ over training (top) and the Lemma 4.2 factor
                               (σk² + (μk − μ)²)/σ² (bottom), one column per multi-agent setting (first seed)
hetero_{task}                  heterogeneous vs homogeneous non-sharing Dr. MAS: tokens per agent, generation
                               seconds, inference cost per step, Average accuracy (Figure 5)
mechanism                      the mechanism sweep: per (level, seed, agent), the grad-norm ratio global baseline /
                               Dr. MAS (left) and the realized E_k[A²] ratio (right) against the agent's Lemma 4.2
                               factor, with the Lemma's prediction (√factor, factor) drawn in
============================== ===================================================================================
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from drmas.algos import SpikeRule, spike_ratios
from drmas.io import atomic_output

from analysis.runs import GridData, run_averages
from analysis.tables import ABLATION, ABLATION_ONLY, PAIRS, SETTINGS

logger = logging.getLogger(__name__)

SMOOTH = 10  # rolling-mean window (steps) of the training curves
COLORS = {"single_agent_grpo": "0.45", "sharing_grpo": "tab:orange", "sharing_drmas": "tab:cyan",
          "nonsharing_grpo": "tab:red", "nonsharing_drmas": "tab:blue", "hetero_drmas": "tab:green", "homogeneous_drmas": "tab:purple",
          "nonsharing:(mu_k,sigma)": "tab:purple", "nonsharing:(mu,sigma_k)": "tab:olive",
          "nonsharing:pooled_step": "tab:brown", "nonsharing:agent_traj": "tab:pink", "nonsharing:traj_agent": "tab:gray",
          "nonsharing:traj_traj": "tab:cyan"}
SEED_STYLES = ("-", "--", ":", "-.")


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h))
    FigureCanvasAgg(fig)
    return fig


STABLE_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None}, "svg": {"Date": None}}
"""Per format, the metadata that would change between two writes of the same figure (dates, the software
stamp); left out, the same runs give byte-identical files (``tests/test_analysis.py``)."""


def write_figure(fig: Figure, path: Path, fmt: str, **kw: Any) -> Path:
    """``fig`` as ``fmt`` at ``path`` (atomic), byte-stable: no date or software stamp (:data:`STABLE_METADATA`)."""
    with atomic_output(path) as tmp, rc_context({"svg.hashsalt": "drmas"}):
        fig.savefig(str(tmp), format=fmt, metadata=STABLE_METADATA.get(fmt), **kw)
    return Path(path)


def save(fig: Figure | None, out_dir: Path, stem: str) -> list[Path]:
    """Write ``stem.png`` (150 dpi) and ``stem.pdf``; nothing for ``None``."""
    if fig is None:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_figure(fig, out_dir / f"{stem}.png", "png", dpi=150, bbox_inches="tight"),
            write_figure(fig, out_dir / f"{stem}.pdf", "pdf", bbox_inches="tight")]


def _runs(data: GridData, task: str, settings: Sequence[str]) -> pd.DataFrame:
    r = data.runs[(data.runs["task"] == task) & data.runs["setting"].isin(settings) & data.runs["usable"]]
    return r.sort_values(["setting", "seed"])


def _label(setting: str) -> str:
    """``nonsharing:(mu_k,sigma)`` -> ``(mu_k,sigma)``; ``sharing_drmas`` -> ``sharing drmas``."""
    return setting.split(":", 1)[1] if ":" in setting else setting.replace("_", " ")


# ------------------------------------------------------------------------------------------ gradient norms
def fig_gradnorm(data: GridData, task: str, assignment: str, rule: SpikeRule = SpikeRule()) -> Figure | None:
    dr, gr = PAIRS[assignment]
    runs = _runs(data, task, (gr, dr))
    ag = data.agents[data.agents["run"].isin(runs["run"])] if "grad_norm" in data.agents else pd.DataFrame()
    if ag.empty or ag["grad_norm"].notna().sum() == 0 or runs["setting"].nunique() < 1:
        return None
    agents = list(dict.fromkeys(ag["agent"]))
    fig = _figure(4.2 * len(agents), 3.4)
    axes = fig.subplots(1, len(agents), squeeze=False)[0]
    for ax, agent in zip(axes, agents):
        top = 0.0
        for r in runs.itertuples():
            g = ag[(ag["run"] == r.run) & (ag["agent"] == agent)].sort_values("step")
            if g["grad_norm"].isna().all():
                continue
            sp = spike_ratios(g["grad_norm"].to_numpy(), rule)
            color = COLORS.get(r.setting, "k")
            ls = SEED_STYLES[int(r.seed) % len(SEED_STYLES)]
            x, y = g["step"].to_numpy(), sp["norm"].to_numpy()
            ax.plot(x, y, ls, color=color, lw=0.9, alpha=0.85, label=f"{_label(r.setting)} s{r.seed}")
            fin = np.isfinite(y)
            top = max(top, float(np.nanmax(np.where(fin, y, np.nan))) if fin.any() else top)
            spike = sp["spike"].to_numpy() & fin
            ax.scatter(x[spike], y[spike], marker="x", color=color, s=30, zorder=3)
            if (~fin).any():
                ax.scatter(x[~fin], np.full((~fin).sum(), top * 1.1 if top > 0 else 1.0), marker="^", color=color,
                           s=30, zorder=3)
        ax.set(title=f"{agent}", xlabel="RL step", ylabel="pre-clip grad norm")
        lo = ag.loc[ag["agent"] == agent, "grad_norm"]
        lo = lo[np.isfinite(lo) & (lo > 0)]
        if len(lo) and lo.max() / lo.min() > 100:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    fig.suptitle(f"Per-agent gradient norm, {task}, {assignment}: GRPO vs Dr. MAS "
                 f"(x: spike, g_t > {rule.threshold:g} x median of previous {rule.window})", fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ training curves
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


def _eval_curve(data: GridData, runs: pd.DataFrame, metric: str = "avg") -> pd.DataFrame:
    ev = data.tagged(data.evals[data.evals["run"].isin(runs["run"])])
    if ev.empty:
        return pd.DataFrame(columns=["step", metric])
    av = run_averages(ev)
    return av.groupby("step")[metric].mean().reset_index()


def _curves_panel(ax_train, ax_eval, data: GridData, task: str, settings: Sequence[str], seeds=None) -> int:
    n = 0
    for s in settings:
        runs = _runs(data, task, (s,))
        if seeds is not None:
            runs = runs[runs["seed"].isin(seeds)]
        if runs.empty:
            continue
        c = _mean_curve(data, runs, "reward/mean")
        color = COLORS.get(s, None)
        ax_train.plot(c["step"], c["mean"], color=color, lw=1.2, label=f"{_label(s)} ({len(runs)} seed(s))")
        if len(runs) > 1:
            ax_train.fill_between(c["step"], c["min"], c["max"], color=color, alpha=0.15, lw=0)
        e = _eval_curve(data, runs)
        ax_eval.plot(e["step"], e["avg"], "o-", color=color, lw=1.2, ms=3, label=_label(s))
        n += 1
    ax_train.set(xlabel="RL step", ylabel=f"training reward (rolling mean {SMOOTH})")
    ax_eval.set(xlabel="RL step", ylabel="eval Average avg@k")
    ax_train.legend(fontsize=7)
    return n


def fig_training(data: GridData, task: str, settings: Sequence[str] = (*SETTINGS, "hetero_drmas")) -> Figure | None:
    fig = _figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    if not _curves_panel(ax1, ax2, data, task, settings):
        return None
    fig.suptitle(f"Training accuracy, {task} (band: min-max over seeds)", fontsize=10)
    fig.tight_layout()
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
    for s in settings:
        runs = _runs(data, task, (s,))
        if seeds is not None:
            runs = runs[runs["seed"].isin(seeds)]
        ag = data.agents[data.agents["run"].isin(runs["run"])]
        if ag.empty or "grad_norm" not in ag:
            continue
        mx = ag.groupby(["run", "step"])["grad_norm"].max().reset_index().groupby("step")["grad_norm"].mean()
        ax3.plot(mx.index, mx.to_numpy(), color=COLORS.get(s), lw=0.9, label=_label(s))
    ax3.set(xlabel="RL step", ylabel="max over agents of grad norm")
    fig.suptitle(f"Normalization ablation (Table 3 variants + pooled step-level baseline), {task}", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ reward statistics
def fig_reward_stats(data: GridData, task: str) -> Figure | None:
    settings = [s for a in PAIRS.values() for s in reversed(a)]
    runs = _runs(data, task, settings)
    runs = runs[runs.groupby("setting")["seed"].transform("min") == runs["seed"]]
    runs = runs.sort_values("setting", key=lambda s: s.map(settings.index))
    if runs.empty or data.agents.empty or "reward_mean" not in data.agents:
        return None
    fig = _figure(3.6 * len(runs), 6)
    axes = fig.subplots(2, len(runs), squeeze=False, sharex=True)
    for j, r in enumerate(runs.itertuples()):
        st = data.steps[data.steps["run"] == r.run].sort_values("step").set_index("step")
        ag = data.agents[data.agents["run"] == r.run]
        top, bot = axes[0, j], axes[1, j]
        roll = lambda s: s.rolling(5, min_periods=1).mean()  # noqa: E731
        if "task/mu" in st:
            top.plot(st.index, roll(st["task/mu"]), "k-", lw=1.4, label="μ")
        if "task/sigma" in st:
            top.plot(st.index, roll(st["task/sigma"]), "k--", lw=1.4, label="σ")
        for i, (agent, g) in enumerate(ag.groupby("agent", sort=False)):
            g = g.sort_values("step").set_index("step")
            color = f"C{i}"
            top.plot(g.index, roll(g["reward_mean"]), "-", color=color, lw=1, label=f"μk {agent}")
            if "reward_std" in g:
                top.plot(g.index, roll(g["reward_std"]), "--", color=color, lw=1, label=f"σk {agent}")
            if "lemma_factor" in g:
                bot.plot(g.index, roll(g["lemma_factor"]), color=color, lw=1, label=agent)
        bot.axhline(1.0, color="k", lw=0.8, ls=":")
        top.set(title=f"{_label(r.setting)} (seed {r.seed})", ylabel="reward statistics")
        bot.set(xlabel="RL step", ylabel="(σk² + (μk − μ)²) / σ²")
        top.legend(fontsize=6)
        bot.legend(fontsize=6)
    fig.suptitle(f"Per-agent reward statistics and the Lemma 4.2 factor, {task} (rolling mean 5)", fontsize=10)
    fig.tight_layout()
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
        face = color if baseline == "trajectory_grpo" else "none"
        for ax, col in ((ax_n, "ratio"), (ax_a, "a2_ratio")):
            ax.scatter(g["factor"], g[col], marker=marker, facecolors=face, edgecolors=color, s=28, zorder=3)
    top = max(float(points["factor"].max()), 1.5) * 1.15
    x = np.linspace(0.05, top, 200)
    (prediction,) = ax_n.plot(x, np.sqrt(x), "k--", lw=1, label="Lemma 4.2: √factor")
    ax_a.plot(x, x, "k--", lw=1, label="Lemma 4.2: factor")
    for ax, title in ((ax_n, "grad-norm ratio (mean over steps)"), (ax_a, "E_k[A²] ratio")):
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel("Lemma 4.2 factor of the global baseline (mean over steps)")
        ax.set_ylabel(f"{title}: global baseline / Dr. MAS")
        ax.set_xscale("log")
        ax.set_yscale("log")
    handles = [ax_n.scatter([], [], color=cmap[i], marker="o", s=28, label=f"miss rate {lv:g}") for i, lv in enumerate(levels)]
    handles += [ax_n.scatter([], [], color="0.3", marker=AGENT_MARKERS[i % len(AGENT_MARKERS)], s=28, label=a)
                for i, a in enumerate(agents)]
    ax_n.legend(handles=[*handles, prediction], fontsize=7, loc="upper left")
    ax_a.legend(fontsize=7, loc="upper left")
    fig.suptitle("Mechanism sweep (search): filled = trajectory GRPO, open = pooled step-level GRPO", fontsize=10)
    fig.tight_layout()
    return fig


def fig_class_aware(points: pd.DataFrame) -> Figure | None:
    """Measured grad-norm ratio trajectory GRPO / Dr. MAS against its two predictions, per (level, seed, agent)
    of the mechanism sweep: the paper's √F (left) and the class-aware √(class factor) (right); one marker per
    agent, one colour per level (see analysis/class_aware.py). None without the class-aware metrics."""
    p = points[points["baseline"] == "trajectory_grpo"] if len(points) else points
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
