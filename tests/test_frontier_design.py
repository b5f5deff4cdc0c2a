"""The frontier round's pre-registered machinery (analysis/frontier_design.py, docs/frontier.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.frontier_design import LADDER_BASE, MIN_LEVELS, frontier, ladder_level, levels_rule, verdict, x50_of
from analysis.stats import firth_fit


def test_verdict_reads_the_interval_against_the_margin():
    assert verdict((0.6, 1.4)) == "moves up"
    assert verdict((-0.4, 0.45)) == "no shift (equivalent)"
    assert verdict((-1.5, -0.7)) == "moves down"
    assert verdict((0.2, 0.9)) == "inconclusive"  # straddles +0.5
    assert verdict((-0.9, 0.1)) == "inconclusive"


def test_firth_fit_is_finite_under_complete_separation_and_recovers_a_known_curve():
    x = np.repeat(np.linspace(-1, 1, 5), 6)
    b0, b1 = firth_fit(x, (x > 0).astype(int))  # complete separation: the MLE does not exist
    assert math.isfinite(b0) and 0 < b1 < 1e3
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(3.0 * (x - 0.4))))).astype(int)
    b0, b1 = firth_fit(x, y)
    assert -b0 / b1 == pytest.approx(0.4, abs=0.05) and b1 == pytest.approx(3.0, rel=0.15)
    assert firth_fit(x, np.zeros_like(y))[1] == 0.0  # one outcome only: no slope


def test_x50_is_kept_at_the_edge_its_side_points_to():
    assert x50_of(-1.0, 0.0, -3, 3) == 3  # never above 1/2: beyond the top
    assert x50_of(1.0, 0.0, -3, 3) == -3
    assert x50_of(-100.0, 1.0, -3, 3) == 3


def test_levels_rule_spans_the_pooled_transition_on_the_quarter_octave_ladder():
    rng = np.random.default_rng(1)
    x = np.log2(LADDER_BASE) + rng.uniform(-2, 2, 2000)
    p = 1 / (1 + np.exp(-5.0 * (x - np.log2(1.3e-4))))
    levels = levels_rule(x, (rng.random(2000) < p).astype(int))
    ladder = {ladder_level(j) for j in range(-12, 13)}
    assert len(levels) >= MIN_LEVELS and set(levels) <= ladder and levels == sorted(levels)
    steps = np.diff(np.log2(levels))
    assert np.allclose(steps, 0.25, atol=0.01)  # consecutive quarter-octave steps
    prob = lambda lr: 1 / (1 + np.exp(-5.0 * (np.log2(lr) - np.log2(1.3e-4))))  # noqa: E731
    assert prob(levels[0]) < 0.2 and prob(levels[-1]) > 0.8  # most stand at the lowest, most break at the highest
    with pytest.raises(ValueError, match="does not rise"):
        levels_rule(x, np.zeros(2000, int))


def test_the_bootstrap_interval_covers_a_known_shift():
    rng = np.random.default_rng(2)
    x = np.repeat(np.linspace(-1, 1.5, 6), 40)
    yg = (rng.random(len(x)) < 1 / (1 + np.exp(-4 * x))).astype(int)
    yd = (rng.random(len(x)) < 1 / (1 + np.exp(-4 * (x - 0.75)))).astype(int)
    f = frontier(x, yg, x, yd, rng, draws=300)
    assert f.ci[0] < 0.75 < f.ci[1] and f.ci[0] > 0  # Dr. MAS's frontier above GRPO's, the truth inside
    assert f.ratio == pytest.approx(2 ** f.delta) and f.p_above_zero() < 0.05
