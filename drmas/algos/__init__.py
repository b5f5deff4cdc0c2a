"""Algorithm core (import-light: torch, numpy, pandas only).

- :func:`compute_advantages` and the estimator registry (paper Eqs. 2 and 5, Table 3 ablations);
- :func:`policy_loss` (PPO clip, Eq. 3) with loss aggregation, k3 KL and entropy;
- gradient diagnostics: per-model and per-agent gradient norms, the spike statistic.
"""
from drmas.algos.advantages import (
    ESTIMATOR_TERMS,
    ESTIMATORS,
    GLOBAL_BASELINES,
    AdvantageResult,
    EstimatorTerms,
    compute_advantages,
    register_estimator,
    segment_stats,
)
from drmas.algos.diagnostics import (
    AgentGradNorms,
    SpikeDetector,
    SpikeRule,
    class_factors,
    control_positions,
    class_sums,
    first_nonfinite,
    grad_norm,
    lemma_factors,
    spike_ratios,
    step_classes,
)
from drmas.algos.loss import PolicyLossConfig, aggregate_loss, entropy_from_logits, kl_k3, policy_loss

__all__ = [
    "ESTIMATOR_TERMS", "ESTIMATORS", "GLOBAL_BASELINES", "AdvantageResult", "EstimatorTerms", "compute_advantages", "register_estimator",
    "segment_stats", "AgentGradNorms", "SpikeDetector", "SpikeRule", "class_factors", "control_positions", "class_sums", "first_nonfinite", "grad_norm",
    "lemma_factors", "spike_ratios", "step_classes",
    "PolicyLossConfig", "aggregate_loss", "entropy_from_logits", "kl_k3", "policy_loss",
]
