"""The confirmatory stability round's verdicts (docs/stability.md, "The confirmatory round": the rules were committed
there before the round's first run; the constants below are its numbers).

    python -m analysis.confirm --runs results/runs/stability_confirm --out results/stability_confirm

- **The event**: rule (g)'s clauses (non-finite, reward collapse) plus the abandonment of *every* agent the run's
  orchestra declares (``Orchestra.slots`` of its ``env.orchestra``, read from the registry); a run without a collapse
  is censored at its last step.
- **C1** time to collapse: stratified log-rank test (statsmodels ``survdiff``), Cox hazard ratio stratified by
  learning rate (``PHReg``), Kaplan-Meier medians with CIs (``SurvfuncRight``).
- **C2** abandonment of an agent: Cochran-Mantel-Haenszel over the levels (``StratifiedTable``).
- **C3** persistent elevation: per twin pair and agent the GRPO / Dr. MAS ratio of the p95 (and max) pre-clip norm over
  steps 0-39; sign test, Holm over the agents.
- **C4** stability frontier: logistic fit of collapse-by-the-horizon on log2(lr), LR50 with a parametric bootstrap CI.
- **C5** the clip dial: update-norm ratios with and without the clip, time to collapse in the clip-off arm.
- accuracy over time: the exploratory rule (:func:`analysis.stability.accuracy_over_time`) with Holm over the levels.

The main arm is the runs tagged ``arm: main``, the clip dial ``arm: clip_dial``. Only finished runs enter a verdict;
a verdict computed on fewer runs than the grid holds is marked incomplete.
"""
from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.claims import (CONFIRMATORY, DESCRIPTIVE, INCONCLUSIVE, NO_DIFFERENCE, NOT_RUN, REFUTED, REPRODUCED,
                             UNDERPOWERED, Judged, incomplete, incomplete_so_far)
from analysis.integrity import problem_lines
from analysis.runs import GridData, load_grid, run_manifest
from analysis.stability import (DRMAS, EARLY, GRPO, PERSIST, ROLL, SEARCH_DROP, _finished, _first_sustained,
                                _steps_of, accuracy_over_time, nonfinite_and_reward)
from analysis.stats import N_BOOT
from analysis.tables import markdown
from drmas.io import atomic_write_text

logger = logging.getLogger(__name__)

ABANDON_DROP = SEARCH_DROP   # rolling calls per trajectory below this share of the early level (as rule g's search clause)
WINDOW = 40                  # C3 / C5: steps 0 .. WINDOW-1, both twins alive
ALPHA = 0.05
N_FRONTIER_BOOT = 2000
POWER_EVENTS = 0.5           # C1 assumed Dr. MAS collapsing by the horizon in 30-70 % of runs: at least half of all runs
"""C1's power statement assumed collapse probabilities of 0.3-0.7 (Dr. MAS) and more under GRPO; a round that ends
with fewer than this share of its runs collapsed had less information than the statement assumed."""


# ------------------------------------------------------------------------------------------ the event
def declared_agents(run_path: Path) -> tuple[str, ...]:
    """The agents the run's orchestra declares (its ``slots``), from the run's ``manifest.json`` config."""
    from drmas.orchestra import ORCHESTRA_REGISTRY

    name = (run_manifest(Path(run_path))["config"].get("env") or {}).get("orchestra")
    return tuple(ORCHESTRA_REGISTRY.get(name).slots)


@dataclass(frozen=True)
class Event:
    """One run's collapse: its step (None: censored), the run's last step, the first clause, abandoned agents."""

    step: int | None
    last_step: int
    reason: str                     # "non-finite", "reward", "abandoned:<agent>", or "" (censored)
    abandoned: tuple[str, ...] = ()  # every agent whose abandonment clause fired, in any order of time


def collapse_event(steps: pd.DataFrame, agents: tuple[str, ...], persist: int = PERSIST) -> Event:
    """The confirmatory event (module docstring) on one run's step records."""
    s = steps.sort_values("step").set_index("step")
    fired = nonfinite_and_reward(s, persist)
    abandoned = []
    for agent in agents:
        key = f"agent/{agent}/calls_per_traj"
        if key not in s:
            continue
        calls = s[key].fillna(0.0)  # a step without a call of the agent logs no key: 0 calls
        early = calls.iloc[:EARLY].mean()
        roll = calls.rolling(ROLL, min_periods=ROLL).mean()
        if (t := _first_sustained((roll < ABANDON_DROP * early) & roll.notna(), persist)) is not None:
            fired[f"abandoned:{agent}"] = t
            abandoned.append(agent)
    last = int(s.index.max()) if len(s) else -1
    if not fired:
        return Event(None, last, "", ())
    reason = min(fired, key=fired.get)
    return Event(fired[reason], last, reason, tuple(abandoned))


def event_table(data: GridData) -> pd.DataFrame:
    """One row per finished run: estimator, lr, seed, arm, clip, the time (collapse step, or last step when
    censored), the event flag, its reason, abandoned agents, and the code commit it ran with."""
    finished = _finished(data)
    rows = []
    for r, done in zip(data.runs.itertuples(), finished):
        if not done:
            continue
        path = Path(r.path)
        agents = declared_agents(path)
        ev = collapse_event(_steps_of(data, r.run), agents)
        manifest = run_manifest(path)
        clip = clip_setting(manifest["config"])
        rows.append({"run": r.run, "estimator": r.estimator, "lr": float(r.level), "seed": int(r.seed),
                     "arm": "clip_dial" if clip == "off" else "main", "clip": clip,
                     "time": ev.step if ev.step is not None else ev.last_step, "event": int(ev.step is not None),
                     "reason": ev.reason, "abandoned": ",".join(ev.abandoned), "agents": ",".join(agents),
                     "git_commit": manifest.get("git_commit")})
    return pd.DataFrame(rows, columns=["run", "estimator", "lr", "seed", "arm", "clip", "time", "event", "reason",
                                       "abandoned", "agents", "git_commit"])


CLIP_OFF = 1.0e6
"""A run whose every model clips at ``optim.max_grad_norm`` >= this does not clip (the dial sets 1e9; the largest
pre-clip norm any committed run logged is 5.5e5)."""


def clip_setting(config: dict) -> str:
    """"off" when no model of the run's config clips (:data:`CLIP_OFF`), else "on" (read from the run's own config,
    so that the arm is right without the grid's index too)."""
    norms = [float((m.get("optim") or {}).get("max_grad_norm", 1.0)) for m in (config.get("models") or {}).values()]
    return "off" if norms and min(norms) >= CLIP_OFF else "on"


# ------------------------------------------------------------------------------------------ C1
def km_median(time: np.ndarray, event: np.ndarray) -> tuple[float, float, float]:
    """Kaplan-Meier median time to collapse with its 95 % CI (inf: not reached)."""
    from statsmodels.duration.survfunc import SurvfuncRight

    if event.sum() == 0:
        return math.inf, math.inf, math.inf
    sf = SurvfuncRight(time, event)
    median = sf.quantile(0.5)
    with np.errstate(divide="ignore", invalid="ignore"):  # the CI's log-log transform at survival 1 or 0
        low, high = sf.quantile_ci(0.5)
    fix = lambda x: math.inf if x is None or not np.isfinite(x) else float(x)
    return fix(median), fix(low), fix(high)


def time_to_collapse(events: pd.DataFrame) -> dict:
    """C1: stratified log-rank (one-sided toward GRPO collapsing sooner), stratified Cox hazard ratio with CI,
    Kaplan-Meier medians per estimator pooled and per level."""
    from statsmodels.duration.hazard_regression import PHReg
    from statsmodels.duration.survfunc import survdiff

    t = events["time"].to_numpy(float)
    e = events["event"].to_numpy(int)
    grpo = (events["estimator"] == GRPO).to_numpy(int)
    strata = events["lr"].rank(method="dense").to_numpy(int)
    out: dict = {"runs": len(events), "events": int(e.sum())}
    if e.sum() == 0 or grpo.sum() in (0, len(grpo)):
        out.update(p=math.nan, hr=math.nan, hr_low=math.nan, hr_high=math.nan)
    else:
        _, p_two = survdiff(t, e, grpo, strata=strata)
        fit = PHReg(t, grpo[:, None].astype(float), status=e, strata=strata).fit(disp=False)
        coef = float(fit.params[0])
        low, high = fit.conf_int()[0]
        with np.errstate(over="ignore"):  # one arm without any collapse: the Cox fit diverges, HR -> inf or 0
            hr, hr_low, hr_high = (float(np.exp(np.clip(v, -50.0, 50.0))) for v in (coef, low, high))
        out.update(p=float(p_two / 2 if coef > 0 else 1 - p_two / 2), p_two_sided=float(p_two), hr=hr, hr_low=hr_low,
                   hr_high=hr_high, hr_note="" if 0 < e[grpo == 1].sum() and 0 < e[grpo == 0].sum() and hr_high < 1e6
                   else "the Cox fit diverges (no collapse in one arm, or too few runs): HR bounds clipped at e^±50")
    medians = []
    for (lr, est), g in [*(((lr, est), g) for (lr, est), g in events.groupby(["lr", "estimator"])),
                         *(((math.nan, est), g) for est, g in events.groupby("estimator"))]:
        m, lo, hi = km_median(g["time"].to_numpy(float), g["event"].to_numpy(int))
        medians.append({"lr": lr, "estimator": est, "runs": len(g), "collapsed": int(g["event"].sum()),
                        "median": m, "low": lo, "high": hi})
    out["medians"] = pd.DataFrame(medians)
    return out


# ------------------------------------------------------------------------------------------ C2
def abandonment(events: pd.DataFrame) -> pd.DataFrame:
    """C2: per agent (and "any"), abandoned runs per estimator and the one-sided CMH p over the levels."""
    from statsmodels.stats.contingency_tables import StratifiedTable

    agents = sorted({a for row in events["agents"] for a in row.split(",") if a})
    rows = []
    for agent in ["any", *agents]:
        hit = (events["abandoned"] != "") if agent == "any" else events["abandoned"].str.split(",").apply(
            lambda xs, a=agent: a in xs)
        tables = []
        for _, g in events.assign(hit=hit.to_numpy()).groupby("lr"):
            cg = int(g.loc[g["estimator"] == GRPO, "hit"].sum()); ng = int((g["estimator"] == GRPO).sum())
            cd = int(g.loc[g["estimator"] == DRMAS, "hit"].sum()); nd = int((g["estimator"] == DRMAS).sum())
            if ng and nd:
                tables.append(np.array([[cg, ng - cg], [cd, nd - cd]], float))
        grpo_n = sum(int(t[0].sum()) for t in tables); drmas_n = sum(int(t[1].sum()) for t in tables)
        grpo_hit = sum(int(t[0, 0]) for t in tables); drmas_hit = sum(int(t[1, 0]) for t in tables)
        p = math.nan
        if tables and (grpo_hit + drmas_hit) > 0 and (grpo_hit + drmas_hit) < grpo_n + drmas_n:
            st = StratifiedTable(tables)
            two = float(st.test_null_odds(correction=True).pvalue)
            p = two / 2 if grpo_hit / grpo_n > drmas_hit / drmas_n else 1 - two / 2
        elif tables:
            p = 1.0
        rows.append({"agent": agent, "grpo": grpo_hit, "grpo_n": grpo_n, "drmas": drmas_hit, "drmas_n": drmas_n,
                     "p": p})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ C3
def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, float)
    return multipletests(p, method="holm")[1] if len(p) else p


def twin_pairs(events: pd.DataFrame) -> list[tuple[float, int, str, str]]:
    """(lr, seed, GRPO run, Dr. MAS run) of every finished twin pair."""
    pairs = []
    for (lr, seed), g in events.groupby(["lr", "seed"]):
        by = {e: g.loc[g["estimator"] == e, "run"] for e in (GRPO, DRMAS)}
        if all(len(v) == 1 for v in by.values()):
            pairs.append((float(lr), int(seed), by[GRPO].iloc[0], by[DRMAS].iloc[0]))
    return pairs


def _window(frame: pd.DataFrame, run: str, column: str, agent_col: str, agent: str) -> np.ndarray:
    x = frame[(frame["run"] == run) & (frame[agent_col] == agent) & (frame["step"] < WINDOW)][column]
    x = x.to_numpy(float)
    return x[np.isfinite(x)]  # steps at which the agent was not called log no norm


def elevation(data: GridData, events: pd.DataFrame, rng: np.random.Generator, n_boot: int = N_BOOT) -> pd.DataFrame:
    """C3: per agent and statistic (p95, max), the GRPO / Dr. MAS ratios over twin pairs: pairs above 1, the median
    ratio with a bootstrap CI over pairs, the one-sided sign-test p and its Holm value over the agents."""
    pairs = twin_pairs(events)
    rows = []
    for stat, fn in (("p95", lambda x: np.percentile(x, 95)), ("max", np.max)):
        per_agent = []
        for agent in sorted(data.agents["agent"].unique()):
            logs = []
            for _, _, g, d in pairs:
                xg = _window(data.agents, g, "grad_norm", "agent", agent)
                xd = _window(data.agents, d, "grad_norm", "agent", agent)
                if len(xg) and len(xd) and fn(xd) > 0 and fn(xg) > 0:
                    logs.append(math.log(fn(xg) / fn(xd)))
            logs = np.array(logs)
            if not len(logs):
                continue
            boot = np.median(rng.choice(logs, (n_boot, len(logs))), axis=1)
            above = int((logs > 0).sum())
            per_agent.append({"stat": stat, "agent": agent, "pairs": len(logs), "above": above,
                              "median_ratio": math.exp(np.median(logs)), "low": math.exp(np.percentile(boot, 2.5)),
                              "high": math.exp(np.percentile(boot, 97.5)),
                              "p": float(sps.binomtest(above, len(logs), 0.5, alternative="greater").pvalue),
                              "p_below": float(sps.binomtest(above, len(logs), 0.5, alternative="less").pvalue)})
        if per_agent:
            frame = pd.DataFrame(per_agent)
            frame["p_holm"] = holm(frame["p"].to_numpy())
            frame["p_below_holm"] = holm(frame["p_below"].to_numpy())
            rows.append(frame)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


# ------------------------------------------------------------------------------------------ C4
def _separates(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether a logistic fit of y on x has no finite maximum: all-or-none, or every collapse at or above every
    non-collapse. The quasi-complete case (collapses and non-collapses meet at one level, e.g. 5 of 6 at the lowest
    level and all above it) separates too: its likelihood rises without bound as the slope grows, so a fitted
    LR50 there is wherever the optimiser stopped."""
    return y.min() == y.max() or x[y == 0].max() <= x[y == 1].min()


def _logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(b0, b1) of a binomial GLM of y on x, or None where the fit separates (:func:`_separates`) or its slope is not
    positive."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import PerfectSeparationWarning

    if _separates(x, y):
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfectSeparationWarning)
        try:
            fit = sm.GLM(y, sm.add_constant(x), family=sm.families.Binomial()).fit()
        except (PerfectSeparationWarning, np.linalg.LinAlgError, ValueError):
            return None
    b0, b1 = map(float, fit.params)
    return (b0, b1) if b1 > 0 else None


def _bracket(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """log2 bounds of LR50 where the fit separates: the highest level at which fewer than half of the runs collapsed
    and the lowest at which more than half did (-inf / inf where no level is on that side; a level at which exactly
    half collapsed is LR50 itself)."""
    levels = np.unique(x)
    frac = np.array([y[x == v].mean() for v in levels])
    if (frac == 0.5).any():
        v = float(levels[frac == 0.5][0])
        return v, v
    below, above = levels[frac < 0.5], levels[frac > 0.5]
    return (float(below.max()) if len(below) else -math.inf, float(above.min()) if len(above) else math.inf)


def frontier(events: pd.DataFrame, rng: np.random.Generator, n_boot: int = N_FRONTIER_BOOT) -> pd.DataFrame:
    """C4: per estimator LR50 = 2^(-b0/b1) of the logistic fit of collapse on log2(lr), with a parametric bootstrap
    95 % CI (draws that separate sit at the grid's edge they point to); where the estimator's own data separate
    (completely or quasi-completely, :func:`_separates`), the bracket of :func:`_bracket`: "below" / "above" the grid
    (an interval open on that side: (0, lowest level] or [highest level, inf)) or "between" two levels (the bootstrap
    then draws log2 LR50 uniformly in that interval: the data say no more); and the ratio Dr. MAS / GRPO with its
    bootstrap CI, open on the side an estimator outside the grid leaves unbounded."""
    lo_edge, hi_edge = math.log2(events["lr"].min()), math.log2(events["lr"].max())
    draws, rows = {}, []
    for est in (GRPO, DRMAS):
        g = events[events["estimator"] == est]
        if g.empty:
            continue
        x, y = np.log2(g["lr"].to_numpy(float)), g["event"].to_numpy(int)
        fit = _logistic(x, y)
        if fit is None:
            low, high = _bracket(x, y) if _separates(x, y) else (-math.inf, math.inf)
            if low > high or (low == -math.inf and high == math.inf):  # collapse does not rise with the lr
                rows.append({"estimator": est, "lr50": math.nan, "low": 0.0, "high": math.inf,
                             "note": "not identified (collapse does not rise with the lr)"})
                draws[est] = np.full(n_boot, math.nan)
                continue
            note = ("below the grid" if low == -math.inf else "above the grid" if high == math.inf else
                    f"at {2 ** low:.2g} (separated)" if low == high else
                    f"between {2 ** low:.2g} and {2 ** high:.2g} (separated)")
            rows.append({"estimator": est, "lr50": 2 ** low if low == high else math.nan,
                         "low": 0.0 if low == -math.inf else 2 ** low, "high": math.inf if high == math.inf else 2 ** high,
                         "note": note})
            # Outside the grid the edge only bounds LR50 (the ratio's interval is opened below); inside, a uniform draw.
            low, high = max(low, lo_edge), min(high, hi_edge)
            draws[est] = rng.uniform(low, high, n_boot) if high > low else np.full(n_boot, low)
            continue
        b0, b1 = fit
        p = 1 / (1 + np.exp(-(b0 + b1 * x)))
        boot = []
        for _ in range(n_boot):
            yb = (rng.random(len(p)) < p).astype(int)
            fb = _logistic(x, yb)
            if fb is None:
                boot.append(lo_edge if yb.mean() >= 0.5 else hi_edge)
            else:
                boot.append(min(max(-fb[0] / fb[1], lo_edge - 2), hi_edge + 2))
        boot = np.array(boot)
        draws[est] = boot
        rows.append({"estimator": est, "lr50": 2 ** (-b0 / b1), "low": 2 ** np.percentile(boot, 2.5),
                     "high": 2 ** np.percentile(boot, 97.5), "note": ""})
    out = pd.DataFrame(rows, columns=["estimator", "lr50", "low", "high", "note"])
    if set(draws) == {GRPO, DRMAS}:
        ratio = 2 ** (draws[DRMAS] - draws[GRPO])
        point = out.set_index("estimator")["lr50"]
        low, high = float(np.percentile(ratio, 2.5)), float(np.percentile(ratio, 97.5))
        # An estimator outside the grid was drawn at the grid's edge, which only bounds its LR50; the ratio's interval
        # is then open on the side that bound cannot reach (both below the grid: (0, inf), not identified).
        bounds = out.set_index("estimator")
        if bounds.at[GRPO, "low"] == 0 or bounds.at[DRMAS, "high"] == math.inf:
            high = math.inf
        if bounds.at[GRPO, "high"] == math.inf or bounds.at[DRMAS, "low"] == 0:
            low = 0.0
        out.attrs["ratio"] = (float(point[DRMAS] / point[GRPO]) if point.notna().all() else math.nan, low, high)
    return out


# ------------------------------------------------------------------------------------------ C5
def update_ratios(data: GridData, events: pd.DataFrame) -> pd.DataFrame:
    """C5: per clip setting and model, the GRPO / Dr. MAS ratio of the median ``wg/{m}/update_norm`` over steps
    0-39 per twin pair: pairs above 1, median ratio, one-sided sign-test p."""
    if "update_norm" not in data.groups:
        return pd.DataFrame()
    rows = []
    for clip, g in events.groupby("clip"):
        for wg in sorted(data.groups["wg"].unique()):
            logs = []
            for _, _, rg, rd in twin_pairs(g):
                xg = _window(data.groups, rg, "update_norm", "wg", wg)
                xd = _window(data.groups, rd, "update_norm", "wg", wg)
                if len(xg) and len(xd) and np.median(xd) > 0 and np.median(xg) > 0:
                    logs.append(math.log(np.median(xg) / np.median(xd)))
            if logs:
                above = int((np.array(logs) > 0).sum())
                rows.append({"clip": clip, "model": wg, "pairs": len(logs), "above": above,
                             "median_ratio": math.exp(np.median(logs)),
                             "p": float(sps.binomtest(above, len(logs), 0.5, alternative="greater").pvalue)})
    return pd.DataFrame(rows)


def clip_dial(data: GridData, events: pd.DataFrame) -> dict:
    """C5: the update-norm ratios, C1's test inside the clip-off arm, and a Cox model over the dial's level with
    estimator, clip and their interaction."""
    from statsmodels.duration.hazard_regression import PHReg

    off = events[events["clip"] == "off"]
    if off.empty:
        return {}
    level = events[events["lr"].isin(off["lr"].unique())]
    out = {"updates": update_ratios(data, level), "off": time_to_collapse(off.assign(lr=off["lr"]))}
    grpo = (level["estimator"] == GRPO).to_numpy(float)
    clip_off = (level["clip"] == "off").to_numpy(float)
    if level["event"].sum() and len(set(clip_off)) == 2:
        x = np.column_stack([grpo, clip_off, grpo * clip_off])
        try:
            fit = PHReg(level["time"].to_numpy(float), x, status=level["event"].to_numpy(int)).fit(disp=False)
            with np.errstate(over="ignore"):
                hr, low, high = (float(np.exp(np.clip(v, -50.0, 50.0))) for v in (fit.params[2], *fit.conf_int()[2]))
            out["interaction"] = {"hr": hr, "low": low, "high": high, "p": float(fit.pvalues[2])}
        except (np.linalg.LinAlgError, ValueError) as exc:
            out["interaction"] = {"note": f"Cox fit failed: {exc}"}
    return out


# ------------------------------------------------------------------------------------------ the whole
@dataclass
class Confirmation:
    """Every number of the confirmatory verdicts, from one grid folder."""

    data: GridData
    finished: int
    total: int
    events: pd.DataFrame
    c1: dict
    c2: pd.DataFrame
    c3: pd.DataFrame
    c4: pd.DataFrame
    c5: dict
    accuracy: pd.DataFrame
    verdicts: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.finished == self.total


def analyze(data: GridData, seed: int = 0, n_boot: int = N_BOOT) -> Confirmation:
    """Every claim of the round from one grid. Each bootstrap draws from its own stream of ``seed`` (C3, C4, accuracy),
    so a change to one claim's resampling leaves the others' intervals as they are."""
    rng_c3, rng_c4, rng_acc = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    events = event_table(data)
    total = len(data.runs)
    main = events[events["arm"] == "main"]
    c1 = time_to_collapse(main) if len(main) else {}
    c2 = abandonment(main) if len(main) else pd.DataFrame()
    c3 = elevation(data, main, rng_c3, n_boot) if len(main) else pd.DataFrame()
    c4 = frontier(main, rng_c4) if len(main) else pd.DataFrame()
    c5 = clip_dial(data, events) if len(events) else {}
    runs = main.rename(columns={"event": "collapsed"})
    acc = accuracy_over_time(data, runs, rng_acc, n_boot) if len(runs) else pd.DataFrame()
    if len(acc):
        auc = acc["measure"] == "auc"
        acc.loc[auc, "p_holm"] = holm(acc.loc[auc, "p_wilcoxon"].to_numpy())
    an = Confirmation(data, len(events), total, events, c1, c2, c3, c4, c5, acc)
    an.verdicts = verdicts(an)
    return an


def _incomplete(an: Confirmation, verdict: str) -> str:
    """``verdict``, marked incomplete (with the verdict so far) while the round has runs that do not count (not
    started, unfinished, their folder gone, their records in conflict: :func:`analysis.stability.grid_status`)."""
    return verdict if an.complete else incomplete_so_far(an.finished, an.total, verdict)


def verdicts(an: Confirmation) -> dict[str, str]:
    """The verdict words of docs/stability.md per confirmatory claim."""
    out = {}
    c1 = an.c1
    if c1 and np.isfinite(c1.get("p", math.nan)):
        if c1["p"] < ALPHA:
            v = REPRODUCED
        elif c1["hr"] < 1 and 1 - c1["p"] < ALPHA:
            v = REFUTED
        elif c1["events"] < POWER_EVENTS * c1["runs"]:
            v = UNDERPOWERED
        else:
            v = INCONCLUSIVE
        out["C1"] = _incomplete(an, v)
    c2 = an.c2
    if len(c2):
        p = float(c2.loc[c2["agent"] == "any", "p"].iloc[0])
        row = c2[c2["agent"] == "any"].iloc[0]
        v = (REPRODUCED if p < ALPHA else REFUTED if row["drmas"] / row["drmas_n"] > row["grpo"] / row["grpo_n"]
             and 1 - p < ALPHA else INCONCLUSIVE)
        out["C2"] = _incomplete(an, v)
    c3 = an.c3
    if len(c3):
        p95 = c3[c3["stat"] == "p95"]
        up, down = (p95["p_holm"] < ALPHA).any(), (p95["p_below_holm"] < ALPHA).any()
        out["C3"] = _incomplete(an, REPRODUCED if up and not down else REFUTED if down and not up else INCONCLUSIVE)
    ratio = an.c4.attrs.get("ratio") if len(an.c4) else None
    if ratio:
        out["C4"] = _incomplete(an, REPRODUCED if ratio[1] > 1 else REFUTED if ratio[2] < 1 else INCONCLUSIVE)
    if an.c5:
        out["C5"] = _incomplete(an, DESCRIPTIVE)
    acc = an.accuracy
    if len(acc):
        auc = acc[acc["measure"] == "auc"]
        above = ((auc["p_holm"] < ALPHA) & (auc["low"] > 0)).any()
        below = ((auc["p_holm"] < ALPHA) & (auc["high"] < 0)).any()
        out["accuracy-confirm"] = _incomplete(an, REPRODUCED if above and not below else REFUTED if below and
                                              not above else NO_DIFFERENCE)
    return out


def _interval(low: float, high: float) -> str:
    """An interval for the summary; an open end (0 below, inf above) is written as such."""
    return f"[{'0' if low == 0 else _fmt(low)}, {'∞' if high == math.inf else _fmt(high)}]"


def _fmt(x: float, digits: int = 2) -> str:
    """A number for the summary: "not reached" for inf, "—" for none, 3 significant digits outside 0.01-10^4."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == math.inf:
        return "not reached"
    return f"{x:.{max(digits, 3)}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """Infinite medians and bounds (not reached) as words, not empty cells."""
    return frame.map(lambda v: "not reached" if isinstance(v, float) and v == math.inf else v)


def step_seconds(an: Confirmation) -> pd.Series:
    """Seconds of RL steps per finished run (the sum of its ``timing/step`` records, every sitting of a resumed
    run included), indexed by run; empty where the records carry no step time."""
    steps = an.data.steps
    if "timing/step" not in steps.columns or not len(an.events):
        return pd.Series(dtype=float)
    return steps[steps["run"].isin(an.events["run"])].groupby("run")["timing/step"].sum()


def _label(key: str) -> str:
    """A claim as REPORT.md names it, with its key where the two differ (``C-acc (accuracy-confirm)``)."""
    label = LABELS.get(key, (key, ""))[0]
    return label if label == key else f"{label} ({key})"


def summary_markdown(an: Confirmation, runs_dir: Path) -> str:
    """results/stability_confirm/summary.md: each claim's verdict, test, effect with CI and data."""
    lines = [f"# Confirmatory stability round ({runs_dir})", "",
             f"Finished runs: {an.finished} of {an.total}" + ("" if an.complete else " (verdicts incomplete)") + ".",
             f"Rules: docs/stability.md, \"The confirmatory round\". Code commits: "
             f"{', '.join(sorted(set(an.events['git_commit'].dropna().astype(str)))) or 'none recorded'}.", ""]
    lines += ["| claim | verdict |", "|---|---|", *[f"| {_label(k)} | {v} |" for k, v in an.verdicts.items()], ""]
    if an.c1:
        c = an.c1
        lines += ["## C1 time to collapse", "",
                  f"Stratified log-rank, one-sided p = {_fmt(c.get('p', math.nan), 3)}; Cox hazard ratio GRPO / Dr. MAS "
                  f"{_fmt(c.get('hr', math.nan))} [{_fmt(c.get('hr_low', math.nan))}, {_fmt(c.get('hr_high', math.nan))}]"
                  + (f" ({c['hr_note']})" if c.get("hr_note") else "") + "; "
                  f"{c['events']} collapses in {c['runs']} runs. Power (planned): 0.82 at HR = 3.", "",
                  markdown(_shown(c["medians"]), index=False), ""]
    for title, frame in (("C2 abandonment of an agent (by the horizon)", an.c2),
                         ("C3 persistent elevation (steps 0-39, GRPO / Dr. MAS per twin pair)", an.c3),
                         ("C4 stability frontier (LR50)", an.c4), ("Accuracy over time (Dr. MAS − GRPO, avg@4)", an.accuracy)):
        if len(frame):
            lines += [f"## {title}", "", markdown(frame, index=False), ""]
    if len(an.c4) and an.c4.attrs.get("ratio"):
        r = an.c4.attrs["ratio"]
        lines += [f"LR50 ratio Dr. MAS / GRPO: {_fmt(r[0])} {_interval(r[1], r[2])}"
                  + (" (not identified: both frontiers lie outside the grid on the same side)"
                     if r[1] == 0 and r[2] == math.inf else "") + ".", ""]
    if an.c5:
        lines += ["## C5 the clip dial", ""]
        if len(an.c5.get("updates", [])):
            lines += [markdown(an.c5["updates"], index=False), ""]
        off = an.c5.get("off", {})
        if off:
            lines += [f"Clip off: log-rank one-sided p = {_fmt(off.get('p', math.nan), 3)}, HR {_fmt(off.get('hr', math.nan))} "
                      f"[{_fmt(off.get('hr_low', math.nan))}, {_fmt(off.get('hr_high', math.nan))}]", ""]
        if "interaction" in an.c5:
            inter = an.c5["interaction"]
            lines += ["Estimator x clip interaction (Cox): " + (inter["note"] if "note" in inter else
                      f"HR {_fmt(inter['hr'])} [{_fmt(inter['low'])}, {_fmt(inter['high'])}], p = {_fmt(inter['p'], 3)}"), ""]
    if len(cost := step_seconds(an)):
        lines += ["## Cost", "", f"Step time of the {len(cost)} finished runs (Σ `timing/step` of each run over all its "
                  f"sittings; evaluations and start-up not counted): {cost.sum() / 3600:.1f} h in all, median "
                  f"{cost.median():,.0f} s per run ({cost.min():,.0f}-{cost.max():,.0f} s).", ""]
    lines += ["## Runs", "", markdown(an.events.drop(columns=["agents", "git_commit"]), index=False), ""]
    if problems := problem_lines(an.data):
        lines += ["## Data problems", "", *(f"- {item}" for item in problems), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("results/runs/stability_confirm"))
    parser.add_argument("--out", type=Path, default=Path("results/stability_confirm"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.runs.is_dir():
        logger.error("drmas: %s is not a grid folder (run experiments/grids/stability_confirm.yaml first)", args.runs)
        return 2
    try:
        an = analyze(load_grid(args.runs))
    except (FileNotFoundError, ValueError) as exc:
        logger.error("drmas: %s; nothing was written", exc)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "summary.md", summary_markdown(an, args.runs))
    an.events.to_csv(args.out / "events.csv", index=False)
    for claim, verdict in an.verdicts.items():
        logger.info("%s: %s", claim, verdict)
    return 0


# ------------------------------------------------------------------------------------------ REPORT.md
PAPER_STABLE = "GRPO's per-agent gradient norms spike and the run can collapse; Dr. MAS trains stably (Sec. 5, Figs. 4, 6, 8)"
PAPER_STABLE_HEADLINE = "GRPO unstable, Dr. MAS stable"
CLAIMS = {
    "C1": ("time to collapse: GRPO collapses sooner than Dr. MAS",
           "stratified log-rank test over the 3 levels, one-sided, α = 0.05; Cox hazard ratio GRPO / Dr. MAS with 95 % CI; "
           "Kaplan-Meier medians; power 0.82 at HR = 3 with 6 seeds per cell (docs/stability.md C1)"),
    "C2": ("abandonment of an agent: GRPO stops calling some agent more often",
           "per run, any declared agent's calls per trajectory (10-step mean) below 1/4 of its early level for 20 "
           "steps; Cochran-Mantel-Haenszel over the levels, one-sided, α = 0.05 (docs/stability.md C2)"),
    "C3": ("persistent elevation: GRPO's per-agent pre-clip norm above its Dr. MAS twin's",
           "per twin pair and agent, GRPO / Dr. MAS of the p95 norm over steps 0-39; sign test over pairs, Holm over "
           "agents, α = 0.05 (docs/stability.md C3)"),
    "C4": ("stability frontier: Dr. MAS tolerates a higher learning rate",
           "per estimator LR50 of a logistic fit of collapse on log2(lr), parametric bootstrap CI; reproduced when the "
           "CI of LR50(Dr. MAS) / LR50(GRPO) lies above 1 (docs/stability.md C4)"),
    "C5": ("the clip dial: without clipping, GRPO's larger norm becomes a larger update and an earlier collapse "
           "(descriptive)", "update-norm ratio per twin pair with the clip on and off, log-rank in the "
           "clip-off arm, Cox interaction estimator x clip; underpowered by design (docs/stability.md C5)"),
    "accuracy-confirm": ("accuracy over time: Dr. MAS above GRPO",
                         "Dr. MAS − GRPO of the time-averaged avg@4 per main-arm level, paired bootstrap CI over tasks, "
                         "Wilcoxon over tasks, Holm over the 3 levels (docs/stability.md)"),
}

LABELS = {
    "C1": ("C1", "HR = Cox hazard ratio of collapse (Terms), GRPO / Dr. MAS, stratified by lr (> 1: GRPO collapses "
                 "sooner) with its 95 % CI; p = one-sided stratified log-rank test"),
    "C2": ("C2", "abandonment (Terms); k/n = runs that abandoned an agent out of the finished runs; p = one-sided "
                 "Cochran-Mantel-Haenszel test over the lrs"),
    "C3": ("C3", "ratio = GRPO / Dr. MAS of the p95 pre-clip norm over steps 0-39 of a twin pair (the Dr. MAS run of the "
                 "same lr and seed), median over pairs; k/n above = pairs whose ratio is > 1"),
    "C4": ("C4", "LR50 = the lr at which an estimator's fitted collapse probability crosses 1/2 (the C4 frontier); "
                 "ratio = LR50(Dr. MAS) / LR50(GRPO) with its bootstrap CI; \"below the grid\": more than half of the "
                 "estimator's runs collapsed at the lowest lr tried and every run above it, so the fit separates and "
                 "its LR50 lies below that lr (no point estimate: —; the ratio's CI is then open on that side)"),
    "C5": ("C5", "update ratio = GRPO / Dr. MAS of the norm of the applied parameter update per twin pair, with the "
                 "clip on and off; HR as in C1, in the clip-off arm"),
    "accuracy-confirm": ("C-acc", "auc as in S-acc (Dr. MAS − GRPO of the time-averaged avg@4, pts) per main-arm lr, "
                                  "Holm over the 3 lrs (a secondary measure, not one of C1-C5)"),
}
"""REPORT.md label and gloss of each claim of :data:`CLAIMS` (same keys, same order)."""

def _ours(an: Confirmation, key: str) -> tuple[str, str]:
    """(ours in words, ours in one number) of one claim."""
    if key == "C1":
        c = an.c1
        head = f"HR {_fmt(c['hr'])} [{_fmt(c['hr_low'])}, {_fmt(c['hr_high'])}], p {_fmt(c['p'], 3)}"
        med = c["medians"][c["medians"]["lr"].isna()].set_index("estimator")["median"]
        return (f"{head}; {c['events']} collapses in {c['runs']} runs; median time to collapse GRPO "
                f"{_fmt(med.get(GRPO, math.nan))}, Dr. MAS {_fmt(med.get(DRMAS, math.nan))} steps", head)
    if key == "C2":
        r = an.c2[an.c2["agent"] == "any"].iloc[0]
        per = "; ".join(f"{a.agent} {a.grpo} vs {a.drmas}" for a in an.c2.itertuples() if a.agent != "any")
        head = f"GRPO {r['grpo']}/{r['grpo_n']} vs Dr. MAS {r['drmas']}/{r['drmas_n']} runs, p {_fmt(r['p'], 3)}"
        return f"{head}; per agent (GRPO vs Dr. MAS): {per}", head
    if key == "C3":
        p95 = an.c3[an.c3["stat"] == "p95"]
        per = "; ".join(f"{a.agent} {a.above}/{a.pairs} pairs above, median ratio {_fmt(a.median_ratio)} "
                        f"[{_fmt(a.low)}, {_fmt(a.high)}], Holm p {_fmt(a.p_holm, 3)}" for a in p95.itertuples())
        best = p95.sort_values("p_holm").iloc[0]
        return per, f"{best['agent']}: {best['above']}/{best['pairs']} above, ratio {_fmt(best['median_ratio'])}"
    if key == "C4":
        rows = "; ".join(f"{'GRPO' if r.estimator == GRPO else 'Dr. MAS'} "
                         + (f"{_fmt(r.lr50)} [{_fmt(r.low)}, {_fmt(r.high)}]" if not r.note else r.note)
                         for r in an.c4.itertuples())
        ratio = an.c4.attrs.get("ratio", (math.nan,) * 3)
        head = f"ratio {_fmt(ratio[0])} {_interval(ratio[1], ratio[2])}"
        return f"LR50: {rows}; Dr. MAS / GRPO {head}", head
    if key == "C5":
        up = an.c5.get("updates", pd.DataFrame())
        parts = [f"clip {r.clip}, {r.model}: update ratio {_fmt(r.median_ratio)} ({r.above}/{r.pairs} pairs above)"
                 for r in up.itertuples()] if len(up) else []
        off = an.c5.get("off", {})
        if off:
            parts.append(f"clip off: HR {_fmt(off.get('hr', math.nan))}, p {_fmt(off.get('p', math.nan), 3)}")
        return "; ".join(parts) or "no clip-off runs finished", (parts[-1] if parts else "no data")
    auc = an.accuracy[an.accuracy["measure"] == "auc"]
    per = "; ".join(f"lr {r.lr:g}: {100 * r.diff:+.1f} pts [{100 * r.low:+.1f}, {100 * r.high:+.1f}], Holm p "
                    f"{_fmt(r.p_holm, 3)}" for r in auc.itertuples())
    return per, f"{100 * auc['diff'].min():+.1f} to {100 * auc['diff'].max():+.1f} pts"


def judge(an: Confirmation | None, key: str) -> Judged:
    """One confirmatory claim judged (``an`` None: the round not run)."""
    claim, _ = CLAIMS[key]
    if an is None or key not in an.verdicts:
        state = ("the confirmatory grid has not run" if an is None else
                 f"{an.finished} of {an.total} runs finished, none that this claim reads")
        verdict = NOT_RUN if an is None else f"{incomplete(an.finished, an.total)}: no data yet"
        return Judged(claim, PAPER_STABLE, state, verdict, headline=state, paper_headline=PAPER_STABLE_HEADLINE,
                      design=CONFIRMATORY)
    ours, head = _ours(an, key)
    return Judged(claim, PAPER_STABLE, ours, an.verdicts[key], headline=head, paper_headline=PAPER_STABLE_HEADLINE,
                  figures=("stability_gradnorm_search_confirm",), design=CONFIRMATORY)


def load_optional(path: Path | None) -> Confirmation | None:
    """The round's analysis from its grid folder; None where the folder or its runs do not exist yet."""
    if path is None or not Path(path).is_dir() or not any(p.is_dir() for p in Path(path).iterdir()):
        return None
    return analyze(load_grid(Path(path)))


if __name__ == "__main__":
    raise SystemExit(main())
