"""The exploratory stability grids' measurements (docs/stability.md; the constants are its numbers), from one grid's
frames: the run table with rule (g) per run, the stress dial read off the pilot, the collapse counts with Fisher exact
tests, their power and the frontier, which signal moved first, what trains a run once no trajectory is rewarded, and the
twin spikes of rule (b) revisited. :mod:`analysis.stability` judges the claims on them."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from drmas.algos.catalog import DRMAS, GRPO

from analysis.claims import INCONCLUSIVE, NOT_RUN, REFUTED, SUPPORTED
from analysis.events import EARLY, REWARD_DROP, SEARCH_CALLS, Collapse, collapse_of, finished, search_calls, steps_of
from analysis.runs import GridData
from analysis.stats import ALPHA, holm
from analysis.twins import twin_pairs

PILOT_PERSIST = 10       # M of the pilot's instability rule (the grids': analysis.events.PERSIST)
TWIN_RATIO = 2.0         # a twin spike: at least this many times the twin's norm at the same step
PILOT_BASE_LR = 5.0e-5
PILOT_LEVELS = tuple(PILOT_BASE_LR * 4 ** i for i in range(4))



# ------------------------------------------------------------------------------------------ rule (g)
def run_table(data: GridData) -> pd.DataFrame:
    """One row per run of the grid: estimator, lr, seed, status, steps done, collapse step and reason."""
    rows = []
    for r in data.runs.itertuples():
        st = steps_of(data, r.run)
        c = collapse_of(st) if len(st) else Collapse(None, "")
        rows.append({"run": r.run, "estimator": r.estimator, "lr": float(r.level), "seed": r.seed,
                     "done": r.status == "done", "n_steps": len(st), "collapse_step": c.step,
                     "collapse_reason": c.reason, "collapsed": c.step is not None})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ the dial
def pilot_unstable(steps: pd.DataFrame) -> bool:
    """The pilot's instability rule: rule (g) with M = PILOT_PERSIST, or the mean reward of the last 10
    steps at most REWARD_DROP of the first 10's."""
    s = steps.sort_values("step")
    r = s["reward/mean"].to_numpy(float)
    late_drop = len(r) >= 2 * EARLY and r[-EARLY:].mean() <= REWARD_DROP * r[:EARLY].mean()
    return collapse_of(s, persist=PILOT_PERSIST).step is not None or bool(late_drop)


def dial_levels(unstable: dict[float, bool]) -> tuple[list[float], str]:
    """The grid's learning rates from the pilot's verdict per level (docs/stability.md, "The stress dial")."""
    levels = sorted(unstable)
    bad = [i for i, lr in enumerate(levels) if unstable[lr]]
    if not bad:
        return [levels[0], levels[2], levels[3]], "no pilot level was unstable"
    i = bad[0]
    if i == 0:
        return [levels[0]], "the default learning rate is already unstable"
    if i == 1:
        return [levels[0], 1.0e-4, levels[1]], f"smallest unstable level {levels[1]:g}"
    return [levels[0], levels[i - 1], levels[i]], f"smallest unstable level {levels[i]:g}"


def pilot_summary(pilot: GridData) -> pd.DataFrame:
    rows = []
    for r in pilot.runs.itertuples():
        st = steps_of(pilot, r.run).sort_values("step")
        rew = st["reward/mean"].to_numpy(float)
        c = collapse_of(st, persist=PILOT_PERSIST)
        rows.append({"lr": float(r.level), "steps": len(st), "reward_first10": rew[:EARLY].mean(),
                     "reward_last10": rew[-EARLY:].mean(),
                     "search_calls_first10": search_calls(st).iloc[:EARLY].mean() if SEARCH_CALLS in st else np.nan,
                     "search_calls_last10": search_calls(st).iloc[-EARLY:].mean() if SEARCH_CALLS in st else np.nan,
                     "collapse_step": c.step, "collapse_reason": c.reason, "unstable": pilot_unstable(st)})
    return pd.DataFrame(rows).sort_values("lr").reset_index(drop=True)


def finished_runs(data: GridData) -> pd.DataFrame:
    table = run_table(data)
    return table[finished(data).to_numpy()].reset_index(drop=True)


# -------------------------------------------------------------------------------------- rule (g) tests
def collapse_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (estimator, lr): seeds, collapsed seeds, and per lr the one-sided Fisher exact p (GRPO collapses
    more often than Dr. MAS), plus a pooled row (lr = NaN) over every learning rate."""
    rows = []
    for lr, g in [*runs.groupby("lr"), (np.nan, runs)]:
        counts = {e: (int(g.loc[g["estimator"] == e, "collapsed"].sum()), int((g["estimator"] == e).sum()))
                  for e in (GRPO, DRMAS)}
        (cg, ng), (cd, nd) = counts[GRPO], counts[DRMAS]
        p = float(sps.fisher_exact([[cg, ng - cg], [cd, nd - cd]], alternative="greater").pvalue) if ng and nd else np.nan
        rows.append({"lr": lr, "grpo_collapsed": cg, "grpo_n": ng, "drmas_collapsed": cd, "drmas_n": nd,
                     "fisher_p": p})
    return pd.DataFrame(rows)


POWER_EFFECT = (0.8, 0.2)  # collapse rates GRPO vs Dr. MAS: "GRPO collapses, Dr. MAS is stable"
POWER_NEEDED = 0.8


def fisher_power(n_grpo: int, n_drmas: int, rates: tuple[float, float] = POWER_EFFECT, alpha: float = ALPHA) -> float:
    """Exact power of the one-sided Fisher test with these arm sizes against collapse rates ``rates`` (GRPO,
    Dr. MAS): the probability, summed over every outcome, that it finds p < ``alpha``."""
    if not n_grpo or not n_drmas:
        return 0.0
    pg = sps.binom.pmf(np.arange(n_grpo + 1), n_grpo, rates[0])
    pd_ = sps.binom.pmf(np.arange(n_drmas + 1), n_drmas, rates[1])
    return float(sum(pg[a] * pd_[b] for a in range(n_grpo + 1) for b in range(n_drmas + 1)
                     if sps.fisher_exact([[a, n_grpo - a], [b, n_drmas - b]], alternative="greater").pvalue < alpha))


def frontier(runs: pd.DataFrame) -> dict[str, float | None]:
    """Per estimator, the largest learning rate at which none of its seeds collapsed and every lower level
    held (None: it collapses at the lowest level; only levels with finished runs count)."""
    out: dict[str, float | None] = {}
    for est, g in runs.groupby("estimator"):
        best = None
        for lr, cell in g.groupby("lr"):
            if cell["collapsed"].any():
                break
            best = float(lr)
        out[est] = best
    return out


SIGNALS = ("grad_norm", "control_prob", "search_calls", "entropy")


def moved_first(steps: pd.DataFrame, agents: pd.DataFrame) -> dict[str, int | None]:
    """For one run: the first step at which each signal left its own early range (docs/stability.md)."""
    s = steps.sort_values("step").set_index("step")
    a = agents.sort_values("step")
    out: dict[str, int | None] = {}

    def first(mask: pd.Series) -> int | None:
        mask = mask[mask.index >= EARLY]
        return int(mask.idxmax()) if mask.any() else None

    def per_agent(column: str, test) -> int | None:
        hits = []
        for _, g in a.groupby("agent"):
            if column not in g or g[column].notna().sum() == 0:
                continue
            g = g.set_index("step")
            series = g[column]
            early = series[series.index < EARLY]
            hits.append(first(test(series, early, g)))
        hits = [h for h in hits if h is not None]
        return min(hits) if hits else None

    # a missing value (the agent not called that step) is NaN and moves nothing; a logged non-finite norm is a
    # spike (``spike`` = 1) and moves the norm
    logged_nonfinite = lambda x, g: (g["spike"].fillna(0).astype(bool) if "spike" in g else False) & ~np.isfinite(x)
    out["grad_norm"] = per_agent("grad_norm", lambda x, e, g: (x > 3 * e.median()) | logged_nonfinite(x, g))
    out["control_prob"] = per_agent("control_prob", lambda x, e, g: (x - e.mean()).abs() > 0.2)
    out["entropy"] = per_agent("entropy", lambda x, e, g: (x < 0.5 * e.mean()) | (x > 2 * e.mean()))
    if SEARCH_CALLS in s:
        calls = search_calls(s)
        out["search_calls"] = first(calls < 0.5 * calls.iloc[:EARLY].mean())
    else:
        out["search_calls"] = None
    return out


def first_movers(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the first step of each signal and which moved first (ties joined by '+'); the runs that did
    not collapse (``collapsed`` False) are the control: a signal that leaves its early range there too at the same
    steps does not mark a collapse."""
    rows = []
    for r in runs.itertuples():
        steps = moved_first(steps_of(data, r.run), data.agents[data.agents["run"] == r.run])
        seen = {k: v for k, v in steps.items() if v is not None}
        earliest = min(seen.values()) if seen else None
        rows.append({"run": r.run, "estimator": r.estimator, "lr": r.lr, "seed": r.seed, "collapsed": r.collapsed,
                     "collapse_step": r.collapse_step, "collapse_reason": r.collapse_reason,
                     **{f"first_{k}": v for k, v in steps.items()},
                     "moved_first": "+".join(k for k in SIGNALS if seen.get(k) == earliest) if seen else "never"})
    return pd.DataFrame(rows)


def zero_reward_signal(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """What still trains a run once no trajectory is rewarded (a finding, no verdict): per (estimator, lr), the
    share of steps whose training reward is 0, and over those steps the mean advantage second moment per agent
    (``agent/{k}/adv_m2``) and the mean step score. With every reward 0 the scores differ only by the invalid-action
    penalty, and both estimators divide by a std: trajectory GRPO by the group's, Dr. MAS by each agent's, so a
    penalty of 0.01 can become an advantage of order 1 (docs/stability.md)."""
    if runs.empty or "adv_m2" not in data.agents:
        return pd.DataFrame()
    steps = data.steps[data.steps["run"].isin(runs["run"])].reindex(columns=["run", "step", "reward/mean", "score/mean"])
    zero = steps[steps["reward/mean"] == 0]
    ag = data.agents.merge(zero[["run", "step"]], on=["run", "step"])
    per_run = pd.DataFrame({"zero_share": steps.groupby("run")["reward/mean"].apply(lambda r: float((r == 0).mean())),
                            "score_at_zero": zero.groupby("run")["score/mean"].mean()})
    m2 = ag.pivot_table(index="run", columns="agent", values="adv_m2", aggfunc="mean").add_prefix("adv_m2_")
    per_run = per_run.join(m2).join(runs.set_index("run")[["estimator", "lr"]])
    return per_run.groupby(["estimator", "lr"]).mean().reset_index()


# ------------------------------------------------------------------------------- rule (b) revisited
def twin_spikes(data: GridData, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (lr, seed, agent) with both twins finished: GRPO's twin spikes (spike in its own history and
    >= TWIN_RATIO x the Dr. MAS norm at the same step) and Dr. MAS's (the same the other way)."""
    ag = data.agents[["run", "step", "agent", "grad_norm", "spike"]]
    rows = []
    for lr, seed, grpo_run, drmas_run in twin_pairs(runs):
        g = ag[ag["run"] == grpo_run]
        d = ag[ag["run"] == drmas_run]
        both = g.merge(d, on=["step", "agent"], suffixes=("_g", "_d"))
        for agent, b in both.groupby("agent"):
            ng, nd = b["grad_norm_g"].to_numpy(float), b["grad_norm_d"].to_numpy(float)
            # a missing norm (NaN: the agent not called) is no update: never a spike (its run logged no spike
            # flag) and never "far above" (NaN compares False); a logged inf is far above a finite twin
            with np.errstate(invalid="ignore", divide="ignore"):
                g_far = (np.isposinf(ng) & np.isfinite(nd)) | (ng >= TWIN_RATIO * nd)
                d_far = (np.isposinf(nd) & np.isfinite(ng)) | (nd >= TWIN_RATIO * ng)
            rows.append({"lr": lr, "seed": seed, "agent": agent, "steps": int((np.isfinite(ng) & np.isfinite(nd)).sum()),
                         "grpo": int((b["spike_g"].fillna(0).astype(bool).to_numpy() & g_far).sum()),
                         "drmas": int((b["spike_d"].fillna(0).astype(bool).to_numpy() & d_far).sum())})
    return pd.DataFrame(rows, columns=["lr", "seed", "agent", "steps", "grpo", "drmas"])


def spike_verdict(spikes: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """Per agent G, D, the two-sided binomial p of G ~ Bin(G + D, 1/2) and its Holm-adjusted value; the
    verdict of docs/stability.md (supported / refuted / inconclusive)."""
    per = spikes.groupby("agent")[["grpo", "drmas"]].sum().reset_index()
    if per.empty:
        return NOT_RUN, per
    per["p"] = [float(sps.binomtest(int(g), int(g + d), 0.5).pvalue) if g + d else 1.0
                for g, d in zip(per["grpo"], per["drmas"])]
    per["p_holm"] = holm(per["p"].to_numpy())
    sig = per["p_holm"] < ALPHA
    grpo_more, drmas_more = (sig & (per["grpo"] > per["drmas"])).any(), (sig & (per["drmas"] > per["grpo"])).any()
    verdict = (SUPPORTED if grpo_more and not drmas_more else REFUTED if drmas_more and not grpo_more
               else INCONCLUSIVE)
    return verdict, per
