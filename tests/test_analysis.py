"""Tests of the analysis package (analysis/runs, stats, tables, figures, report).

Synthetic run directories in ``tmp_path`` are a fixture for the analysis code (they mimic the files
``drmas train`` and ``experiments/grid.py`` write), never results. Numeric vectors show their arithmetic.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.runs import load_grid
from analysis.views import final_evals, run_averages
from analysis.stats import (average_interval, bootstrap_ci, grad_norm_summary, kendall_tau, paired_test, pass_at_k,
                            task_scores)
from analysis.tables import (DATA, headline_gain, load_paper, load_prices, paper_averages, paper_gain)
from drmas.algos import spike_ratios

# ------------------------------------------------------------------------------------------ synthetic grid
AGENTS = {"math": ["solver", "verifier"], "search": ["verifier", "search", "answer"]}
BENCHMARKS = {"math": ["d1-word", "d1-expr"], "search": ["kb-1hop", "kb-2hop"]}
FACTOR = {"solver": 1.0, "verifier": 1.6, "search": 2.4, "answer": 4.0}  # Lemma factor of each agent (synthetic)
QUALITY = {"single_agent_grpo": 0.30, "sharing_grpo": 0.35, "sharing_drmas": 0.60, "nonsharing_grpo": 0.35,
           "nonsharing_drmas": 0.62, "hetero_drmas": 0.60, "nonsharing:(mu_k,sigma)": 0.45,
           "nonsharing:(mu,sigma_k)": 0.52, "nonsharing:pooled_step": 0.50, "nonsharing:agent_traj": 0.55}
N_TASKS, K, STEPS = 40, 4, 30


def _models(task: str, assignment: str) -> tuple[dict, list[dict]]:
    agents = AGENTS[task] if assignment != "single" else ["solver"]
    if assignment in ("single", "sharing"):
        models = {"shared": {"preset": "tiny"}}
        return models, [{"name": a, "model": "shared"} for a in agents]
    models = {f"{a}_model": {"preset": "nano" if assignment == "hetero" and a != "verifier" else "tiny"} for a in agents}
    return models, [{"name": a, "model": f"{a}_model"} for a in agents]


def _write_run(root: Path, name: str, task: str, setting: str, estimator: str, assignment: str, seed: int,
               done: bool = True, torn: bool = False) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{name}:{seed}".encode()))
    run_dir = root / name
    run_dir.mkdir(parents=True)
    models, agents = _models(task, assignment)
    manifest = {"name": name, "config": {"env": {"name": f"{task}_generated"}, "models": models, "agents": agents,
                                         "algo": {"estimator": estimator}, "train": {"seed": seed}},
                "seeds": {"train": seed}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    grpo = "grpo" in setting
    lines = []
    for step in range(STEPS):
        m = {"step": step, "reward/mean": QUALITY[setting] * (0.5 + step / STEPS) + 0.02 * rng.standard_normal(),
             "task/mu": 0.4, "task/sigma": 0.45, "timing/rollout": 2.0, "timing/update": 1.0, "timing/step": 3.0}
        for a in agents:
            k = a["name"]
            scale = math.sqrt(FACTOR[k]) if grpo else 1.0
            norm = scale * (1 + 0.05 * rng.standard_normal())
            if grpo and k == agents[-1]["name"] and step in (12, 24):
                norm *= 10  # a spike
            m.update({f"agent/{k}/grad_norm": norm, f"agent/{k}/reward_mean": 0.4, f"agent/{k}/reward_std": 0.4,
                      f"agent/{k}/lemma_factor": FACTOR[k] * (1 + 0.02 * rng.standard_normal()),
                      f"agent/{k}/adv_m2": 1.0, f"agent/{k}/invalid_rate": 0.0, f"agent/{k}/response_len": 20.0,
                      f"tokens/{k}": 1000 + 10 * step})
        for w, spec in models.items():
            m[f"wg/{w}/grad_norm"] = 1.0
            m[f"timing/generate/{w}"] = 0.2 if spec["preset"] == "nano" else 0.6
        lines.append(json.dumps(m))
    if torn:
        lines.append('{"step": 30, "reward/me')
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    task_effect = np.random.default_rng(7).normal(0, 1.0, size=N_TASKS)  # the same tasks for every run of a family
    evals = []
    for step in (0, STEPS):
        q = 0.3 if step == 0 else QUALITY[setting]
        for b in BENCHMARKS[task]:
            p = 1 / (1 + np.exp(-(np.log(q / (1 - q)) + task_effect)))
            succ = rng.binomial(K, p)
            evals.append(json.dumps({"step": step, "benchmark": b, "avg": float(succ.mean() / K),
                                     "pass": float((succ > 0).mean()), "k": K, "n_tasks": N_TASKS,
                                     "successes": succ.tolist()}))
    (run_dir / "eval.jsonl").write_text("\n".join(evals) + "\n")
    if done:
        (run_dir / "DONE").write_text("")


def make_grid(root: Path, tasks=("math", "search"), seeds=(0, 1), extras: bool = True) -> Path:
    """A grid directory like experiments/grids/cpu.yaml's (fewer steps and tasks), plus a failed and a partial run."""
    entries = []

    def add(name, task, setting, estimator, assignment, seed, status="done", write=True, **kw):
        run = f"{name}_s{seed}"
        if write:
            _write_run(root, run, task, setting, estimator, assignment, seed, done=status == "done", **kw)
        entries.append({"run": run, "config": "x.yaml", "overrides": [], "task": task, "setting": setting,
                        "estimator": estimator, "assignment": assignment, "entry": name, "seed": seed,
                        "status": status, "seconds": 60.0})

    for task in tasks:
        for seed in seeds:
            add(f"{task}_single_grpo", task, "single_agent_grpo", "trajectory_grpo", "single", seed)
            for assignment in ("sharing", "nonsharing"):
                add(f"{task}_{assignment}_grpo", task, f"{assignment}_grpo", "trajectory_grpo", assignment, seed)
                add(f"{task}_{assignment}_drmas", task, f"{assignment}_drmas", "drmas", assignment, seed)
        if task == "search" and extras:
            add("search_hetero_drmas", task, "hetero_drmas", "drmas", "hetero", 0)
            add("search_nonsharing_mean_only", task, "nonsharing:(mu_k,sigma)", "drmas_mean_only", "nonsharing", 0)
            add("search_nonsharing_std_only", task, "nonsharing:(mu,sigma_k)", "drmas_std_only", "nonsharing", 0)
            add("search_nonsharing_pooled", task, "nonsharing:pooled_step", "pooled_grpo", "nonsharing", 0)
    if extras:
        add("math_failed", "math", "nonsharing_grpo", "trajectory_grpo", "nonsharing", 5, status="failed", write=False)
        add("math_partial", "math", "nonsharing_drmas", "drmas", "nonsharing", 6, status="partial", torn=True)
    (root / "index.json").write_text(json.dumps({"grid": "synthetic", "runs": entries}))
    return root


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    return make_grid(tmp_path_factory.mktemp("grid"))


# ------------------------------------------------------------------------------------------ pass@k
def test_pass_at_k_vectors():
    # 1 - C(n-c, k) / C(n, k):
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7;  n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    # n=16, c=1, k=2: 1 - C(15,2)/C(16,2) = 1 - 105/120 = 0.125;  n=10, c=0: 0;  n=4, c=3, k=2: n-c < k -> 1
    got = pass_at_k([5, 4, 16, 10, 4], [2, 1, 1, 0, 3], 2)
    np.testing.assert_allclose(got, [0.7, 0.5, 0.125, 0.0, 1.0], atol=1e-12)
    # k = 1 is the success rate c / n; n = k is 1[c > 0]
    np.testing.assert_allclose(pass_at_k(16, np.arange(17), 1), np.arange(17) / 16, atol=1e-12)
    np.testing.assert_array_equal(pass_at_k(4, [0, 1, 4], 4), [0.0, 1.0, 1.0])
    # against exact binomials
    rng = np.random.default_rng(0)
    n = rng.integers(8, 40, 50)
    c = rng.integers(0, n + 1)
    exact = [1 - math.comb(int(ni - ci), 5) / math.comb(int(ni), 5) for ni, ci in zip(n, c)]
    np.testing.assert_allclose(pass_at_k(n, c, 5), exact, atol=1e-9)
    # large n without overflow
    assert 0 < pass_at_k(10_000, 3, 16) < 1
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(3, 1, 4)


def test_task_scores_avg_and_pass():
    # successes out of k = 4: avg = c/4, pass@4 = 1[c > 0]
    np.testing.assert_allclose(task_scores([0, 1, 4], 4, "avg"), [0, 0.25, 1])
    np.testing.assert_allclose(task_scores([0, 1, 4], 4, "pass"), [0, 1, 1])


# ------------------------------------------------------------------------------------------ bootstrap
def test_bootstrap_seeded_and_contains_mean():
    x = np.tile([0.0, 1.0], 50)  # mean 0.5, s.e. of the mean = 0.5 / sqrt(100) = 0.05 -> 95 % CI ~ 0.5 ± 0.098
    a = bootstrap_ci(x, np.random.default_rng(3), n_boot=4000)
    assert a.low < 0.5 < a.high and a.point == 0.5
    assert 0.08 < a.halfwidth < 0.12
    # same seed -> same interval, another seed -> another one (continuous scores, so quantiles move)
    y = np.linspace(0, 1, 101) ** 2
    b1, b2 = (bootstrap_ci(y, np.random.default_rng(3), n_boot=500) for _ in range(2))
    b3 = bootstrap_ci(y, np.random.default_rng(4), n_boot=500)
    assert b1 == b2 and b1 != b3 and b1.low < y.mean() < b1.high
    # (seeds, tasks): the point is the mean over both, the interval comes from task resampling
    m = np.array([[0.0, 1.0, 1.0, 0.5], [1.0, 1.0, 0.0, 0.5]])
    ci = bootstrap_ci(m, np.random.default_rng(0), n_boot=500)
    assert ci.point == pytest.approx(0.625) and ci.low <= 0.625 <= ci.high
    # a constant array has a zero-width interval
    z = bootstrap_ci(np.ones(30), np.random.default_rng(0), n_boot=200)
    assert (z.low, z.high) == (1.0, 1.0)


def test_average_interval_is_mean_of_benchmark_means():
    # benchmark means 0.25 (4 tasks) and 0.8 (10 tasks): Average = (0.25 + 0.8) / 2 = 0.525, not the pooled 0.643
    xs = [np.array([0, 0, 0, 1.0]), np.array([1.0] * 8 + [0, 0])]
    ci = average_interval(xs, np.random.default_rng(0), n_boot=500)
    assert ci.point == pytest.approx(0.525)
    assert ci.low < 0.525 < ci.high


def test_paired_test_dominating_and_identical():
    rng = np.random.default_rng(0)
    b = (rng.random((2, 60)) < 0.3).astype(float)
    a = np.maximum(b, (rng.random((2, 60)) < 0.6).astype(float))  # a >= b on every task, often strictly
    res = paired_test(a, b, np.random.default_rng(1), n_boot=1000)
    assert res.diff.point > 0 and res.diff.low > 0
    assert res.p_value < 1e-4 and res.n_seeds == 2 and res.seeds_positive == 2
    same = paired_test(b, b.copy(), np.random.default_rng(1), n_boot=1000)
    assert same.diff.point == 0 and (same.diff.low, same.diff.high) == (0, 0)
    assert same.p_value == 1.0 and same.seeds_positive == 0
    with pytest.raises(ValueError, match="equal shapes"):
        paired_test(a, b[:1], np.random.default_rng(1))


# ------------------------------------------------------------------------------------------ spikes
def test_spike_count_uses_documented_rule():
    # 10 steps at 1.0, then 5.0 (5 > 3 x median 1.0: spike), then 2.0 (median 1.0: 2 < 3, no spike), then NaN
    norms = [1.0] * 10 + [5.0, 2.0, float("nan")] + [1.0] * 5
    frame = pd.DataFrame({"run": "r", "agent": "a", "step": np.arange(len(norms)), "grad_norm": norms,
                          "spike": spike_ratios(norms)["spike"].astype(int)})
    s = grad_norm_summary(frame).iloc[0]
    assert s["spikes"] == 2 and s["nonfinite"] == 1 and s["spikes_logged"] == 2
    assert s["max"] == 5.0 and s["max_ratio"] == pytest.approx(5.0)
    # at least 5 steps of history: a large value at step 3 is no spike
    early = pd.DataFrame({"run": "r", "agent": "a", "step": range(4), "grad_norm": [1.0, 1.0, 1.0, 50.0]})
    assert grad_norm_summary(early).iloc[0]["spikes"] == 0


def test_kendall_tau():
    assert kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == pytest.approx(1.0)
    assert kendall_tau(["c", "b", "a"], ["a", "b", "c"]) == pytest.approx(-1.0)


# ------------------------------------------------------------------------------------------ paper numbers
def test_paper_headline_gains():
    """docs/paper.md §5: +5.6 % avg / +4.6 % pass (math), +15.2 % / +13.1 % (search), sum over {Qwen 2 models} x
    {sharing, non-sharing}. The printed values come out when each Average is the unrounded mean of the benchmark
    rows; summing the printed (rounded) Average rows gives 13.0 % for search pass@16 (222.8 / 197.1 - 1)."""
    paper = load_paper()
    reported = yaml.safe_load((DATA / "paper_claims.yaml").read_text())["headline_gains"]
    for task in ("math", "search"):
        g = paper_gain(paper, task)
        for m in ("avg", "pass"):
            assert round(100 * g[m], 1) == pytest.approx(100 * reported[task][m]), (task, m, g)
    assert round(100 * paper_gain(paper, "math")["avg"], 1) == 5.6
    assert round(100 * paper_gain(paper, "search")["pass"], 1) == 13.1
    rows = paper_gain(paper, "search", source="average_rows")
    assert rows["pass"] == pytest.approx(222.8 / 197.1 - 1)  # (53.8 + 53.0 + 57.7 + 58.3) / (52.9 + 46.7 + 57.0 + 40.5)
    assert round(100 * rows["pass"], 1) == 13.0
    # the paper's printed Average rows are its benchmark means up to rounding
    for task in ("math", "search"):
        a, b = paper_averages(paper, task), paper_averages(paper, task, "average_rows")
        merged = a.merge(b, on=["model", "setting"])
        assert np.abs(merged["avg_x"] - merged["avg_y"]).max() < 0.0006


def test_headline_gain_formula_and_missing_assignment():
    # Dr. MAS (0.6 + 0.4) / GRPO (0.5 + 0.5) - 1 = 0
    av = pd.DataFrame({"setting": ["sharing_drmas", "nonsharing_drmas", "sharing_grpo", "nonsharing_grpo"],
                       "avg": [0.6, 0.4, 0.5, 0.5], "pass": [0.9, 0.9, 0.6, 0.9]})
    g = headline_gain(av)
    assert g["avg"] == pytest.approx(0.0) and g["pass"] == pytest.approx(1.8 / 1.5 - 1)
    # without sharing_grpo only the non-sharing pair counts: 0.4 / 0.5 - 1 = -0.2
    assert headline_gain(av[av["setting"] != "sharing_grpo"])["avg"] == pytest.approx(-0.2)


def test_prices_mirror_paper_ratio():
    prices = load_prices()
    assert prices["tiny"] / prices["nano"] == pytest.approx(0.30 / 0.06)


# ------------------------------------------------------------------------------------------ loading
def test_load_grid_robust_to_failed_partial_torn(grid, caplog):
    data = load_grid(grid)
    runs = data.runs.set_index("run")
    assert not runs.loc["math_failed_s5", "usable"] and "no run folder" in runs.loc["math_failed_s5", "problem"]
    assert not runs.loc["math_partial_s6", "usable"] and runs.loc["math_partial_s6", "status"] == "partial"
    assert runs.loc["math_partial_s6", "n_steps"] == STEPS  # the torn last line was skipped
    assert runs["usable"].sum() == len(runs) - 2 and len(data.problems) == 2
    final = final_evals(data)
    assert set(final["step"]) == {STEPS} and "math_partial_s6" not in set(final["run"])
    av = run_averages(final)
    one = final[final["run"] == "math_sharing_drmas_s0"]
    assert av.set_index("run").loc["math_sharing_drmas_s0", "avg"] == pytest.approx(one["avg"].mean())
    # tidy per-agent and per-worker-group frames
    assert {"grad_norm", "lemma_factor", "tokens"} <= set(data.agents.columns)
    assert set(data.agents.loc[data.agents["run"] == "search_hetero_drmas_s0", "agent"]) == {"verifier", "search", "answer"}
    assert "generate_s" in data.groups.columns
    hetero = data.assignment[data.assignment["run"] == "search_hetero_drmas_s0"].set_index("agent")["preset"]
    assert hetero.to_dict() == {"verifier": "tiny", "search": "nano", "answer": "nano"}


def test_load_without_index_tags_from_manifest(tmp_path):
    _write_run(tmp_path, "a", "math", "sharing_drmas", "drmas", "sharing", 0)
    _write_run(tmp_path, "b", "search", "hetero_drmas", "drmas_std_only", "hetero", 1)
    data = load_grid(tmp_path)
    tags = data.runs.set_index("run")
    assert tags.loc["a", "setting"] == "sharing_drmas" and tags.loc["a", "assignment"] == "sharing"
    assert tags.loc["b", "setting"] == "hetero:(mu,sigma_k)" and tags.loc["b", "seed"] == 1


def test_load_grid_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_grid(tmp_path / "missing")
    with pytest.raises(ValueError, match="no index.json and no run folders"):
        load_grid(tmp_path)


# ------------------------------------------------------------------------------------------ end to end
def test_report_end_to_end(grid, tmp_path):
    from analysis.report import make_report

    out, figs = tmp_path / "out", tmp_path / "figs"
    report = make_report(grid, out, figs, n_boot=200)
    text = report.read_text()
    claims = pd.read_csv(out / "tables" / "claims.csv").set_index("key")
    verdicts = claims.groupby(level=0)["verdict"].apply(list).to_dict()
    # synthetic GRPO: spikes and grad norms growing with the factor; Dr. MAS clearly better; ordering as in the paper.
    # The grid's failed and partial math runs (a GRPO / Dr. MAS pair setting each) are runs of the design of a, b and
    # c-math that their verdicts could not use: those say so (16 of the 18 pair runs, 8 of the 10 math ones)
    assert verdicts["a"] == ["incomplete (16 of 18 runs): reproduced so far", "not run"]  # the class-aware rule needs the sweep
    assert verdicts["b"] == ["incomplete (16 of 18 runs): reproduced so far"]
    assert verdicts["c"] == ["incomplete (8 of 10 runs): reproduced so far", "reproduced"]
    assert verdicts["d"] == ["reproduced"]
    assert verdicts["e"] == ["reproduced"]  # nano agents are cheaper and faster, accuracy unchanged
    assert verdicts["f"] == ["finding (no paper value)"]
    assert "| a1 |" in text and "| a2 |" in text and "needs GPU scale" in text and "## Data problems" in text
    assert claims.loc["c", "label"].tolist() == ["c-math", "c-search"]  # one key, a label each
    for stem in ("table1_math", "table2_search", "table1_math_average", "table2_search_paper", "table3_ablation_search",
                 "headline_gains", "gradnorm", "hetero_search"):
        for ext in ("md", "tex", "csv"):
            assert (out / "tables" / f"{stem}.{ext}").stat().st_size > 0, (stem, ext)
    assert "\\begin{tabular}" in (out / "tables" / "table1_math.tex").read_text()
    t1 = (out / "tables" / "table1_math.md").read_text()
    assert "Δ nonsharing" in t1 and "Average" in t1
    for stem in ("gradnorm_math_sharing", "gradnorm_search_nonsharing", "train_math", "ablation_search",
                 "reward_stats_search", "hetero_search"):
        for ext in ("png", "pdf"):
            assert (figs / f"{stem}.{ext}").stat().st_size > 0, (stem, ext)


def test_official_ablation_rows_appear_only_where_run(tmp_path):
    """The reference code's ablation estimators are Table 3 rows (with their paired difference to (mu,sigma)) where the
    grid ran them, and absent where it did not; the paper's four rows are always there."""
    from analysis.main_grid import analyze, claim_ablation
    from analysis.runs import load_grid

    root = make_grid(tmp_path / "g", tasks=("search",), seeds=(0,))
    without = analyze(load_grid(root), n_boot=50).ablation["search"]
    assert "official agent_traj (the branch's default)" not in set(without["variant"]) and len(without) == 5
    _write_run(root, "search_nonsharing_agent_traj_s0", "search", "nonsharing:agent_traj", "agent_traj", "nonsharing", 0)
    index = json.loads((root / "index.json").read_text())
    index["runs"].append({"run": "search_nonsharing_agent_traj_s0", "config": "x.yaml", "overrides": [], "task": "search",
                          "setting": "nonsharing:agent_traj", "estimator": "agent_traj", "assignment": "nonsharing",
                          "entry": "search_nonsharing_agent_traj", "seed": 0, "status": "done", "seconds": 60.0})
    (root / "index.json").write_text(json.dumps(index))
    an = analyze(load_grid(root), n_boot=50)
    row = an.ablation["search"].set_index("variant").loc["official agent_traj (the branch's default)"]
    assert row["d_avg"] > 0  # synthetic quality 0.55 against (mu,sigma)'s 0.35
    assert "the reference code's ablation estimators (no paper column): agent_traj" in claim_ablation(an).ours


def test_report_missing_runs_say_not_run(tmp_path):
    from analysis.report import make_report

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    report = make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=100, with_figures=False)
    claims = pd.read_csv(tmp_path / "out" / "tables" / "claims.csv")
    by = dict(zip(claims["claim"], claims["verdict"]))
    search = [c for c in by if "search" in c]
    assert search and all(by[c] == "not run" for c in search)
    assert "not run" in report.read_text()


# ------------------------------------------------------------------------------------------ mechanism sweep
def make_mechanism_grid(root: Path, factors: dict[float, float], seeds=(0, 1, 2),
                        search_class: dict[float, float] | None = None) -> Path:
    """Synthetic sweep: per miss level, the Answer agent's factor under a global baseline is ``factors[level]`` and
    its grad norm scales with √factor (the Lemma's prediction); the Search agent's factor is 1 throughout. With
    ``search_class``, the runs log the class-aware metrics: the Answer agent's class factor is its factor, the
    Search agent's is ``search_class[level]`` and its grad norm scales with √(class factor) instead."""
    entries = []
    for level, f in factors.items():
        for est in ("trajectory_grpo", "pooled_grpo", "drmas"):
            for seed in seeds:
                rng = np.random.default_rng(zlib.crc32(f"{level}:{est}:{seed}".encode()))
                run = f"mech_miss{level:g}_{est}_s{seed}"
                (root / run).mkdir(parents=True)
                lines = []
                for step in range(4):
                    m = {"step": step, "reward/mean": 0.5}
                    for agent, fac in (("answer", f), ("search", 1.0)):
                        own = 1.0 if est == "drmas" else fac * (1 + 0.05 * rng.standard_normal())
                        cls = fac if agent == "answer" or search_class is None else search_class[level]
                        cls *= 1 + 0.05 * rng.standard_normal()
                        norm = math.sqrt(own if search_class is None or agent == "answer" or est == "drmas" else cls)
                        m.update({f"agent/{agent}/lemma_factor": own, f"agent/{agent}/lemma_factor_max": 2 * own,
                                  f"agent/{agent}/grad_norm": norm * (1 + 0.02 * rng.standard_normal()),
                                  f"agent/{agent}/adv_m2": own})
                        if search_class is not None:
                            m.update({f"agent/{agent}/class_factor_{b}": cls for b in ("trajectory_grpo", "pooled_grpo")})
                            m[f"agent/{agent}/distinct_share"] = 0.1
                    lines.append(json.dumps(m))
                (root / run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
                (root / run / "DONE").write_text("")
                (root / run / "manifest.json").write_text(json.dumps({"config": {"train": {"evaluate": False}}}))
                entries.append({"run": run, "task": "search", "setting": f"mechanism:miss={level:g}", "estimator": est,
                                "assignment": "nonsharing", "entry": run[:-3], "seed": seed, "level": level,
                                "status": "done", "seconds": 10.0})
    (root / "index.json").write_text(json.dumps({"grid": "mechanism", "runs": entries}))
    return root


def test_mechanism_points_pair_each_baseline_with_drmas(tmp_path):
    from analysis.mechanism import mechanism_points, mechanism_verdict

    sweep = load_grid(make_mechanism_grid(tmp_path / "m", {0.0: 1.0, 0.5: 1.5, 0.75: 2.5, 0.9: 4.0}))
    assert sweep.problems == [] and sweep.runs["usable"].all()  # no evaluation by design (train.evaluate=false)
    pts = mechanism_points(sweep)
    assert set(pts["baseline"]) == {"trajectory_grpo", "pooled_grpo"} and len(pts) == 2 * 4 * 3 * 2
    answer = pts[(pts["baseline"] == "trajectory_grpo") & (pts["agent"] == "answer")].groupby("level")
    np.testing.assert_allclose(answer["factor"].mean(), [1.0, 1.5, 2.5, 4.0], rtol=0.05)
    np.testing.assert_allclose(answer["ratio"].mean(), np.sqrt([1.0, 1.5, 2.5, 4.0]), rtol=0.05)  # √factor by construction
    np.testing.assert_allclose(answer["a2_ratio"].mean(), [1.0, 1.5, 2.5, 4.0], rtol=0.05)
    v = mechanism_verdict(pts)
    assert v.verdict == "reproduced" and v.n_points == 24 and v.rho > 0.5 and v.sqrt_fit == pytest.approx(1.0, abs=0.05)
    # within one agent: the Answer agent's ratio follows its factor; the Search agent's factor is 1 at every level
    n, rho, p = v.per_agent["answer"]
    assert n == 12 and rho > 0.8 and p < 0.01
    assert v.per_agent["search"][0] == 12 and abs(v.per_agent["search"][1]) < 0.8


def test_mechanism_verdict_needs_heterogeneity_and_points(tmp_path):
    from analysis.mechanism import mechanism_points, mechanism_verdict

    flat = mechanism_points(load_grid(make_mechanism_grid(tmp_path / "flat", {0.0: 1.0, 0.5: 1.2, 0.9: 1.5})))
    assert mechanism_verdict(flat).verdict == "not produced"
    few = mechanism_points(load_grid(make_mechanism_grid(tmp_path / "few", {0.0: 1.0, 0.9: 4.0}, seeds=(0,))))
    assert mechanism_verdict(few).verdict == "not run"  # 4 points < 12


def test_report_decides_claim_a_on_the_sweep(grid, tmp_path):
    from analysis.report import make_report

    mech = make_mechanism_grid(tmp_path / "mech", {0.0: 1.0, 0.5: 1.5, 0.75: 2.5, 0.9: 4.0})
    out, figs = tmp_path / "out", tmp_path / "figs"
    text = make_report(grid, out, figs, n_boot=100, mechanism=mech).read_text()
    claims = pd.read_csv(out / "tables" / "claims.csv").set_index("key")
    paper_rule, class_rule = claims.loc["a"].iloc[0], claims.loc["a"].iloc[1]
    assert paper_rule["verdict"] == "reproduced" and "sweep over miss rate" in paper_rule["ours"]
    assert "Pooled step-level GRPO" in paper_rule["ours"]
    assert "main grid: math: largest mean factor under GRPO" in paper_rule["ours"]
    assert class_rule["verdict"] == "not run" and "class-aware" in class_rule["rule"]  # no class metrics logged
    assert "--mechanism" in text and (figs / "mechanism.png").stat().st_size > 0
    assert (out / "tables" / "mechanism.md").stat().st_size > 0


def test_class_aware_rule_predicts_where_the_paper_factor_does_not(tmp_path):
    """The Search agent's grad ratio follows √(class factor) while its Lemma factor stays 1: the class-aware
    prediction passes the rule (rank and scale), the paper's √F fails it on the same points."""
    from analysis.class_aware import class_points, class_verdict

    levels = {0.0: 1.0, 0.5: 1.5, 0.75: 2.5, 0.9: 4.0}
    grid = make_mechanism_grid(tmp_path / "m", levels, search_class={0.0: 9.0, 0.5: 0.3, 0.75: 3.0, 0.9: 20.0})
    pts = class_points(load_grid(grid))
    assert pts["class_factor"].notna().all() and (pts["distinct"] == 0.1).all()
    cls, paper = class_verdict(pts)
    assert cls.verdict == "reproduced" and cls.n_points == 24 and cls.median_ratio == pytest.approx(1.0, abs=0.05)
    assert cls.rho > 0.9 and cls.p < 1e-6
    assert paper.verdict == "not reproduced" and paper.rho < cls.rho
    from analysis.figures import fig_class_aware

    assert fig_class_aware(pts) is not None and fig_class_aware(pts.assign(pred_class=np.nan)) is None
    # a prediction off in scale fails the rule even when its ranks are right
    off = pts.assign(pred_class=pts["pred_class"] * 3)
    from analysis.class_aware import judge_prediction

    j = judge_prediction(off[off["baseline"] == "trajectory_grpo"], "pred_class", "class_factor", "class_factor_step0", "x")
    assert j.verdict == "not reproduced" and "scale off" in j.reason


def test_regenerating_the_analysis_is_byte_identical(tmp_path):
    """The same runs give the same bytes in every file the analysis writes (PDF/PNG without dates or software
    stamps, tables, REPORT.md), so a rerun of run_all.sh leaves `git status` clean."""
    from analysis.report import make_report

    small = make_grid(tmp_path / "grid", tasks=("search",), seeds=(0,))  # a small set of runs: every kind of figure
    mech = make_mechanism_grid(tmp_path / "mech", {0.0: 1.0, 0.9: 4.0}, seeds=(0,))
    written = []
    for name in ("first", "second"):
        root = tmp_path / name
        make_report(small, root / "out", root / "figs", n_boot=20, mechanism=mech)
        written.append({p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()})
    assert written[0].keys() == written[1].keys() and any(p.suffix == ".pdf" for p in written[0])
    changed = [str(p) for p in written[0] if written[0][p] != written[1][p]]
    assert not changed, f"differ between two runs on the same data: {changed}"


def test_report_opens_with_a_verdict_table_then_one_section_per_claim(grid, tmp_path):
    """REPORT.md's layout: a short verdict table (claim, paper, ours in one number, verdict), then a section per
    claim with its rule, statistics and inline figure; a judge that returns only claim/paper/ours/verdict
    still renders (first clauses in the table, every clause a bullet)."""
    from analysis import report as rep
    from analysis.claims import FINDING, ClaimSpec, Judged

    inputs, given = rep.load_inputs(grid, seed=0, n_boot=50)
    an = rep.assemble(inputs, given=given)
    bare = ClaimSpec("z", judge=lambda an: Judged("a new claim", "paper 1; more", "ours 2 (x; y); z 3", FINDING),
                     rule="a rule")
    claims = [*an.claims(), bare.evaluate(an)]
    figs = {"ablation_search": tmp_path / "figs" / "ablation_search.png"}
    text = rep.report_markdown(an, claims, tmp_path, tmp_path / "tables", list(figs.values()), grid)
    assert "The *design* column says which test judged a claim" in text.split("\n\n")[2]
    table = text.split("\n\n")[3].splitlines()
    assert table[0] == "| label | claim | design | paper | ours | verdict |" and len(table) == 2 + len(claims)
    assert all(len(row) < 400 for row in table), "verdict table cells must stay short"
    assert "| z | [a new claim](#z-a-new-claim) | main grid | paper 1 | ours 2 (x; y) | **finding (no paper value)** |" in table
    designs = {row.split(" | ")[0].strip("| "): row.split(" | ")[2] for row in table[2:]}
    assert designs["S-g"] == "exploratory" and designs["C1"] == "confirmatory" and designs["c-math"] == "main grid"
    assert len(designs) == len(claims), "every claim has its own label"
    section = text.split("## z a new claim")[1].split("\n## ")[0]
    assert "- **Rule.** a rule" in section and "  - ours 2 (x; y)\n  - z 3" in section
    d = text.split("## d ")[1].split("\n## ")[0]
    assert "![ablation_search](figs/ablation_search.png)" in d and "Kendall tau" in d
    assert rep.summary_text(claims, Path("R.md")).splitlines()[-1] == "full report: R.md"
    # the (mu,sigma_k) variant's pre-clip norms are stated in words in d and f, with the runs' own numbers
    an = an.analyses[0][1]
    gn = an.gradnorm[(an.gradnorm["task"] == "search") & an.gradnorm["seed"].isin(an.ablation_seeds["search"])]
    peaks = gn[gn["setting"] == "nonsharing:(mu,sigma_k)"].groupby("run")["max"].max()
    sentence = f"per-run peaks {peaks.min():.3g} to {peaks.max():.3g} over seeds"
    assert sentence in d and sentence in text.split("## f ")[1].split("\n## ")[0]
    assert f"Dr. MAS's peak {gn.loc[gn['setting'] == 'nonsharing_drmas', 'max'].max():.3g}" in d


def test_paper_gains_in_points():
    """The report's one convention: the paper's headline gains as absolute points, the mean Dr. MAS − GRPO of its
    Average rows over the four multi-agent settings (math: (2.2 + 3.6 + 4.5 + 2.6) / 4 = 3.225 points)."""
    from analysis.formatting import fmt_pts
    from analysis.tables import paper_gain_pts

    paper = load_paper()
    assert paper_gain_pts(paper, "math", "average_rows")["avg"] == pytest.approx(0.03225)
    assert fmt_pts(paper_gain_pts(paper, "math")["avg"]) == "+3.2 pts"
    assert fmt_pts(paper_gain_pts(paper, "search")["avg"]) == "+5.3 pts"


# ------------------------------------------------------------------------------------------ the committed report
ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "results" / "REPORT.md"


def _verdict_table(text: str) -> list[list[str]]:
    """The cells of the committed report's verdict table (label, claim, design, paper, ours, verdict)."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and "](#" in line]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def test_committed_report_labels_are_unique_and_each_claim_has_a_gloss():
    """Every claim of REPORT.md has its own label (the table's first column and its section heading), and the
    line right under the heading glosses the claim's terms."""
    text = COMMITTED.read_text()
    labels = [row[0] for row in _verdict_table(text)]
    assert len(labels) >= 20 and len(labels) == len(set(labels)), labels
    fixed = {"Terms", "Where the numbers are", "Data problems"}
    headings = [h for h in (line[3:] for line in text.splitlines() if line.startswith("## ")) if h not in fixed]
    assert [h.split(" ", 1)[0] for h in headings] == labels
    for h in headings:
        after = text.split(f"## {h}\n\n", 1)[1]
        assert after.startswith("*Terms:* "), h
    assert {"C1", "C2", "C3", "C4", "C5"} <= set(labels)


def test_committed_report_gives_gains_in_one_convention():
    """Gains are absolute points (pts): no signed relative percentage anywhere in REPORT.md (the old report put
    "+2.8 % avg@4" beside "+0.2 ± 0.4 pts"), and the paper's headline gains are given in points."""
    text = COMMITTED.read_text()
    relative = re.compile(r"[+\-−]\d+(\.\d+)? ?%")
    assert not [line for line in text.splitlines() if relative.search(line)]
    from analysis.formatting import fmt_pts
    from analysis.tables import paper_gain_pts

    rows = {row[0]: row for row in _verdict_table(text)}
    for task in ("math", "search"):
        assert rows[f"c-{task}"][3] == f"{fmt_pts(paper_gain_pts(load_paper(), task)['avg'])} avg@16"
        assert re.fullmatch(r"[+\-]\d+\.\d ± \d+\.\d pts avg@\d+ \(paired\)", rows[f"c-{task}"][4])


JARGON = {"factor": "Lemma factor", "class-aware": "class-aware factor", "grad-norm ratio": "grad-norm ratio",
          "rho": "rho", "spike": "spike", "pts": "pts", "avg@": "avg@k / pass@k", "Kendall tau": "Kendall tau",
          "×": "×", "frontier": "frontier", "collaps": "collapse", "auc": "auc", "HR ": "HR",
          "pre-clip": "pre-clip norm", "twin": "twin", "LR50": "frontier", "abandon": "abandonment",
          "incomplete": "incomplete (n of N runs)", "exploratory": "exploratory / confirmatory",
          "confirmatory": "exploratory / confirmatory", "[": "±, [low, high]", "±": "±, [low, high]"}
"""A term a verdict line may use -> the glossary entry that defines it."""


def test_committed_report_defines_every_term_of_its_verdict_lines():
    """Each term a verdict line uses (the verdict table's rows, each section's "**verdict**: ours ...; paper ..."
    line) has its line in the Terms section, among them the Lemma factor, the class-aware factor and frontier."""
    text = COMMITTED.read_text()
    terms = text.split("\n## Terms\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    defined = {line[4:].split("**:", 1)[0] for line in terms}
    assert {"Lemma factor", "class-aware factor", "frontier", "pre-clip norm", "collapse"} <= defined
    assert "(σk² + (μk − μ)²)/σ²" in next(t for t in terms if t.startswith("- **Lemma factor**"))
    assert "1/2" in next(t for t in terms if t.startswith("- **frontier**"))
    verdict_lines = [" | ".join(row) for row in _verdict_table(text)]
    verdict_lines += [line for line in text.splitlines() if line.startswith("**") and ": ours " in line]
    used = {entry for line in verdict_lines for word, entry in JARGON.items() if word in line}
    assert used - defined == set()
    assert {"Lemma factor", "class-aware factor", "frontier"} <= used


def _logged_peaks(run_glob: str) -> dict[str, float]:
    """Per run folder, the largest pre-clip norm any agent logged (agent/*/grad_norm of metrics.jsonl)."""
    out = {}
    for run in sorted((ROOT / "results" / "runs" / "cpu").glob(run_glob)):
        norms = [v for line in (run / "metrics.jsonl").read_text().splitlines()
                 for k, v in json.loads(line).items() if k.startswith("agent/") and k.endswith("/grad_norm")
                 and isinstance(v, (int, float)) and math.isfinite(v)]
        out[run.name] = max(norms)
    return out


def test_committed_report_states_the_std_only_norms_from_the_runs():
    """The (mu,sigma_k) ablation's pre-clip norms (the grid's largest) are in the words of claims d and f, equal to
    the max of the norms its runs logged, with Dr. MAS's peak, the ε cause and the paper's Table 3 value."""
    text = COMMITTED.read_text()
    mixed = _logged_peaks("search_nonsharing_std_only_s*")
    drmas = _logged_peaks("search_nonsharing_drmas_s*")
    assert len(mixed) == 3 and min(mixed.values()) > 1e4
    paper = load_paper().set_index("setting")
    for label in ("d", "f"):
        section = text.split(f"\n## {label} ", 1)[1].split("\n## ")[0]
        line = next(line for line in section.splitlines() if "pre-clip norm of (μ,σk)" in line)
        assert f"per-run peaks {min(mixed.values()):.3g} to {max(mixed.values()):.3g} over seeds 0, 1, 2" in line
        assert f"Dr. MAS's peak {max(drmas.values()):.3g}" in line
        assert "σk + ε (ε = 1e-06)" in line and "σk = 0" in line
        assert f"(μ,σk) at {paper.loc['nonsharing:(mu,sigma_k)', 'avg_at_16']:.1f} avg@16" in line
