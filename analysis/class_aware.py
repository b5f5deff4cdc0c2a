"""Claim (a)'s second rule: Lemma 4.2 with repeated responses, tested as a prediction on the mechanism sweep.

Lemma 4.2 treats every sample as its own gradient. An agent whose samples of a task group repeat one
(prompt, response) has one per-sample gradient z_c per class c of identical samples, so its batch gradient is
Σ_c S_c z_c with S_c = Σ_{i∈c} A_i (docs/theory.md, "Repeated responses"). With orthogonal, equal-norm z_c
the squared grad-norm ratio of a global baseline b over Dr. MAS is the class-aware factor
Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(drmas)², logged per agent and step as ``agent/{k}/class_factor_{b}``
(``drmas.algos.class_factors``). The paper's prediction of the same ratio is √F_k with F_k the Lemma factor
(``lemma_factor``).

For every (level, seed, agent) point of :func:`analysis.mechanism.mechanism_points`, :func:`class_points`
adds ``class_factor`` (mean over the b run's steps of its ``class_factor_{b}``) and the two predictions
``pred_class`` = √class_factor and ``pred_paper`` = √factor; :func:`class_verdict` applies :data:`RULE`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from drmas.algos.catalog import GRPO

from analysis.claims import NOT_PRODUCED, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Judged
from analysis.mechanism import BASELINES, FACTOR_REGIME, MIN_POINTS, REFERENCE, mechanism_points
from analysis.runs import GridData
from analysis.stats import ALPHA, spearman

CALIBRATION = (0.5, 2.0)  # the band the median of measured / predicted must fall in (a factor 2 in the norm)

RULE = (
    "class-aware second rule (analysis/class_aware.py), on the same mechanism-sweep points as the paper's rule: "
    "prediction of the trajectory-GRPO / Dr. MAS grad-norm ratio = √(class-aware factor), the mean over the GRPO "
    "run's steps of agent/{k}/class_factor_trajectory_grpo (classes of identical (prompt, response) pairs, "
    "orthogonal equal-norm class gradients); points whose prediction is not finite (Dr. MAS's class sums all 0) are "
    f"left out and counted. Not run with fewer than {MIN_POINTS} finite points; not produced if no point's "
    f"class-aware factor reaches {FACTOR_REGIME:g}; else reproduced if Spearman rho(√class factor, measured ratio) > 0 "
    f"with p < 0.05 and the median of measured / predicted lies in [{CALIBRATION[0]:g}, {CALIBRATION[1]:g}], not "
    "reproduced otherwise. The paper's √factor is judged by the same rule beside it (its median is the paper "
    "rule's ratio / √factor). The paper's rule tests whether the ratio rises with the per-sample factor; this one "
    "tests whether the ratio is predicted, in rank and in scale, once repeated responses share one gradient")


def class_points(data: GridData) -> pd.DataFrame:
    """:func:`mechanism_points` with ``factor_step0`` (the b run's Lemma factor at step 0), ``class_factor`` (the b run's mean ``class_factor_{b}`` over steps;
    ``class_factor_step0``: at step 0), ``distinct`` (mean ``distinct_share``), ``pred_class`` = √class_factor
    and ``pred_paper`` = √factor. Points of runs that did not log the class-aware metrics get NaN."""
    points = mechanism_points(data)
    usable = data.runs.loc[data.runs["status"] == "done", ["run", "estimator", "seed", "level"]]
    ag = data.agents.merge(usable, on="run").sort_values(["run", "agent", "step"])
    ag["level"] = pd.to_numeric(ag["level"], errors="coerce")
    frames = []
    for b in points["baseline"].unique():
        col = f"class_factor_{b}"
        mine = ag[ag["estimator"] == b]
        if col not in mine:
            continue
        g = mine.groupby(["level", "seed", "agent"])
        frames.append(pd.DataFrame({"factor_step0": g["lemma_factor"].first(), "class_factor": g[col].mean(),
                                    "class_factor_step0": g[col].first(), "distinct": g["distinct_share"].mean()})
                      .reset_index().assign(baseline=b))
    extra = (pd.concat(frames, ignore_index=True) if frames else
             pd.DataFrame(columns=["baseline", "level", "seed", "agent", "factor_step0", "class_factor",
                                   "class_factor_step0", "distinct"]))
    out = points.merge(extra, on=["baseline", "level", "seed", "agent"], how="left")
    with np.errstate(invalid="ignore"):
        out["pred_class"] = np.sqrt(out["class_factor"].astype(float))
        out["pred_paper"] = np.sqrt(out["factor"].astype(float))
    return out


@dataclass
class PredictionFit:
    """One prediction of the grad-norm ratio judged by :data:`RULE`: finite points, left-out points, ρ and p
    (prediction vs measured mean ratio; at step 0 vs the step-0 ratio), median measured / predicted, verdict."""

    prediction: str
    n_points: int
    n_left_out: int
    largest_factor: float
    rho: float
    p: float
    rho_step0: float
    p_step0: float
    median_ratio: float
    verdict: str
    reason: str

    def text(self) -> str:
        return (f"{self.prediction}: rho = {self.rho:.2f} (p = {self.p:.2g}) over {self.n_points} points"
                + (f" ({self.n_left_out} left out: prediction not finite)" if self.n_left_out else "")
                + f", median measured / predicted = {self.median_ratio:.2f}; at step 0 rho = {self.rho_step0:.2f} "
                  f"(p = {self.p_step0:.2g}); by the rule: {self.verdict} ({self.reason})")


def judge_prediction(points: pd.DataFrame, prediction: str, factor: str, step0: str, label: str) -> PredictionFit:
    """:data:`RULE` on column ``prediction`` (√ of column ``factor``; ``step0``: the step-0 factor column)."""
    finite = np.isfinite(points[prediction].astype(float)) & np.isfinite(points["ratio"].astype(float))
    p = points[finite]
    rho, pv = spearman(p[prediction], p["ratio"])
    rho0, pv0 = spearman(np.sqrt(p[step0].astype(float)), p["ratio_step0"])
    median = float(np.median(p["ratio"] / p[prediction])) if len(p) else np.nan
    largest = float(p[factor].max()) if len(p) else np.nan
    if len(p) < MIN_POINTS:
        verdict, reason = NOT_RUN, f"{len(p)} finite points < {MIN_POINTS}"
    elif not largest >= FACTOR_REGIME:
        verdict, reason = NOT_PRODUCED, f"largest factor {largest:.2f} < {FACTOR_REGIME:g}"
    elif not (np.isfinite(rho) and rho > 0 and pv < ALPHA):
        verdict, reason = NOT_REPRODUCED, f"rho = {rho:.2f}, p = {pv:.2g}"
    elif not CALIBRATION[0] <= median <= CALIBRATION[1]:
        verdict, reason = NOT_REPRODUCED, f"rank holds, scale off: median {median:.2f} outside {list(CALIBRATION)}"
    else:
        verdict, reason = REPRODUCED, f"rho = {rho:.2f} > 0 with p = {pv:.2g}, median {median:.2f} in {list(CALIBRATION)}"
    return PredictionFit(label, len(p), int((~finite).sum()), largest, rho, pv, rho0, pv0, median, verdict, reason)


def class_verdict(points: pd.DataFrame, baseline: str = GRPO) -> tuple[PredictionFit, PredictionFit]:
    """(class-aware, paper's) predictions of ``baseline``'s grad-norm ratio over Dr. MAS, judged by :data:`RULE`."""
    p = points[points["baseline"] == baseline]
    return (judge_prediction(p, "pred_class", "class_factor", "class_factor_step0", "class-aware √(class factor)"),
            judge_prediction(p, "pred_paper", "factor", "factor_step0", "paper's √F"))


def claim_lemma_classes(an) -> Judged:
    """Claim (a) by :data:`RULE` (a :class:`analysis.claims.ClaimSpec` judge): the class-aware prediction and
    the paper's, side by side, on the mechanism sweep points ``an.mechanism`` (:func:`class_points`) of the
    report's :class:`analysis.report.Analysis` ``an``."""
    title = "Lemma 4.2 with repeated responses: the gradient-norm ratio predicted by the class-aware factor"
    paper = ("Lemma 4.2 treats each sample as its own gradient: ratio ≈ √F; identical (prompt, response) samples share "
             "one gradient, so their advantages add up first (not in the paper)")
    if "pred_class" not in an.mechanism or not an.mechanism["pred_class"].notna().any():
        return Judged(title, paper, "no mechanism sweep with the class-aware metrics", NOT_RUN)
    parts = []
    for b in BASELINES:
        mine = an.mechanism[an.mechanism["baseline"] == b]
        if len(mine):
            cls, ppr = class_verdict(an.mechanism, b)
            parts.append(f"{b} / Dr. MAS: {cls.text()}; beside it, {ppr.text()}; distinct share per group "
                         f"{mine['distinct'].min():.2f}-{mine['distinct'].max():.2f}")
    verdict = class_verdict(an.mechanism, GRPO)[0].verdict
    return Judged(title, paper, ". ".join(parts), verdict)


__all__ = ["CALIBRATION", "RULE", "REFERENCE", "PredictionFit", "claim_lemma_classes", "class_points", "class_verdict",
           "judge_prediction"]
