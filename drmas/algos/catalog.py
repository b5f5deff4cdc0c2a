"""The advantage estimators' catalogue: their names, the module that implements each, how the suite speaks of
them, and the statistical conventions they share. Torch-free, so that validating a config (``algo.estimator``,
``algo.ddof`` ...) reads this catalogue and imports no implementation; :mod:`drmas.algos.advantages` registers
the functions under these names."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from drmas.registry import Registry

Singleton = Literal["raw", "zero"]
Ddof = Literal[0, 1]


@dataclass(frozen=True)
class Conventions:
    """The statistical conventions of every estimator; the defaults are the reference code's and the one
    place they are written (``algo.*`` in the run config and :func:`compute_advantages` default to them)."""

    ddof: Ddof = 1
    """Delta degrees of freedom of the std: 1 = unbiased (the reference, ``torch.std``), 0 = population."""
    eps: float = 1e-6
    """Added to the std in the denominator."""
    singleton: Singleton = "raw"
    """A group of one sample: ``raw`` = mean 0, std 1 (advantage = its score / (1 + eps)); ``zero`` = 0."""
    scale_by_std: bool = True
    """Divide by the std; False = mean-only (Dr. GRPO style), for every estimator."""

    def __post_init__(self) -> None:
        if self.ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 (population std) or 1 (unbiased, reference), got {self.ddof!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        if self.singleton not in ("raw", "zero"):
            raise ValueError(f"singleton must be 'raw' (mean 0, std 1) or 'zero' (advantage 0), got {self.singleton!r}")


DEFAULT = Conventions()


@dataclass(frozen=True)
class EstimatorTerms:
    """How the suite speaks of one estimator: its baseline's family and its spelling in the paper's tables."""

    baseline: Literal["global", "agent-wise", "mixed", "leave-one-out", "official branch"]
    """global: one (μ, σ) per task group for every agent (the paper's "vanilla GRPO", whose inflation Lemma 4.2
    bounds); agent-wise: each agent's own (μk, σk) (Dr. MAS, Eq. 5); mixed: one statistic global, one agent-wise
    (Table 3); leave-one-out: RLOO baselines; official branch: the reference code's ablation switch."""
    setting: str | None = None
    """The estimator's part of a setting tag (``nonsharing_drmas``, ``nonsharing:(mu_k,sigma)``): the spelling
    of analysis/data/paper_tables.csv. ``None``: no paper column (its registry key is used)."""
    label: str | None = None
    """The estimator's name in prose, figures and reports (``GRPO``, ``Dr. MAS``); ``None``: its registry key."""


REFERENCE_ABLATIONS: tuple[str, ...] = tuple(f"{mean}_{std}{suffix}" for mean in ("agent", "traj")
                                             for std in ("agent", "traj") for suffix in ("", "_uid"))
"""The official code's ablation branch: mean level, std level, and ``_uid`` when grouped by task only."""

GRPO = "trajectory_grpo"
"""The paper's baseline, vanilla GRPO (Eq. 2, as the reference code implements it)."""
DRMAS = "drmas"
"""The paper's method, Dr. MAS (Eq. 5)."""

ESTIMATOR_TERMS: dict[str, EstimatorTerms] = {
    GRPO: EstimatorTerms("global", "grpo", "GRPO"),
    "pooled_grpo": EstimatorTerms("global", "pooled_step"),
    DRMAS: EstimatorTerms("agent-wise", "drmas", "Dr. MAS"),
    "drmas_mean_only": EstimatorTerms("mixed", "(mu_k,sigma)"),  # Table 3
    "drmas_std_only": EstimatorTerms("mixed", "(mu,sigma_k)"),  # Table 3
    **{name: EstimatorTerms("official branch") for name in REFERENCE_ABLATIONS},
    "rloo": EstimatorTerms("leave-one-out"),
    "rloo_agent": EstimatorTerms("leave-one-out"),
}
"""The one declaration of the built-in estimators and their vocabulary, by registry key. A plug-in estimator
without an entry has no family and is spelled by its key."""


def estimator_label(name: str) -> str:
    """The estimator's name in prose (:attr:`EstimatorTerms.label`), or its registry key without one."""
    terms = ESTIMATOR_TERMS.get(name)
    return terms.label if terms is not None and terms.label else name


GLOBAL_BASELINES: tuple[str, ...] = tuple(k for k, t in ESTIMATOR_TERMS.items() if t.baseline == "global")
"""The global baselines (``trajectory_grpo``, ``pooled_grpo``): every run logs each agent's Lemma 4.2 factor and
class-aware factor under each of them (``agent/{k}/lemma_factor_{b}``), whatever estimator it trains with."""

ESTIMATORS: Registry = Registry("advantage estimator", builtins=dict.fromkeys(ESTIMATOR_TERMS, "drmas.algos.advantages"))
"""Estimator name -> function (:data:`drmas.algos.advantages.EstimatorFn`); the built-ins are imported on first use."""

register_estimator = ESTIMATORS.register  # decorator: @register_estimator("name"); duplicate names are rejected
