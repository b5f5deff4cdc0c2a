"""An advantage estimator: Dr. MAS advantages (paper Eq. 5) clipped to [-CLIP, CLIP], so that one agent's
near-constant group cannot hand a few steps very large advantages. Use it with `algo.estimator: drmas_clipped`."""
import torch

from drmas.algos.advantages import Grouping, StepBatch, drmas, register_estimator

CLIP = 3.0


@register_estimator("drmas_clipped")
def drmas_clipped(batch: StepBatch) -> tuple[torch.Tensor, Grouping]:
    """(x - mu_k) / (sigma_k + eps) within each (task, agent) group, clipped; the grouping is Dr. MAS's."""
    advantages, grouping = drmas(batch)
    return advantages.clamp(-CLIP, CLIP), grouping


drmas_clipped.shift_invariant = True  # adding a constant to a task group's scores changes nothing (check_estimator)
