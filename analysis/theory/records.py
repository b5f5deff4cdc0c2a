"""One record per (study, setting, agent, normalization): the prediction of Lemma 4.2 against the
Monte Carlo measurement, plus the in-sample identity check."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from analysis.theory.lemma import NORMALIZATION, LemmaTerms

REQUIRED_KEYS = ("study", "setting", "agent", "normalization", "factor", "score_m2", "delta",
                 "m2_measured", "m2_predicted", "rel_error")


@dataclass(frozen=True)
class Prediction:
    """The right-hand side of Lemma 4.2 for every agent (arrays of length n_agents) and where it comes
    from: ``"population"`` (closed form from the known distributions) or ``"out_of_sample"`` (estimated
    on a calibration batch that the measurement does not use)."""

    source: str
    score_m2: np.ndarray
    factor: np.ndarray
    delta: np.ndarray
    se: np.ndarray | None = None  # standard error of score_m2 * factor + delta (None: exact)

    @classmethod
    def from_terms(cls, terms: LemmaTerms) -> "Prediction":
        """Prediction from a calibration sample; its error is that sample's m2 error (the identity is exact)."""
        return cls("out_of_sample", terms.score_m2, terms.factor, terms.delta, terms.m2_se)


@dataclass(frozen=True)
class GradStats:
    """Per-agent norm of the batch gradient sum_y A_y z_y / |Y_k in batch| over the measured batches."""

    grad_sq: np.ndarray  # mean over batches of ||g_k||^2
    grad_norm: np.ndarray  # mean over batches of ||g_k||
    batch_groups: int


@dataclass(frozen=True)
class Record:
    """A row of ``lemma42.json``.

    ``factor``, ``score_m2``, ``delta`` are the prediction's inputs (source in ``prediction``),
    ``m2_predicted = score_m2 * factor + delta``, ``rel_error = |m2_measured - m2_predicted| / m2_measured``,
    ``rel_error_se`` = standard error of that difference / m2_measured (measurement and calibration noise).
    The ``*_emp`` fields are the same terms on the measured sample itself, where the identity is exact
    (``identity_residual`` = its relative gap, float rounding only); ``delta_rel = delta_emp /
    (score_m2_emp * factor_emp)`` is Delta_k relative to the main term (``delta_rel_se``: its jackknife
    standard error over task groups). ``factor_global`` is the global
    factor of the same agent and samples (the x-axis of the inflation curves for both normalizations).
    ``offset`` = (mu_k - mu) / sigma and ``spread`` = sigma_k / sigma are population values where known.
    """

    study: str
    setting: str
    agent: str
    normalization: str
    estimator: str
    prediction: str
    factor: float
    score_m2: float
    delta: float
    m2_measured: float
    m2_predicted: float
    rel_error: float
    m2_se: float
    rel_error_se: float
    factor_global: float
    factor_emp: float
    score_m2_emp: float
    delta_emp: float
    delta_rel: float
    delta_rel_se: float
    identity_residual: float
    degenerate: float
    n_groups: int
    n_samples: int
    grad_sq: float
    grad_norm: float
    batch_groups: int
    offset: float | None = None
    spread: float | None = None


def make_records(study: str, setting: str, agents: Sequence[str], measured: Mapping[str, LemmaTerms],
                 predicted: Mapping[str, Prediction], grads: Mapping[str, GradStats],
                 offset: Sequence[float] | None = None, spread: Sequence[float] | None = None) -> list[Record]:
    """Records for every estimator in ``measured`` and every agent. ``factor_global`` is taken from the
    first global estimator of ``predicted`` (dict order)."""
    global_est = next(e for e in predicted if NORMALIZATION[e] == "global")
    out = []
    for est, t in measured.items():
        p, g = predicted[est], grads[est]
        for k, name in enumerate(agents):
            m2_pred = float(p.score_m2[k] * p.factor[k] + p.delta[k])
            pred_se = 0.0 if p.se is None else float(p.se[k])
            main = t.score_m2[k] * t.factor[k]
            out.append(Record(
                study=study, setting=setting, agent=name, normalization=NORMALIZATION[est], estimator=est,
                prediction=p.source, factor=float(p.factor[k]), score_m2=float(p.score_m2[k]),
                delta=float(p.delta[k]), m2_measured=float(t.m2[k]), m2_predicted=m2_pred,
                rel_error=float(abs(t.m2[k] - m2_pred) / t.m2[k]), m2_se=float(t.m2_se[k]),
                rel_error_se=float(np.hypot(t.m2_se[k], pred_se) / t.m2[k]),
                factor_global=float(predicted[global_est].factor[k]), factor_emp=float(t.factor[k]),
                score_m2_emp=float(t.score_m2[k]), delta_emp=float(t.delta[k]),
                delta_rel=float(t.delta[k] / main) if main > 0 else float("nan"),
                delta_rel_se=float(t.delta_se[k] / main) if main > 0 else float("nan"),
                identity_residual=float(t.identity_residual[k]), degenerate=float(t.degenerate[k]),
                n_groups=t.n_groups, n_samples=int(t.n[k]), grad_sq=float(g.grad_sq[k]),
                grad_norm=float(g.grad_norm[k]), batch_groups=g.batch_groups,
                offset=None if offset is None else float(offset[k]),
                spread=None if spread is None else float(spread[k]),
            ))
    return out
