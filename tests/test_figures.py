"""Tests of the shared plotting helpers (analysis/plotting.py) and of what the figures draw with them: the log-axis
decision, no offset label on any axis, the median and band over seeds, eval points without a joining line.

Synthetic run directories (``test_analysis.make_grid``) are a fixture for the analysis code, never results.
Numeric vectors show their arithmetic.
"""
from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis import plotting as P
from analysis.runs import load_grid
from test_analysis import make_grid


def _axes():
    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _offsets(fig) -> list[str]:
    """The offset / multiplier text of every axis of ``fig``, after a draw ("" where there is none)."""
    fig.canvas.draw()
    return [axis.get_major_formatter().get_offset() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load_grid(make_grid(tmp_path_factory.mktemp("figgrid"), seeds=(0, 1, 2)))


# ------------------------------------------------------------------------------------------ log-axis decision
def test_log_axis_only_when_values_span_decades():
    assert P.wants_log([0.5, 3.0, 1.8e5])  # 1.8e5 / 0.5 = 3.6e5 >= 1e2
    assert not P.wants_log([0.2, 0.9, 1.5])  # 1.5 / 0.2 = 7.5 < 1e2
    assert not P.wants_log([0.0, 0.5, 20.0])  # zeros cannot be drawn on a log axis: 20 / 0.5 = 40 < 1e2
    assert P.wants_log([0.0, 0.05, 20.0])  # 20 / 0.05 = 400
    assert P.wants_log([np.array([1.0, np.nan]), np.array([np.inf, 100.0])])  # a list of arrays; non-finite ignored
    assert not P.wants_log([1.0, 99.0]) and P.wants_log([1.0, 100.0])  # the threshold: 2 decades
    assert P.wants_log([1.0, 11.0], decades=1.0)
    assert not P.wants_log([5.0]) and not P.wants_log([])
    fig, ax = _axes()
    assert P.scale_from_span(ax, [1e-3, 1.0, 10.0]) and ax.get_yscale() == "log"
    fig, ax = _axes()
    assert not P.scale_from_span(ax, [0.1, 0.3]) and ax.get_yscale() == "linear"
    assert P.scale_from_span(ax, [1.0, 1e4], axis="x") and ax.get_xscale() == "log" and ax.get_yscale() == "linear"


# ------------------------------------------------------------------------------------------ no offset
def test_no_offset_removes_offset_and_multiplier_labels():
    rng = np.random.default_rng(0)
    for y in (1 + 1e-8 * rng.standard_normal(20), 1e-6 * (1 + rng.random(20))):  # an offset "+1", a multiplier "1e-6"
        fig, ax = _axes()
        ax.plot(np.arange(20), y)
        assert any(_offsets(fig)), "the default formatter would label this axis with an offset (test premise)"
        P.no_offset(ax)
        assert not any(_offsets(fig))
    fig, ax = _axes()
    ax.plot([1, 2, 3], [1e-3, 1.0, 1e3])
    ax.set_yscale("log")
    P.finish(fig)  # a log axis has no ScalarFormatter: left as it is
    assert not any(_offsets(fig))


# ------------------------------------------------------------------------------------------ median and band
def test_seed_band_median_min_max_and_quartiles():
    v = np.array([[1.0, 2.0, 3.0, 10.0],
                  [np.nan, 4.0, 6.0, np.inf],  # non-finite values left out: the finite 4, 6
                  [np.nan, np.nan, np.nan, np.nan]])
    mid, lo, hi = P.seed_band(v, "minmax")
    np.testing.assert_allclose(mid[:2], [2.5, 5.0])  # (2 + 3) / 2, (4 + 6) / 2
    np.testing.assert_allclose(lo[:2], [1.0, 4.0])
    np.testing.assert_allclose(hi[:2], [10.0, 6.0])
    assert np.isnan(mid[2]) and np.isnan(lo[2]) and np.isnan(hi[2])
    mid, lo, hi = P.seed_band(v, "iqr")
    # [1, 2, 3, 10]: the 25th percentile sits at rank 0.75 -> 1 + 0.75 x (2 - 1) = 1.75, the 75th at rank 2.25 ->
    # 3 + 0.25 x (10 - 3) = 4.75; [4, 6]: 4 + 0.25 x 2 = 4.5 and 4 + 0.75 x 2 = 5.5
    np.testing.assert_allclose(lo[:2], [1.75, 4.5])
    np.testing.assert_allclose(hi[:2], [4.75, 5.5])
    np.testing.assert_allclose(P.seed_band([3.0, 7.0])[0], [3.0, 7.0])  # one seed: the values themselves
    with pytest.raises(ValueError):
        P.seed_band(v, "sd")


def test_plot_median_band_draws_one_line_and_one_band():
    fig, ax = _axes()
    mid, lo, hi = P.plot_median_band(ax, [0, 1], [[1.0, 3.0, 8.0], [2.0, 2.0, 5.0]], "tab:red", "GRPO")
    np.testing.assert_allclose(mid, [3.0, 2.0])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [3.0, 2.0])
    assert len(ax.lines) == 1 and len(ax.collections) == 1  # one median line, one band
    fig, ax = _axes()
    P.plot_median_band(ax, [0, 1], [[1.0], [2.0]], "k")
    assert len(ax.collections) == 0  # one seed: no band


# ------------------------------------------------------------------------------------------ constant series
def test_constant_series_is_said_constant_on_a_fixed_range():
    noise = 1 + 4e-9 * np.array([1.0, -1.0, 0.5])
    assert P.flat_series(noise)[0] and not P.flat_series([1.0, 1.05])[0]
    assert P.tolerance_text(4e-9) == "within 1e-8" and P.tolerance_text(0.0) == "exactly"
    fig, ax = _axes()
    ax.plot([0, 1, 2], noise)
    assert P.mark_constant(ax, noise, ylim=(0.0, 2.0))
    assert ax.get_ylim() == (0.0, 2.0)
    assert [t.get_text() for t in ax.texts] == ["constant (= 1 within 1e-8)"]
    fig, ax = _axes()
    ax.plot([0, 1], [0.9, 1.1])
    before = ax.get_ylim()
    assert not P.mark_constant(ax, [0.9, 1.1]) and ax.get_ylim() == before and not ax.texts


# ------------------------------------------------------------------------------------------ eval points
def test_two_eval_points_are_markers_without_a_line():
    fig, ax = _axes()
    c = P.plot_points(ax, [0, 50], [9.5, 9.0], [6.0, 6.1], [13.0, 12.2])
    assert c.lines[0].get_linestyle() == "None" and c.lines[0].get_marker() == "o"
    np.testing.assert_allclose(c.lines[2][0].get_segments()[0][:, 1], [6.0, 13.0])  # the first point's interval
    c = P.plot_points(ax, [0, 25, 50], [9.5, 9.2, 9.0])
    assert c.lines[0].get_linestyle() == "-"


def test_min_span_keeps_a_one_point_gap_small():
    fig, ax = _axes()
    ax.set_ylim(8.8, 9.9)
    assert P.min_span(ax, 20.0, (0.0, 100.0)) == (0.0, 20.0)  # centre 9.35 -> (-0.65, 19.35), shifted into [0, 100]
    ax.set_ylim(40.0, 41.0)
    assert P.min_span(ax, 20.0, (0.0, 100.0)) == (30.5, 50.5)
    ax.set_ylim(0.0, 60.0)
    assert P.min_span(ax, 20.0, (0.0, 100.0)) == (0.0, 60.0)  # already wider: kept


# ------------------------------------------------------------------------------------------ the figures
def test_figures_have_no_offset_and_legends_outside_the_axes(data):
    from analysis import figures as F

    figs = {"gradnorm": F.fig_gradnorm(data, "search", "nonsharing"), "train": F.fig_training(data, "math"),
            "ablation": F.fig_ablation(data, "search"), "reward_stats": F.fig_reward_stats(data, "search")}
    for name, fig in figs.items():
        assert fig is not None, name
        assert not any(_offsets(fig)), name
        assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1, name


def test_gradnorm_figure_draws_one_median_line_per_estimator(data):
    from analysis import figures as F

    fig = F.fig_gradnorm(data, "search", "nonsharing")
    for ax in fig.axes:
        assert len(ax.lines) == 2  # GRPO and Dr. MAS medians, not one line per seed
        assert len(ax.collections) >= 2  # their bands (+ the spike markers)
    a = data.agents
    runs = data.runs[(data.runs["setting"] == "nonsharing_grpo") & (data.runs["task"] == "search") & data.runs["usable"]]
    ans = a[a["run"].isin(runs["run"]) & (a["agent"] == "answer")].pivot(index="step", columns="run", values="grad_norm")
    line = [ax for ax in fig.axes if ax.get_title() == "answer"][0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), ans.median(axis=1).to_numpy())


def test_training_figure_eval_points_are_not_joined_and_not_magnified(data):
    from analysis import figures as F

    fig = F.fig_training(data, "math")
    ax_eval = fig.axes[1]
    eval_lines = [ln for ln in ax_eval.lines if ln.get_marker() == "o"]
    assert eval_lines and all(len(ln.get_xdata()) == 2 and ln.get_linestyle() == "None" for ln in eval_lines)
    lo, hi = ax_eval.get_ylim()
    assert hi - lo >= F.EVAL_MIN_SPAN and lo >= 0.0


def test_reward_stats_says_the_drmas_factor_is_constant(tmp_path):
    from analysis import figures as F

    root = make_grid(tmp_path / "g", tasks=("search",), seeds=(0,), extras=False)
    for run in root.glob("search_*drmas*"):  # Dr. MAS's factor: 1 up to float noise, as its baseline makes it
        lines = (run / "metrics.jsonl").read_text().splitlines()
        fixed = []
        for i, line in enumerate(lines):
            for k in ("verifier", "search", "answer"):
                line = line.replace(f'"agent/{k}/lemma_factor": ', f'"agent/{k}/lemma_factor": {1 + 1e-9 * (i % 3)}, "x{k}": ')
            fixed.append(line)
        (run / "metrics.jsonl").write_text("\n".join(fixed) + "\n")
    fig = F.fig_reward_stats(load_grid(root), "search")
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    bottom = fig.axes[len(fig.axes) // 2:]
    notes = [[t.get_text() for t in ax.texts] for ax in bottom]
    assert any(n and n[0].startswith("factor constant (= 1 within 1e-") for n in notes), texts
    assert any(not n for n in notes)  # GRPO's factor varies: drawn, not annotated
    assert not any(_offsets(fig))
