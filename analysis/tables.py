"""The paper's tables from run directories: Table 1 (math), Table 2 (search), Table 3 (normalization ablation),
the headline relative gains, the gradient-norm summary and the heterogeneous-assignment cost table.

Numbers are fractions internally and percent in the written tables (as in the paper). Every cell of ours is the
mean over seeds with a 95 % bootstrap interval over eval tasks (:mod:`analysis.stats`), written ``mean ± half-width``
(the CSV keeps mean, low, high). Δ = Dr. MAS − GRPO of the same assignment, paired by seed and task.

Headline gain, the paper's way (docs/paper.md §5): ``sum(Dr. MAS Average) / sum(GRPO Average) - 1`` over the multi-agent
settings {sharing, non-sharing} and, for the paper, its two models. The paper's printed gains (+5.6 % / +4.6 % math,
+15.2 % / +13.1 % search) are reproduced when each Average is the unrounded mean of the per-benchmark values;
summing the printed (rounded) Average rows gives +13.0 % for search pass@16 instead of +13.1 %
(``tests/test_analysis.py::test_paper_headline_gains``). :func:`headline_gain` therefore recomputes the Averages
from the benchmark rows (``source="benchmarks"``, the default).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import yaml

from drmas.algos.catalog import DRMAS, GRPO

from analysis.claims import NOT_RUN
from analysis.formatting import fmt_ci, fmt_gain, fmt_pct
from analysis.run_records import setting_of
from analysis.runs import GridData
from analysis.views import benchmarks_of
from analysis.stats import (N_BOOT, Interval, average_interval, bootstrap_ci, grad_norm_summary, paired_test,
                            task_scores)

logger = logging.getLogger(__name__)

DATA = Path(__file__).resolve().parent / "data"
PAPER_CSV = DATA / "paper_tables.csv"
PRICES_YAML = DATA / "prices.yaml"

SETTINGS = ("single_agent_grpo", "sharing_grpo", "sharing_drmas", "nonsharing_grpo", "nonsharing_drmas")
PAIRS = {"sharing": ("sharing_drmas", "sharing_grpo"), "nonsharing": ("nonsharing_drmas", "nonsharing_grpo")}
METRICS = ("avg", "pass")
TABLE_OF_TASK = {"math": "table1", "search": "table2"}


@dataclass(frozen=True)
class Variant:
    """A row of Table 3, named by its estimator (the ``drmas.algos`` registry key, ``algo.estimator``):
    its label in our tables, our setting tag and the paper's setting name (None: not in the paper)."""

    estimator: str
    label: str
    paper: str | None

    @property
    def ours(self) -> str:
        return setting_of("nonsharing", self.estimator)


ABLATION = (
    Variant(GRPO, "(mu,sigma) = GRPO", "nonsharing:(mu,sigma)=grpo"),
    Variant("drmas_mean_only", "(mu_k,sigma)", "nonsharing:(mu_k,sigma)"),
    Variant("drmas_std_only", "(mu,sigma_k)", "nonsharing:(mu,sigma_k)"),
    Variant(DRMAS, "(mu_k,sigma_k) = Dr. MAS", "nonsharing:(mu_k,sigma_k)=drmas"),
    Variant("pooled_grpo", "pooled step-level (mu,sigma)", None),
    # the reference code's ablation branch (langfengQ/DrMAS@72d1dbc, docs/algorithms.md): the mean from one level,
    # the std from another, both inside each (task, agent) group; none of them is a paper column
    Variant("agent_traj", "official agent_traj (the branch's default)", None),
    Variant("traj_agent", "official traj_agent", None),
    Variant("traj_traj", "official traj_traj", None),
)
"""Table 3's rows in table order; look one up by estimator with :data:`VARIANT`, never by position. A row not in
the paper (``paper`` None) is left out of the tables where the grid did not run it."""
VARIANT = {v.estimator: v for v in ABLATION}
ABLATION_ONLY = tuple(v.ours for v in ABLATION if v.estimator not in (GRPO, DRMAS))
"""Our setting tags of the variants that run only for the ablation (Tables 1-2 use GRPO and Dr. MAS)."""
PAPER_ABLATION_ORDER = ("(mu_k,sigma_k) = Dr. MAS", "(mu,sigma_k)", "(mu_k,sigma)", "(mu,sigma) = GRPO")


# ------------------------------------------------------------------------------------------ paper numbers
def load_paper(path: Path = PAPER_CSV) -> pd.DataFrame:
    """The paper's Tables 1-3 (percent)."""
    return pd.read_csv(path)


def headline_gain(averages: pd.DataFrame) -> dict[str, float]:
    """``sum(Dr. MAS) / sum(GRPO) - 1`` of the Average rows over the multi-agent settings (and models).
    ``averages``: columns setting, avg, pass (any other columns, e.g. model, are summed over). An assignment
    (sharing / non-sharing) whose GRPO or Dr. MAS rows are missing is left out of both sums."""
    out = {}
    for metric in METRICS:
        by = averages.groupby("setting")[metric].sum(min_count=1)
        counts = averages.groupby("setting")[metric].count()
        # an assignment enters when both of its settings have the same number of Average rows (models)
        used = [p for p in PAIRS.values() if counts.get(p[0], 0) == counts.get(p[1], 0) > 0]
        dr = sum(by[p[0]] for p in used)
        gr = sum(by[p[1]] for p in used)
        out[metric] = float(dr / gr - 1) if used and gr > 0 else np.nan
    return out


def headline_gain_pts(averages: pd.DataFrame) -> dict[str, float]:
    """The absolute form of :func:`headline_gain` (REPORT.md's one convention for gains): the mean over the
    (model, assignment) pairs of Dr. MAS − GRPO of the Average rows, as a fraction (0.032 = +3.2 points). The same
    pairs enter as in :func:`headline_gain`."""
    out = {}
    for metric in METRICS:
        by = averages.groupby("setting")[metric].sum(min_count=1)
        counts = averages.groupby("setting")[metric].count()
        used = [p for p in PAIRS.values() if counts.get(p[0], 0) == counts.get(p[1], 0) > 0]
        n = sum(int(counts[p[0]]) for p in used)
        out[metric] = float(sum(by[p[0]] - by[p[1]] for p in used) / n) if n else np.nan
    return out


def paper_gain_pts(paper: pd.DataFrame, task: str, source: str = "benchmarks") -> dict[str, float]:
    """The paper's headline gains of one task in points (:func:`headline_gain_pts`; ``source`` as in
    :func:`paper_averages`)."""
    return headline_gain_pts(paper_averages(paper, task, source))


def paper_averages(paper: pd.DataFrame, task: str, source: str = "benchmarks") -> pd.DataFrame:
    """Average rows of the paper (fractions): per model and setting, recomputed from the benchmark rows
    (``source="benchmarks"``, unrounded) or the printed Average rows (``source="average_rows"``)."""
    t = paper[(paper["task"] == task) & (paper["table"] == TABLE_OF_TASK.get(task, ""))]
    if source == "benchmarks":
        t = t[t["benchmark"] != "average"].groupby(["model", "setting"])[["avg_at_16", "pass_at_16"]].mean()
    elif source == "average_rows":
        t = t[t["benchmark"] == "average"].set_index(["model", "setting"])[["avg_at_16", "pass_at_16"]]
    else:
        raise ValueError(f"source must be 'benchmarks' or 'average_rows', got {source!r}")
    return (t.rename(columns={"avg_at_16": "avg", "pass_at_16": "pass"}) / 100).reset_index()


def paper_gain(paper: pd.DataFrame, task: str, source: str = "benchmarks") -> dict[str, float]:
    """The paper's headline relative gains of one task (see the module docstring for ``source``)."""
    return headline_gain(paper_averages(paper, task, source))


def load_prices(path: Path = PRICES_YAML) -> dict[str, float]:
    """Model preset -> USD per million tokens."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {str(k): float(v) for k, v in data.get("usd_per_million_tokens", {}).items()}


# ------------------------------------------------------------------------------------------ our scores
def score_matrix(final: pd.DataFrame, setting: str, benchmark: str, metric: str,
                 seeds: Sequence[int] | None = None) -> tuple[np.ndarray, list[int]]:
    """``(seeds, tasks)`` per-task scores of one setting and benchmark (rows ordered by seed; ``seeds``
    restricts and orders them). Tasks beyond the shortest run are dropped (same task order per family)."""
    rows = final[(final["setting"] == setting) & (final["benchmark"] == benchmark)].sort_values("seed")
    if seeds is not None:
        rows = rows.set_index("seed").reindex(list(seeds)).dropna(subset=["run"]).reset_index()
    if rows.empty:
        return np.zeros((0, 0)), []
    n = min(len(s) for s in rows["successes"])
    mat = np.stack([task_scores(s[:n], int(k), metric) for s, k in zip(rows["successes"], rows["k"])])
    return mat, [int(s) for s in rows["seed"]]


def _complete_seeds(final: pd.DataFrame, setting: str, benchmarks: Sequence[str]) -> list[int]:
    """Seeds of a setting whose final eval covers every benchmark."""
    rows = final[final["setting"] == setting]
    ok = rows.groupby("seed")["benchmark"].apply(lambda b: set(benchmarks) <= set(b))
    return sorted(int(s) for s in ok[ok].index)


def accuracy_long(final: pd.DataFrame, task: str, rng: np.random.Generator, n_boot: int = N_BOOT,
                  settings: Iterable[str] | None = None, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per (setting, benchmark incl. ``average``, metric): mean over seeds, 95 % CI, n_seeds, k, n_tasks.
    ``seeds``: use only these seeds (Table 3 uses the seeds every variant ran)."""
    f = final[final["task"] == task]
    benches = benchmarks_of(f, task)
    rows = []
    for setting in settings if settings is not None else list(dict.fromkeys(f["setting"])):
        use = _complete_seeds(f, setting, benches)
        if seeds is not None:
            use = [s for s in use if s in set(seeds)]
        if not use:
            continue
        for metric in METRICS:
            mats = []
            for b in benches:
                mat, _ = score_matrix(f, setting, b, metric, use)
                mats.append(mat)
                ci = bootstrap_ci(mat, rng, n_boot)
                rows.append(_acc_row(task, setting, b, metric, ci, len(use), f, b))
            rows.append(_acc_row(task, setting, "average", metric, average_interval(mats, rng, n_boot), len(use), f, None))
    return pd.DataFrame(rows, columns=["task", "setting", "benchmark", "metric", "mean", "low", "high", "n_seeds",
                                       "k", "n_tasks"])


def _acc_row(task, setting, bench, metric, ci: Interval, n_seeds, f, b) -> dict:
    sub = f[f["benchmark"] == b] if b else f
    return {"task": task, "setting": setting, "benchmark": bench, "metric": metric, "mean": ci.point,
            "low": ci.low, "high": ci.high, "n_seeds": n_seeds, "k": int(sub["k"].max()) if len(sub) else 0,
            "n_tasks": int(sub["n_tasks"].max()) if b else int(sub.drop_duplicates("benchmark")["n_tasks"].sum())}


def paired_long(final: pd.DataFrame, task: str, pairs: dict[str, tuple[str, str]], rng: np.random.Generator,
                n_boot: int = N_BOOT) -> pd.DataFrame:
    """Paired Δ = a − b for each named pair ``(a, b)`` of settings, per benchmark and for the Average, over the
    seeds both ran: mean, paired bootstrap CI, Wilcoxon p (pooled over seeds), seeds with Δ > 0. A pair named
    ``pooled`` may list several (a, b) couples joined by ``+`` (stacked as extra seed rows)."""
    f = final[final["task"] == task]
    benches = benchmarks_of(f, task)
    rows = []
    for name, (a, b) in pairs.items():
        couples = list(zip(a.split("+"), b.split("+")))
        seeds = {c: sorted(set(_complete_seeds(f, c[0], benches)) & set(_complete_seeds(f, c[1], benches)))
                 for c in couples}
        if not any(seeds.values()):
            continue
        for metric in METRICS:
            mats_a, mats_b = [], []
            for bench in benches:
                ma = [score_matrix(f, ca, bench, metric, seeds[(ca, cb)])[0] for ca, cb in couples if seeds[(ca, cb)]]
                mb = [score_matrix(f, cb, bench, metric, seeds[(ca, cb)])[0] for ca, cb in couples if seeds[(ca, cb)]]
                n = min(m.shape[1] for m in ma + mb)
                mats_a.append(np.vstack([m[:, :n] for m in ma]))
                mats_b.append(np.vstack([m[:, :n] for m in mb]))
            for bench, xa, xb in [*zip(benches, ([m] for m in mats_a), ([m] for m in mats_b)),
                                  ("average", mats_a, mats_b)]:
                res = paired_test(xa, xb, rng, n_boot)
                rows.append({"task": task, "pair": name, "a": a, "b": b, "benchmark": bench, "metric": metric,
                             "mean": res.diff.point, "low": res.diff.low, "high": res.diff.high,
                             "p_value": res.p_value, "n_pairs": res.n_seeds, "pairs_positive": res.seeds_positive,
                             "n_tasks": res.n_tasks})
    return pd.DataFrame(rows, columns=["task", "pair", "a", "b", "benchmark", "metric", "mean", "low", "high",
                                       "p_value", "n_pairs", "pairs_positive", "n_tasks"])


def ours_averages(acc: pd.DataFrame) -> pd.DataFrame:
    """Our Average rows (setting, avg, pass) for :func:`headline_gain`."""
    a = acc[acc["benchmark"] == "average"].pivot_table(index="setting", columns="metric", values="mean")
    return a.reindex(columns=list(METRICS)).reset_index()


def accuracy_table(acc: pd.DataFrame, deltas: pd.DataFrame, metric: str, settings: Sequence[str] = SETTINGS) -> pd.DataFrame:
    """Formatted table of one metric: rows = benchmarks + Average, columns = settings, then Δ sharing and
    Δ non-sharing (Dr. MAS − GRPO, paired, with Wilcoxon p)."""
    a = acc[acc["metric"] == metric]
    benches = [b for b in dict.fromkeys(a["benchmark"]) if b != "average"] + ["average"]
    out = pd.DataFrame(index=pd.Index(benches, name="benchmark"))
    for s in settings:
        cell = a[a["setting"] == s].set_index("benchmark")
        out[s] = [fmt_ci(*cell.loc[b, ["mean", "low", "high"]]) if b in cell.index else NOT_RUN for b in benches]
    d = deltas[deltas["metric"] == metric] if len(deltas) else deltas
    for name in PAIRS:
        cell = d[d["pair"] == name].set_index("benchmark") if len(d) else pd.DataFrame()
        out[f"Δ {name}"] = [(fmt_ci(*cell.loc[b, ["mean", "low", "high"]], signed=True) + f" (p={cell.loc[b, 'p_value']:.2g})")
                            if b in cell.index else NOT_RUN for b in benches]
    out.index = [("Average" if b == "average" else b) for b in benches]
    out.index.name = "benchmark"
    return out


def average_comparison(acc: pd.DataFrame, paper: pd.DataFrame, task: str, label: str) -> pd.DataFrame:
    """Our Average row next to the paper's Average row of each model (percent), with the headline gain."""
    rows = {}
    a = acc[acc["benchmark"] == "average"]
    ours = {}
    for s in SETTINGS:
        for m in METRICS:
            c = a[(a["setting"] == s) & (a["metric"] == m)]
            ours[f"{s} {m}"] = fmt_ci(*c[["mean", "low", "high"]].iloc[0]) if len(c) else NOT_RUN
    g = headline_gain(ours_averages(acc)) if len(a) else {m: np.nan for m in METRICS}
    rows[label] = {**ours, "gain avg": fmt_gain(g["avg"]), "gain pass": fmt_gain(g["pass"])}
    pav = paper_averages(paper, task)
    for model, p in pav.groupby("model", sort=False):
        p = p.set_index("setting")
        pg = headline_gain(p.reset_index())
        rows[f"paper {model}"] = {**{f"{s} {m}": fmt_pct(p.loc[s, m]) if s in p.index else "—"
                                     for s in SETTINGS for m in METRICS},
                                  "gain avg": fmt_gain(pg["avg"]), "gain pass": fmt_gain(pg["pass"])}
    if len(pav):
        pg = paper_gain(paper, task)
        rows["paper (both models)"] = {**{f"{s} {m}": "" for s in SETTINGS for m in METRICS},
                                       "gain avg": fmt_gain(pg["avg"]), "gain pass": fmt_gain(pg["pass"])}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "source"
    return out


def paper_benchmark_table(paper: pd.DataFrame, task: str) -> pd.DataFrame:
    """The paper's per-benchmark table of a task (percent, avg / pass per model and setting)."""
    t = paper[(paper["task"] == task) & (paper["table"] == TABLE_OF_TASK.get(task, ""))]
    if t.empty:
        return pd.DataFrame()
    t = t.assign(cell=[f"{a:.1f} / {p:.1f}" for a, p in zip(t["avg_at_16"], t["pass_at_16"])])
    out = t.pivot_table(index="benchmark", columns=["model", "setting"], values="cell", aggfunc="first", sort=False)
    cols = [(m, s) for m in dict.fromkeys(t["model"]) for s in SETTINGS if (m, s) in out.columns]
    return out.reindex(columns=pd.MultiIndex.from_tuples(cols)).reindex(list(dict.fromkeys(t["benchmark"])))


HEADLINE_POINTS = ("ours avg pts", "ours pass pts", "paper avg pts", "paper pass pts")
"""Columns of :func:`headline_table` in points (:func:`headline_gain_pts`); the ``rel`` ones are relative gains."""


def headline_table(accs: dict[str, pd.DataFrame], paper: pd.DataFrame) -> pd.DataFrame:
    """Headline gains per task, ours (from our Average rows) and the paper's (recomputed from its CSV), in both
    forms: points (:func:`headline_gain_pts`, REPORT.md's convention; columns :data:`HEADLINE_POINTS`) and the
    relative gain of the sums (:func:`headline_gain`, the form the paper prints)."""
    rows = []
    for task in ("math", "search"):
        acc = accs.get(task)
        ours = ours_averages(acc) if acc is not None and len(acc) else None
        nan = {m: np.nan for m in METRICS}
        pts = headline_gain_pts(ours) if ours is not None else nan
        rel = headline_gain(ours) if ours is not None else nan
        p_pts, p_rel = paper_gain_pts(paper, task), paper_gain(paper, task)
        rows.append({"task": task, "ours avg pts": pts["avg"], "ours pass pts": pts["pass"],
                     "paper avg pts": p_pts["avg"], "paper pass pts": p_pts["pass"],
                     "ours avg rel": rel["avg"], "ours pass rel": rel["pass"], "paper avg rel": p_rel["avg"],
                     "paper pass rel": p_rel["pass"]})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ Table 3
def ablation_seeds(final: pd.DataFrame, task: str) -> list[int]:
    """Seeds that every Table 3 variant that ran has completed (the rows stay paired)."""
    benches = benchmarks_of(final[final["task"] == task], task)
    sets = [set(_complete_seeds(final[final["task"] == task], v.ours, benches)) for v in ABLATION]
    sets = [s for s in sets if s]
    return sorted(set.intersection(*sets)) if sets else []


def ablation_long(final: pd.DataFrame, paper: pd.DataFrame, task: str, rng: np.random.Generator,
                  n_boot: int = N_BOOT) -> pd.DataFrame:
    """Table 3 rows (numeric): ours (Average over benchmarks, common seeds) with CI, paired Δ vs (mu,sigma),
    and the paper's value (Qwen2.5-7B, search non-sharing)."""
    seeds = ablation_seeds(final, task)
    ran = set(final.loc[final["task"] == task, "setting"])
    variants = [v for v in ABLATION if v.paper is not None or v.ours in ran]
    acc = accuracy_long(final, task, rng, n_boot, settings=[v.ours for v in variants], seeds=seeds)
    base = VARIANT[GRPO].ours
    pairs = {v.ours: (v.ours, base) for v in variants if v.ours != base}
    f = final[(final["task"] == task) & final["seed"].isin(seeds)]
    deltas = paired_long(f, task, pairs, rng, n_boot)
    p3 = paper[paper["table"] == "table3"].set_index("setting")
    rows = []
    for v in variants:
        row = {"variant": v.label, "setting": v.ours, "n_seeds": len(seeds)}
        for m in METRICS:
            c = acc[(acc["setting"] == v.ours) & (acc["benchmark"] == "average") & (acc["metric"] == m)]
            row.update({f"{m}": c["mean"].iloc[0] if len(c) else np.nan, f"{m}_low": c["low"].iloc[0] if len(c) else np.nan,
                        f"{m}_high": c["high"].iloc[0] if len(c) else np.nan})
            d = deltas[(deltas["pair"] == v.ours) & (deltas["benchmark"] == "average") & (deltas["metric"] == m)]
            row.update({f"d_{m}": d["mean"].iloc[0] if len(d) else np.nan, f"d_{m}_low": d["low"].iloc[0] if len(d) else np.nan,
                        f"d_{m}_high": d["high"].iloc[0] if len(d) else np.nan})
            col = "avg_at_16" if m == "avg" else "pass_at_16"
            row[f"paper_{m}"] = p3.loc[v.paper, col] / 100 if v.paper in p3.index else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def ablation_table(abl: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=pd.Index(abl["variant"], name="variant"))
    for m in METRICS:
        out[f"ours {m}@k"] = [fmt_ci(r[m], r[f"{m}_low"], r[f"{m}_high"]) for _, r in abl.iterrows()]
        out[f"Δ {m} vs (mu,sigma)"] = [fmt_ci(r[f"d_{m}"], r[f"d_{m}_low"], r[f"d_{m}_high"], signed=True)
                                        if i else "" for i, (_, r) in enumerate(abl.iterrows())]
    for m in METRICS:
        out[f"paper {m}@16"] = [fmt_pct(x) for x in abl[f"paper_{m}"]]
    out["seeds"] = abl["n_seeds"].to_numpy()
    return out


# ------------------------------------------------------------------------------------------ gradient norms
def gradnorm_runs(data: GridData) -> pd.DataFrame:
    """Per (run, agent) gradient-norm summary (:func:`analysis.stats.grad_norm_summary`) with the run tags and
    the mean / max Lemma 4.2 factor of the run's reward statistics."""
    usable = data.usable_runs()["run"]
    ag = data.agents[data.agents["run"].isin(usable)]
    summ = grad_norm_summary(ag)
    if summ.empty:
        return data.tagged(summ.assign(factor_mean=pd.Series(dtype=float), factor_max=pd.Series(dtype=float)))
    if "lemma_factor" in ag:
        fac = ag.groupby(["run", "agent"])["lemma_factor"].agg(factor_mean="mean", factor_max="max").reset_index()
        summ = summ.merge(fac, on=["run", "agent"], how="left")
    else:
        summ = summ.assign(factor_mean=np.nan, factor_max=np.nan)
    return data.tagged(summ)


def gradnorm_pairs(gn: pd.DataFrame) -> pd.DataFrame:
    """GRPO vs Dr. MAS per (task, assignment, seed, agent): grad-norm level (mean, p95, max), spikes, non-finite
    norms, the Lemma 4.2 factor in the GRPO run, and the ratios GRPO / Dr. MAS."""
    cols = ["task", "assignment", "seed", "agent"]
    if gn.empty:
        return pd.DataFrame(columns=cols)
    frames = []
    for assignment, (dr, gr) in PAIRS.items():
        a = gn[gn["setting"] == gr].set_index(cols)
        b = gn[gn["setting"] == dr].set_index(cols)
        j = a.merge(b, left_index=True, right_index=True, suffixes=("_grpo", "_drmas"), how="inner")
        if len(j):
            frames.append(j.reset_index())
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    for q in ("mean", "p95", "max"):
        out[f"ratio_{q}"] = out[f"{q}_grpo"] / out[f"{q}_drmas"]
    return out


def gradnorm_table(gn: pd.DataFrame) -> pd.DataFrame:
    """Per (task, setting, agent): grad-norm mean / p95 / max (averaged over seeds), spikes and non-finite norms
    (summed over seeds), the Lemma 4.2 factor (mean over steps and seeds; max)."""
    if gn.empty:
        return pd.DataFrame()
    g = gn.groupby(["task", "setting", "agent"], sort=False).agg(
        runs=("run", "nunique"), mean=("mean", "mean"), p95=("p95", "mean"), max=("max", "max"),
        spikes=("spikes", "sum"), nonfinite=("nonfinite", "sum"), factor_mean=("factor_mean", "mean"),
        factor_max=("factor_max", "max"))
    return g.reset_index()


# ------------------------------------------------------------------------------------------ heterogeneous
def efficiency_long(data: GridData, prices: dict[str, float], settings: Sequence[str] = ("nonsharing_drmas", "hetero_drmas"),
                    task: str = "search") -> pd.DataFrame:
    """Per (run, agent) of the given settings: preset, price, tokens per step, cost per step (USD, tokens x price
    per million), and the run's generation seconds per step (sum over worker groups of ``timing/generate``)."""
    runs = data.usable_runs()
    runs = runs[(runs["task"] == task) & runs["setting"].isin(settings)]
    if runs.empty or data.agents.empty or "tokens" not in data.agents:
        return pd.DataFrame(columns=["run", "setting", "seed", "agent", "preset", "price", "tokens", "cost",
                                     "generate_s", "rollout_s"])
    ag = data.agents[data.agents["run"].isin(runs["run"])]
    tok = ag.groupby(["run", "agent"])["tokens"].mean().reset_index()
    tok = tok.merge(data.assignment, on=["run", "agent"], how="left")
    missing = sorted(set(tok["preset"].dropna()) - set(prices))
    if missing:
        logger.warning("no price for model preset(s) %s in %s: their cost is NaN", missing, PRICES_YAML)
    tok["price"] = tok["preset"].map(prices)
    tok["cost"] = tok["tokens"] * tok["price"] / 1e6
    st = data.steps[data.steps["run"].isin(runs["run"])]
    gen_cols = [c for c in st.columns if c.startswith("timing/generate/")]
    per_run = pd.DataFrame({"run": st["run"], "generate_s": st[gen_cols].sum(axis=1, min_count=1) if gen_cols else np.nan,
                            "rollout_s": st["timing/rollout"] if "timing/rollout" in st else np.nan})
    per_run = per_run.groupby("run").mean().reset_index()
    out = tok.merge(per_run, on="run", how="left").merge(runs[["run", "setting", "seed"]], on="run")
    return out[["run", "setting", "seed", "agent", "preset", "price", "tokens", "cost", "generate_s", "rollout_s"]]


def efficiency_summary(eff: pd.DataFrame, final: pd.DataFrame, rng: np.random.Generator, n_boot: int = N_BOOT,
                       settings: Sequence[str] = ("nonsharing_drmas", "hetero_drmas"), task: str = "search") -> pd.DataFrame:
    """Per setting (seeds both settings ran): tokens / cost / generation seconds per step and Average accuracy."""
    seeds = None
    for s in settings:
        ss = set(eff.loc[eff["setting"] == s, "seed"])
        seeds = ss if seeds is None else seeds & ss
    seeds = sorted(seeds or [])
    rows = []
    if not seeds:
        return pd.DataFrame(columns=["setting", "seeds", "tokens", "cost", "generate_s", "rollout_s", "avg", "avg_low",
                                     "avg_high", "pass", "pass_low", "pass_high"])
    acc = accuracy_long(final, task, rng, n_boot, settings=list(settings), seeds=seeds)
    for s in settings:
        e = eff[(eff["setting"] == s) & eff["seed"].isin(seeds)]
        per_run = e.groupby("run").agg(tokens=("tokens", "sum"), cost=("cost", "sum"), generate_s=("generate_s", "first"),
                                       rollout_s=("rollout_s", "first"))
        row = {"setting": s, "seeds": len(seeds), **per_run.mean().to_dict()}
        for m in METRICS:
            c = acc[(acc["setting"] == s) & (acc["benchmark"] == "average") & (acc["metric"] == m)]
            row.update({m: c["mean"].iloc[0] if len(c) else np.nan, f"{m}_low": c["low"].iloc[0] if len(c) else np.nan,
                        f"{m}_high": c["high"].iloc[0] if len(c) else np.nan})
        rows.append(row)
    return pd.DataFrame(rows)
