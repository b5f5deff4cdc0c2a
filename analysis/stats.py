"""Statistics every study shares: bootstrap CIs of avg@k / pass@k, the unbiased pass@k estimator, spike counts,
the paired Dr. MAS vs GRPO test, the Holm correction and the one significance level :data:`ALPHA`, one bootstrap
stream per claim (:func:`bootstrap_streams`), Kaplan-Meier medians, the logistic fit of an event on log2 of a level
with its LR50 (:func:`lr50`), and the Firth-penalised logistic fit (:func:`firth_fit`, finite under separation).

Array contract (one entry point per quantity, explicit RNG; the API shape of rliable's
``get_interval_estimates``): scores are ``(seeds, tasks)`` arrays of per-task scores in [0, 1] — one row per
seed (run), one column per eval task, the task order being the same in every run of a task family. A task's
score is ``c / k`` for avg@k and ``pass_at_k(k, c, k)`` (= 1[c > 0]) for pass@k, ``c`` its success count
out of ``k`` samples. Every random function takes a ``numpy.random.Generator``: the same seed gives the same
interval (tested).

Bootstrap: tasks are resampled with replacement (the same task indices for every seed row, since seeds see the
same tasks), the statistic is the mean over seeds and resampled tasks; the interval is the percentile interval
of ``n_boot`` replicates. A several-benchmark *Average* resamples each benchmark's tasks independently and
averages the benchmark replicates (:func:`average_interval`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.special import gammaln

from drmas.algos import SpikeRule, spike_ratios

logger = logging.getLogger(__name__)

N_BOOT = 2000
ALPHA = 0.05
"""The significance level of every test of the analysis (and 1 - the coverage of every interval)."""
_BLOCK_ELEMENTS = 4_000_000  # bootstrap index block size (memory ~32 MB of int64 per block)


# ------------------------------------------------------------------------------------------ pass@k
def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k from ``c`` successes among ``n >= k`` samples: 1 - C(n - c, k) / C(n, k)
    (Chen et al. 2021), vectorized over ``n`` and ``c`` via log-gamma (no overflow for large n).
    Example: n = 5, c = 2, k = 2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7."""
    n = np.asarray(n, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    n, c = np.broadcast_arrays(n, c)
    if np.any(n < k):
        raise ValueError(f"pass@{k} needs n >= k samples per task; got n = {n.min():.0f}")
    if np.any((c < 0) | (c > n)):
        raise ValueError("success counts must lie in [0, n]")
    fail = n - c
    out = np.ones_like(n)
    ok = fail >= k  # otherwise every k-subset holds a success: pass@k = 1
    f, m = fail[ok], n[ok]
    log_ratio = gammaln(f + 1) - gammaln(f - k + 1) - gammaln(m + 1) + gammaln(m - k + 1)
    out[ok] = 1.0 - np.exp(log_ratio)
    return out


def task_scores(successes, k: int, metric: str) -> np.ndarray:
    """Per-task scores from success counts out of ``k``: ``avg`` -> c / k, ``pass`` -> pass@k with n = k."""
    c = np.asarray(successes, dtype=np.float64)
    if metric == "avg":
        return c / k
    if metric == "pass":
        return pass_at_k(np.full_like(c, k), c, k)
    raise ValueError(f"metric must be 'avg' or 'pass', got {metric!r}")


# ------------------------------------------------------------------------------------------ bootstrap
@dataclass(frozen=True)
class Interval:
    """Point estimate and percentile bootstrap interval."""

    point: float
    low: float
    high: float

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    @classmethod
    def empty(cls) -> "Interval":
        return cls(np.nan, np.nan, np.nan)


def _as_matrix(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"expected a (seeds, tasks) array with at least one task, got shape {a.shape}")
    return a


def bootstrap_replicates(x, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the mean of a ``(seeds, tasks)`` array (tasks resampled, the same
    indices for every seed: the mean over seeds of resampled tasks equals the resampled seed-mean)."""
    per_task = _as_matrix(x).mean(axis=0)
    t = per_task.size
    block = max(1, _BLOCK_ELEMENTS // t)
    out = np.empty(n_boot)
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        idx = rng.integers(0, t, size=(stop - start, t))
        out[start:stop] = per_task[idx].mean(axis=1)
    return out


def percentile_interval(point: float, replicates: np.ndarray, alpha: float = ALPHA) -> Interval:
    lo, hi = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return Interval(float(point), float(lo), float(hi))


def bootstrap_ci(x, rng: np.random.Generator, n_boot: int = N_BOOT, alpha: float = ALPHA) -> Interval:
    """Mean of a ``(seeds, tasks)`` score array with its (1 - alpha) percentile bootstrap interval."""
    a = _as_matrix(x)
    return percentile_interval(a.mean(), bootstrap_replicates(a, rng, n_boot), alpha)


def average_interval(xs: Sequence, rng: np.random.Generator, n_boot: int = N_BOOT, alpha: float = ALPHA) -> Interval:
    """The paper's Average (mean over benchmarks of the benchmark means) with a bootstrap interval that
    resamples each benchmark's tasks independently. ``xs``: one ``(seeds, tasks_b)`` array per benchmark."""
    if not len(xs):
        return Interval.empty()
    mats = [_as_matrix(x) for x in xs]
    reps = np.mean([bootstrap_replicates(m, rng, n_boot) for m in mats], axis=0)
    return percentile_interval(float(np.mean([m.mean() for m in mats])), reps, alpha)


# ------------------------------------------------------------------------------------------ paired test
@dataclass
class PairedResult:
    """Dr. MAS (a) minus GRPO (b), paired by seed and task.

    ``diff``: mean difference (the Average over benchmarks when several are given) with its paired bootstrap
    interval (tasks resampled jointly for a and b); ``wilcoxon``/``p_value``: Wilcoxon signed-rank test of the
    per-task differences averaged over seeds (all benchmarks' tasks pooled; zero differences dropped, p = 1
    when all are zero); ``per_seed``: the mean difference and Wilcoxon p of each seed pair."""

    diff: Interval
    wilcoxon: float
    p_value: float
    n_tasks: int
    n_seeds: int
    per_seed: list[tuple[float, float]] = field(default_factory=list)

    @property
    def seeds_positive(self) -> int:
        return sum(d > 0 for d, _ in self.per_seed)


def _wilcoxon(d: np.ndarray) -> tuple[float, float]:
    d = d[np.isfinite(d)]
    if d.size == 0 or np.all(d == 0):
        return 0.0, 1.0
    res = sps.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return float(res.statistic), float(res.pvalue)


def paired_test(a: Sequence, b: Sequence, rng: np.random.Generator, n_boot: int = N_BOOT,
                alpha: float = ALPHA) -> PairedResult:
    """Paired comparison of two sets of runs. ``a``, ``b``: one ``(seeds, tasks_b)`` array per benchmark (or a
    single array), row i of ``a`` paired with row i of ``b`` (same seed), column j with column j (same task)."""
    if isinstance(a, np.ndarray) and a.ndim <= 2:
        a, b = [a], [b]
    mats_a, mats_b = [_as_matrix(x) for x in a], [_as_matrix(x) for x in b]
    if len(mats_a) != len(mats_b) or any(x.shape != y.shape for x, y in zip(mats_a, mats_b)):
        raise ValueError("paired_test needs arrays of equal shapes (same seeds and tasks) for a and b; got "
                         f"{[x.shape for x in mats_a]} vs {[y.shape for y in mats_b]}")
    diffs = [x - y for x, y in zip(mats_a, mats_b)]
    diff = average_interval(diffs, rng, n_boot, alpha)
    stat, p = _wilcoxon(np.concatenate([d.mean(axis=0) for d in diffs]))
    n_seeds = diffs[0].shape[0]
    per_seed = []
    for s in range(n_seeds):
        mean_s = float(np.mean([d[s].mean() for d in diffs]))
        per_seed.append((mean_s, _wilcoxon(np.concatenate([d[s] for d in diffs]))[1]))
    return PairedResult(diff=diff, wilcoxon=stat, p_value=p, n_tasks=sum(d.shape[1] for d in diffs),
                        n_seeds=n_seeds, per_seed=per_seed)


# ------------------------------------------------------------------------------------------ gradient norms
def grad_norm_summary(agents: pd.DataFrame, rule: SpikeRule = SpikeRule(), column: str = "grad_norm",
                      by: Sequence[str] = ("run", "agent")) -> pd.DataFrame:
    """Per (run, agent): steps, mean / p95 / max of the finite pre-clip gradient norms, non-finite count,
    spikes under ``rule`` (recomputed with :func:`drmas.algos.spike_ratios` on the step-ordered series) and
    the trainer's logged spike count (``spikes_logged``, NaN when the run did not log it), max spike ratio."""
    cols = ["steps", "mean", "p95", "max", "nonfinite", "spikes", "spikes_logged", "max_ratio"]
    if agents.empty or column not in agents:
        return pd.DataFrame(columns=[*by, *cols])
    rows = []
    for key, g in agents.sort_values("step").groupby(list(by), sort=True):
        # a run that never logged this column is skipped; otherwise NaN / inf in the series are non-finite norms
        # (analysis.runs keeps a logged NaN and drops the steps where the agent did not act)
        series = g[column].to_numpy(dtype=np.float64)
        if series.size == 0 or np.isnan(series).all():
            continue
        finite = series[np.isfinite(series)]
        sp = spike_ratios(series, rule)
        ratio = sp["ratio"].to_numpy()
        ratio = ratio[np.isfinite(ratio)]
        logged = g["spike"].sum() if "spike" in g and g["spike"].notna().any() else np.nan
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "steps": int(series.size),
                     "mean": float(finite.mean()) if finite.size else np.nan,
                     "p95": float(np.quantile(finite, 0.95)) if finite.size else np.nan,
                     "max": float(finite.max()) if finite.size else np.nan,
                     "nonfinite": int((~np.isfinite(series)).sum()), "spikes": int(sp["spike"].sum()),
                     "spikes_logged": float(logged), "max_ratio": float(ratio.max()) if ratio.size else np.nan})
    return pd.DataFrame(rows, columns=[*by, *cols])


def spearman(x, y) -> tuple[float, float]:
    """Spearman rank correlation and its p-value over the finite pairs (NaN with fewer than 3 pairs)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return np.nan, np.nan
    res = sps.spearmanr(x[ok], y[ok])
    return float(res.statistic), float(res.pvalue)


def kendall_tau(order_a: Sequence[str], order_b: Sequence[str]) -> float:
    """Kendall's tau between two orderings of the same items (1 = same order, -1 = reversed)."""
    common = [x for x in order_a if x in order_b]
    if len(common) < 2:
        return np.nan
    rank_b = {x: i for i, x in enumerate(order_b)}
    return float(sps.kendalltau(np.arange(len(common)), [rank_b[x] for x in common]).statistic)


# ------------------------------------------------------------------------------------------ multiple tests
def holm(p) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone, at most 1), in the order of ``p``."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, float)
    return multipletests(p, method="holm")[1] if len(p) else p


def bootstrap_streams(seed: int, n: int) -> list[np.random.Generator]:
    """``n`` independent generators spawned from ``seed`` (``numpy.random.SeedSequence``): one per claim, so that a
    change to one claim's resampling leaves the others' intervals as they are."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


# ------------------------------------------------------------------------------------------ survival
def km_median(time: np.ndarray, event: np.ndarray) -> tuple[float, float, float]:
    """Kaplan-Meier median time to the event with its 95 % CI (inf: not reached)."""
    from statsmodels.duration.survfunc import SurvfuncRight

    if event.sum() == 0:
        return math.inf, math.inf, math.inf
    sf = SurvfuncRight(time, event)
    median = sf.quantile(0.5)
    with np.errstate(divide="ignore", invalid="ignore"):  # the CI's log-log transform at survival 1 or 0
        low, high = sf.quantile_ci(0.5)
    fix = lambda x: math.inf if x is None or not np.isfinite(x) else float(x)  # noqa: E731
    return fix(median), fix(low), fix(high)


# ------------------------------------------------------------------------------------------ logistic fits
def separates(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether a logistic fit of y on x has no finite maximum: all-or-none, or every event at or above every
    non-event. The quasi-complete case (events and non-events meet at one level, e.g. 5 of 6 at the lowest level and
    all above it) separates too: its likelihood rises without bound as the slope grows, so a fitted LR50 there is
    wherever the optimiser stopped."""
    return y.min() == y.max() or x[y == 0].max() <= x[y == 1].min()


def logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(b0, b1) of a binomial GLM of y on x, or None where the fit separates (:func:`separates`) or its slope is not
    positive."""
    import warnings

    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import PerfectSeparationWarning

    if separates(x, y):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfectSeparationWarning)
        try:
            fit = sm.GLM(y, sm.add_constant(x), family=sm.families.Binomial()).fit()
        except (PerfectSeparationWarning, np.linalg.LinAlgError, ValueError):
            return None
    b0, b1 = map(float, fit.params)
    return (b0, b1) if b1 > 0 else None


def bracket(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Bounds of the level at which half the runs have the event, where the fit separates: the highest level at which
    fewer than half did and the lowest at which more than half did (-inf / inf where no level is on that side; a level
    at which exactly half did is LR50 itself)."""
    levels = np.unique(x)
    frac = np.array([y[x == v].mean() for v in levels])
    if (frac == 0.5).any():
        v = float(levels[frac == 0.5][0])
        return v, v
    below, above = levels[frac < 0.5], levels[frac > 0.5]
    return (float(below.max()) if len(below) else -math.inf, float(above.min()) if len(above) else math.inf)


def firth_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(b0, b1) of the Firth-penalised logistic regression of ``y`` (0/1) on ``x``. A sample without both outcomes
    gives b1 = 0 (no slope is identified) and b0 at the Firth estimate of the one proportion."""
    import warnings

    from firthmodels import FirthLogisticRegression

    x = np.asarray(x, float)
    y = np.asarray(y, int)
    if y.min() == y.max():
        n = len(y)
        p = (y.sum() + 0.5) / (n + 1.0)  # Firth's estimate of a single proportion (Jeffreys)
        return math.log(p / (1 - p)), 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = FirthLogisticRegression(backend="numpy").fit(x[:, None], y)
    return float(fit.intercept_), float(fit.coef_[0])


def lr50(x: np.ndarray, y: np.ndarray, edges: tuple[float, float], rng: np.random.Generator,
         n_boot: int) -> tuple[dict, np.ndarray]:
    """LR50 = 2^(-b0/b1) of the logistic fit of the event ``y`` on ``x`` = log2(level), with a parametric bootstrap
    95 % CI (draws that separate sit at the grid's edge they point to; ``edges``: log2 of the lowest and highest
    level of the grid); where the data separate (completely or quasi-completely, :func:`separates`), the bracket of
    :func:`bracket`: "below" / "above" the grid (an interval open on that side: (0, lowest level] or [highest level,
    inf)) or "between" two levels (the bootstrap then draws log2 LR50 uniformly in that interval: the data say no
    more). Returns the row (``lr50``, ``low``, ``high``, ``note``) and the ``n_boot`` draws of log2 LR50."""
    lo_edge, hi_edge = edges
    fit = logistic(x, y)
    if fit is None:
        low, high = bracket(x, y) if separates(x, y) else (-math.inf, math.inf)
        if low > high or (low == -math.inf and high == math.inf):  # the event does not rise with the level
            return ({"lr50": math.nan, "low": 0.0, "high": math.inf,
                     "note": "not identified (collapse does not rise with the lr)"}, np.full(n_boot, math.nan))
        note = ("below the grid" if low == -math.inf else "above the grid" if high == math.inf else
                f"at {2 ** low:.2g} (separated)" if low == high else
                f"between {2 ** low:.2g} and {2 ** high:.2g} (separated)")
        row = {"lr50": 2 ** low if low == high else math.nan, "low": 0.0 if low == -math.inf else 2 ** low,
               "high": math.inf if high == math.inf else 2 ** high, "note": note}
        # Outside the grid the edge only bounds LR50 (a ratio's interval is opened there); inside, a uniform draw.
        low, high = max(low, lo_edge), min(high, hi_edge)
        return row, (rng.uniform(low, high, n_boot) if high > low else np.full(n_boot, low))
    b0, b1 = fit
    p = 1 / (1 + np.exp(-(b0 + b1 * x)))
    boot = []
    for _ in range(n_boot):
        yb = (rng.random(len(p)) < p).astype(int)
        fb = logistic(x, yb)
        if fb is None:
            boot.append(lo_edge if yb.mean() >= 0.5 else hi_edge)
        else:
            boot.append(min(max(-fb[0] / fb[1], lo_edge - 2), hi_edge + 2))
    boot = np.array(boot)
    return ({"lr50": 2 ** (-b0 / b1), "low": 2 ** np.percentile(boot, 2.5), "high": 2 ** np.percentile(boot, 97.5),
             "note": ""}, boot)


# ------------------------------------------------------------------------------------------ accelerated failure time
@dataclass(frozen=True)
class AFTFit:
    """A log-normal accelerated-failure-time fit: coefficients (on log T), their standard errors, σ, and whether the
    optimiser converged."""

    params: np.ndarray
    bse: np.ndarray
    sigma: float
    converged: bool

    def time_ratio(self, j: int, z: float = 1.959963984540054) -> tuple[float, float, float]:
        """e^β_j with its Wald interval: the factor by which covariate j multiplies the time to the event."""
        b, se = float(self.params[j]), float(self.bse[j])
        return math.exp(b), math.exp(b - z * se), math.exp(b + z * se)


def lognormal_aft(time: np.ndarray, event: np.ndarray, covariates: np.ndarray) -> AFTFit:
    """Maximum-likelihood log-normal AFT model with right censoring: log T = Xβ + σε, ε ~ N(0, 1), X = [1,
    covariates]. An event at T contributes log φ(z)/(σT), a censored time log(1 − Φ(z)), z = (log T − Xβ)/σ.
    statsmodels' ``GenericLikelihoodModel`` maximises it (lifelines' ``LogNormalAFTFitter`` is the same model but
    needs pandas < 3); σ is fitted on the log scale and the Wald errors come from the numerical Hessian."""
    from scipy.stats import norm
    from statsmodels.base.model import GenericLikelihoodModel

    t = np.asarray(time, float)
    d = np.asarray(event, bool)
    x = np.column_stack([np.ones(len(t)), np.asarray(covariates, float).reshape(len(t), -1)])
    if (t <= 0).any():
        raise ValueError("an AFT model needs positive times")
    k = x.shape[1]

    class _LogNormalAFT(GenericLikelihoodModel):
        def loglikeobs(self, params):
            beta, log_sigma = params[:k], params[k]
            sigma = math.exp(log_sigma) if np.isscalar(log_sigma) else np.exp(log_sigma)
            z = (np.log(t) - x @ beta) / sigma
            return np.where(d, norm.logpdf(z) - np.log(sigma) - np.log(t), norm.logsf(z))

    start = np.zeros(k + 1)
    start[0] = float(np.log(t).mean())
    model = _LogNormalAFT(np.log(t), x, extra_params_names=["log_sigma"])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        fit = model.fit(start_params=start, method="bfgs", maxiter=2000, disp=False)
        fit = model.fit(start_params=fit.params, method="newton", maxiter=200, disp=False)
    converged = bool(fit.mle_retvals.get("converged", False))
    bse = np.asarray(fit.bse, float)
    return AFTFit(np.asarray(fit.params[:k], float), bse[:k], float(math.exp(fit.params[k])), converged)
