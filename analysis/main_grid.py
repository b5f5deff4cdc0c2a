"""The main grid's study (``experiments/grids/cpu.yaml``, docs/analysis.md): the paper's claims a-f with their rules,
Tables 1-3 and the main grid's figures. Claim a is decided on the mechanism sweep when the report is given one
(``--mechanism``: a1 the Lemma factor, a2 the class-aware prediction), on the main grid's GRPO / Dr. MAS pairs
otherwise. Each claim is one :class:`analysis.claims.ClaimSpec` in :data:`CLAIMS`; :data:`STUDY` is this study in
the report's list (:mod:`analysis.report`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import yaml

from drmas.algos.catalog import DRMAS, GRPO
from drmas.io import atomic_write_text

from analysis import figures as figs
from analysis.figures import GRADNORM_FIGURES
from analysis.claims import FINDING, NEEDS_GPU, NOT_REPRODUCED, NOT_RUN, REPRODUCED, ClaimSpec, Judged, Study
from analysis.class_aware import RULE as CLASS_RULE
from analysis.class_aware import claim_lemma_classes, class_points
from analysis.formatting import fmt_ci, fmt_gain, fmt_pts, fmt_ratio, write_table
from analysis.mechanism import FACTOR_REGIME, MIN_POINTS, claim_lemma
from analysis.run_records import run_settings
from analysis.runs import GridData
from analysis.views import describe_scale, final_evals
from analysis.stats import N_BOOT, kendall_tau
from analysis.tables import (ABLATION, ABLATION_ONLY, DATA, HEADLINE_POINTS, PAIRS, PAPER_ABLATION_ORDER,
                             TABLE_OF_TASK, VARIANT, ablation_long, ablation_seeds, ablation_table, accuracy_long,
                             accuracy_table, average_comparison, efficiency_long, efficiency_summary, gradnorm_pairs,
                             gradnorm_runs, gradnorm_table, headline_table, load_paper, load_prices, paired_long,
                             paper_benchmark_table, paper_gain_pts)


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
    mechanism_data: GridData | None = None
    """the mechanism sweep's grid (its runs are claim a's design); None without a sweep"""


def analyze(data: GridData, seed: int = 0, n_boot: int = N_BOOT, mechanism: GridData | None = None) -> Analysis:
    """All tables' numbers (bootstrap with ``numpy.random.default_rng(seed)``); ``mechanism``: the sweep's runs
    (claim a's design)."""
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
            pooled_v, drmas_v, grpo_v = VARIANT["pooled_grpo"], VARIANT[DRMAS], VARIANT[GRPO]
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
                    mechanism_data=mechanism)


# ------------------------------------------------------------------------------------------ claims
def _pts(mean, low, high) -> str:
    return fmt_ci(mean, low, high, signed=True) + " pts"


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
    drmas = peaks[peaks["estimator"] == DRMAS]
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
    tag, dr = VARIANT["drmas_std_only"].paper, VARIANT[DRMAS].paper
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
    others = abl[abl["variant"].isin(paper_variants) & (abl["setting"] != VARIANT[GRPO].ours)]
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


POOLED_ESTIMATORS = ("pooled_grpo", DRMAS, GRPO)
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
    for v in (VARIANT["pooled_grpo"], VARIANT[DRMAS], VARIANT[GRPO]):
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
)
"""The main grid's claims (a-f) in REPORT.md order; each carries its rule, its inputs and its verdict function."""



# ------------------------------------------------------------------------------------------ tables
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


# ------------------------------------------------------------------------------------------ the study
def _figures(an: Analysis, out: Path) -> list[Path]:
    seeds = next(iter(an.ablation_seeds.values()), None)
    return figs.write_figures(an.data, out, an.efficiency, an.efficiency_summary, seeds)


STUDY = Study(
    name="main grid",
    analyze=lambda inputs: analyze(inputs.main, seed=inputs.seed, n_boot=inputs.n_boot,
                                   mechanism=inputs.grids.get("mechanism")),
    claims=CLAIMS, tables=write_tables, figures=_figures)
"""The main grid as a study of the report (:mod:`analysis.report`): claims a-f, Tables 1-3, the paper's figures."""
