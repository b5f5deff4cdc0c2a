"""``python -m analysis.report --runs results/runs/cpu [--out results] [--figures paper_figures]``

Turns a grid directory into the paper's tables (``<out>/tables/``), figures (``<figures>/``) and a one-page
``<out>/REPORT.md``: each claim of the paper with our measurement, the paper's value, a verdict and the rule that
gave it. Every number in the report is computed here from the run directories (the paper's from
``analysis/data/``); a claim whose runs are missing says "not run", one computed on fewer runs than its design
says "incomplete (n of N runs)", and "Data problems" lists every run not used and every record dropped, of every grid
read (docs/reliability.md, "The records rule"). Each claim is one :class:`analysis.claims.ClaimSpec` in
:data:`CLAIMS`: its rule (also in docs/analysis.md), the runs of its design, and its verdict function.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
import yaml

from drmas.io import atomic_write_text

from analysis import figures as figs
from analysis.claims import (FINDING, NEEDS_GPU, NOT_PRODUCED, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Claim, ClaimSpec,
                             Judged)
from analysis.cli import parse_dataclass_args
from analysis.integrity import data_problems_section
from analysis.class_aware import RULE as CLASS_RULE
from analysis.class_aware import claim_lemma_classes, class_points
from analysis.mechanism import FACTOR_REGIME, MIN_POINTS, MechanismVerdict, level_table, mechanism_verdict
from analysis.runs import GridData, GridLoadError, describe_scale, final_evals, load_grid, run_settings
from analysis.stats import N_BOOT, kendall_tau, spearman
from analysis import confirm, stability
from analysis.tables import (ABLATION, ABLATION_ONLY, DATA, HEADLINE_POINTS, PAIRS, PAPER_ABLATION_ORDER, PRICES_YAML,
                             TABLE_OF_TASK, VARIANT, ablation_long, ablation_seeds, ablation_table, accuracy_long,
                             accuracy_table, average_comparison, efficiency_long, efficiency_summary, fmt_ci,
                             fmt_gain, fmt_pts, fmt_ratio, gradnorm_pairs, gradnorm_runs, gradnorm_table,
                             headline_table, load_paper, load_prices, paired_long, paper_benchmark_table,
                             paper_gain_pts, write_table)

logger = logging.getLogger("analysis.report")
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Analysis:
    """Everything the report and the tables need, computed once from a :class:`GridData`."""

    data: GridData
    paper: pd.DataFrame
    claims_paper: dict[str, Any]
    final: pd.DataFrame
    acc: dict[str, pd.DataFrame]
    deltas: dict[str, pd.DataFrame]
    pooled: dict[str, pd.DataFrame]
    ablation: dict[str, pd.DataFrame]
    ablation_extra: dict[str, pd.DataFrame]
    ablation_seeds: dict[str, list[int]]
    gradnorm: pd.DataFrame
    pairs: pd.DataFrame
    efficiency: pd.DataFrame
    efficiency_summary: pd.DataFrame
    hetero_delta: pd.DataFrame
    headline: pd.DataFrame
    scale: dict[str, Any]
    mechanism: pd.DataFrame = field(default_factory=pd.DataFrame)
    """points of the mechanism sweep (:func:`analysis.class_aware.class_points`); empty without a sweep"""
    stability: dict[str, stability.StabilityAnalysis] = field(
        default_factory=lambda: {t: stability.analyze_stability(None, task=t) for t in stability.TASKS})
    """per system (search, math), its stability grid's verdicts (:mod:`analysis.stability`); "not run" without one"""
    confirm: "confirm.Confirmation | None" = None
    """the confirmatory stability round's verdicts (:mod:`analysis.confirm`); None: not run"""
    mechanism_data: GridData | None = None
    """the mechanism sweep's grid (its runs are claim a's design); None without a sweep"""

    def other_grids(self) -> list[GridData]:
        """Every grid the report reads besides the main one: the mechanism sweep, the stability grids, the
        confirmatory round."""
        grids = [self.mechanism_data] + [st.data for st in self.stability.values()]
        grids.append(self.confirm.data if self.confirm is not None else None)
        return [g for g in grids if g is not None]


def analyze(data: GridData, seed: int = 0, n_boot: int = N_BOOT, mechanism: GridData | None = None,
            stability_grids: Sequence[GridData] = ()) -> Analysis:
    """All tables' numbers (bootstrap with ``numpy.random.default_rng(seed)``); ``mechanism``: the sweep's runs;
    ``stability_grids``: stability grids, at most one per system."""
    rng = np.random.default_rng(seed)
    paper = load_paper()
    claims_paper = yaml.safe_load((DATA / "paper_claims.yaml").read_text())
    final = final_evals(data)
    tasks = [t for t in ("math", "search") if t in set(data.runs["task"])] + \
            [t for t in dict.fromkeys(data.runs["task"].dropna()) if t not in ("math", "search")]
    acc, deltas, pooled, abl, abl_extra, abl_seeds = {}, {}, {}, {}, {}, {}
    pooled_pair = {"pooled": ("+".join(p[0] for p in PAIRS.values()), "+".join(p[1] for p in PAIRS.values()))}
    for task in tasks:
        acc[task] = accuracy_long(final, task, rng, n_boot)
        deltas[task] = paired_long(final, task, PAIRS, rng, n_boot)
        pooled[task] = paired_long(final, task, pooled_pair, rng, n_boot)
        settings = set(final.loc[final["task"] == task, "setting"])
        if any(tag in settings for tag in ABLATION_ONLY):
            abl_seeds[task] = ablation_seeds(final, task)
            abl[task] = ablation_long(final, paper, task, rng, n_boot)
            f = final[(final["task"] == task) & final["seed"].isin(abl_seeds[task])]
            pooled_v, drmas_v, grpo_v = VARIANT["pooled_grpo"], VARIANT["drmas"], VARIANT["trajectory_grpo"]
            abl_extra[task] = paired_long(f, task, {"pooled-drmas": (pooled_v.ours, drmas_v.ours),
                                                    "pooled-grpo": (pooled_v.ours, grpo_v.ours)}, rng, n_boot)
    gn = gradnorm_runs(data)
    ref = hetero_reference(data)
    eff = efficiency_long(data, load_prices(), settings=(ref, "hetero_drmas"))
    eff_sum = efficiency_summary(eff, final, rng, n_boot, settings=(ref, "hetero_drmas"))
    # hetero vs homogeneous Dr. MAS, paired (paper Figure 5 compares the two assignments of the search system)
    hetero_delta = paired_long(final, "search", {"hetero": ("hetero_drmas", ref)}, rng, n_boot)
    return Analysis(data=data, paper=paper, claims_paper=claims_paper, final=final, acc=acc, deltas=deltas,
                    pooled=pooled, ablation=abl, ablation_extra=abl_extra, ablation_seeds=abl_seeds, gradnorm=gn,
                    pairs=gradnorm_pairs(gn), efficiency=eff, efficiency_summary=eff_sum, hetero_delta=hetero_delta,
                    headline=headline_table(acc, paper), scale=describe_scale(data),
                    mechanism=class_points(mechanism) if mechanism is not None else pd.DataFrame(),
                    stability=stability_by_task(stability_grids, seed, n_boot), mechanism_data=mechanism)


def stability_by_task(grids: Sequence[GridData], seed: int = 0, n_boot: int = N_BOOT) -> dict[str, stability.StabilityAnalysis]:
    """Each system's stability verdicts: from its grid, or "not run"; two grids of one system are an error."""
    out = {t: stability.analyze_stability(None, task=t) for t in stability.TASKS}
    seen: set[str] = set()
    for grid in grids:
        task = stability.task_of(grid)
        if task in seen:
            raise ValueError(f"two stability grids of the {task} system were given; pass one per system")
        seen.add(task)
        out[task] = stability.analyze_stability(grid, seed=seed, n_boot=n_boot)
    return out


# ------------------------------------------------------------------------------------------ claims
def _pts(mean, low, high) -> str:
    return fmt_ci(mean, low, high, signed=True) + " pts"


def claim_lemma(an: Analysis) -> Judged:
    paper = ("global baseline: E||A z||^2 grows with (σk² + (μk − μ)²)/σ² (Lemma 4.2), so the gradient norm "
             "inflates when the factor does (Prop. 4.3)")
    title = "Lemma 4.2 / Prop. 4.3: gradient-norm inflation under the global baseline"
    p = an.pairs
    main = _main_grid_factors(p)
    if len(an.mechanism):
        v = mechanism_verdict(an.mechanism, "trajectory_grpo")
        text = _mechanism_text(v, an.mechanism)
        pooled = mechanism_verdict(an.mechanism, "pooled_grpo")
        if pooled.n_points:
            text += (f"; Pooled step-level GRPO (the other global baseline): largest mean factor {pooled.factor_max_mean:.2f} "
                     f"(step max {pooled.factor_max_step:.2f}); rho(factor, grad-norm ratio) = {pooled.rho:.2f} (p = "
                     f"{pooled.p:.2g}); rho(factor, E_k[A²] ratio) = {pooled.rho_a2:.2f} (p = {pooled.p_a2:.2g}); within one "
                     f"agent: {_per_agent_text(pooled)}; the same rule would say: {pooled.verdict}")
        return Judged(title, paper, text + "; main grid: " + main, v.verdict,
                      headline=f"rho(factor, grad-norm ratio) = {v.rho:.2f} (p = {v.p:.2g}), {v.n_points} points",
                      paper_headline=LEMMA_HEADLINE, figures=("mechanism",), short=LEMMA_SHORT)
    if p.empty:
        return Judged(title, paper, "no GRPO / Dr. MAS pair", NOT_RUN)
    rho, pv = spearman(p["factor_mean_grpo"], p["ratio_mean"])
    top = p.loc[p["factor_mean_grpo"].idxmax()] if p["factor_mean_grpo"].notna().any() else None
    fmax = float(p["factor_mean_grpo"].max()) if top is not None else np.nan
    ours = (f"{len(p)} (setting, seed, agent) pairs; largest mean factor under GRPO {fmax:.2f} "
            f"({top['task']}/{top['assignment']}/{top['agent']}, step max {top['factor_max_grpo']:.2f})"
            if top is not None else f"{len(p)} pairs; no lemma_factor logged")
    ours += (f"; grad-norm ratio GRPO/Dr. MAS: median {p['ratio_mean'].median():.2f} (mean norm), "
             f"{p['ratio_max'].median():.2f} (max norm); Spearman rho(factor, ratio) = "
             + ("n/a" if not np.isfinite(rho) else f"{rho:.2f} (p = {pv:.2g})"))
    if not np.isfinite(fmax):
        verdict = NOT_RUN
    elif fmax < FACTOR_REGIME:
        verdict = NOT_PRODUCED
    else:
        verdict = REPRODUCED if np.isfinite(rho) and rho > 0 and pv < 0.05 else NOT_REPRODUCED
    return Judged(title, paper, ours, verdict, paper_headline=LEMMA_HEADLINE, figures=GRADNORM_FIGURES, short=LEMMA_SHORT,
                  headline=f"rho(factor, grad-norm ratio) = {rho:.2f} (p = {pv:.2g}), {len(p)} pairs"
                  if np.isfinite(rho) else "")


LEMMA_HEADLINE = "grad-norm ratio rises with the factor (rho > 0)"
LEMMA_SHORT = "grad-norm inflation follows the Lemma factor"
GRADNORM_FIGURES = tuple(f"gradnorm_{t}_{a}" for t in ("search", "math") for a in ("nonsharing", "sharing"))


def _main_grid_factors(p: pd.DataFrame) -> str:
    """The largest mean Lemma factor of a GRPO agent in the main grid, per task (with its step max)."""
    if p.empty or "factor_mean_grpo" not in p or not p["factor_mean_grpo"].notna().any():
        return "no GRPO / Dr. MAS pair with factors"
    parts = []
    for task, g in p.dropna(subset=["factor_mean_grpo"]).groupby("task"):
        top = g.loc[g["factor_mean_grpo"].idxmax()]
        parts.append(f"{task}: largest mean factor under GRPO {top['factor_mean_grpo']:.2f} ({top['assignment']}/"
                     f"{top['agent']}, seed {top['seed']}, step max {top['factor_max_grpo']:.2f}; largest step max "
                     f"{g['factor_max_grpo'].max():.2f}), grad-norm ratio GRPO/Dr. MAS median {g['ratio_mean'].median():.2f}")
    return "; ".join(parts)


def _mechanism_text(v: MechanismVerdict, points: pd.DataFrame) -> str:
    lv = level_table(points[points["baseline"] == v.baseline])
    per_level = ", ".join(f"{level:g}: {g['factor'].max():.2f} / {g.loc[g['factor'].idxmax(), 'ratio']:.2f}"
                          for level, g in lv.groupby("level"))
    return (f"sweep over miss rate {v.levels} x seeds {v.seeds}: {v.n_points} (level, seed, agent) points; largest mean "
            f"factor under trajectory GRPO {v.factor_max_mean:.2f} (step max {v.factor_max_step:.2f}); per level, largest "
            f"agent factor / its grad-norm ratio GRPO/Dr. MAS: {per_level}; Spearman rho(factor, ratio) = {v.rho:.2f} "
            f"(p = {v.p:.2g}); at step 0 (identical rollouts) {v.rho_step0:.2f} (p = {v.p_step0:.2g}); rho(factor, E_k[A²] "
            f"ratio) = {v.rho_a2:.2f} (p = {v.p_a2:.2g}); median ratio / √factor = {v.sqrt_fit:.2f} (Lemma: 1); within "
            f"one agent (descriptive, not the rule): {_per_agent_text(v)}")


def _per_agent_text(v: MechanismVerdict) -> str:
    return ", ".join(f"{agent} rho {rho:.2f} (p = {pv:.2g}, {n} points)" if np.isfinite(rho) else f"{agent} n/a"
                     for agent, (n, rho, pv) in sorted(v.per_agent.items()))


def claim_spikes(an: Analysis) -> Judged:
    p = an.pairs
    title = "Dr. MAS removes the gradient-norm spikes of GRPO"
    paper = str(an.claims_paper.get("gradient", ""))
    if p.empty:
        return Judged(title, paper, "no GRPO / Dr. MAS pair", NOT_RUN)
    sg, sd = int(p["spikes_grpo"].sum()), int(p["spikes_drmas"].sum())
    ng, nd = int(p["nonfinite_grpo"].sum()), int(p["nonfinite_drmas"].sum())
    lower_max = int((p["max_drmas"] < p["max_grpo"]).sum())
    lower_p95 = int((p["p95_drmas"] < p["p95_grpo"]).sum())
    ours = (f"spikes GRPO {sg} vs Dr. MAS {sd}, non-finite {ng} vs {nd} over {len(p)} agent pairs; Dr. MAS lower max "
            f"norm in {lower_max}/{len(p)}, lower p95 in {lower_p95}/{len(p)}; median max norm "
            f"{p['max_grpo'].median():.3g} vs {p['max_drmas'].median():.3g}")
    if sg + ng == 0:
        verdict = NEEDS_GPU
    else:
        verdict = REPRODUCED if (sd + nd < sg + ng and lower_max > len(p) / 2) else NOT_REPRODUCED
    return Judged(title, paper, ours, verdict, headline=f"spikes GRPO {sg} vs Dr. MAS {sd}",
                  paper_headline="GRPO norm > 80, then NaN; Dr. MAS flat", figures=GRADNORM_FIGURES,
                  short="Dr. MAS removes GRPO's grad-norm spikes")


def claim_accuracy(an: Analysis, task: str) -> Judged:
    pp = paper_gain_pts(an.paper, task)
    paper = (f"{fmt_pts(pp['avg'])} avg@16 / {fmt_pts(pp['pass'])} pass@16 (mean Dr. MAS − GRPO of the Average rows "
             f"over the paper's four multi-agent settings, recomputed from Table {TABLE_OF_TASK[task][-1]}; the paper prints "
             f"the relative gain of their sums, tables/headline_gains.md)"
             if task in TABLE_OF_TASK else "")
    title = f"accuracy gain of Dr. MAS over GRPO, {task} (Table {TABLE_OF_TASK.get(task, '?')[-1]} headline)"
    pooled = an.pooled.get(task, pd.DataFrame())
    if pooled.empty:
        return Judged(title, paper, "no GRPO / Dr. MAS pair", NOT_RUN)
    av = pooled[pooled["benchmark"] == "average"].set_index("metric")
    d = an.deltas[task]
    per = []
    for name in PAIRS:
        r = d[(d["pair"] == name) & (d["benchmark"] == "average") & (d["metric"] == "avg")]
        if len(r):
            per.append(f"{name} {_pts(*r[['mean', 'low', 'high']].iloc[0])}")
    k = int(an.acc[task]["k"].max()) if len(an.acc.get(task, [])) else 0
    ours = (f"paired Δ avg@{k} {_pts(*av.loc['avg', ['mean', 'low', 'high']])} (Wilcoxon p = "
            f"{av.loc['avg', 'p_value']:.2g}, {int(av.loc['avg', 'n_pairs'])} run pairs, "
            f"{int(av.loc['avg', 'pairs_positive'])} > 0), pass@{k} {_pts(*av.loc['pass', ['mean', 'low', 'high']])}; "
            + ", ".join(per))
    a = av.loc["avg"]
    verdict = REPRODUCED if a["mean"] > 0 and a["low"] > 0 else NOT_REPRODUCED
    return Judged(title, paper, ours, verdict, figures=(f"train_{task}", f"reward_stats_{task}"),
                  short=f"accuracy gain over GRPO, {task}",
                  headline=f"{_pts(a['mean'], a['low'], a['high'])} avg@{k} (paired)",
                  paper_headline=f"{fmt_pts(pp['avg'])} avg@16" if task in TABLE_OF_TASK else "")


OFFICIAL_ABLATION = ("agent_traj", "traj_agent", "traj_traj")
"""The estimators of the reference code's ablation branch that are no paper column (docs/algorithms.md)."""


def ablation_peaks(an: Analysis, task: str = "search") -> pd.DataFrame:
    """Per Table 3 variant (and the pooled baseline), its runs' peak pre-clip norms on the ablation seeds: one row per
    run with ``peak`` (the largest grad norm any agent logged), ``agent`` (whose) and ``adv_absmax`` (the largest |A|
    it logged, NaN when not logged). From :attr:`Analysis.gradnorm` (the runs' logged norms)."""
    gn = an.gradnorm
    cols = ["variant", "estimator", "run", "seed", "agent", "peak", "adv_absmax"]
    if gn.empty:
        return pd.DataFrame(columns=cols)
    seeds = an.ablation_seeds.get(task, [])
    ag = an.data.agents
    rows = []
    for v in ABLATION:
        g = gn[(gn["task"] == task) & (gn["setting"] == v.ours) & gn["seed"].isin(seeds)]
        for run, r in g.groupby("run", sort=True):
            top = r.loc[r["max"].idxmax()]
            adv = ag.loc[ag["run"] == run, "adv_absmax"] if "adv_absmax" in ag else pd.Series(dtype=float)
            rows.append({"variant": v.label.split(" ")[0], "estimator": v.estimator, "run": run, "seed": int(top["seed"]),
                         "agent": top["agent"], "peak": float(top["max"]),
                         "adv_absmax": float(adv.max()) if adv.notna().any() else np.nan})
    return pd.DataFrame(rows, columns=cols)


def _run_eps(an: Analysis, runs: Sequence[str]) -> float | None:
    """The ε of the advantage denominator the runs were configured with (their settings' ``algo.eps``); None when
    the runs disagree or record none."""
    paths = an.data.runs.set_index("run")["path"]
    seen = set()
    for run in runs:
        seen.add((run_settings(Path(str(paths.get(run, "")))).get("algo") or {}).get("eps"))
    return seen.pop() if len(seen) == 1 and None not in seen else None


def std_only_sentence(an: Analysis, task: str = "search") -> str:
    """The (mu,sigma_k) variant's pre-clip norms in words, against Dr. MAS's peak and the next loudest setting of the
    grid, with their cause and the paper's Table 3 value ("" when either variant has no run). One clause (no
    top-level ``;``): every number is computed from the runs' logged norms, advantages and configs."""
    peaks = ablation_peaks(an, task)
    mixed = peaks[peaks["estimator"] == "drmas_std_only"]
    drmas = peaks[peaks["estimator"] == "drmas"]
    if mixed.empty or drmas.empty:
        return ""
    agents = list(dict.fromkeys(mixed.sort_values("seed")["agent"]))
    where = (f"the {agents[0]} agent's in every seed" if len(agents) == 1 else
             "agents " + ", ".join(f"{r.agent} (seed {r.seed})" for r in mixed.sort_values("seed").itertuples()))
    gn = an.gradnorm
    rest = gn[gn["setting"] != VARIANT["drmas_std_only"].ours].dropna(subset=["max"])
    loudest = ""
    if len(rest):
        nxt = rest.loc[rest["max"].idxmax()]
        loudest = (f", the largest of the whole grid (next: {nxt['setting']} at {nxt['max']:.3g})"
                   if mixed["peak"].max() > nxt["max"] else f" (below {nxt['setting']}'s {nxt['max']:.3g})")
    eps = _run_eps(an, list(mixed["run"]))
    eps_text = f"ε (ε = {eps:g})" if eps is not None else "ε"
    adv = (f" (its logged |A| reaches {mixed['adv_absmax'].max():.3g})" if mixed["adv_absmax"].notna().any() else "")
    p3 = an.paper[(an.paper["table"] == "table3") & (an.paper["benchmark"] == "average")].set_index("setting")
    tag, dr = VARIANT["drmas_std_only"].paper, VARIANT["drmas"].paper
    paper = (f". The paper's Table 3 reports (μ,σk) at {p3.loc[tag, 'avg_at_16']:.1f} avg@16 / "
             f"{p3.loc[tag, 'pass_at_16']:.1f} pass@16, next to Dr. MAS's {p3.loc[dr, 'avg_at_16']:.1f} / "
             f"{p3.loc[dr, 'pass_at_16']:.1f}" if tag in p3.index and dr in p3.index else "")
    seeds = ", ".join(str(x) for x in sorted(mixed["seed"]))
    return (f"pre-clip norm of (μ,σk): per-run peaks {mixed['peak'].min():.3g} to {mixed['peak'].max():.3g} over seeds "
            f"{seeds}, {where}{loudest}, against Dr. MAS's peak {drmas['peak'].max():.3g}. The cause: (μ,σk) divides "
            f"x − μ, μ the task group's trajectory mean, by σk + {eps_text}, so in a group where all of an agent's "
            f"steps score the same, σk = 0 while x − μ ≠ 0 and A = (x − μ)/ε{adv}{paper}")


def claim_ablation(an: Analysis, task: str = "search") -> Judged:
    title = f"Table 3 ordering (μk,σk) > (μ,σk) > (μk,σ) > (μ,σ), {task} non-sharing"
    p3 = an.paper[an.paper["table"] == "table3"]
    paper = ", ".join(f"{s.split(':', 1)[1].split('=')[0]} {a:.1f}" for s, a in zip(p3["setting"], p3["avg_at_16"])) + " avg@16"
    abl = an.ablation.get(task)
    paper_variants = [v.label for v in ABLATION if v.paper is not None]
    if abl is None or abl.loc[abl["variant"].isin(paper_variants), "avg"].isna().any():
        missing = [] if abl is None else list(abl.loc[abl["variant"].isin(paper_variants) & abl["avg"].isna(), "variant"])
        return Judged(title, paper, f"variants missing: {', '.join(missing) or 'all'}", NOT_RUN)
    four = abl[abl["variant"].isin(paper_variants)].sort_values("avg", ascending=False)
    order = list(four["variant"])
    tau = kendall_tau(order, list(PAPER_ABLATION_ORDER))
    short = lambda lab: lab.split(" ")[0]  # noqa: E731
    others = abl[abl["variant"].isin(paper_variants) & (abl["setting"] != VARIANT["trajectory_grpo"].ours)]
    gaps = "; ".join(f"{short(r.variant)} {_pts(r.d_avg, r.d_avg_low, r.d_avg_high)}" for r in others.itertuples())
    official = abl[abl["setting"].isin([v.ours for v in ABLATION if v.estimator in OFFICIAL_ABLATION])]
    off = "; ".join(f"{r.variant.split(' ')[1]} {100 * r.avg:.1f}, Δ vs (mu,sigma) {_pts(r.d_avg, r.d_avg_low, r.d_avg_high)}"
                    for r in official.itertuples())
    ours = (f"order {' > '.join(short(o) + f' {100 * a:.1f}' for o, a in zip(order, four['avg']))} avg@k "
            f"(seeds {an.ablation_seeds.get(task)}); Kendall tau vs paper {tau:.2f}; Δ vs (mu,sigma): {gaps}"
            + (f"; the reference code's ablation estimators (no paper column): {off}" if off else ""))
    if sentence := std_only_sentence(an, task):
        ours += "; " + sentence
    return Judged(title, paper, ours, REPRODUCED if tau == 1 else NOT_REPRODUCED, headline=f"Kendall tau {tau:.2f}",
                  paper_headline="the order (tau = 1)", figures=(f"ablation_{task}",), short="Table 3 order")


def hetero_reference(data: GridData) -> str:
    """The homogeneous assignment the heterogeneous one is compared with: ``homogeneous_drmas`` (every agent
    on the larger model, as the paper's all-Qwen2.5-7B system) when the grid has it, else ``nonsharing_drmas``."""
    return HOMOGENEOUS if HOMOGENEOUS in set(data.runs["setting"].dropna()) else "nonsharing_drmas"


HOMOGENEOUS = "homogeneous_drmas"


def claim_hetero(an: Analysis) -> Judged:
    h = an.claims_paper.get("hetero", {})
    title = "heterogeneous assignment: same accuracy, lower latency and cost (Figure 5, search)"
    p_lat, p_cost = (1 + h[k] if h.get(k) is not None else None for k in ("latency_change", "cost_change"))
    paper = (f"latency {fmt_ratio(p_lat)}, cost {fmt_ratio(p_cost)} (hetero / homogeneous), accuracy "
             f"{h.get('accuracy', '')}")
    s = an.efficiency_summary
    if s.empty or s["setting"].nunique() < 2:
        return Judged(title, paper, "hetero_drmas or nonsharing_drmas not run", NOT_RUN)
    s = s.set_index("setting")
    ref = hetero_reference(an.data)
    ho, ht = s.loc[ref], s.loc["hetero_drmas"]
    lat = ht["generate_s"] / ho["generate_s"]
    cost = ht["cost"] / ho["cost"]
    d = an.hetero_delta
    if d.empty:
        return Judged(title, paper, f"no seed with both hetero_drmas and {hetero_reference(an.data)}", NOT_RUN)
    d = d[(d["benchmark"] == "average")].set_index("metric")
    ours = (f"generation s/step {ht['generate_s']:.2f} vs {ho['generate_s']:.2f} ({fmt_ratio(lat)}), cost/step "
            f"{fmt_ratio(cost)}, tokens/step {ht['tokens']:.0f} vs {ho['tokens']:.0f}; Δ avg@k "
            f"{_pts(*d.loc['avg', ['mean', 'low', 'high']])}, pass@k {_pts(*d.loc['pass', ['mean', 'low', 'high']])} "
            f"({int(ht['seeds'])} seed(s); reference: {ref})")
    if d.loc["avg", "low"] > 0:
        ours += (". Accuracy is higher, not the same: at this scale the smaller model is the better search/answer "
                 "base, so the accuracy part mixes the assignment with base-model quality; the latency and cost parts "
                 "are the comparable ones")
    no_loss = d.loc["avg", "high"] >= 0  # the CI includes 0 or lies above it
    verdict = REPRODUCED if lat < 1 and cost < 1 and no_loss else NOT_REPRODUCED
    return Judged(title, paper, ours, verdict, figures=("hetero_search",), short="heterogeneous assignment",
                  headline=f"latency {fmt_ratio(lat)}, cost {fmt_ratio(cost)}, "
                           f"Δ avg {_pts(*d.loc['avg', ['mean', 'low', 'high']])}",
                  paper_headline=f"latency {fmt_ratio(p_lat)}, cost {fmt_ratio(p_cost)}")


POOLED_ESTIMATORS = ("pooled_grpo", "drmas", "trajectory_grpo")
"""The estimators claim f compares (non-sharing)."""


def claim_pooled(an: Analysis, task: str = "search") -> Judged:
    title = f"extra ablation: pooled step-level (μ,σ) vs agent-wise (μk,σk), {task} non-sharing"
    extra = an.ablation_extra.get(task, pd.DataFrame())
    if extra.empty or "pooled-drmas" not in set(extra["pair"]):
        return Judged(title, "not in the paper", f"{VARIANT['pooled_grpo'].ours} not run", NOT_RUN)
    av = extra[(extra["benchmark"] == "average") & (extra["metric"] == "avg")].set_index("pair")
    parts = [f"Δ avg@k pooled − {name.split('-')[1]} {_pts(*av.loc[name, ['mean', 'low', 'high']])}"
             for name in ("pooled-drmas", "pooled-grpo") if name in av.index]
    gn = an.gradnorm
    sp = []
    for v in (VARIANT["pooled_grpo"], VARIANT["drmas"], VARIANT["trajectory_grpo"]):
        g = gn[(gn["task"] == task) & (gn["setting"] == v.ours) & gn["seed"].isin(an.ablation_seeds.get(task, []))]
        if len(g):
            sp.append(f"{v.label.split(' ')[0] if v.estimator != 'pooled_grpo' else 'pooled'}: {int(g['spikes'].sum())} spikes, "
                      f"max norm {g['max'].max():.3g}")
    if sentence := std_only_sentence(an, task):
        sp.append(sentence)
    return Judged(title, "not in the paper", "; ".join(parts + sp), FINDING, paper_headline="-",
                  figures=(f"ablation_{task}",), short="pooled step-level baseline (extra)")


# ------------------------------------------------------------------------------------------ the runs of each claim
PAIR_SETTINGS = tuple(s for pair in PAIRS.values() for s in pair)
"""The settings of the GRPO / Dr. MAS pairs (claims a without a sweep, b, c)."""


def main_runs(tasks: Sequence[str] | None = None,
              settings: "Sequence[str] | Callable[[Analysis], Sequence[str]] | None" = None) -> Callable[[Analysis], pd.DataFrame]:
    """A claim's design runs in the main grid (:attr:`analysis.claims.ClaimSpec.design_runs`): the rows of its
    ``runs`` frame of these tasks and settings (``settings`` may depend on the analysis), usable or not."""
    def select(an: Analysis) -> pd.DataFrame:
        runs = an.data.runs
        mask = pd.Series(True, index=runs.index)
        if tasks is not None:
            mask &= runs["task"].isin(tasks)
        if settings is not None:
            mask &= runs["setting"].isin(settings(an) if callable(settings) else settings)
        return runs[mask]
    return select


def sweep_runs(an: Analysis) -> pd.DataFrame:
    """Claim a's design runs: every run of the mechanism sweep, or the main grid's pairs without a sweep."""
    return an.mechanism_data.runs if an.mechanism_data is not None else main_runs(settings=PAIR_SETTINGS)(an)


def class_sweep_runs(an: Analysis) -> pd.DataFrame:
    """The class-aware rule's design runs: every run of the mechanism sweep (none without one: "not run")."""
    return an.mechanism_data.runs if an.mechanism_data is not None else an.data.runs.iloc[0:0]


GLOSS_PTS = ("pts = absolute percentage points, Dr. MAS − GRPO of avg@k (Terms); paired = the "
             "difference per (seed, assignment) run pair over the same eval tasks; the paper's number is the same "
             "difference of its Average rows, averaged over its four multi-agent settings (2 models x sharing / "
             "non-sharing)")
STABILITY_LABELS = {
    "b-revisited": ("S-b", "twin = the Dr. MAS run of the same lr and seed; counts = GRPO steps that spike in their own "
                           "history (> 3x the median of the previous 20 steps) and are >= 2x the twin's pre-clip norm at "
                           "that step, against the same count the other way; p_Holm = binomial test, Holm over agents"),
    "g": ("S-g", "collapsed = runs with a collapse (Terms) out of the estimator's runs; frontier = the largest lr at "
                 "which no seed of the estimator collapsed (and no lower lr did)"),
    "accuracy-over-time": ("S-acc", "auc = Dr. MAS − GRPO of the time-averaged avg@k (area under the eval curve / its "
                                    "step span) in pts, paired by seed and task; last = the same at the last evaluation; "
                                    "[low, high] = 95 % bootstrap interval over tasks"),
}
"""REPORT.md label and gloss of each stability claim of the search grid; another system's carry its name (S-b-math)."""


def stability_label(key: str) -> tuple[str, str]:
    """(label, gloss) of a stability claim key (``g``, ``g-math``, ...)."""
    base = next(k for k in sorted(STABILITY_LABELS, key=len, reverse=True) if key == k or key.startswith(k + "-"))
    label, gloss = STABILITY_LABELS[base]
    return label + key[len(base):], gloss


CLAIMS = (
    ClaimSpec("a", judge=claim_lemma, design_runs=sweep_runs, label="a1", gloss=(
        "factor = the Lemma factor (Terms) of an agent under trajectory GRPO, mean over the run's steps; grad-norm "
        "ratio = that agent's mean pre-clip norm under GRPO / under Dr. MAS at the same (miss rate, seed); rho = "
        "Spearman rank correlation over the (miss rate, seed, agent) points; E_k[A²] = the agent's mean squared "
        "advantage"), rule=(
        "decided on the mechanism sweep (trajectory GRPO vs Dr. MAS, same seeds; analysis/mechanism.py): not run with "
        f"fewer than {MIN_POINTS} (level, seed, agent) points; not produced if no agent's mean Lemma factor under GRPO "
        f"reaches {FACTOR_REGIME:g}; else reproduced if the GRPO/Dr. MAS grad-norm ratio rises with the factor "
        "(Spearman rho > 0, p < 0.05), not reproduced otherwise. Without a sweep, the same rule on the main grid's "
        "(setting, seed, agent) pairs")),
    ClaimSpec("a", judge=claim_lemma_classes, rule=CLASS_RULE, design_runs=class_sweep_runs, label="a2", gloss=(
        "class-aware factor (Terms); predicted ratio = √(class-aware factor), the paper's √F with F the Lemma factor; "
        "measured / predicted = the grad-norm ratio of a1 over its prediction; rho as in a1; distinct share = the "
        "share of distinct (prompt, response) pairs in a group")),
    ClaimSpec("b", judge=claim_spikes, design_runs=main_runs(settings=PAIR_SETTINGS), label="b", gloss=(
        "spike (Terms); counts summed over the main grid's GRPO / Dr. MAS agent pairs (same task, assignment, seed, "
        "agent); max norm / p95 = the largest / 95th-percentile pre-clip norm of an agent over the run's steps"), rule=(
        "needs GPU scale if GRPO runs show no spike and no non-finite norm (nothing to remove); else reproduced if "
        "Dr. MAS has fewer spikes + non-finite norms than GRPO and a lower max grad norm in most agent pairs, "
        "not reproduced otherwise")),
    *(ClaimSpec("c", judge=partial(claim_accuracy, task=task), design_runs=main_runs([task], PAIR_SETTINGS),
                label=f"c-{task}", gloss=GLOSS_PTS, rule=(
        "reproduced if the paired Dr. MAS - GRPO difference of avg@k (Average over benchmarks, pooled over sharing, "
        "non-sharing and seeds) is > 0 and its 95 % CI excludes 0; not reproduced otherwise"))
      for task in ("math", "search")),
    ClaimSpec("d", judge=claim_ablation, design_runs=main_runs(["search"], [v.ours for v in ABLATION]), label="d",
              gloss=("avg@k of the Average row per variant, percent (μ, σ: the task group's trajectory statistics; "
                     "μk, σk: agent k's); Kendall tau = rank agreement of our order with the paper's (1 = the same "
                     "order); Δ in pts; pre-clip norm (Terms)"), rule=(
        "reproduced if our avg@k order of the four variants equals the paper's (Kendall tau = 1); the paired "
        "differences to (mu,sigma) show which gaps the CIs resolve")),
    ClaimSpec("e", judge=claim_hetero, design_runs=main_runs(["search"], lambda an: [hetero_reference(an.data), "hetero_drmas"]),
              label="e", gloss=(
        "latency = generation seconds per step, cost = USD per step at analysis/data's prices; × = hetero / "
        "homogeneous (below 1: faster, cheaper); Δ avg = avg@k hetero − homogeneous Dr. MAS, in pts"), rule=(
        "reproduced if hetero has lower generation time and lower cost per step and its paired accuracy difference "
        "to homogeneous Dr. MAS has a 95 % CI that includes 0 or lies above it; not reproduced otherwise")),
    ClaimSpec("f", judge=claim_pooled, design_runs=main_runs(["search"], [VARIANT[e].ours for e in POOLED_ESTIMATORS]),
              label="f", gloss=(
        "pooled = one z-score over every step row of a task group (steps, not trajectories); Δ avg@k in pts; max norm "
        "= the largest pre-clip norm (Terms) any agent of the variant logged on the ablation seeds"), rule=(
        "no verdict (the paper does not run it): paired differences of pooled step-level normalization to "
        "agent-wise and to trajectory GRPO, and its spikes")),
    *(ClaimSpec(key, judge=lambda an, judge=judge, task=task: judge(an.stability[task]), rule=rule,
                label=stability_label(key)[0], gloss=stability_label(key)[1])
      for task in stability.TASKS for key, judge, rule in stability.judges(task)),
    *(ClaimSpec(key, judge=lambda an, key=key: confirm.judge(an.confirm, key), rule=rule,
                label=confirm.LABELS.get(key, (key, ""))[0], gloss=confirm.LABELS.get(key, (key, ""))[1])
      for key, (_, rule) in confirm.CLAIMS.items()),
)
"""The paper's claims in REPORT.md order; each carries its rule, its inputs and its verdict function."""


def build_claims(an: Analysis) -> list[Claim]:
    return [spec.evaluate(an) for spec in CLAIMS]


# ------------------------------------------------------------------------------------------ writing
def write_tables(an: Analysis, out: Path) -> list[Path]:
    """Tables 1-3, their paper counterparts, headline gains, gradient norms and the hetero table under ``out``."""
    paths = []
    for task, acc in an.acc.items():
        stem = f"{TABLE_OF_TASK.get(task, 'table')}_{task}"
        k = int(acc["k"].max()) if len(acc) else 0
        numeric = pd.concat([acc.assign(kind="score"), an.deltas[task].assign(kind="delta")], ignore_index=True)
        paths += write_table(out, stem, [(f"avg@{k}", accuracy_table(acc, an.deltas[task], "avg")),
                                         (f"pass@{k}", accuracy_table(acc, an.deltas[task], "pass"))], numeric,
                             f"{task}: ours (percent, mean over seeds ± 95 % CI half-width); Δ = Dr. MAS − GRPO, paired")
        presets = "/".join(an.scale["tasks"].get(task, {}).get("presets", [])) or "?"
        paths += write_table(out, f"{stem}_average", average_comparison(acc, an.paper, task, f"ours ({presets}, k={k})"),
                             None, f"{task}: Average rows, ours vs the paper's (percent); gain = sum(Dr. MAS) / sum(GRPO) − 1")
        pb = paper_benchmark_table(an.paper, task)
        if len(pb):
            paths += write_table(out, f"{stem}_paper", pb, None, f"{task}: the paper's table (avg@16 / pass@16, percent)")
    head = an.headline
    shown = head.assign(**{c: head[c].map(fmt_pts if c in HEADLINE_POINTS else fmt_gain)
                           for c in head.columns if c != "task"}).set_index("task")
    paths += write_table(out, "headline_gains", shown, head,
                         "Headline gains of Dr. MAS over GRPO: in points (pts: mean Dr. MAS − GRPO of the "
                         "Average rows over the (model, assignment) pairs, REPORT.md's convention) and relative, "
                         "as the paper prints them (sum(Dr. MAS Average) / sum(GRPO Average) − 1)")
    for task, abl in an.ablation.items():
        paths += write_table(out, f"table3_ablation_{task}", ablation_table(abl), abl,
                             f"Normalization ablation, {task} non-sharing (Average, percent; seeds every variant ran)")
    gt = gradnorm_table(an.gradnorm)
    if len(an.gradnorm):  # per (run, agent): the spike count of every run
        atomic_write_text(Path(out) / "gradnorm_runs.csv", an.gradnorm.to_csv(index=False))
        paths.append(Path(out) / "gradnorm_runs.csv")
    paths += write_table(out, "gradnorm", gt.set_index(["task", "setting", "agent"]) if len(gt) else gt,
                         gt if len(gt) else None,
                         "Per-agent pre-clip gradient norm (mean, p95 averaged over seeds; max, spikes, non-finite over "
                         "all seeds) and the Lemma 4.2 factor")
    if len(an.pairs):
        cols = ["task", "assignment", "seed", "agent", "factor_mean_grpo", "mean_grpo", "mean_drmas", "p95_grpo",
                "p95_drmas", "max_grpo", "max_drmas", "spikes_grpo", "spikes_drmas", "nonfinite_grpo",
                "nonfinite_drmas", "ratio_mean", "ratio_max"]
        paths += write_table(out, "gradnorm_pairs", an.pairs[cols].set_index(["task", "assignment", "seed", "agent"]),
                             an.pairs, "GRPO vs Dr. MAS per (task, assignment, seed, agent)")
    if len(an.mechanism):
        lv = level_table(an.mechanism)
        paths += write_table(out, "mechanism", lv.set_index(["baseline", "level", "agent"]), an.mechanism,
                             "Mechanism sweep: per (baseline, miss rate, agent), mean over seeds of the Lemma 4.2 factor "
                             "under the baseline and the grad-norm / E_k[A²] ratios baseline / Dr. MAS (CSV: every point)")
    if len(an.efficiency_summary):
        e = an.efficiency_summary
        shown = pd.DataFrame({
            "setting": e["setting"], "seeds": e["seeds"], "tokens/step": e["tokens"].round(0),
            "cost/step (USD per 1M steps)": (e["cost"] * 1e6).round(1), "generation s/step": e["generate_s"].round(3),
            "rollout s/step": e["rollout_s"].round(3),
            "avg@k": [fmt_ci(*r) for r in e[["avg", "avg_low", "avg_high"]].to_numpy()],
            "pass@k": [fmt_ci(*r) for r in e[["pass", "pass_low", "pass_high"]].to_numpy()]}).set_index("setting")
        per_agent = an.efficiency.groupby(["setting", "agent", "preset", "price"], sort=False)[["tokens", "cost"]].mean()
        paths += write_table(out, "hetero_search", [("per setting", shown), ("per agent (mean over seeds)", per_agent)],
                             an.efficiency, "Heterogeneous vs homogeneous non-sharing Dr. MAS (search)")
    return paths


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(Path(path).resolve(), Path(start).resolve())


def _scale_text(scale: dict[str, Any]) -> str:
    params = (yaml.safe_load(PRICES_YAML.read_text()) or {}).get("parameters_millions", {})
    parts = []
    for task, t in scale["tasks"].items():
        presets = ", ".join(f"{p} ({params[p]:g}M parameters)" if p in params else p for p in t["presets"]) or "?"
        parts.append(f"{task}: {t['runs']} finished runs, presets {presets}, "
                     f"{'/'.join(str(s) for s in t['steps'])} RL steps, seeds {t['seeds']}, benchmarks "
                     f"{', '.join(t['benchmarks'])} ({'/'.join(str(n) for n in t['n_tasks'])} tasks each, "
                     f"k = {'/'.join(str(k) for k in t['k'])} samples)"
                     + (f", {t['hours']:.1f} run-hours" if t["hours"] > 0 else ""))
    status = ", ".join(f"{n} {s}" for s, n in scale["status"].items())
    return (f"Grid `{scale['grid']}`: {scale['n_runs']} runs ({status}). " + "; ".join(parts) + ". "
            "The paper trains 3B-8B Qwen models on DAPO-Math / NQ+HotpotQA for hundreds of steps on 4-8 H100 and "
            "evaluates avg@16 / pass@16 on public benchmarks; here the policies are tiny Qwen2-architecture models "
            "SFT'd from scratch on generated tasks, with k samples per eval task. Verdicts at this scale are "
            "about the mechanism (gradient statistics, the direction of effects), not the paper's absolute numbers.")


TERMS = (
    ("pts", "absolute percentage points of avg@k / pass@k (a difference of two accuracies, e.g. Dr. MAS − GRPO); the "
            "report's one convention for gains, the paper's gains recomputed the same way from paper_tables.csv"),
    ("avg@k / pass@k", "mean success over k samples per eval task / success of any of the k (k = 16 in the paper)"),
    ("±, [low, high]", "95 % bootstrap interval over eval tasks (± its half-width); p = the named test's p-value"),
    ("×", "a ratio of two times or costs (hetero / homogeneous); below 1 is faster or cheaper"),
    ("Lemma factor", "F_k = (σk² + (μk − μ)²)/σ², μ, σ the group's statistics and μk, σk agent k's (the paper's "
                     "Lemma 4.2): how much the global baseline inflates agent k's gradient second moment E‖A·z‖² "
                     "over agent-wise normalization (F_k = 1 under Dr. MAS); logged per agent and step"),
    ("class-aware factor", "Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(Dr. MAS)², S_c the sum of the advantages of a class c of "
                           "identical (prompt, response) samples, which share one gradient: the squared grad-norm "
                           "ratio of baseline b over Dr. MAS when class gradients are orthogonal and of equal norm "
                           "(analysis/class_aware.py); its square root is the predicted ratio"),
    ("grad-norm ratio", "an agent's mean pre-clip norm under a global baseline (GRPO) / under Dr. MAS, same seed and "
                        "setting"),
    ("rho", "Spearman rank correlation (a1, a2: over the sweep's (miss rate, seed, agent) points)"),
    ("pre-clip norm", "L2 norm of one agent's policy-gradient before gradient clipping (agent/{k}/grad_norm, the "
                      "norm the clip then caps)"),
    ("spike", "a step whose pre-clip norm is > 3x the median of the agent's previous 20 steps (at least 5 of them), "
              "or non-finite (drmas/algos/diagnostics.py)"),
    ("twin", "the Dr. MAS run of the same lr and seed as a GRPO run (S-b, C3, C5 compare them step by step)"),
    ("collapse", "S-g: a run's first non-finite norm or skipped step, or its 10-step mean reward <= half its running "
                 "peak for 20 steps, or (search) its 10-step mean Search calls per trajectory < 1/4 of steps 0-9 for "
                 "20 steps; C1-C5: the non-finite and reward clauses plus the abandonment of any agent"),
    ("abandonment", "an agent's 10-step mean calls per trajectory below 1/4 of its early level for 20 steps"),
    ("frontier", "S-g: the largest lr at which no seed of an estimator collapsed (and no lower lr did); C4 (LR50): "
                 "the lr at which its collapse probability crosses 1/2, from a logistic fit of collapse on log2(lr) "
                 "(analysis/confirm.py)"),
    ("HR", "Cox hazard ratio of collapse, GRPO / Dr. MAS, stratified by lr (> 1: GRPO collapses sooner)"),
    ("auc", "time-averaged avg@k: the area under the eval curve / its step span"),
    ("Kendall tau", "rank agreement of our order of the four Table 3 variants with the paper's (1 = the same order)"),
    ("exploratory / confirmatory", "the stability grids (3 seeds, rules that could only say \"not reproduced\") / "
                                   "the confirmatory round (fresh seeds, rules and power written before its runs)"),
    ("incomplete (n of N runs)", "a verdict computed on fewer finished runs than its design holds"),
)
"""The report's Terms section: (term, one line)."""


def terms_section() -> list[str]:
    """REPORT.md's glossary: one line per term of :data:`TERMS`."""
    return ["", "## Terms", "", *(f"- **{term}**: {text}." for term, text in TERMS)]


def report_markdown(an: Analysis, claims: list[Claim], out: Path, tables_dir: Path, figures: list[Path],
                    runs_dir: Path, mechanism_dir: Path | None = None, stability_dirs: Sequence[Path] = ()) -> str:
    """REPORT.md: the verdict table (claim, the paper's number, ours in one number, verdict), the scale, then one
    section per claim (:func:`claim_section`), where the numbers are, and the data problems."""
    theory = next((p for p in (out / "theory" / "summary.md", ROOT / "results" / "theory" / "summary.md") if p.exists()), None)
    pngs = {p.stem: p for p in figures if p.suffix == ".png"}
    lines = ["# Dr. MAS reproduction: claims and verdicts", "",
             f"Generated by `python -m analysis.report --runs {runs_dir}"
             + (f" --mechanism {mechanism_dir}" if mechanism_dir else "")
             + (f" --stability {' '.join(map(str, stability_dirs))}" if stability_dirs else "")
             + (f" --confirm {an.confirm.data.root}" if an.confirm is not None else "") + "`; every number below is computed from the run "
             "directories (the paper's from `analysis/data/`). Gains are absolute percentage points (pts), Dr. MAS − "
             "GRPO unless named, the paper's recomputed the same way; ± is the half-width of a 95 % bootstrap interval "
             "over eval tasks; the terms are defined under [Terms](#terms).", "",
             "The *design* column says which test judged a claim: the main grid's pre-registered rules, the stability "
             "grids (**exploratory**: 3 seeds, a test that could only say \"not reproduced\"), or the confirmatory "
             "round (**confirmatory**: fresh seeds, rules and power statements committed before its runs, "
             "docs/stability.md). Labels: a1-f the main grid (the paper's claims a-f), S-... the exploratory "
             "stability grids (S-b revisits b, S-g is claim g, collapse; -math: the math system), C1-C5 and C-acc "
             "the confirmatory round.", "",
             "| label | claim | design | paper | ours | verdict |", "|---|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.label} | [{c.claim}](#{_anchor(c)}) | {c.design} | {c.paper_headline} | {c.headline} | "
                     f"**{c.verdict}** |".replace("\n", " "))
    lines += terms_section()
    lines += ["", "**Scale.** " + _scale_text(an.scale)]
    for c in claims:
        lines += claim_section(c, pngs, out)
    lines += ["", "## Where the numbers are", "", "Tables (Markdown, LaTeX, CSV) in "
              f"[`{_rel(tables_dir, out)}/`]({_rel(tables_dir, out)}/): "
              + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in sorted(tables_dir.glob('*.md'))) + "."]
    if pngs:
        lines += ["", "Figures: " + ", ".join(f"[{stem}]({_rel(p, out)})" for stem, p in pngs.items()) + "."]
    if theory is not None:
        lines += ["", f"Controlled checks of Lemma 4.2 / Prop. 4.3 (softmax policies and a tiny LM): "
                      f"[{_rel(theory, out)}]({_rel(theory, out)})."]
    else:
        lines += ["", "Controlled checks of Lemma 4.2 / Prop. 4.3: run `python -m analysis.theory` (results/theory/summary.md)."]
    lines += ["", "Verdict rules in full, table and figure definitions: docs/analysis.md."]
    lines += data_problems_section(an.data, an.other_grids())
    return "\n".join(lines) + "\n"


SECTION_FIGURES = 2
"""Figures drawn inline in a claim's section; the rest of its figures are linked."""


def _anchor(c: Claim) -> str:
    """GitHub's anchor of the claim's section heading."""
    heading = f"{c.label or c.key} {c.claim}".lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def claim_section(c: Claim, pngs: dict[str, Path], out: Path) -> list[str]:
    """One claim's REPORT.md section: verdict, rule, the paper's statement, our statistics, its figures."""
    lines = ["", f"## {c.label or c.key} {c.claim}", "", *([f"*Terms:* {c.gloss}.", ""] if c.gloss else []),
             f"**{c.verdict}**: ours {c.headline}; paper {c.paper_headline}.", "",
             f"- **Rule.** {c.rule}", f"- **Paper.** {c.paper}", "- **Ours.**",
             *(f"  - {d}" for d in c.details)]
    shown = [pngs[s] for s in c.figures if s in pngs]
    if shown:
        lines += ["", *(f"![{p.stem}]({_rel(p, out)})" for p in shown[:SECTION_FIGURES])]
        if shown[SECTION_FIGURES:]:
            lines += ["", "More: " + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in shown[SECTION_FIGURES:]) + "."]
    return lines


def summary_text(claims: list[Claim], report: Path) -> str:
    """What the terminal shows after the analysis: one line per claim (key, verdict, ours in one number)."""
    width = max(len(c.verdict) for c in claims) if claims else 0
    key_width = max(len(c.label or c.key) for c in claims) if claims else 0
    rows = [f"  {c.label or c.key:<{key_width}}  {c.verdict:<{width}}  {c.short}: {c.headline}" for c in claims]
    return "\n".join(["claims (verdict, ours in one number):", *rows, f"full report: {report}"])


def make_report(runs: Path, out: Path = Path("results"), figures_dir: Path = Path("paper_figures"), seed: int = 0,
                n_boot: int = N_BOOT, with_figures: bool = True, mechanism: Path | None = None,
                stability_runs: Sequence[Path] = ()) -> Path:
    """Load ``runs`` (and the mechanism sweep's ``mechanism`` and the stability grids' ``stability_runs``
    directories, if given), write tables, figures and
    ``out/REPORT.md``; return the report's path."""
    return write_report(runs, out, figures_dir, seed, n_boot, with_figures, mechanism, stability_runs)[0]


def write_report(runs: Path, out: Path = Path("results"), figures_dir: Path = Path("paper_figures"), seed: int = 0,
                 n_boot: int = N_BOOT, with_figures: bool = True,
                 mechanism: Path | None = None, stability_runs: Sequence[Path] = (),
                 confirm_runs: Path | None = None) -> tuple[Path, list[Claim]]:
    """:func:`make_report`, returning the judged claims too. A given folder that does not exist is refused
    (:class:`analysis.runs.GridLoadError`, one line) before anything is read or written."""
    if missing := stability.missing_paths(runs=runs, mechanism=mechanism, confirm=confirm_runs):
        raise GridLoadError("; ".join(missing) + "; pass the out_dir of a grid, e.g. results/runs/cpu; nothing was written")
    if missing := [f"--stability {p} does not exist" for p in stability_runs if not Path(p).exists()]:
        raise GridLoadError("; ".join(missing) + "; pass the stability grids' out_dirs, e.g. results/runs/stability; "
                            "nothing was written")
    data = load_grid(runs)
    grids = {Path(p): stability.load_optional(p) for p in stability_runs}  # None: the grid was not run ("not run")
    stability_dirs = [p for p, g in grids.items() if g is not None]
    an = analyze(data, seed=seed, n_boot=n_boot, mechanism=load_grid(mechanism) if mechanism else None,
                 stability_grids=[grids[p] for p in stability_dirs])
    an.confirm = confirm.load_optional(confirm_runs)
    tables_dir = Path(out) / "tables"
    write_tables(an, tables_dir)
    fig_paths = []
    if with_figures:
        seeds = next(iter(an.ablation_seeds.values()), None)
        fig_paths = figs.write_figures(data, figures_dir, an.efficiency, an.efficiency_summary, seeds)
        fig_paths += figs.save(figs.fig_mechanism(an.mechanism), figures_dir, "mechanism")
        fig_paths += figs.save(figs.fig_class_aware(an.mechanism), figures_dir, "mechanism_class_aware")
        for st in an.stability.values():
            if st.data is not None:
                fig_paths += figs.save(stability.fig_gradnorm_over_steps(st.data, st.runs, st.in_progress), figures_dir,
                                       stability.figure_stem(st.task))
        if an.confirm is not None:
            main_arm = an.confirm.events[an.confirm.events["arm"] == "main"]
            fig_paths += figs.save(stability.fig_gradnorm_over_steps(an.confirm.data, main_arm), figures_dir,
                                   "stability_gradnorm_search_confirm")
    claims = build_claims(an)
    pd.DataFrame([{"label": c.label or c.key, "key": c.key, "claim": c.claim, "paper": c.paper, "ours": c.ours,
                   "verdict": c.verdict,
                   "headline": c.headline, "rule": c.rule} for c in claims]).to_csv(tables_dir / "claims.csv", index=False)
    path = Path(out) / "REPORT.md"
    atomic_write_text(path, report_markdown(an, claims, Path(out), tables_dir, fig_paths, Path(runs), mechanism,
                                                   stability_dirs))
    logger.info("wrote %s, %d tables in %s, %d figure files in %s", path, len(list(tables_dir.glob("*.md"))),
                tables_dir, len(fig_paths), figures_dir)
    return path, claims


# ------------------------------------------------------------------------------------------ CLI
@dataclass
class Args:
    runs: Path = field(metadata={"help": "grid output directory (holds index.json), e.g. results/runs/cpu"})
    out: Path = field(default=Path("results"), metadata={"help": "folder of REPORT.md and tables/"})
    figures: Path = field(default=Path("paper_figures"), metadata={"help": "folder of the PNG/PDF figures"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap Generator"})
    n_boot: int = field(default=N_BOOT, metadata={"help": "bootstrap replicates per interval"})
    no_figures: bool = field(default=False, metadata={"help": "skip the figures"})
    mechanism: Optional[Path] = field(default=None, metadata={"help": "the mechanism sweep's grid directory, e.g. "
                                                                         "results/runs/mechanism (claim a)"})
    stability: list[Path] = field(default_factory=list, metadata={
        "help": "stability grid directories, one per system, e.g. results/runs/stability results/runs/stability_math "
                "(claims b-revisited, g, accuracy-over-time and their -math forms)"})
    confirm: Optional[Path] = field(default=None, metadata={
        "help": "the confirmatory stability round's grid directory, results/runs/stability_confirm (claims C1-C5, "
                "accuracy-confirm)"})


def parse_args(argv: list[str] | None = None) -> Args:
    return parse_dataclass_args(Args, "python -m analysis.report", "Tables, figures and REPORT.md from a grid directory (docs/analysis.md).", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path, claims = write_report(args.runs, args.out, args.figures, args.seed, args.n_boot, not args.no_figures,
                                    args.mechanism, args.stability, args.confirm)
    except (FileNotFoundError, ValueError) as exc:
        print(f"analysis.report: {exc}", file=sys.stderr)
        return 2
    print(summary_text(claims, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
