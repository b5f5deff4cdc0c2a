"""Shared plotting helpers of the analysis figures (:mod:`analysis.figures`, :mod:`analysis.twins`): the parts
every figure needs drawn the same way, so that a figure reads at a glance.

* :func:`seed_band` / :func:`plot_median_band`: per estimator one line, the median over seeds, with a band
  (min-max or 25-75 % over seeds: :data:`BAND_LABELS` says which, for the axis label or legend);
* :func:`wants_log` / :func:`scale_from_span`: a log axis exactly when the drawn values span decades;
* :func:`no_offset` / :func:`finish`: no axis shows an offset or a multiplier label ("1e−8+1");
* :func:`flat_series` / :func:`mark_constant`: a series constant up to float noise is said to be constant, on a
  fixed y-range, instead of magnified noise;
* :func:`plot_points` / :func:`min_span`: eval points with their intervals, joined by a line only from 3 points
  on, on a y-range that does not magnify a 1-point difference;
* :func:`legend_outside` / :func:`legend_below`: legends that cover no data;
* :func:`figure` / :func:`save`: a figure on the Agg canvas, written as byte-stable PNG and PDF.

Every function draws on the axes it is given and returns what it computed; none keeps state.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from drmas.io import atomic_output

BAND_LABELS = {"minmax": "band: min-max over seeds", "iqr": "band: 25-75 % over seeds"}
LOG_DECADES = 2.0
"""A value axis is logarithmic when its positive values span at least this many decades (max / min >= 100)."""
FLAT_RTOL = 1e-6
"""A series is constant when its spread is at most this, relative to max(1, |its median|) (float noise)."""


# ------------------------------------------------------------------------------------------ median and band
def seed_band(values, band: str = "minmax") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a ``(steps, seeds)`` array: (median, low, high) over the finite values of the row; low/high are
    the min/max (``band="minmax"``) or the 25th/75th percentile (``"iqr"``). A row without a finite value gives NaN
    (no warning). A 1-d array is one row per entry (one seed)."""
    if band not in BAND_LABELS:
        raise ValueError(f"band must be one of {sorted(BAND_LABELS)}, got {band!r}")
    a = np.asarray(values, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    a = np.where(np.isfinite(a), a, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row with no finite value
        mid = np.nanmedian(a, axis=1)
        if band == "minmax":
            lo, hi = np.nanmin(a, axis=1), np.nanmax(a, axis=1)
        else:
            lo, hi = np.nanpercentile(a, 25, axis=1), np.nanpercentile(a, 75, axis=1)
    return mid, lo, hi


def plot_median_band(ax, x, values, color: Any, label: str | None = None, band: str = "minmax", ls: str = "-",
                     lw: float = 1.1, alpha: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw the median over seeds of ``values`` (``(len(x), seeds)``) as a line and its band (:func:`seed_band`);
    the band only with more than one seed. Returns (median, low, high)."""
    a = np.asarray(values, dtype=np.float64)
    mid, lo, hi = seed_band(a, band)
    ax.plot(x, mid, ls, color=color, lw=lw, label=label)
    if a.ndim == 2 and a.shape[1] > 1:
        ax.fill_between(x, lo, hi, color=color, alpha=alpha, lw=0)
    return mid, lo, hi


# ------------------------------------------------------------------------------------------ scales
def _finite(values: Iterable) -> np.ndarray:
    parts = [np.ravel(np.asarray(v, dtype=np.float64)) for v in (values if isinstance(values, (list, tuple)) else [values])]
    a = np.concatenate(parts) if parts else np.zeros(0)
    return a[np.isfinite(a)]


def wants_log(values, decades: float = LOG_DECADES) -> bool:
    """Whether the positive finite ``values`` (an array or a list of arrays) span at least ``decades`` decades.
    Zeros and negatives do not count (a log axis cannot show them); fewer than two positive values: no."""
    a = _finite(values)
    a = a[a > 0]
    return len(a) >= 2 and float(a.max() / a.min()) >= 10.0 ** decades


def scale_from_span(ax, values, axis: str = "y", decades: float = LOG_DECADES) -> bool:
    """Set ``ax``'s ``axis`` ("x" or "y") to log when :func:`wants_log` of ``values``; returns whether it did."""
    log = wants_log(values, decades)
    if log:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    return log


def no_offset(ax) -> None:
    """No offset ("+1") and no multiplier ("1e−8") label on either axis of ``ax``: a linear axis gets a
    :class:`~matplotlib.ticker.ScalarFormatter` that writes each tick in full; log axes have none to switch off.
    Call after the scales are set (``set_yscale`` replaces the formatter)."""
    for axis in (ax.xaxis, ax.yaxis):
        fmt = axis.get_major_formatter()
        if isinstance(fmt, ScalarFormatter):
            fmt.set_useOffset(False)
            fmt.set_scientific(False)


def finish(fig) -> None:
    """:func:`no_offset` on every axes of ``fig`` (the last step of a figure function, before the layout)."""
    for ax in fig.axes:
        no_offset(ax)


# ------------------------------------------------------------------------------------------ constant series
def flat_series(values, rtol: float = FLAT_RTOL) -> tuple[bool, float, float]:
    """(constant, value, deviation) of the finite ``values``: constant when max - min <= ``rtol`` x
    max(1, |median|); value = the median, deviation = the largest |v - median|. No finite value: (False, nan, nan)."""
    a = _finite(values)
    if not len(a):
        return False, math.nan, math.nan
    c = float(np.median(a))
    dev = float(np.max(np.abs(a - c)))
    return bool(a.max() - a.min() <= rtol * max(1.0, abs(c))), c, dev


def tolerance_text(dev: float) -> str:
    """``4e-9`` -> ``1e-8`` (the power of ten at or above ``dev``); 0 -> ``exactly``."""
    if not dev > 0:
        return "exactly"
    return f"within 1e{math.ceil(math.log10(dev))}"


def mark_constant(ax, values, ylim: tuple[float, float] | None = None, rtol: float = FLAT_RTOL,
                  name: str = "constant") -> bool:
    """When ``values`` (what ``ax`` draws) are constant up to float noise (:func:`flat_series`): fix the y-range
    (``ylim``, default the value ± max(0.5 |value|, 0.5)) and write "constant (= v within 1e-k)" on the axes.
    Returns whether the series was constant (the axes is untouched otherwise)."""
    flat, c, dev = flat_series(values, rtol)
    if not flat:
        return False
    half = max(0.5 * abs(c), 0.5)
    ax.set_ylim(*(ylim if ylim is not None else (c - half, c + half)))
    ax.text(0.5, 0.9, f"{name} (= {c:.6g} {tolerance_text(dev)})", transform=ax.transAxes, ha="center", va="top",
            fontsize=8, bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"})
    return True


# ------------------------------------------------------------------------------------------ points with intervals
def plot_points(ax, x, y, low=None, high=None, color: Any = None, label: str | None = None, ms: float = 4,
                lw: float = 1.2, capsize: float = 2.5):
    """``y`` at ``x`` with error bars from ``low``/``high`` (absolute bounds, optional); markers only for at most
    two points (a line through two points suggests a trend between them), markers joined by a line from three
    points on. Returns matplotlib's ErrorbarContainer."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    yerr = None
    if low is not None and high is not None:
        yerr = np.vstack([y - np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64) - y])
        yerr = np.where(np.isfinite(yerr), np.maximum(yerr, 0), 0)
    fmt = "o" if len(x) <= 2 else "o-"
    return ax.errorbar(x, y, yerr=yerr, fmt=fmt, color=color, label=label, ms=ms, lw=lw, capsize=capsize)


def min_span(ax, span: float, bounds: tuple[float | None, float | None] = (None, None)) -> tuple[float, float]:
    """Widen ``ax``'s y-range about its centre to at least ``span`` (data units), kept inside ``bounds`` (shifted,
    not cut, where the span fits); returns the new limits. A range already wider is kept."""
    lo, hi = ax.get_ylim()
    if hi - lo < span:
        mid = (lo + hi) / 2
        lo, hi = mid - span / 2, mid + span / 2
        b_lo, b_hi = bounds
        if b_lo is not None and lo < b_lo:
            lo, hi = b_lo, b_lo + span
        if b_hi is not None and hi > b_hi:
            lo, hi = b_hi - span, b_hi
        if b_lo is not None:
            lo = max(lo, b_lo)
        ax.set_ylim(lo, hi)
    return lo, hi


def dodge(i: int, n: int, width: float) -> float:
    """x offset of series ``i`` of ``n`` drawn side by side at the same x, spread over ``width``."""
    return 0.0 if n <= 1 else (i - (n - 1) / 2) * width / (n - 1)


# ------------------------------------------------------------------------------------------ legends
def legend_outside(ax, handles: Sequence | None = None, labels: Sequence[str] | None = None, fontsize: float = 7,
                   **kw: Any):
    """A legend right of ``ax`` (``loc="upper left", bbox_to_anchor=(1.01, 1)``), over no data."""
    args = () if handles is None else ((handles,) if labels is None else (handles, labels))
    return ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize=fontsize,
                     frameon=False, **kw)


def legend_below(fig, handles: Sequence, labels: Sequence[str], ncol: int | None = None, fontsize: float = 7,
                 **kw: Any):
    """One legend for the whole figure, centred below the axes (outside them: the saved figure's tight bounding
    box takes it in). Call after ``fig.tight_layout()``."""
    ncol = ncol or min(len(labels), 4) or 1
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=fontsize,
                      frameon=False, **kw)


def unique_handles(*axes) -> tuple[list, list[str]]:
    """Legend handles and labels of ``axes``, each label once, in first-seen order."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab and not lab.startswith("_"):
                seen.setdefault(lab, h)
    return list(seen.values()), list(seen)


# ------------------------------------------------------------------------------------------ writing
def figure(w: float, h: float) -> Figure:
    """A ``w`` x ``h`` inch figure on the Agg canvas (no pyplot state)."""
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
