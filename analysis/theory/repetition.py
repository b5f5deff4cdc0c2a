"""Repetition study: Lemma 4.2 when an agent's samples repeat, against the class-aware second moment.

The controlled three-agent system of :mod:`analysis.theory.softmax` (verifier / search / answer, 4 / 2 / 1
visits, independent rewards), with the number of actions V swept from 1024 down to 2: the smaller V, the
more of an agent's samples in a task group are one response. A class c is a (task group, agent, action)
triple: its samples share one gradient z_c. Class gradients are modelled as ``z_c = s_c u_c``: s_c² the
exact softmax score norm of the class's action, ‖e_a − π‖² = 1 − 2π_a + ‖π‖², and u_c ~ N(0, I/D) a
direction drawn independently per class (distinct (prompt, response) pairs of a language model with
unrelated gradient directions; D = 256). Per task group and agent the gradient is g_k = Σ_c S_c z_c,
S_c = Σ_{i∈c} A_i, and its second moment is predicted, from the same groups' advantages, classes and score
norms but not from the gradient directions, by

- ``class_measured``: E[Σ_c S_c² s_c²]                  (class-aware, measured ‖z_c‖²)
- ``class_equal``:    E[Σ_c S_c²] · E_i[s_i²]            (class-aware, equal ‖z_c‖²)
- ``lemma``:          E[Σ_i A_i² s_i²]                   (independent samples: Lemma 4.2's E‖A z‖² per step, summed)

and measured with explicit vectors (``measured`` = mean over groups of ‖g_k‖²). The
measured/predicted ratio of the global baseline over Dr. MAS is reported beside the class-aware factor
(``drmas.algos.class_factors``, the trainer's metric) and the paper's factor F_k. The advantage core is
``drmas.algos.compute_advantages`` throughout (through :func:`analysis.theory.lemma.lemma_terms` and
``class_factors``); the class sums are ``drmas.algos.class_sums``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from analysis.theory.lemma import lemma_terms
from analysis.theory.softmax import ESTIMATORS, ControlledConfig, SoftmaxSample, SoftmaxSystem, make_policies, \
    sample_groups
from drmas.algos import class_factors, class_sums

log = logging.getLogger(__name__)

TOLERANCE = 0.05  # the controlled checks' target relative error (docs/theory.md)


@dataclass(frozen=True)
class RepetitionConfig:
    n_actions: tuple[int, ...] = (1024, 64, 16, 4, 2)  # V: fewer actions, more repeated samples
    n_groups: int = 1000  # i.i.d. task groups (32 trajectories, 224 steps each)
    dim: int = 256  # D: dimension of the class-gradient directions
    chunk_groups: int = 250  # task groups whose class gradients are drawn at once
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_groups < 4 or self.dim < 1 or min(self.n_actions) < 2:
            raise ValueError(f"need n_groups >= 4, dim >= 1 and every n_actions >= 2, got {self.n_groups}, "
                             f"{self.dim}, {self.n_actions}")


def class_codes(sample: SoftmaxSample, n_agents: int, n_actions: int) -> np.ndarray:
    """Dense class code of each step: its (task group, agent, action)."""
    t = sample.table
    key = (t.task.numpy() * n_agents + t.agent.numpy()) * n_actions + sample.action.numpy()
    return np.unique(key, return_inverse=True)[1]


def _class_columns(sample: SoftmaxSample, classes: np.ndarray, n_agents: int):
    """Per class: its (task group × agent) cell and its score norm s_c² (one action per class)."""
    t = sample.table
    cell = np.zeros(classes.max() + 1, np.int64)
    cell[classes] = t.task.numpy() * n_agents + t.agent.numpy()
    s2 = np.zeros(classes.max() + 1)
    s2[classes] = t.sq_norm.double().numpy()
    return cell, s2


def group_moments(sample: SoftmaxSample, classes: np.ndarray, n_agents: int, dim: int, chunk_groups: int,
                  gen: torch.Generator) -> dict[str, dict[str, np.ndarray]]:
    """Per estimator, [n_groups, n_agents] arrays: ``measured`` ‖Σ_c S_c s_c u_c‖² with explicit random
    directions u_c ~ N(0, I/D) (shared by the estimators: a paired comparison; drawn ``chunk_groups`` task
    groups at a time), and the predictions ``class_measured`` Σ_c S_c² s_c², ``class_sq`` Σ_c S_c² (times the
    mean s² for ``class_equal``) and ``lemma`` Σ_i A_i² s_i² (module docstring). ``dim = 0``: predictions only."""
    t = sample.table
    n_groups = int(t.task.max()) + 1
    size = n_groups * n_agents
    cell, s2 = _class_columns(sample, classes, n_agents)
    step_cell = t.task.numpy() * n_agents + t.agent.numpy()
    step_s2 = t.sq_norm.double().numpy()
    out = {}
    for est in ESTIMATORS:
        a = lemma_terms(t, est).advantages.double().numpy()
        s = class_sums(a, classes)
        out[est] = {"class_measured": np.bincount(cell, weights=s * s * s2, minlength=size),
                    "class_sq": np.bincount(cell, weights=s * s, minlength=size),
                    "lemma": np.bincount(step_cell, weights=a * a * step_s2, minlength=size),
                    "measured": np.zeros(size), "sums": s}
    class_group = cell // n_agents
    for start in range(0, n_groups if dim else 0, chunk_groups):
        mine = np.flatnonzero((class_group >= start) & (class_group < start + chunk_groups))
        z = torch.randn(len(mine), dim, generator=gen, dtype=torch.float64) / dim ** 0.5
        z *= torch.as_tensor(np.sqrt(s2[mine]))[:, None]
        local = torch.as_tensor(cell[mine] - start * n_agents)
        for est in ESTIMATORS:
            g = torch.zeros(chunk_groups * n_agents, dim, dtype=torch.float64)
            g.index_add_(0, local, z * torch.as_tensor(out[est]["sums"][mine])[:, None])
            stop = min(size, (start + chunk_groups) * n_agents)
            out[est]["measured"][start * n_agents:stop] = g.pow(2).sum(1).numpy()[:stop - start * n_agents]
    return {est: {k: v.reshape(-1, n_agents) for k, v in d.items() if k != "sums"} for est, d in out.items()}


def distinct_share(sample: SoftmaxSample, classes: np.ndarray) -> np.ndarray:
    """Per agent: distinct classes / steps in a task group, averaged over groups."""
    t = sample.table
    f = pd.DataFrame({"task": t.task.numpy(), "agent": t.agent.numpy(), "cls": classes})
    per = f.groupby(["task", "agent"])["cls"].agg(["nunique", "size"])
    return (per["nunique"] / per["size"]).groupby(level="agent").mean().to_numpy()


def repetition_rows(system: SoftmaxSystem, sample: SoftmaxSample, classes: np.ndarray, cfg: RepetitionConfig,
                    gen: torch.Generator, true_classes: np.ndarray | None = None) -> pd.DataFrame:
    """One row per (estimator, agent): the three predictions from the sample's advantages, classes and score
    norms, the measurement from explicit class gradients, relative errors (and their standard errors over
    task groups), the distinct share and the global / Dr. MAS ratios. ``classes`` are the prediction's class
    codes; the gradients are drawn per ``true_classes`` (default: the same), so a wrong grouping can be tried."""
    k_all = len(system.agents)
    true_classes = classes if true_classes is None else true_classes
    measured = group_moments(sample, true_classes, k_all, cfg.dim, cfg.chunk_groups, gen)
    predicted = group_moments(sample, classes, k_all, 0, cfg.chunk_groups, gen)
    t = sample.table
    mean_s2 = (np.bincount(t.agent.numpy(), weights=t.sq_norm.double().numpy(), minlength=k_all)
               / np.bincount(t.agent.numpy(), minlength=k_all))
    names = np.array([a.name for a in system.agents], object)
    cf = class_factors(t.scores.numpy(), t.task.numpy(), names[t.agent.numpy()], t.traj.numpy(), classes,
                       ("pooled_grpo",))["factor_pooled_grpo"].reindex(names).to_numpy()
    share = distinct_share(sample, true_classes)
    rows = []
    for est in ESTIMATORS:
        m = measured[est]["measured"]
        preds = {"class_measured": predicted[est]["class_measured"], "class_equal": predicted[est]["class_sq"] * mean_s2,
                 "lemma": predicted[est]["lemma"]}
        for k, name in enumerate(names):
            row = {"estimator": est, "agent": name, "distinct": share[k], "measured": m[:, k].mean()}
            for col, p in preds.items():
                d = m[:, k] - p[:, k]
                row[col] = p[:, k].mean()
                row[f"rel_error_{col}"] = abs(d.mean()) / row["measured"]
                row[f"rel_error_{col}_se"] = d.std(ddof=1) / np.sqrt(len(d)) / row["measured"]
            rows.append(row)
    out = pd.DataFrame(rows)
    wide = out.set_index(["agent", "estimator"])
    for col in ("measured", "class_measured", "lemma"):
        ratio = wide[col].xs("pooled_grpo", level="estimator") / wide[col].xs("drmas", level="estimator")
        out[f"ratio_{col}"] = ratio.reindex(out["agent"]).to_numpy()
    out["class_factor"] = pd.Series(cf, names).reindex(out["agent"]).to_numpy()
    out["paper_factor"] = pd.Series(np.asarray(lemma_terms(t, "pooled_grpo").factor), names).reindex(out["agent"]).to_numpy()
    return out


def run_repetition(cfg: RepetitionConfig) -> pd.DataFrame:
    """The study's table: one row per (V, estimator, agent)."""
    base = ControlledConfig().systems[0]  # the controlled study's "independent" system
    frames = []
    for i, v in enumerate(cfg.n_actions):
        system = replace(base, name=f"V={v}", n_actions=v)
        rng = np.random.default_rng([cfg.seed, 4, i])
        pol = make_policies(system, rng)
        sample = sample_groups(system, pol, cfg.n_groups, rng)
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + i)
        rows = repetition_rows(system, sample, class_codes(sample, len(system.agents), v), cfg, gen)
        frames.append(rows.assign(n_actions=v))
        log.info("repetition V=%d: distinct share %s", v, np.round(rows["distinct"].to_numpy()[:3], 3))
    return pd.concat(frames, ignore_index=True)[COLUMNS]


COLUMNS = ["n_actions", "agent", "estimator", "distinct", "measured", "class_measured", "rel_error_class_measured",
           "rel_error_class_measured_se", "class_equal", "rel_error_class_equal", "lemma", "rel_error_lemma",
           "rel_error_lemma_se", "ratio_measured", "ratio_class_measured", "ratio_lemma", "class_factor", "paper_factor"]


def repetition_markdown(frame: pd.DataFrame) -> str:
    """The study's table as markdown (``repetition.md``)."""
    from analysis.theory.report import _md_table

    note = ("Per (V, agent, estimator): `measured` = mean over task groups of ||g_k||^2 with explicit class "
            "gradients; predictions from the same groups' advantages, classes and score norms: `class_measured` "
            "(class-aware, measured ||z_c||^2), `class_equal` (class-aware, equal ||z_c||^2), `lemma` "
            "(independent samples); `rel_error_*` = |measured - predicted| / measured (`_se`: its standard error over "
            "task groups). `ratio_*`: pooled GRPO / Dr. MAS of each; `class_factor` (the trainer's metric) and "
            "`paper_factor` (F_k) predict `ratio_measured`. Definitions: docs/theory.md, \"Repeated responses\".")
    return "\n".join(["# Repetition: class-aware second moment vs Lemma 4.2", "", note, "", _md_table(frame), ""])


def plot_repetition(frame: pd.DataFrame):
    """measured / predicted E||g_k||^2 against the distinct share, one panel per normalization, one colour per
    prediction, one marker per agent; the band is the controlled checks' tolerance."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    colors = {"class_measured": "tab:blue", "class_equal": "tab:green", "lemma": "tab:red"}
    labels = {"class_measured": "class-aware, measured ||z_c||²", "class_equal": "class-aware, equal ||z_c||²",
              "lemma": "Lemma 4.2 (independent samples)"}
    markers = dict(zip(sorted(frame["agent"].unique()), "os^D"))
    for ax, (est, title) in zip(axes, (("pooled_grpo", "global baseline (pooled GRPO)"), ("drmas", "agent-wise (Dr. MAS)"))):
        part = frame[frame["estimator"] == est]
        for col, color in colors.items():
            for agent, g in part.groupby("agent"):
                ax.scatter(g["distinct"], g["measured"] / g[col], color=color, marker=markers[agent], s=28,
                           label=f"{labels[col]}" if agent == min(markers) else None)
        ax.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="0.85", zorder=0)
        ax.set(xscale="log", yscale="log", title=title, xlabel="distinct share of an agent's samples per group")
    axes[0].set_ylabel("measured / predicted E||g_k||²")
    handles = [plt.Line2D([], [], color="k", marker=m, ls="", label=a) for a, m in markers.items()]
    axes[1].legend(handles=axes[0].get_legend_handles_labels()[0] + handles, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def write_repetition(frame: pd.DataFrame, out_dir, fig_dir) -> list:
    """``repetition.csv`` and ``repetition.md`` under ``out_dir``; ``theory_repetition.{png,pdf}`` under
    ``fig_dir`` (None: no figure)."""
    from pathlib import Path

    from analysis.theory.report import save_figure
    from drmas.io import atomic_write_text

    paths = [Path(out_dir) / "repetition.csv", Path(out_dir) / "repetition.md"]
    atomic_write_text(paths[0], frame.to_csv(index=False))
    atomic_write_text(paths[1], repetition_markdown(frame))
    if fig_dir is not None and len(frame):
        paths += save_figure(plot_repetition(frame), fig_dir, "theory_repetition")
    return paths
