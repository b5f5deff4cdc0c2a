"""Controlled study and inflation sweep: K agents with softmax (categorical) policies.

Agent k has a categorical policy pi_k = softmax(theta_k) over V actions and takes ``visits`` steps per
trajectory. Its score vector has the exact closed form z = grad_theta log pi_k(a) = e_a - pi_k, so
||z||^2 = 1 - 2 pi_a + ||pi||^2 and E||z||^2 = 1 - ||pi||^2. Given the action a, the step reward is
Gaussian with mean m_a = mu_k + rho * sigma_k * u_a and std sigma_k * sqrt(1 - rho^2), where u_a is
||z_a||^2 standardized under pi_k. Whatever rho, the agent's reward has mean mu_k and variance sigma_k^2;
rho = 0 makes reward and score independent (Delta_k = 0), rho != 0 correlates them (Delta_k != 0).

Rewards are i.i.d. across task groups, so population values are known in closed form
(:func:`population_terms`): the controlled study compares them with the Monte Carlo measurement; the
sweep predicts from a calibration batch and measures on fresh batches (Prop. 4.3's linear inflation).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from analysis.theory.lemma import SampleTable, batch_index, batch_weights, fit_line, lemma_terms
from analysis.theory.records import GradStats, Prediction, Record, make_records

log = logging.getLogger(__name__)

ESTIMATORS = ("pooled_grpo", "drmas")
"""Global = ``pooled_grpo`` (mu, sigma over all steps of the group: the lemma's mu, sigma are those of
the samples' own rewards); agent-wise = ``drmas``."""


# ------------------------------------------------------------------------------------------------ model
@dataclass(frozen=True)
class AgentSpec:
    """One softmax agent of a controlled system."""

    name: str
    visits: int  # steps per trajectory: |Y_k| = group_size * visits in every task group
    mu: float  # population mean mu_k of the step reward
    sigma: float  # population std sigma_k of the step reward
    rho: float = 0.0  # correlation of the reward with the standardized ||z||^2 (0: independent)

    def __post_init__(self) -> None:
        if self.visits < 1 or self.sigma <= 0 or not -1 <= self.rho <= 1:
            raise ValueError(f"agent {self.name!r}: need visits >= 1, sigma > 0 and |rho| <= 1, got visits="
                             f"{self.visits}, sigma={self.sigma}, rho={self.rho}")


@dataclass(frozen=True)
class SoftmaxSystem:
    """K softmax agents acting in task groups of ``group_size`` trajectories."""

    name: str
    agents: tuple[AgentSpec, ...]
    group_size: int = 16  # N trajectories per task group
    n_actions: int = 8  # V
    logit_scale: float = 1.5  # theta_k ~ logit_scale * N(0, I): a non-uniform policy, so ||z||^2 varies

    def __post_init__(self) -> None:
        if len(self.agents) < 2 or self.group_size < 2 or self.n_actions < 2:
            raise ValueError(f"system {self.name!r}: need >= 2 agents, group_size >= 2 and n_actions >= 2, got "
                             f"{len(self.agents)}, {self.group_size}, {self.n_actions}")

    @property
    def weights(self) -> np.ndarray:
        """Share of each agent among the steps: |Y_k| / sum_j |Y_j|."""
        v = np.array([a.visits for a in self.agents], dtype=np.float64)
        return v / v.sum()

    def global_moments(self) -> tuple[float, float]:
        """Population mu, sigma over all steps (law of total variance over the agents' mixture)."""
        w = self.weights
        mu_k = np.array([a.mu for a in self.agents])
        var_k = np.array([a.sigma for a in self.agents]) ** 2
        mu = float(w @ mu_k)
        return mu, float(np.sqrt(w @ (var_k + (mu_k - mu) ** 2)))


@dataclass(frozen=True)
class Policies:
    """Per-agent policy and reward tables, all [K, V]."""

    pi: np.ndarray  # action probabilities
    sq_norm: np.ndarray  # ||z_a||^2 = ||e_a - pi||^2
    reward_mean: np.ndarray  # m_a
    reward_std: np.ndarray  # std of the reward given a


def score_sq_norm(pi: np.ndarray) -> np.ndarray:
    """||e_a - pi||^2 = 1 - 2 pi_a + ||pi||^2 for every action (the exact softmax score, last axis)."""
    return 1.0 - 2.0 * pi + np.sum(pi * pi, axis=-1, keepdims=True)


def make_policies(system: SoftmaxSystem, rng: np.random.Generator) -> Policies:
    """Draw the agents' logits and build the per-action reward tables (module docstring)."""
    k, v = len(system.agents), system.n_actions
    logits = system.logit_scale * rng.standard_normal((k, v))
    pi = np.exp(logits - logits.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    s = score_sq_norm(pi)
    s_mean = np.sum(pi * s, 1, keepdims=True)
    s_std = np.sqrt(np.sum(pi * (s - s_mean) ** 2, 1, keepdims=True))
    u = (s - s_mean) / np.where(s_std > 0, s_std, 1.0)
    mu = np.array([[a.mu] for a in system.agents])
    sigma = np.array([[a.sigma] for a in system.agents])
    rho = np.array([[a.rho] for a in system.agents])
    return Policies(pi, s, mu + rho * sigma * u, np.broadcast_to(sigma * np.sqrt(1 - rho**2), (k, v)).copy())


def population_terms(pol: Policies, mu: np.ndarray, sigma: np.ndarray) -> Prediction:
    """Closed-form right-hand side of Lemma 4.2 with normalization statistics (mu, sigma) per agent.

    E||z||^2 = sum_a pi_a s_a;  factor = sum_a pi_a e_a / sigma^2 with e_a = E[(R - mu)^2 | a]
    = std_a^2 + (m_a - mu)^2;  Delta = sum_a pi_a s_a e_a / sigma^2 - E||z||^2 * factor.
    Global normalization: mu, sigma = the population (mu, sigma) of all steps, factor =
    (sigma_k^2 + (mu_k - mu)^2) / sigma^2. Agent-wise: mu, sigma = (mu_k, sigma_k), factor = 1.
    """
    mu, sigma = np.asarray(mu, np.float64)[:, None], np.asarray(sigma, np.float64)[:, None]
    e = (pol.reward_std**2 + (pol.reward_mean - mu) ** 2) / sigma**2
    score_m2 = np.sum(pol.pi * pol.sq_norm, 1)
    factor = np.sum(pol.pi * e, 1)
    return Prediction("population", score_m2, factor, np.sum(pol.pi * pol.sq_norm * e, 1) - score_m2 * factor)


def system_population(system: SoftmaxSystem, pol: Policies) -> dict[str, Prediction]:
    """Population predictions for each estimator of :data:`ESTIMATORS`."""
    mu, sigma = system.global_moments()
    k = len(system.agents)
    mu_k = np.array([a.mu for a in system.agents])
    sigma_k = np.array([a.sigma for a in system.agents])
    return {"pooled_grpo": population_terms(pol, np.full(k, mu), np.full(k, sigma)),
            "drmas": population_terms(pol, mu_k, sigma_k)}


# --------------------------------------------------------------------------------------------- sampling
@dataclass(frozen=True)
class SoftmaxSample:
    table: SampleTable
    action: torch.Tensor  # int64 [n]


def sample_groups(system: SoftmaxSystem, pol: Policies, n_groups: int, rng: np.random.Generator) -> SoftmaxSample:
    """``n_groups`` i.i.d. task groups: agent k contributes group_size * visits steps per group, each an
    action a ~ pi_k and a reward from the table of a (vectorized per agent, no per-sample loop)."""
    n_traj = system.group_size
    parts = []
    for k, spec in enumerate(system.agents):
        n = n_groups * n_traj * spec.visits
        cdf = np.cumsum(pol.pi[k])
        a = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), system.n_actions - 1)
        r = pol.reward_mean[k, a] + pol.reward_std[k, a] * rng.standard_normal(n)
        traj = np.arange(n) // spec.visits  # = group * n_traj + trajectory index within the group
        parts.append((r, traj // n_traj, np.full(n, k), traj, pol.sq_norm[k, a], a))
    cols = [np.concatenate(c) for c in zip(*parts)]
    t = lambda x, dt: torch.as_tensor(x, dtype=dt)  # noqa: E731
    table = SampleTable(t(cols[0], torch.float64), t(cols[1], torch.int64), t(cols[2], torch.int64),
                        t(cols[3], torch.int64), t(cols[4], torch.float64), len(system.agents))
    return SoftmaxSample(table, t(cols[5], torch.int64))


def softmax_batch_grads(sample: SoftmaxSample, pol: Policies, adv: torch.Tensor, batch_groups: int) -> GradStats:
    """Norm of each agent's batch gradient g_k = sum_y w_y (e_{a_y} - pi_k), w_y = A_y / |Y_k in batch|,
    over batches of ``batch_groups`` task groups, from action histograms: g_k = H_k - (sum_y w_y) pi_k,
    exact and without per-sample vectors."""
    tab, k_all, v = sample.table, pol.pi.shape[0], pol.pi.shape[1]
    batch = batch_index(tab.task, batch_groups)
    w = batch_weights(adv, tab.agent, batch, k_all)
    n_b = int(batch.max()) + 1
    cell = batch * k_all + tab.agent
    hist = torch.bincount(cell * v + sample.action, weights=w, minlength=n_b * k_all * v).view(n_b, k_all, v)
    w_sum = torch.bincount(cell, weights=w, minlength=n_b * k_all).view(n_b, k_all, 1)
    g = hist - w_sum * torch.as_tensor(pol.pi)[None]
    norm = torch.linalg.vector_norm(g, dim=-1)
    return GradStats(norm.pow(2).mean(0).numpy(), norm.mean(0).numpy(), batch_groups)


# ------------------------------------------------------------------------------------------- controlled
def _independent_and_correlated() -> tuple[SoftmaxSystem, ...]:
    # Three agents at different frequencies and reward scales (a search-like system): the rare "answer"
    # agent has a large mean offset and spread, so its global factor is about 4.3. 32 trajectories per
    # group (224 steps): the per-group statistics deviate from the population ones by O(1 / 224), about
    # 1 % of the factor (16 trajectories: about 3 %).
    agents = (AgentSpec("verifier", visits=4, mu=0.5, sigma=0.3),
              AgentSpec("search", visits=2, mu=0.2, sigma=0.25),
              AgentSpec("answer", visits=1, mu=1.2, sigma=0.8))
    correlated = tuple(AgentSpec(a.name, a.visits, a.mu, a.sigma, rho=0.8) for a in agents)
    return SoftmaxSystem("independent", agents, group_size=32), SoftmaxSystem("correlated", correlated, group_size=32)


@dataclass(frozen=True)
class ControlledConfig:
    """Controlled study: population prediction vs Monte Carlo for each system."""

    n_groups: int = 4000  # i.i.d. task groups of the Monte Carlo
    batch_groups: int = 32  # task groups per batch for the batch-gradient norm (paper math: 32 tasks)
    seed: int = 0
    systems: tuple[SoftmaxSystem, ...] = field(default_factory=_independent_and_correlated)


def run_controlled(cfg: ControlledConfig) -> list[Record]:
    """Lemma 4.2 with population statistics against the Monte Carlo E_{Y_k}||A z||^2, per system."""
    records: list[Record] = []
    for i, system in enumerate(cfg.systems):
        rng = np.random.default_rng([cfg.seed, 1, i])
        pol = make_policies(system, rng)
        sample = sample_groups(system, pol, cfg.n_groups, rng)
        measured = {e: lemma_terms(sample.table, e) for e in ESTIMATORS}
        grads = {e: softmax_batch_grads(sample, pol, t.advantages, cfg.batch_groups) for e, t in measured.items()}
        mu, sigma = system.global_moments()
        offset = [(a.mu - mu) / sigma for a in system.agents]
        spread = [a.sigma / sigma for a in system.agents]
        records += make_records("controlled", system.name, [a.name for a in system.agents], measured,
                                system_population(system, pol), grads, offset, spread)
        log.info("controlled %d/%d: %s, %d steps", i + 1, len(cfg.systems), system.name, sample.table.scores.numel())
    return records


# ------------------------------------------------------------------------------------------------ sweep
@dataclass(frozen=True)
class SweepConfig:
    """Inflation sweep: a rare agent whose (mu_k - mu)/sigma and sigma_k/sigma are swept against a
    frequent one that keeps the global (mu, sigma) = (0, 1); independent scores (Delta_k = 0)."""

    offsets: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)  # (mu_k - mu) / sigma of the swept agent
    spreads: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5)  # sigma_k / sigma of the swept agent
    swept_visits: int = 2  # steps per trajectory of the swept (rare) agent
    main_visits: int = 16  # steps per trajectory of the frequent agent (share 16/18: factors up to 9)
    min_main_sigma: float = 0.2  # skip points that would leave the frequent agent's std below this
    group_size: int = 8  # trajectories per task group
    calib_groups: int = 64  # task groups of the one calibration batch the prediction is estimated on
    batch_groups: int = 16  # task groups per fresh batch (batch-gradient norm)
    fresh_batches: int = 64  # fresh batches on which the second moment and gradient norm are measured
    n_actions: int = 32  # more actions: ||g_k||^2 averages over more directions (less noisy)
    logit_scale: float = 1.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.fresh_batches < 2 or self.batch_groups < 1 or self.calib_groups < 2:
            raise ValueError(f"need fresh_batches >= 2, batch_groups >= 1 and calib_groups >= 2, got "
                             f"{self.fresh_batches}, {self.batch_groups}, {self.calib_groups}")

    def points(self) -> list[tuple[float, float, SoftmaxSystem]]:
        """(offset, spread, system) for every feasible grid point. The swept agent has mu_k = offset,
        sigma_k = spread; the frequent agent (share 1 - w) gets mu_0 = -w offset / (1 - w) and
        sigma_0^2 = (1 - w (offset^2 + spread^2)) / (1 - w) - mu_0^2, so that mu = 0 and sigma = 1."""
        w = self.swept_visits / (self.swept_visits + self.main_visits)
        out = []
        for d in self.offsets:
            for r in self.spreads:
                mu0 = -w * d / (1 - w)
                var0 = (1 - w * (d * d + r * r)) / (1 - w) - mu0 * mu0
                if var0 < self.min_main_sigma**2:
                    continue
                agents = (AgentSpec("frequent", self.main_visits, mu0, float(np.sqrt(var0))),
                          AgentSpec("swept", self.swept_visits, d, r))
                out.append((d, r, SoftmaxSystem(f"offset={d:g},spread={r:g}", agents, self.group_size,
                                                self.n_actions, self.logit_scale)))
        return out


@dataclass(frozen=True)
class SweepFit:
    """Line fit of a measured quantity of the swept agent against its (calibration) global factor."""

    quantity: str  # "m2" (E||A z||^2) or "grad_sq" (mean ||g_k||^2 of the batch gradient)
    normalization: str
    slope: float
    intercept: float
    r2: float
    n_points: int
    max_factor: float
    expected_slope: float  # E||z||^2 (m2) or E||z||^2 / |Y_k per batch| (grad_sq); 0 agent-wise


def run_sweep(cfg: SweepConfig) -> tuple[list[Record], list[SweepFit]]:
    """Prop. 4.3 inflation: for each grid point, factor / E||z||^2 / Delta from one calibration batch,
    E||A z||^2 and the batch-gradient norm measured on ``fresh_batches`` fresh batches."""
    points = cfg.points()
    if not points:
        raise ValueError("the sweep grid has no feasible point; lower offsets/spreads or min_main_sigma")
    rng_pol = np.random.default_rng([cfg.seed, 2])
    pol0 = make_policies(points[0][2], rng_pol)  # one pair of policies for the whole sweep: fixed E||z||^2
    records: list[Record] = []
    for i, (d, r, system) in enumerate(points):
        pol = make_policies_like(pol0, system)
        rng = np.random.default_rng([cfg.seed, 3, i])
        sample = sample_groups(system, pol, cfg.calib_groups + cfg.batch_groups * cfg.fresh_batches, rng)
        calib, fresh = split_groups(sample, cfg.calib_groups)
        predicted = {e: Prediction.from_terms(lemma_terms(calib.table, e)) for e in ESTIMATORS}
        measured = {e: lemma_terms(fresh.table, e) for e in ESTIMATORS}
        grads = {e: softmax_batch_grads(fresh, pol, t.advantages, cfg.batch_groups) for e, t in measured.items()}
        mu, sigma = system.global_moments()
        records += make_records("sweep", system.name, [a.name for a in system.agents], measured, predicted, grads,
                                [(a.mu - mu) / sigma for a in system.agents], [a.sigma / sigma for a in system.agents])
        if (i + 1) % max(1, len(points) // 5) == 0 or i + 1 == len(points):
            log.info("sweep %d/%d points", i + 1, len(points))
    return records, sweep_fits(records, pol0, cfg)


def make_policies_like(pol: Policies, system: SoftmaxSystem) -> Policies:
    """Same action probabilities as ``pol`` with the reward tables of ``system`` (independent rewards)."""
    mu = np.array([[a.mu] for a in system.agents])
    sigma = np.array([[a.sigma] for a in system.agents])
    shape = pol.pi.shape
    return Policies(pol.pi, pol.sq_norm, np.broadcast_to(mu, shape).copy(), np.broadcast_to(sigma, shape).copy())


def split_groups(sample: SoftmaxSample, n_first: int) -> tuple[SoftmaxSample, SoftmaxSample]:
    """(the first ``n_first`` task groups, the rest): calibration and fresh batches of one draw."""
    first = sample.table.task < n_first
    return (SoftmaxSample(sample.table.select(first), sample.action[first]),
            SoftmaxSample(sample.table.select(~first), sample.action[~first]))


def sweep_fits(records: list[Record], pol: Policies, cfg: SweepConfig) -> list[SweepFit]:
    """Linear fits over the sweep of the swept agent's m2 and grad_sq against its global factor."""
    swept = [r for r in records if r.agent == "swept"]
    score_m2 = float(np.sum(pol.pi[1] * pol.sq_norm[1]))
    per_batch = cfg.batch_groups * cfg.group_size * cfg.swept_visits
    fits = []
    for norm in ("global", "agent"):
        rows = [r for r in swept if r.normalization == norm]
        x = np.array([r.factor_global for r in rows])
        for quantity, expected in (("m2", score_m2), ("grad_sq", score_m2 / per_batch)):
            y = np.array([getattr(r, "m2_measured" if quantity == "m2" else "grad_sq") for r in rows])
            f = fit_line(x, y)
            fits.append(SweepFit(quantity, norm, f.slope, f.intercept, f.r2, f.n, float(x.max()),
                                 expected if norm == "global" else 0.0))
    return fits

