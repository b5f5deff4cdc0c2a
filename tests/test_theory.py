"""Lemma 4.2 / Prop. 4.3 checks (analysis.theory): the identity on empirical distributions against a slow
per-group reference, the agent-wise factor, a closed-form two-agent case, the tiny-LM per-sample
gradients, the CLI and the notebook."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.theory import REQUIRED_KEYS, SampleTable, lemma_terms
from analysis.theory.lemma import batch_index, batch_weights, fit_line
from analysis.theory.softmax import (AgentSpec, Policies, SoftmaxSystem, make_policies, population_terms,
                                     sample_groups, score_sq_norm, softmax_batch_grads, system_population)
from notebooks import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
ESTIMATORS = ("pooled_grpo", "trajectory_grpo", "drmas")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Segment reductions are faster single-threaded on 2 shared cores (the CLI does the same)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_table(seed: int, n_groups: int = 12, n_traj: int = 5) -> SampleTable:
    """Task groups of n_traj trajectories; agent 0 acts once, agent 1 one to three times, agent 2 once or
    twice per trajectory; rewards differ per agent and ||z||^2 is correlated with the reward."""
    rng = np.random.default_rng(seed)
    traj = np.arange(n_groups * n_traj)
    visits = np.stack([np.ones_like(traj), rng.integers(1, 4, traj.size), rng.integers(1, 3, traj.size)])
    agent = np.concatenate([np.full(visits[k].sum(), k) for k in range(3)])
    traj_col = np.concatenate([np.repeat(traj, visits[k]) for k in range(3)])
    team = rng.integers(0, 2, traj.size).astype(float)[traj_col]
    scores = team + rng.normal([0.0, -0.3, 1.0], [0.2, 0.5, 1.0])[agent] * rng.random(agent.size)
    sq_norm = rng.gamma(2.0, size=agent.size) * (1 + scores**2)
    t = lambda x, dt=torch.float64: torch.as_tensor(x, dtype=dt)  # noqa: E731
    return SampleTable(t(scores), t(traj_col // n_traj, torch.int64), t(agent, torch.int64), t(traj_col, torch.int64),
                       t(sq_norm), 3)


def reference_terms(table: SampleTable, estimator: str) -> pd.DataFrame:
    """Slow reference (pandas, one task group at a time): R, mu, sigma as the estimator defines them,
    population statistics (ddof = 0), then per agent E||z||^2, factor, Delta and E[||z||^2 (R-mu)^2/sigma^2]."""
    df = pd.DataFrame({"x": table.scores.numpy(), "task": table.task.numpy(), "agent": table.agent.numpy(),
                       "traj": table.traj.numpy(), "s": table.sq_norm.numpy()})
    df["R"] = df.groupby("traj")["x"].transform("mean") if estimator == "trajectory_grpo" else df["x"]
    parts = []
    for _, g in df.groupby("task"):
        g = g.copy()
        if estimator == "drmas":
            g["mu"] = g.groupby("agent")["R"].transform("mean")
            g["sigma"] = g.groupby("agent")["R"].transform(lambda r: r.std(ddof=0))
        elif estimator == "trajectory_grpo":
            per_traj = g.groupby("traj")["R"].first()  # each trajectory once
            g["mu"], g["sigma"] = per_traj.mean(), per_traj.std(ddof=0)
        else:
            g["mu"], g["sigma"] = g["R"].mean(), g["R"].std(ddof=0)
        # factor of each (task, agent) cell from mu_gk, sigma_gk^2 of R over the agent's steps (Lemma 4.2)
        cell = g.groupby("agent")["R"].agg(mu_k="mean", var_k=lambda r: r.var(ddof=0))
        g = g.join(cell, on="agent")
        g["cell_factor"] = (g["var_k"] + (g["mu_k"] - g["mu"]) ** 2) / g["sigma"] ** 2
        parts.append(g)
    df = pd.concat(parts)
    df["u2"] = (df["R"] - df["mu"]) ** 2 / df["sigma"] ** 2
    out = {}
    for k, g in df.groupby("agent"):
        cov = ((g["s"] - g["s"].mean()) * (g["u2"] - g["u2"].mean())).mean()
        out[k] = {"score_m2": g["s"].mean(), "factor": g["cell_factor"].mean(), "delta": cov,
                  "m2": (g["s"] * g["u2"]).mean()}
    return pd.DataFrame(out).T


# ----------------------------------------------------------------------------------------- identity
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identity_exact_on_empirical_distribution(estimator, seed):
    table = random_table(seed)
    t = lemma_terms(table, estimator)
    ref = reference_terms(table, estimator)
    np.testing.assert_allclose(t.score_m2, ref["score_m2"], rtol=1e-12)
    np.testing.assert_allclose(t.factor, ref["factor"], rtol=1e-10)  # (sigma_k^2 + (mu_k - mu)^2)/sigma^2
    np.testing.assert_allclose(t.delta, ref["delta"], rtol=1e-9, atol=1e-12)
    # m2 uses the core's float32 advantages: equal to float32 rounding.
    np.testing.assert_allclose(t.m2, ref["m2"], rtol=1e-6)
    np.testing.assert_allclose(t.adv_m2, t.factor, rtol=1e-6)  # E[A^2] = E[(R - mu)^2] / sigma^2
    assert np.abs(t.identity_residual).max() < 1e-6  # m2 = E||z||^2 * factor + Delta
    assert (t.degenerate == 0).all()


def test_delta_jackknife_se_matches_a_loop_over_groups():
    table = random_table(4)
    t = lemma_terms(table, "pooled_grpo")
    u2 = t.advantages.numpy() ** 2
    s, task, agent = table.sq_norm.numpy(), table.task.numpy(), table.agent.numpy()
    groups = np.unique(task)
    for k in range(3):
        loo = []
        for g in groups:  # slow reference: recompute Cov without group g
            keep = (agent == k) & (task != g)
            loo.append(np.mean(s[keep] * u2[keep]) - s[keep].mean() * u2[keep].mean())
        loo = np.array(loo)
        se = np.sqrt((len(loo) - 1) / len(loo) * np.sum((loo - loo.mean()) ** 2))
        assert t.delta_se[k] == pytest.approx(se, rel=1e-4)


def test_agentwise_factor_is_one_and_m2_is_score_plus_delta():
    t = lemma_terms(random_table(3), "drmas")
    np.testing.assert_allclose(t.factor, 1.0, rtol=1e-12)
    np.testing.assert_allclose(t.adv_m2, 1.0, rtol=1e-6)
    np.testing.assert_allclose(t.m2, t.score_m2 + t.delta, rtol=1e-6)


def test_constant_group_gets_zero_advantage_and_counts_as_degenerate():
    # One task, two trajectories, two agents, all scores 1.0: sigma = 0, A = 0, factor contribution 0.
    t = lambda x, dt=torch.float64: torch.as_tensor(x, dtype=dt)  # noqa: E731
    table = SampleTable(t([1.0, 1.0, 1.0, 1.0]), t([0, 0, 0, 0], torch.int64), t([0, 1, 0, 1], torch.int64),
                        t([0, 0, 1, 1], torch.int64), t([1.0, 2.0, 3.0, 4.0]), 2)
    for est in ESTIMATORS:
        terms = lemma_terms(table, est)
        np.testing.assert_array_equal(terms.m2, 0.0)
        np.testing.assert_array_equal(terms.factor, 0.0)
        np.testing.assert_array_equal(terms.degenerate, 1.0)


def test_invalid_inputs_raise():
    table = random_table(0)
    with pytest.raises(ValueError, match="not one of"):
        lemma_terms(table, "rloo")
    with pytest.raises(ValueError, match="one value per agent step"):
        SampleTable(table.scores, table.task[:-1], table.agent, table.traj, table.sq_norm, 3)
    with pytest.raises(ValueError, match="sigma > 0"):
        AgentSpec("a", visits=1, mu=0.0, sigma=0.0)


# ------------------------------------------------------------------------------------ softmax model
def test_softmax_score_is_exact():
    theta = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64, requires_grad=True)
    pi = torch.softmax(theta, 0).detach().numpy()
    for a in range(4):
        (g,) = torch.autograd.grad(torch.log_softmax(theta, 0)[a], theta)
        np.testing.assert_allclose(g.numpy(), np.eye(4)[a] - pi, atol=1e-12)  # z = e_a - pi
        np.testing.assert_allclose(score_sq_norm(pi[None])[0, a], np.sum((np.eye(4)[a] - pi) ** 2), atol=1e-12)
    np.testing.assert_allclose(np.sum(pi * score_sq_norm(pi[None])[0]), 1 - np.sum(pi**2), atol=1e-12)


def test_correlated_rewards_keep_agent_moments_and_population_terms():
    agents = (AgentSpec("a", 3, 0.5, 0.3, rho=0.8), AgentSpec("b", 1, 1.5, 1.0, rho=-0.5))
    system = SoftmaxSystem("s", agents, group_size=4)
    pol = make_policies(system, np.random.default_rng(0))
    mean = np.sum(pol.pi * pol.reward_mean, 1)
    var = np.sum(pol.pi * (pol.reward_std**2 + pol.reward_mean**2), 1) - mean**2
    np.testing.assert_allclose(mean, [0.5, 1.5], atol=1e-12)
    np.testing.assert_allclose(var, [0.09, 1.0], atol=1e-12)
    pred = system_population(system, pol)
    mu, sigma = system.global_moments()
    np.testing.assert_allclose(pred["pooled_grpo"].factor, (var + (mean - mu) ** 2) / sigma**2, rtol=1e-12)
    np.testing.assert_allclose(pred["drmas"].factor, 1.0, rtol=1e-12)
    assert np.all(np.abs(pred["pooled_grpo"].delta) > 1e-3)  # correlated: Delta_k != 0


def test_two_agent_gaussian_closed_form():
    # Agent A: 3 steps per trajectory, reward N(0, 1); agent B: 1 step, N(2, 1); scores independent.
    # w = (3/4, 1/4); mu = 1/4 * 2 = 0.5; sigma^2 = 3/4 * (1 + 0.25) + 1/4 * (1 + 2.25) = 1.75
    # factor_A = (1 + 0.25) / 1.75 = 0.714286, factor_B = (1 + 2.25) / 1.75 = 1.857143
    # pi = (1/2, 1/4, 1/8, 1/8): ||pi||^2 = 0.34375, E||z||^2 = 1 - ||pi||^2 = 0.65625, Delta = 0
    # => E||A z||^2 (global) = 0.65625 * (0.714286, 1.857143) = (0.468750, 1.218750); agent-wise = 0.65625
    system = SoftmaxSystem("gauss", (AgentSpec("A", 3, 0.0, 1.0), AgentSpec("B", 1, 2.0, 1.0)), group_size=64)
    pi = np.tile([0.5, 0.25, 0.125, 0.125], (2, 1))
    pol = Policies(pi, score_sq_norm(pi), np.array([[0.0] * 4, [2.0] * 4]), np.ones((2, 4)))
    expected = {"pooled_grpo": np.array([0.468750, 1.218750]), "drmas": np.array([0.65625, 0.65625])}
    np.testing.assert_allclose(population_terms(pol, [0.5, 0.5], [1.75**0.5] * 2).factor, [1.25 / 1.75, 3.25 / 1.75])
    sample = sample_groups(system, pol, 300, np.random.default_rng(0))
    for est, closed in expected.items():
        t = lemma_terms(sample.table, est)
        # Monte Carlo error (4 s.e.) plus the O(1/256) bias of per-group statistics (groups of 256 steps).
        assert np.all(np.abs(t.m2 - closed) < 4 * t.m2_se + 0.005 * closed), (est, t.m2, closed, t.m2_se)


def test_softmax_batch_grads_match_explicit_vectors():
    system = SoftmaxSystem("s", (AgentSpec("a", 2, 0.0, 1.0), AgentSpec("b", 1, 1.0, 0.5)), group_size=3)
    pol = make_policies(system, np.random.default_rng(1))
    sample = sample_groups(system, pol, 6, np.random.default_rng(2))
    adv = lemma_terms(sample.table, "pooled_grpo").advantages
    got = softmax_batch_grads(sample, pol, adv, batch_groups=2)
    tab = sample.table
    batch = batch_index(tab.task, 2)
    w = batch_weights(adv, tab.agent, batch, 2).numpy()
    z = np.eye(pol.pi.shape[1])[sample.action.numpy()] - pol.pi[tab.agent.numpy()]  # explicit e_a - pi
    norms = np.zeros((3, 2))
    for b in range(3):
        for k in range(2):
            rows = (batch.numpy() == b) & (tab.agent.numpy() == k)
            norms[b, k] = np.linalg.norm((w[rows, None] * z[rows]).sum(0))
    np.testing.assert_allclose(got.grad_sq, (norms**2).mean(0), rtol=1e-10)
    np.testing.assert_allclose(got.grad_norm, norms.mean(0), rtol=1e-10)


def test_fit_line_recovers_a_line():
    x = np.array([0.0, 1.0, 2.0, 4.0])
    f = fit_line(x, 0.5 * x + 0.1)
    assert f.slope == pytest.approx(0.5) and f.intercept == pytest.approx(0.1) and f.r2 == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ tiny LM
def test_tiny_lm_per_sample_gradients_match_autograd_loop():
    from analysis.theory.tiny_lm import TinyLMConfig, build_models, per_sample_scores

    cfg = TinyLMConfig(n_groups=2, batch_groups=1, num_layers=1)
    model = build_models(cfg)[0]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (3, cfg.prompt_len + cfg.response_len), generator=gen)
    weights = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    sq, sums = per_sample_scores(model, tokens, cfg.prompt_len, weights, torch.tensor([0, 0, 1]), 2, chunk_size=2)
    grads = []
    for row in tokens:  # the slow reference: one backward pass per sample
        model.zero_grad()
        logp = torch.log_softmax(model(row[None], use_cache=False).logits[0, cfg.prompt_len - 1 : -1], -1)
        logp.gather(-1, row[cfg.prompt_len:, None]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    ref = torch.stack(grads)
    torch.testing.assert_close(sq, ref.pow(2).sum(1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sums[0, 0], 0.5 * ref[0] - ref[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sums[1, 0], 2.0 * ref[2], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------- CLI and notebook
def test_cli_quick_writes_json_tables_and_figures(tmp_path):
    """``--out DIR`` alone puts the figures under DIR/figures: the committed paper_figures/theory_* stay as they are
    (a quick run with --out must not write its figures over them)."""
    out, figs = tmp_path / "theory", tmp_path / "theory" / "figures"
    committed = {p: p.stat().st_mtime_ns for p in (ROOT / "paper_figures").glob("theory_*")}
    cmd = [sys.executable, "-m", "analysis.theory", "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert committed and {p: p.stat().st_mtime_ns for p in committed} == committed
    records = json.loads((out / "lemma42.json").read_text())
    assert {r["study"] for r in records} == {"controlled", "sweep", "tiny_lm"}  # repetition: its own table
    assert all(set(REQUIRED_KEYS) <= set(r) for r in records)
    assert {r["normalization"] for r in records} == {"global", "agent"}
    # Acceptance numbers: controlled independent within 5 %, agent-wise m2 within 10 % of E||z||^2.
    indep = [r for r in records if r["study"] == "controlled" and r["setting"] == "independent"]
    assert max(r["rel_error"] for r in indep) < 0.05
    assert all(abs(r["m2_measured"] / r["score_m2"] - 1) < 0.10 for r in indep if r["normalization"] == "agent")
    summary = pd.read_csv(out / "summary.csv")
    fit = summary[(summary.setting == "fit m2 vs factor") & (summary.normalization == "global")].iloc[0]
    assert fit.max_factor >= 4 and fit.r2 >= 0.98
    assert (out / "summary.md").read_text().startswith("# Lemma 4.2")
    for name in ("theory_measured_vs_predicted", "theory_inflation", "theory_delta"):
        assert (figs / f"{name}.png").stat().st_size > 0 and (figs / f"{name}.pdf").stat().st_size > 0
    rep = pd.read_csv(out / "repetition.csv")
    assert len(rep) == 3 * 3 * 2 and (figs / "theory_repetition.png").stat().st_size > 0
    assert "in-sample identity" in proc.stdout
    assert not list(out.glob(".*.tmp")) and not list(figs.glob(".*.tmp"))  # atomic writes leave no temp file


@pytest.mark.parametrize("argv, out, figures", [
    ([], "results/theory", "paper_figures"),  # the full run writes the committed files
    (["--out", "results/theory"], "results/theory", "paper_figures"),
    (["--quick"], "results/theory/quick", "results/theory/quick/figures"),  # never over the full run's
    (["--out", "/tmp/th"], "/tmp/th", "/tmp/th/figures"),
    (["--quick", "--out", "/tmp/th", "--figures", "/tmp/f"], "/tmp/th", "/tmp/f"),  # told otherwise
])
def test_cli_output_folders(argv, out, figures):
    from analysis.theory.__main__ import parse_args

    args = parse_args(argv)
    assert (args.out_dir, args.figures_dir) == (Path(out), Path(figures))


def test_notebook_executes_headless_in_quick_mode(monkeypatch):
    monkeypatch.setenv("DRMAS_THEORY_QUICK", "1")  # inherited by the kernel process
    text, outputs = execute_notebook(ROOT / "analysis/notebooks/gradient_variance.ipynb")
    assert f"prefix: {sys.prefix} " in text and "quick: True" in text  # the kernel ran in this environment
    assert "in-sample identity" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3  # the three figures


def _repetition(n_actions: int, wrong_key: bool = False) -> pd.DataFrame:
    from dataclasses import replace

    from analysis.theory.repetition import RepetitionConfig, class_codes, repetition_rows
    from analysis.theory.softmax import ControlledConfig

    cfg = RepetitionConfig(n_actions=(n_actions,), n_groups=200)
    system = replace(ControlledConfig().systems[0], n_actions=n_actions)
    rng = np.random.default_rng([0, 4, n_actions])
    sample = sample_groups(system, make_policies(system, rng), cfg.n_groups, rng)
    classes = class_codes(sample, 3, n_actions)
    if wrong_key:  # one class per (agent, action) over all task groups: classes of different groups merged
        prediction = np.unique(sample.table.agent.numpy() * n_actions + sample.action.numpy(), return_inverse=True)[1]
        return repetition_rows(system, sample, prediction, cfg, torch.Generator().manual_seed(1), true_classes=classes)
    return repetition_rows(system, sample, classes, cfg, torch.Generator().manual_seed(1))


@pytest.mark.parametrize("n_actions", [64, 4])
def test_class_aware_second_moment_matches_repeated_samples_and_the_lemma_misses(n_actions):
    """Class gradients drawn per (task group, agent, action): Σ_c S_c² ||z_c||² predicts E||g_k||² within the
    controlled checks' 5 % for every agent and both normalizations; the independent-sample Lemma misses by more
    (the global baseline's repeated advantages add up)."""
    from analysis.theory.repetition import TOLERANCE

    rows = _repetition(n_actions)
    assert rows["rel_error_class_measured"].max() < TOLERANCE
    assert rows["rel_error_lemma"].max() > 2 * TOLERANCE
    glob = rows[rows["estimator"] == "pooled_grpo"].set_index("agent")
    assert (glob["measured"] > 1.5 * glob["lemma"]).any()  # repetition inflates the global-baseline gradient
    np.testing.assert_allclose(glob["ratio_class_measured"], glob["ratio_measured"], rtol=2 * TOLERANCE)


def test_class_aware_prediction_fails_when_the_classes_are_wrong():
    """The same check with classes keyed by (agent, action) only, merging samples of different task groups whose
    gradients are independent: the prediction misses the measurement by more than the tolerance."""
    from analysis.theory.repetition import TOLERANCE

    rows = _repetition(4, wrong_key=True)
    assert rows["rel_error_class_measured"].max() > 4 * TOLERANCE
