"""How the analysis writes numbers and tables: percent, points, ratios and intervals as text, GitHub Markdown and
LaTeX tables, and one table written as Markdown, LaTeX and CSV (:func:`write_table`)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from drmas.io import atomic_write_text

from analysis.claims import NOT_RUN


# ------------------------------------------------------------------------------------------ formatting
def fmt_pct(x: float, digits: int = 1) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{100 * x:.{digits}f}"


def fmt_ci(mean: float, low: float, high: float, digits: int = 1, signed: bool = False) -> str:
    """``45.3 ± 3.9`` in percent (± = half-width of the 95 % interval)."""
    if mean is None or not np.isfinite(mean):
        return NOT_RUN
    sign = "+" if signed and mean > 0 else ""
    half = (high - low) / 2 if np.isfinite(low) and np.isfinite(high) else np.nan
    return f"{sign}{100 * mean:.{digits}f}" + (f" ± {100 * half:.{digits}f}" if np.isfinite(half) else "")


def fmt_gain(g: float) -> str:
    """A relative gain (tables only; REPORT.md gives gains in points, :func:`fmt_pts`)."""
    return "—" if g is None or not np.isfinite(g) else f"{100 * g:+.1f} %"


def fmt_pts(g: float) -> str:
    """An absolute gain in percentage points: ``+3.2 pts`` (``g`` a fraction)."""
    return "—" if g is None or not np.isfinite(g) else f"{100 * g:+.1f} pts"


def fmt_ratio(r: float) -> str:
    """A ratio of two costs or times: ``× 0.81`` (REPORT.md writes no relative change in percent)."""
    return "—" if r is None or not np.isfinite(r) else f"× {r:.2f}"


def fmt_value(x: float, digits: int = 2) -> str:
    """A number for a summary: "not reached" for inf, "—" for none, 3 significant digits outside 0.01-10^4."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == math.inf:
        return "not reached"
    return f"{x:.{max(digits, 3)}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def fmt_interval(low: float, high: float) -> str:
    """An interval for a summary (:func:`fmt_value`); an open end (0 below, inf above) is written as such."""
    return f"[{'0' if low == 0 else fmt_value(low)}, {'∞' if high == math.inf else fmt_value(high)}]"


def fmt_lr(lr: float) -> str:
    """A learning rate as the grids' configs write their levels: positional, 3 significant digits (``0.000141``,
    ``0.0000861``; ``.3g`` would switch to ``8.61e-05`` below 1e-4 within one interval)."""
    return np.format_float_positional(lr, precision=3, unique=False, fractional=False, trim="-")


def fmt_octaves(value: float, low: float, high: float) -> str:
    """A shift in octaves with its interval, signed, two decimals at every size: ``+0.44 octave [+0.00, +1.10]``
    (:func:`fmt_value` would write a bound near 0 as ``0.000585``)."""
    return f"{value:+.2f} octave [{low:+.2f}, {high:+.2f}]"


# ------------------------------------------------------------------------------------------ tables
def fmt_step_cost(seconds: pd.Series) -> str:
    """The step time of finished runs in one sentence (``seconds``: :meth:`analysis.runs.GridData.step_seconds`)."""
    return (f"Step time of the {len(seconds)} finished runs (Σ `timing/step` of each run over all its sittings; "
            f"evaluations and start-up not counted): {seconds.sum() / 3600:.1f} h in all, median "
            f"{seconds.median():,.0f} s per run ({seconds.min():,.0f}-{seconds.max():,.0f} s).")


def markdown(df: pd.DataFrame, index: bool = True, floatfmt: str = "{:.4g}") -> str:
    """A GitHub Markdown table (no tabulate dependency); floats via ``floatfmt``, NaN as empty."""
    d = df.reset_index() if index else df
    if isinstance(d.columns, pd.MultiIndex):
        d = d.copy()
        d.columns = [" ".join(str(x) for x in c if str(x)) for c in d.columns]

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if not math.isfinite(v) else floatfmt.format(v)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(str(c) for c in d.columns) + " |", "|" + "---|" * len(d.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in d.itertuples(index=False)]
    return "\n".join(lines)


def latex(df: pd.DataFrame, caption: str, label: str) -> str:
    """LaTeX tabular (``DataFrame.to_latex``, booktabs); ``±`` becomes ``$\\pm$``, Δ ``$\\Delta$``."""
    text = df.to_latex(escape=True, caption=caption, label=label, na_rep="", float_format="%.4g")
    return text.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("μ", r"$\mu$").replace("σ", r"$\sigma$")


def write_table(out_dir: Path, stem: str, shown: pd.DataFrame | Sequence[tuple[str, pd.DataFrame]],
                numeric: pd.DataFrame | None, caption: str) -> list[Path]:
    """``stem.md`` (caption + one or more formatted tables), ``stem.tex`` and ``stem.csv`` (``numeric`` when
    given: the machine-readable long frame; else the formatted table)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [("", shown)] if isinstance(shown, pd.DataFrame) else list(shown)
    md = [f"**{caption}**", ""]
    tex = []
    for title, frame in parts:
        if title:
            md += [f"*{title}*", ""]
        md += [markdown(frame) if len(frame) else f"({NOT_RUN})", ""]
        if len(frame):
            tex.append(latex(frame, f"{caption} {title}".strip(), f"tab:{stem}{'-' + title.split()[0] if title else ''}"))
    paths = [out_dir / f"{stem}.md", out_dir / f"{stem}.tex", out_dir / f"{stem}.csv"]
    atomic_write_text(paths[0], "\n".join(md))
    atomic_write_text(paths[1], "\n".join(tex) if tex else f"% {caption}: {NOT_RUN}\n")
    csv = numeric if numeric is not None else (parts[0][1] if parts else pd.DataFrame())
    atomic_write_text(paths[2], csv.to_csv(index=numeric is None))
    return paths
