"""The frontier round's design (docs/frontier.md): the levels rule, the LR50 fit, the ratio's interval, the verdict
against the equivalence margin, and the power simulation that the round's precision and power statements quote.

Everything here is fixed before the pilot's first run; the round's study module calls these functions, so the
rule that chose the design and the rule that judges it are one code.

- **LR50.** Per estimator, a Firth-penalised logistic regression (``firthmodels``; finite under separation) of
  "collapsed by the horizon" on x = log2(lr): logit P = b0 + b1·x, LR50 = 2^x50 with x50 = −b0 / b1.
- **The ratio.** Δ = x50(Dr. MAS) − x50(GRPO) in octaves (ratio = 2^Δ), with a 95 % parametric-bootstrap interval:
  each draw simulates every run's outcome from its estimator's fitted curve at the round's design points, refits
  both estimators and recomputes Δ (:data:`BOOTSTRAP_DRAWS` draws, percentile interval). A draw's x50 is kept
  within ``X50_SPAN`` octaves of the design's levels (a flat refit puts it anywhere: "beyond the grid").
- **Verdict** (:func:`verdict`) against the margin ±``MARGIN_OCTAVES``: "moves up" when the interval lies above
  +margin, "moves down" below −margin, "no shift (equivalent)" inside [−margin, +margin], else "inconclusive".
- **Levels rule** (:func:`levels_rule`): blind to the contrast, from the pilot pooled over both estimators.

``python -m analysis.frontier_design [--replicates N] [--draws B]`` prints the power table of docs/frontier.md.
"""
from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass

import numpy as np

from analysis.stats import firth_fit

logger = logging.getLogger(__name__)

LADDER_BASE = 1e-4
"""The quarter-octave ladder's anchor: levels are LADDER_BASE · 2^(j/4) for integer j."""
MARGIN_OCTAVES = 0.5
"""The equivalence margin on Δ = log2 LR50(Dr. MAS) − log2 LR50(GRPO): the ratio within 2^±0.5."""
BOOTSTRAP_DRAWS = 2000
X50_SPAN = 2.0
LOW_P, HIGH_P = 0.1, 0.9
MIN_LEVELS, MAX_LEVELS = 5, 8


def bootstrap_p(count: int, draws: int) -> float:
    """A bootstrap tail probability from ``count`` of ``draws`` draws, (1 + count) / (draws + 1): never 0."""
    return (1 + count) / (draws + 1)


def ladder_level(j: int) -> float:
    """The j-th quarter-octave level, rounded to 3 significant digits (the value a config carries)."""
    return float(f"{LADDER_BASE * 2 ** (j / 4):.3g}")


def x50_of(b0: float, b1: float, lo: float, hi: float) -> float:
    """x50 = −b0 / b1 kept within [lo, hi]: a flat or falling curve puts it at the edge its side points to."""
    if b1 <= 0:
        return hi if b0 < 0 else lo  # never (or always) above 1/2 on the grid
    return float(np.clip(-b0 / b1, lo, hi))


@dataclass(frozen=True)
class Frontier:
    """One arm's frontier estimates: x50 per estimator (log2 lr), Δ with its interval, and the bootstrap draws."""
    x50_grpo: float
    x50_drmas: float
    delta: float
    ci: tuple[float, float]
    draws: np.ndarray  # Δ* per bootstrap draw (for interactions between arms)
    fits: tuple[tuple[float, float], tuple[float, float]] = ((math.nan, math.nan), (math.nan, math.nan))
    """(b0, b1) of GRPO's and Dr. MAS's fitted curves"""
    draw_fits: np.ndarray | None = None
    """(draws, 2 estimators, 2): every bootstrap draw's refitted (b0, b1), GRPO first: the curves' bands"""
    x50_draws: np.ndarray | None = None
    """(draws, 2 estimators): every draw's x50 (within the span), GRPO first: each LR50's own interval"""

    @property
    def ratio(self) -> float:
        return 2.0 ** self.delta

    def x50_interval(self, which: int) -> tuple[float, float]:
        """95 % percentile interval of estimator ``which``'s x50 (0: GRPO, 1: Dr. MAS) over its own draws."""
        d = self.x50_draws[:, which]
        return float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))

    def p_above_zero(self) -> float:
        """One-sided bootstrap p of "Δ > 0" (Dr. MAS's frontier above GRPO's): (1 + #{Δ* <= 0}) / (B + 1)."""
        return bootstrap_p(int((self.draws <= 0).sum()), len(self.draws))


def frontier(x_grpo: np.ndarray, y_grpo: np.ndarray, x_drmas: np.ndarray, y_drmas: np.ndarray,
             rng: np.random.Generator, draws: int = BOOTSTRAP_DRAWS) -> Frontier:
    """Each estimator's x50 and Δ with its 95 % parametric-bootstrap interval (module doc)."""
    xs = np.concatenate([x_grpo, x_drmas])
    lo, hi = xs.min() - X50_SPAN, xs.max() + X50_SPAN
    fits = [firth_fit(x_grpo, y_grpo), firth_fit(x_drmas, y_drmas)]
    x50 = [x50_of(*f, lo, hi) for f in fits]
    draw_fits = np.empty((draws, 2, 2))
    probs = [1 / (1 + np.exp(-(b0 + b1 * x))) for (b0, b1), x in zip(fits, (x_grpo, x_drmas))]
    for d in range(draws):
        draw_fits[d, 0] = firth_fit(x_grpo, rng.random(len(x_grpo)) < probs[0])
        draw_fits[d, 1] = firth_fit(x_drmas, rng.random(len(x_drmas)) < probs[1])
    x50_draws = np.array([[x50_of(*f, lo, hi) for f in pair] for pair in draw_fits]).reshape(draws, 2)
    delta_draws = x50_draws[:, 1] - x50_draws[:, 0]
    ci = (float(np.quantile(delta_draws, 0.025)), float(np.quantile(delta_draws, 0.975)))
    return Frontier(x50[0], x50[1], x50[1] - x50[0], ci, delta_draws, (fits[0], fits[1]), draw_fits, x50_draws)


def verdict(ci: tuple[float, float], margin: float = MARGIN_OCTAVES) -> str:
    """The pre-registered reading of Δ's interval against the margin (module doc)."""
    lo, hi = ci
    if lo > margin:
        return "moves up"
    if hi < -margin:
        return "moves down"
    if -margin <= lo and hi <= margin:
        return "no shift (equivalent)"
    return "inconclusive"


def levels_rule(x: np.ndarray, y: np.ndarray) -> list[float]:
    """The round's levels from the pilot of one arm, both estimators pooled (blind to the contrast): the pooled
    Firth curve's lowest ladder point with P̂ >= HIGH_P is the highest level, its highest ladder point with
    P̂ <= LOW_P the lowest; fewer than MIN_LEVELS quarter-octave steps are widened one step at a time, above first,
    then below; more than MAX_LEVELS are cut to the MAX_LEVELS nearest the pooled x50. Raises where the pooled
    curve does not rise (no transition: the arm's extension rule applies instead)."""
    b0, b1 = firth_fit(x, y)
    if b1 <= 0:
        raise ValueError("the pooled pilot curve does not rise with the learning rate: no transition to place "
                         "levels around (docs/frontier.md: extend the pilot by half-octaves up to the cap)")
    jx = lambda j: math.log2(LADDER_BASE) + j / 4  # noqa: E731  (x of ladder point j)
    p = lambda j: 1 / (1 + math.exp(-(b0 + b1 * jx(j))))  # noqa: E731
    j50 = (-b0 / b1 - math.log2(LADDER_BASE)) * 4  # the pooled x50 in ladder steps
    lo = math.floor(j50)
    while p(lo) > LOW_P:
        lo -= 1
    hi = math.ceil(j50)
    while p(hi) < HIGH_P:
        hi += 1
    up = True
    while hi - lo + 1 < MIN_LEVELS:
        hi, lo = (hi + 1, lo) if up else (hi, lo - 1)
        up = not up
    while hi - lo + 1 > MAX_LEVELS:  # drop the end farther from the pooled x50
        if (hi - j50) >= (j50 - lo):
            hi -= 1
        else:
            lo += 1
    return [ladder_level(k) for k in range(lo, hi + 1)]


def _simulate(delta: float, slope: float, seeds: int, replicates: int, draws: int,
              rng: np.random.Generator) -> dict[str, float | list]:
    """Operating characteristics of one scenario: GRPO's x50 at 0, Dr. MAS's at ``delta`` (octaves), both curves
    with ``slope`` per octave; levels from :func:`levels_rule` applied to the pooled truth (an 800-run pilot)."""
    grid = np.linspace(-3, 3 + delta, 400)
    pooled = np.concatenate([1 / (1 + np.exp(-slope * grid)), 1 / (1 + np.exp(-slope * (grid - delta))) ])
    xs = np.concatenate([grid, grid]) + math.log2(LADDER_BASE)
    y = (np.random.default_rng(0).random(len(pooled)) < pooled).astype(int)  # an 800-run pilot: nearly the truth
    levels = levels_rule(xs, y)
    x = np.repeat(np.log2(levels), seeds) - math.log2(LADDER_BASE)
    truth = [1 / (1 + np.exp(-slope * x)), 1 / (1 + np.exp(-slope * (x - delta)))]
    verdicts, widths, deltas = [], [], []
    for _ in range(replicates):
        yg, yd = (rng.random(len(x)) < truth[0]).astype(int), (rng.random(len(x)) < truth[1]).astype(int)
        f = frontier(x, yg, x, yd, rng, draws)
        verdicts.append(verdict(f.ci))
        widths.append(f.ci[1] - f.ci[0])
        deltas.append(f.draws)
    out: dict[str, float | list] = {"levels": levels, "median_ci_width": float(np.median(widths))}
    for v in ("moves up", "no shift (equivalent)", "inconclusive", "moves down"):
        out[v] = float(np.mean([w == v for w in verdicts]))
    out["_draws"] = deltas
    return out


def power_table(replicates: int, draws: int, seed: int = 20261203) -> list[dict]:
    """The scenarios of docs/frontier.md's power statement (and the arm x estimator interaction)."""
    rng = np.random.default_rng(seed)
    rows = []
    for slope in (4.0, 8.0):
        sims = {delta: _simulate(delta, slope, 6, replicates, draws, rng) for delta in (0.0, 0.5, 1.0)}
        for delta, s in sims.items():
            rows.append({"slope": slope, "delta": delta, **{k: v for k, v in s.items() if not k.startswith("_")}})
        # interaction: one arm at Δ = 0, the other at Δ = 1; two-sided 95 % interval of the difference
        a, b = sims[0.0]["_draws"], sims[1.0]["_draws"]
        excl = [not (np.quantile(db - da, 0.025) <= 0 <= np.quantile(db - da, 0.975)) for da, db in zip(a, b)]
        null = [not (np.quantile(d2 - d1, 0.025) <= 0 <= np.quantile(d2 - d1, 0.975))
                for d1, d2 in zip(a, a[1:] + a[:1])]
        rows.append({"slope": slope, "interaction_power_1_octave": float(np.mean(excl)),
                     "interaction_size": float(np.mean(null))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for row in power_table(args.replicates, args.draws):
        logger.info("%s", row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
