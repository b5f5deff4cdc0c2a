"""Outputs of the theory studies: ``lemma42.json``, ``summary.csv`` / ``summary.md``, the figures and the
text summary the CLI prints. Every file is written atomically (temporary file + rename)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from drmas.io import atomic_write_text
from analysis.theory.records import Record
from analysis.theory.softmax import SweepFit

FIGURES = ("theory_measured_vs_predicted", "theory_inflation", "theory_delta")
SUMMARY_COLUMNS = ["study", "setting", "agent", "normalization", "estimator", "prediction", "factor", "score_m2",
                   "delta", "delta_emp", "delta_rel", "delta_rel_se", "m2_measured", "m2_se", "m2_predicted", "rel_error", "rel_error_se",
                   "identity_residual", "slope", "intercept", "r2", "expected_slope", "max_factor", "n_points"]


# ----------------------------------------------------------------------------------------------- files
def _clean(value):
    """JSON-safe value: NaN / inf -> None, numpy scalars -> Python."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in records])


def summary_frame(records: Sequence[Record], fits: Sequence[SweepFit]) -> pd.DataFrame:
    """Controlled and tiny-LM records (one row each) and the sweep's line fits (one row per quantity and
    normalization; the per-point sweep records are in the JSON)."""
    rows = records_frame([r for r in records if r.study != "sweep"])
    fit_keys = ("slope", "intercept", "r2", "expected_slope", "max_factor", "n_points")
    fit_rows = pd.DataFrame([{"study": "sweep", "setting": f"fit {f.quantity} vs factor", "agent": "swept",
                              "normalization": f.normalization,
                              "estimator": "pooled_grpo" if f.normalization == "global" else "drmas",
                              "prediction": "out_of_sample", **{k: getattr(f, k) for k in fit_keys}} for f in fits])
    frames = [f for f in (rows, fit_rows) if len(f)]
    if not frames:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=SUMMARY_COLUMNS)


def _md_table(df: pd.DataFrame) -> str:
    def fmt(v) -> str:
        if isinstance(v, (float, np.floating)):
            if not math.isfinite(v):
                return ""
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def summary_markdown(records: Sequence[Record], fits: Sequence[SweepFit], title: str) -> str:
    """Markdown version of :func:`summary_frame`, one table per study."""
    df = summary_frame(records, fits)
    rec_cols = ["setting", "agent", "normalization", "estimator", "factor", "score_m2", "delta", "delta_emp",
                "delta_rel", "delta_rel_se",
                "m2_measured", "m2_se", "m2_predicted", "rel_error", "rel_error_se", "identity_residual"]
    fit_cols = ["setting", "normalization", "slope", "expected_slope", "intercept", "r2", "max_factor", "n_points"]
    out = [f"# {title}", "",
           "E||A z||^2 per agent: `m2_measured` (Monte Carlo, standard error `m2_se`) against "
           "`m2_predicted = score_m2 * factor + delta` (Lemma 4.2); `rel_error_se` is the standard error of "
           "the relative difference (measurement and calibration noise). `factor`, `score_m2`, `delta` are the "
           "prediction's inputs; `delta_emp` is Delta_k on the measured sample and `delta_rel` = delta_emp / "
           "(E||z||^2 * factor) there, with its jackknife standard error `delta_rel_se`; `identity_residual` = relative gap of the in-sample identity. "
           "Definitions: docs/theory.md.", ""]
    for study, cols, note in (
            ("controlled", rec_cols, "Population prediction (closed form) vs Monte Carlo."),
            ("sweep", fit_cols, "Swept agent: measured E||A z||^2 (`m2`) and mean batch-gradient ||g_k||^2 "
                                "(`grad_sq`) on fresh batches against the factor estimated on one calibration batch."),
            ("tiny_lm", rec_cols, "Prediction from the first half of the task groups, measurement on the second.")):
        part = df[df.study == study]
        if len(part):
            out += [f"## {study}", "", note, "", _md_table(part[cols]), ""]
    return "\n".join(out)


def write_results(records: Sequence[Record], fits: Sequence[SweepFit], out_dir: Path, title: str) -> list[Path]:
    """``lemma42.json`` (all records), ``summary.csv``, ``summary.md`` under ``out_dir``."""
    out_dir = Path(out_dir)
    payload = [{k: _clean(v) for k, v in asdict(r).items()} for r in records]
    paths = [out_dir / "lemma42.json", out_dir / "summary.csv", out_dir / "summary.md"]
    atomic_write_text(paths[0], json.dumps(payload, indent=1) + "\n")
    atomic_write_text(paths[1], summary_frame(records, fits).to_csv(index=False))
    atomic_write_text(paths[2], summary_markdown(records, fits, title) + "\n")
    return paths


# --------------------------------------------------------------------------------------------- figures
STUDY_COLORS = {"controlled": "tab:blue", "sweep": "tab:gray", "tiny_lm": "tab:red"}
NORM_MARKERS = {"global": "o", "agent": "s"}


def plot_measured_vs_predicted(records: Sequence[Record]):
    """Left: measured vs predicted E||A z||^2, both divided by the prediction's E||z||^2 (so that softmax
    and LM scores share one axis; y = x is Lemma 4.2). Right: predicted / measured - 1 per record."""
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for i, (study, color) in enumerate(STUDY_COLORS.items()):
        for norm, marker in NORM_MARKERS.items():
            rs = [r for r in records if r.study == study and r.normalization == norm]
            if not rs:
                continue
            scale = np.array([r.score_m2 for r in rs])
            pred, meas = np.array([r.m2_predicted for r in rs]), np.array([r.m2_measured for r in rs])
            se = np.array([r.m2_se for r in rs])
            diff_se = np.array([r.rel_error_se for r in rs])
            style = dict(fmt=marker, color=color, ms=4, alpha=0.8, lw=0.8, mfc="none" if norm == "agent" else color)
            ax.errorbar(pred / scale, meas / scale, yerr=2 * se / scale, label=f"{study}, {norm}", **style)
            ax2.errorbar(i + np.arange(len(rs)) / len(rs), pred / meas - 1, yerr=2 * diff_se, **style)
    ratios = [v for r in records for v in (r.m2_measured / r.score_m2, r.m2_predicted / r.score_m2)]
    ax.plot([min(ratios), max(ratios)], [min(ratios), max(ratios)], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="predicted (factor + Δk / E||z||²)",
           ylabel="measured  E||A z||² / E||z||²", title="Lemma 4.2: measured vs predicted")
    ax.legend(fontsize=7)
    ax2.axhspan(-0.05, 0.05, color="0.9")
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xticks([i + 0.5 for i in range(len(STUDY_COLORS))], list(STUDY_COLORS))
    ax2.set(ylabel="predicted / measured − 1", title="relative error (band ±5 %, bars 2 s.e.)")
    fig.tight_layout()
    return fig


def plot_inflation(records: Sequence[Record], fits: Sequence[SweepFit]):
    """Prop. 4.3: E||A z||^2 and the batch-gradient ||g_k||^2 of the swept agent against its global
    factor, under global and agent-wise normalization, with the fitted lines."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    swept = [r for r in records if r.study == "sweep" and r.agent == "swept"]
    ylabels = ("E||A z||²  (per sample)", "mean ||g_k||²  (batch gradient)")
    for ax, quantity, ylabel in zip(axes, ("m2", "grad_sq"), ylabels):
        for norm, color in (("global", "tab:red"), ("agent", "tab:blue")):
            rs = [r for r in swept if r.normalization == norm]
            x = np.array([r.factor_global for r in rs])
            y = np.array([r.m2_measured if quantity == "m2" else r.grad_sq for r in rs])
            fit = next(f for f in fits if f.quantity == quantity and f.normalization == norm)
            name = "global (pooled_grpo)" if norm == "global" else "agent-wise (drmas)"
            ax.scatter(x, y, s=14, color=color, marker=NORM_MARKERS[norm],
                       label=f"{name}: slope {fit.slope:.3g}, R² {fit.r2:.3f}")
            xs = np.linspace(0, x.max() * 1.02, 50)
            ax.plot(xs, fit.slope * xs + fit.intercept, color=color, lw=1)
            if norm == "global":
                slope_name = "E||z||²" if quantity == "m2" else "E||z||²/|Y_k|"
                ax.plot(xs, fit.expected_slope * xs, "k:", lw=1, label=f"Lemma 4.2 slope {slope_name}")
        ax.set(xlabel="global factor (σk² + (μk − μ)²)/σ²  (calibration batch)", ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.suptitle("Gradient-norm inflation (Prop. 4.3): swept agent")
    fig.tight_layout()
    return fig


def plot_delta(records: Sequence[Record]):
    """|Delta_k| relative to the main term E||z||^2 * factor, per record (controlled, tiny-LM), and the
    sweep's distribution."""
    import matplotlib.pyplot as plt

    rs = [r for r in records if r.study != "sweep"]
    sweep = [r for r in records if r.study == "sweep"]
    fig, ax = plt.subplots(figsize=(7, 0.28 * (len(rs) + 2) + 1.2))
    labels = [f"{r.study}/{r.setting}/{r.agent}/{r.estimator}" for r in rs]
    vals = np.abs([r.delta_rel for r in rs])
    bars = ax.barh(np.arange(len(rs)), vals, color=[STUDY_COLORS[r.study] for r in rs], alpha=0.85)
    for bar, r in zip(bars, rs):
        if r.delta_rel < 0:
            bar.set_hatch("//")
    ax.set_yticks(np.arange(len(rs)), labels, fontsize=7)
    if sweep:
        sv = np.abs([r.delta_rel for r in sweep])
        ax.scatter(sv, np.full(len(sv), len(rs)), s=8, color=STUDY_COLORS["sweep"], label="sweep points")
        ax.set_yticks(np.arange(len(rs) + 1), labels + ["sweep (all points)"], fontsize=7)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set(xlabel="|Δk| / (E||z||² · factor)   (hatched: Δk < 0)", title="Size of the covariance term Δk")
    fig.tight_layout()
    return fig


def save_figures(records: Sequence[Record], fits: Sequence[SweepFit], fig_dir: Path) -> list[Path]:
    """The three figures as PNG and PDF under ``fig_dir`` (names in :data:`FIGURES`)."""
    figs = {"theory_measured_vs_predicted": plot_measured_vs_predicted(records),
            "theory_delta": plot_delta(records)}
    if fits:
        figs["theory_inflation"] = plot_inflation(records, fits)
    return [path for name, fig in figs.items() for path in save_figure(fig, fig_dir, name)]


def save_figure(fig, fig_dir: Path, name: str) -> list[Path]:
    """``fig`` as ``fig_dir/name.png`` and ``.pdf`` (atomic, byte-stable writes: ``analysis.plotting.write_figure``),
    then closed."""
    import matplotlib.pyplot as plt

    from analysis.plotting import write_figure

    paths = []
    for ext in ("png", "pdf"):
        paths.append(write_figure(fig, Path(fig_dir) / f"{name}.{ext}", ext, dpi=150))
    plt.close(fig)
    return paths


# ------------------------------------------------------------------------------------------ text summary
def summary_text(records: Sequence[Record], fits: Sequence[SweepFit]) -> str:
    """The headline numbers (what the CLI prints)."""
    lines = []
    ctrl = [r for r in records if r.study == "controlled" and r.setting == "independent"]
    if ctrl:
        lines.append("controlled, independent scores (population prediction vs Monte Carlo):")
        for r in ctrl:
            lines.append(f"  {r.agent:<10} {r.normalization:<6} factor {r.factor:6.3f}  measured {r.m2_measured:.4g}"
                         f" ± {r.m2_se:.2g}  predicted {r.m2_predicted:.4g}  rel. error {100 * r.rel_error:5.2f} %")
        for r in (r for r in ctrl if r.normalization == "agent"):
            lines.append(f"  {r.agent:<10} agent-wise m2 / E||z||^2 = {r.m2_measured / r.score_m2:.4f}")
    corr = [r for r in records if r.study == "controlled" and r.setting == "correlated"]
    if corr:
        lines.append("controlled, correlated scores: Delta_k / main term (population; measured ± 2 s.e.), "
                     "rel. error of the prediction:")
        lines += [f"  {r.agent:<10} {r.normalization:<6} {r.delta / (r.score_m2 * r.factor):+.3f}  "
                  f"({r.delta_rel:+.3f} ± {2 * r.delta_rel_se:.3f})  {100 * r.rel_error:5.2f} %" for r in corr]
    for f in fits:
        lines.append(f"sweep {f.quantity:<7} {f.normalization:<6}: max factor {f.max_factor:.2f}, slope {f.slope:.4g}"
                     f" (Lemma 4.2: {f.expected_slope:.4g}), intercept {f.intercept:.3g}, R^2 {f.r2:.4f}")
    sweep = [r for r in records if r.study == "sweep"]
    if sweep:
        worst = max(r.rel_error for r in sweep)
        lines.append(f"sweep: max rel. error of the out-of-sample prediction {100 * worst:.2f} % over {len(sweep)} records")
    lm = [r for r in records if r.study == "tiny_lm"]
    if lm:
        lines.append("tiny_lm: factor, Delta_k / main term (measured half), rel. error of the out-of-sample "
                     "prediction:")
        lines += [f"  {r.setting:<28} {r.agent:<9} {r.estimator:<16} factor {r.factor_emp:6.3f}  Delta/main "
                  f"{r.delta_rel:+.4f} ± {2 * r.delta_rel_se:.4f}  rel. error {100 * r.rel_error:5.2f} % "
                  f"(2 s.e. {200 * r.rel_error_se:.1f} %)" for r in lm]
    if records:
        lines.append(f"in-sample identity: max |residual| {max(abs(r.identity_residual) for r in records):.1e}")
    return "\n".join(lines)
