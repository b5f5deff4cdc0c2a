"""Algorithm core (torch, numpy, pandas only).

- :func:`compute_advantages` and the estimator registry (paper Eqs. 2 and 5, Table 3 ablations);
- :func:`policy_loss` (PPO clip, Eq. 3) with loss aggregation, k3 KL and entropy;
- gradient diagnostics: per-model and per-agent gradient norms, the spike statistic.

The names below are imported from their modules on first access (PEP 562), so that importing the torch-free
catalogue :mod:`drmas.algos.catalog` (what config validation reads) does not import torch.
"""
from __future__ import annotations

from drmas.lazy import lazy_exports

_HOMES: dict[str, tuple[str, ...]] = {
    "drmas.algos.catalog": ("ESTIMATOR_TERMS", "ESTIMATORS", "GLOBAL_BASELINES", "EstimatorTerms", "Conventions",
                            "register_estimator", "estimator_label"),
    "drmas.algos.advantages": ("AdvantageResult", "compute_advantages", "segment_stats"),
    "drmas.algos.diagnostics": ("AgentGradNorms", "ControlTokens", "SpikeDetector", "SpikeRule", "class_factors",
                                "control_positions", "class_sums", "first_nonfinite", "grad_norm", "lemma_factors",
                                "spike_ratios", "step_classes", "token_pieces"),
    "drmas.algos.loss": ("PolicyLossConfig", "aggregate_loss", "entropy_from_logits", "kl_k3", "policy_loss"),
}
__getattr__, __dir__, __all__ = lazy_exports("drmas.algos", _HOMES)
