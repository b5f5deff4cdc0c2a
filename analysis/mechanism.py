"""The mechanism sweep (``experiments/grids/mechanism.yaml``): does a global baseline inflate an agent's
gradient in proportion to its Lemma 4.2 factor?

Each (level, seed) of the sweep runs the same SFT'd search system with the same seed under every estimator
of the grid (``trajectory_grpo``, ``pooled_grpo``, ``drmas``); the level is the environment's retrieval-miss
rate, which makes how often each agent acts depend on the outcome (docs/mechanism.md). Step 0 of the runs
of one (level, seed) is the same rollout (same policy, same seed): only the advantages differ.

For every (level, seed, agent) and every global-baseline estimator b, :func:`mechanism_points` pairs the run
of b with the Dr. MAS run and gives

- ``factor``: agent k's mean Lemma 4.2 factor under b's own baseline in the b run (``lemma_factor``, mean
  over steps; ``factor_max``: its largest step),
- ``ratio``: mean pre-clip gradient norm of agent k in the b run / in the Dr. MAS run (``ratio_step0``: at
  step 0 only, where the rollouts are identical),
- ``a2_ratio``: realized E_k[A²] (``adv_m2``) in the b run / in the Dr. MAS run.

The Lemma predicts E‖A z‖² ∝ factor (Δ_k aside), so with per-sample gradients of similar size and weakly
correlated directions the norm ratio grows like √factor; :func:`mechanism_verdict` tests the monotone
relation (Spearman ρ between factor and ratio over the points).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.claims import NOT_PRODUCED, NOT_REPRODUCED, NOT_RUN, REPRODUCED
from analysis.runs import GridData
from analysis.stats import spearman

FACTOR_REGIME = 2.0  # a mean factor from which the predicted second-moment inflation is "large"
MIN_POINTS = 12  # fewest (level, seed, agent) points a verdict rests on
REFERENCE = "drmas"
BASELINES = ("trajectory_grpo", "pooled_grpo")


def _per_run_agent(data: GridData) -> pd.DataFrame:
    """Per (run, agent): mean factor, its step max, mean grad norm, step-0 grad norm, mean adv_m2, with tags."""
    usable = data.runs.loc[data.runs["status"] == "done", "run"]
    ag = data.agents[data.agents["run"].isin(usable)].sort_values(["run", "agent", "step"])
    if ag.empty or "grad_norm" not in ag:
        return pd.DataFrame()
    cols = {c: c for c in ("lemma_factor", "grad_norm", "adv_m2") if c in ag}
    g = ag.groupby(["run", "agent"])
    out = g[list(cols)].mean().rename(columns={"lemma_factor": "factor"})
    out["factor_max"] = g["lemma_factor"].max() if "lemma_factor" in ag else np.nan
    out["grad_norm_step0"] = g["grad_norm"].first()
    out["steps"] = g.size()
    out = out.reset_index().merge(data.runs[["run", "estimator", "seed", "level"]], on="run")
    out["level"] = pd.to_numeric(out["level"], errors="coerce")
    return out


def mechanism_points(data: GridData) -> pd.DataFrame:
    """One row per (baseline, level, seed, agent): factor, factor_max, ratio, ratio_step0, a2_ratio and the
    two runs' grad norms (see the module docstring). Empty when the grid has no Dr. MAS reference runs."""
    per = _per_run_agent(data)
    cols = ["baseline", "level", "seed", "agent", "factor", "factor_max", "ratio", "ratio_step0", "a2_ratio",
            "grad_norm", "grad_norm_ref", "steps"]
    if per.empty or REFERENCE not in set(per["estimator"]):
        return pd.DataFrame(columns=cols)
    key = ["level", "seed", "agent"]
    ref = per[per["estimator"] == REFERENCE].set_index(key)
    frames = []
    for b in BASELINES:
        j = per[per["estimator"] == b].set_index(key).join(ref, suffixes=("", "_ref"), how="inner")
        if j.empty:
            continue
        j = j.reset_index()
        frames.append(pd.DataFrame({
            "baseline": b, "level": j["level"], "seed": j["seed"], "agent": j["agent"], "factor": j["factor"],
            "factor_max": j["factor_max"], "ratio": j["grad_norm"] / j["grad_norm_ref"],
            "ratio_step0": j["grad_norm_step0"] / j["grad_norm_step0_ref"], "a2_ratio": j["adv_m2"] / j["adv_m2_ref"],
            "grad_norm": j["grad_norm"], "grad_norm_ref": j["grad_norm_ref"], "steps": j["steps"]}))
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True).replace([np.inf, -np.inf], np.nan)
    return out.sort_values(["baseline", "level", "seed", "agent"], ignore_index=True)[cols]


@dataclass
class MechanismVerdict:
    """The sweep's answer for one baseline: points, factor range, ρ and p (factor vs ratio, and at step 0),
    the fit to √factor, and the verdict with its reason."""

    baseline: str
    n_points: int
    levels: list[float]
    seeds: list[int]
    factor_max_mean: float
    factor_max_step: float
    rho: float
    p: float
    rho_step0: float
    p_step0: float
    rho_a2: float
    p_a2: float
    sqrt_fit: float  # median of ratio / sqrt(factor): 1 = the Lemma's √factor prediction
    verdict: str
    reason: str
    # agent -> (points, ρ(factor, ratio), p) within one agent: descriptive, not the rule (chosen after the
    # sweep was seen; the agents' gradients differ in scale and structure, docs/mechanism.md)
    per_agent: dict[str, tuple[int, float, float]] = field(default_factory=dict)


def mechanism_verdict(points: pd.DataFrame, baseline: str = "trajectory_grpo") -> MechanismVerdict:
    """Rule: no verdict ("not produced") unless the sweep makes some agent's mean factor reach
    :data:`FACTOR_REGIME` and gives >= :data:`MIN_POINTS` points; then "reproduced" if Spearman ρ(factor,
    ratio) > 0 with p < 0.05, else "not reproduced"."""
    p = points[points["baseline"] == baseline].dropna(subset=["factor", "ratio"])
    rho, pv = spearman(p["factor"], p["ratio"])
    rho0, pv0 = spearman(p["factor"], p["ratio_step0"])
    rho_a2, pv_a2 = spearman(p["factor"], p["a2_ratio"])
    fmax = float(p["factor"].max()) if len(p) else np.nan
    fit = float(np.median(p["ratio"] / np.sqrt(p["factor"].clip(lower=1e-12)))) if len(p) else np.nan
    if len(p) < MIN_POINTS:
        verdict, reason = NOT_RUN, f"{len(p)} points < {MIN_POINTS}"
    elif not fmax >= FACTOR_REGIME:
        verdict, reason = NOT_PRODUCED, f"largest mean factor {fmax:.2f} < {FACTOR_REGIME:g}: no heterogeneity to test"
    elif np.isfinite(rho) and rho > 0 and pv < 0.05:
        verdict, reason = REPRODUCED, f"rho = {rho:.2f} > 0 with p = {pv:.2g} < 0.05"
    else:
        verdict, reason = NOT_REPRODUCED, f"rho = {rho:.2f}, p = {pv:.2g}"
    per_agent = {agent: (len(g), *spearman(g["factor"], g["ratio"])) for agent, g in p.groupby("agent")}
    return MechanismVerdict(baseline, len(p), sorted(p["level"].unique().tolist()), sorted(p["seed"].unique().tolist()),
                            fmax, float(p["factor_max"].max()) if len(p) else np.nan, rho, pv, rho0, pv0, rho_a2, pv_a2,
                            fit, verdict, reason, per_agent)


def level_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per (baseline, level, agent): mean factor, ratio and E_k[A²] ratio over seeds (with the seed count)."""
    if points.empty:
        return pd.DataFrame()
    return points.groupby(["baseline", "level", "agent"]).agg(
        seeds=("seed", "nunique"), factor=("factor", "mean"), factor_max=("factor_max", "max"),
        ratio=("ratio", "mean"), ratio_step0=("ratio_step0", "mean"), a2_ratio=("a2_ratio", "mean")).reset_index()
