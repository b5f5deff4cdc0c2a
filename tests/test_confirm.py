"""The confirmatory stability round's analysis (analysis/confirm.py) on synthetic grids whose outcomes are known, and
its statistics against slow references written here."""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import confirm, events
from analysis.formatting import fmt_interval
from analysis.runs import load_grid

AGENTS = ("verifier", "search", "answer")
STEPS = 80


def write_run(root: Path, est: str, lr: float, seed: int, collapse_at: int | None, abandon: str | None = None,
              clip: str = "on", done: bool = True, grpo_norm: float = 1.0) -> dict:
    """One run folder: reward flat at 0.3 until ``collapse_at`` (then 0.02: the reward clause fires there), or the
    agent ``abandon`` no longer called from ``collapse_at``; every agent's norm 1 (GRPO's Answer: ``grpo_norm``)."""
    name = f"conf_{'grpo' if est == 'trajectory_grpo' else 'drmas'}_lr{lr:g}{'_noclip' if clip == 'off' else ''}_s{seed}"
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    run = root / name
    run.mkdir(parents=True)
    clip_norm = 1.0e9 if clip == "off" else 1.0
    (run / "manifest.json").write_text(json.dumps({"name": name, "git_commit": "abc123", "config": {
        "env": {"name": "search_generated", "orchestra": "search"},
        "models": {f"{a}_model": {"preset": "nano", "optim": {"lr": lr, "max_grad_norm": clip_norm}} for a in AGENTS},
        "agents": [{"name": a, "model": f"{a}_model"} for a in AGENTS], "algo": {"estimator": est},
        "train": {"seed": seed}}, "seeds": {"train": seed}}))
    lines = []
    for step in range(STEPS):
        late = collapse_at is not None and step >= collapse_at
        m = {"step": step, "train/nonfinite": 0, "timing/step": 2.0 + 0.5 * (step % 2),
             "reward/mean": 0.02 if late and abandon is None else 0.3 + 0.02 * rng.random()}
        for a in AGENTS:
            m[f"agent/{a}/calls_per_traj"] = 0.0 if late and a == abandon else 1.0 + 0.1 * rng.random()
            norm = (grpo_norm if est == "trajectory_grpo" and a == "answer" else 1.0) * (1 + 0.05 * rng.random())
            m[f"agent/{a}/grad_norm"] = norm
            m[f"wg/{a}_model/grad_norm"] = norm
            m[f"wg/{a}_model/skipped"] = 0.0
            m[f"wg/{a}_model/update_norm"] = 0.01 * norm if clip == "off" else 0.01
        lines.append(json.dumps(m))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    evals = []
    for step in (0, 40, STEPS):
        succ = np.random.default_rng(zlib.crc32(f"{name}{step}".encode())).binomial(4, 0.4, size=16)
        evals.append(json.dumps({"step": step, "benchmark": "kb", "avg": float(succ.mean() / 4),
                                 "pass": float((succ > 0).mean()), "k": 4, "n_tasks": 16, "successes": succ.tolist()}))
    (run / "eval.jsonl").write_text("\n".join(evals) + "\n")
    if done:
        (run / "DONE").write_text("")
    return {"run": name, "config": "x.yaml", "overrides": [], "task": "search", "setting": f"stability:lr={lr:g}",
            "estimator": est, "assignment": "nonsharing", "entry": name.rsplit("_s", 1)[0], "seed": seed,
            "level": lr, "status": "done" if done else "partial", "seconds": 60.0}


LRS = (2.8e-4, 4.0e-4, 5.7e-4)


def make_grid(root: Path, seeds=range(6), grpo_collapses=True, unfinished: int = 0, clip_dial: bool = False) -> Path:
    """GRPO collapses (the reward clause, or the Answer agent abandoned on odd seeds) at step 30-45, earlier at higher
    levels; Dr. MAS never does. GRPO's Answer norm is 3x Dr. MAS's."""
    root.mkdir(parents=True)
    entries = []
    cells = [(est, lr, s) for s in seeds for lr in LRS for est in ("trajectory_grpo", "drmas")]
    for i, (est, lr, s) in enumerate(cells):
        at = 45 - 5 * LRS.index(lr) + s if (est == "trajectory_grpo") == grpo_collapses else None
        entries.append(write_run(root, est, lr, s, at, abandon="answer" if s % 2 else None,
                                 done=i < len(cells) - unfinished, grpo_norm=3.0))
    if clip_dial:
        for s in seeds:
            for est in ("trajectory_grpo", "drmas"):
                entries.append(write_run(root, est, 4.0e-4, s, 30 if est == "trajectory_grpo" else None, clip="off",
                                         grpo_norm=3.0))
    (root / "index.json").write_text(json.dumps({"grid": "stability_confirm", "runs": entries}))
    return root


def test_declared_agents_come_from_the_orchestra(tmp_path):
    grid = make_grid(tmp_path / "g", seeds=[0])
    run = next(p for p in grid.iterdir() if p.is_dir())
    assert events.declared_agents(run) == AGENTS


def test_collapse_event_watches_every_agent(tmp_path):
    grid = make_grid(tmp_path / "g", seeds=[0, 1])
    data = load_grid(grid)
    events = confirm.event_table(data).set_index("run")
    # seed 1 at 4e-4: the Answer agent is no longer called from step 41; its 10-step mean falls below a quarter of
    # its early level 8 steps later, and the clause names the first step of that sustained stretch
    r = events.loc["conf_grpo_lr0.0004_s1"]
    assert r["event"] == 1 and r["reason"] == "abandoned:answer" and r["abandoned"] == "answer"
    assert 40 <= r["time"] <= 50
    r = events.loc["conf_grpo_lr0.0004_s0"]
    assert r["event"] == 1 and r["reason"] == "reward" and r["abandoned"] == ""
    r = events.loc["conf_drmas_lr0.0004_s0"]
    assert r["event"] == 0 and r["time"] == STEPS - 1 and r["reason"] == ""


def _logrank_by_hand(t, e, g):
    """Two-sided log-rank p of two groups (no strata), the textbook sums over distinct event times."""
    from scipy.stats import chi2

    o_minus_e, var = 0.0, 0.0
    for time in np.unique(t[e == 1]):
        at_risk = t >= time
        n, n1 = at_risk.sum(), (at_risk & (g == 1)).sum()
        d = ((t == time) & (e == 1)).sum()
        d1 = ((t == time) & (e == 1) & (g == 1)).sum()
        o_minus_e += d1 - d * n1 / n
        if n > 1:
            var += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1)
    return float(chi2.sf(o_minus_e ** 2 / var, 1)), o_minus_e


def test_time_to_collapse_matches_a_hand_log_rank():
    rng = np.random.default_rng(3)
    t = np.minimum(rng.exponential(100, 24), 200).round()
    e = (t < 200).astype(int)
    g = np.repeat([1, 0], 12)
    events = pd.DataFrame({"time": t, "event": e, "estimator": np.where(g == 1, "trajectory_grpo", "drmas"),
                           "lr": 4e-4})
    c1 = confirm.time_to_collapse(events)
    p_two, o_minus_e = _logrank_by_hand(t, e, g)
    assert c1["p_two_sided"] == pytest.approx(p_two, rel=1e-6)
    assert c1["p"] == pytest.approx(p_two / 2 if o_minus_e > 0 else 1 - p_two / 2, rel=1e-6)


def test_verdicts_on_a_grid_where_grpo_collapses(tmp_path):
    an = confirm.analyze(load_grid(make_grid(tmp_path / "g")), n_boot=200)
    assert an.complete and an.c1["events"] == 18 and an.c1["hr"] > 1
    assert an.verdicts["C1"] == "reproduced"
    any_row = an.c2[an.c2["agent"] == "any"].iloc[0]
    assert (any_row["grpo"], any_row["drmas"]) == (9, 0) and an.verdicts["C2"] == "reproduced"
    answer = an.c3[(an.c3["stat"] == "p95") & (an.c3["agent"] == "answer")].iloc[0]
    assert answer["above"] == 18 and answer["median_ratio"] == pytest.approx(3.0, rel=0.1)
    assert an.verdicts["C3"] == "reproduced"
    medians = an.c1["medians"]
    assert (medians.loc[medians["estimator"] == "drmas", "median"] == math.inf).all()  # never collapses


def test_the_mirror_grid_is_refuted_and_an_unfinished_run_marks_incomplete(tmp_path):
    an = confirm.analyze(load_grid(make_grid(tmp_path / "g", grpo_collapses=False)), n_boot=200)
    assert an.verdicts["C1"] == "refuted" and an.c1["hr"] < 1
    an = confirm.analyze(load_grid(make_grid(tmp_path / "h", unfinished=2)), n_boot=200)
    assert not an.complete and an.verdicts["C1"].startswith("incomplete (34 of 36 runs)")


def test_the_summary_gives_the_step_time_of_the_finished_runs(tmp_path):
    """The cost section sums each finished run's timing/step records (2 s and 2.5 s on alternate steps here) and
    leaves the unfinished runs out."""
    an = confirm.analyze(load_grid(make_grid(tmp_path / "g", unfinished=2)), n_boot=50)
    cost = an.data.step_seconds(an.events["run"])
    assert len(cost) == an.finished == an.total - 2
    assert cost.tolist() == [2.25 * STEPS] * len(cost)
    text = confirm.summary_markdown(an, tmp_path / "g")
    assert (f"Step time of the {len(cost)} finished runs" in text
            and f"{2.25 * STEPS * len(cost) / 3600:.1f} h in all, median {2.25 * STEPS:,.0f} s per run" in text)


def test_frontier_recovers_a_known_logistic_and_names_separation():
    rng = np.random.default_rng(0)
    lrs = np.repeat([2.8e-4, 4e-4, 5.7e-4], 40)
    truth = 4e-4
    p = 1 / (1 + np.exp(-3 * (np.log2(lrs) - np.log2(truth))))
    rows = [{"estimator": est, "lr": lr, "event": int(rng.random() < pi)} for est in ("trajectory_grpo", "drmas")
            for lr, pi in zip(lrs, p)]
    out = confirm.frontier(pd.DataFrame(rows), rng, n_boot=300).set_index("estimator")
    assert out.loc["trajectory_grpo", "low"] < truth < out.loc["trajectory_grpo", "high"]
    assert 3e-4 < out.loc["trajectory_grpo", "lr50"] < 5.5e-4
    sep = pd.DataFrame([{"estimator": "trajectory_grpo", "lr": lr, "event": int(lr > 3e-4)} for lr in lrs] +
                       [{"estimator": "drmas", "lr": lr, "event": 0} for lr in lrs])
    out = confirm.frontier(sep, rng, n_boot=50).set_index("estimator")
    assert out.loc["trajectory_grpo", "note"].startswith("between 0.00028 and 0.0004")
    assert out.loc["drmas", "note"] == "above the grid"
    assert out.loc["drmas", "low"] == pytest.approx(5.7e-4) and out.loc["drmas", "high"] == math.inf


def test_frontier_outside_the_grid_leaves_the_ratio_open_on_that_side():
    """An estimator that collapses at every level has LR50 somewhere in (0, lowest level]: the edge it is drawn at is a
    bound, not a value. Both below the grid: the ratio is not identified ((0, inf), inconclusive), never [1, 1].
    GRPO below and Dr. MAS above: the ratio is at least highest / lowest level, with no upper bound."""
    rng = np.random.default_rng(0)
    lrs = np.repeat([2.8e-4, 4e-4, 5.7e-4], 6)
    both_below = pd.DataFrame([{"estimator": est, "lr": lr, "event": 1} for est in ("trajectory_grpo", "drmas")
                               for lr in lrs])
    out = confirm.frontier(both_below, rng, n_boot=50)
    assert out.set_index("estimator").loc["drmas", "low"] == 0.0
    point, low, high = out.attrs["ratio"]
    assert math.isnan(point) and low == 0.0 and high == math.inf
    apart = pd.DataFrame([{"estimator": "trajectory_grpo", "lr": lr, "event": 1} for lr in lrs] +
                         [{"estimator": "drmas", "lr": lr, "event": 0} for lr in lrs])
    _, low, high = confirm.frontier(apart, rng, n_boot=50).attrs["ratio"]
    assert low == pytest.approx(5.7e-4 / 2.8e-4) and high == math.inf
    assert fmt_interval(low, high) == "[2.04, ∞]"


def test_frontier_quasi_separation_is_a_bracket_not_a_fitted_point():
    """Collapses and non-collapses meeting at one level (5 of 6 at the lowest level, all above it) have no finite
    maximum-likelihood fit: the LR50 is bracketed by the levels where the collapsed fraction crosses 1/2, never a
    point the optimiser stopped at. A level with 2 of 6 collapsed is below the crossing."""
    rng = np.random.default_rng(0)
    lrs = [2.8e-4, 4e-4, 5.7e-4]

    def runs(est, counts):
        return [{"estimator": est, "lr": lr, "event": int(i < k)} for lr, k in zip(lrs, counts) for i in range(6)]

    out = confirm.frontier(pd.DataFrame(runs("trajectory_grpo", [5, 6, 6]) + runs("drmas", [6, 6, 6])), rng, n_boot=50)
    row = out.set_index("estimator").loc["trajectory_grpo"]
    assert row["note"] == "below the grid" and math.isnan(row["lr50"]) and row["low"] == 0.0
    assert out.attrs["ratio"][1:] == (0.0, math.inf)  # both below the grid: not identified
    out = confirm.frontier(pd.DataFrame(runs("trajectory_grpo", [0, 2, 6]) + runs("drmas", [0, 3, 6])), rng, n_boot=50)
    frame = out.set_index("estimator")
    assert frame.loc["trajectory_grpo", "note"] == "between 0.0004 and 0.00057 (separated)"
    assert frame.loc["drmas", "note"] == "at 0.0004 (separated)" and frame.loc["drmas", "lr50"] == pytest.approx(4e-4)


def test_clip_dial_reads_the_runs_own_config(tmp_path):
    an = confirm.analyze(load_grid(make_grid(tmp_path / "g", seeds=range(3), clip_dial=True)), n_boot=100)
    assert set(an.events.loc[an.events["clip"] == "off", "arm"]) == {"clip_dial"}
    assert (an.events["arm"] == "main").sum() == 18  # the main-arm claims leave the dial's runs out
    updates = an.c5["updates"].set_index(["clip", "model"])
    assert updates.loc[("off", "answer_model"), "median_ratio"] == pytest.approx(3.0, rel=0.1)
    assert updates.loc[("on", "answer_model"), "median_ratio"] == pytest.approx(1.0)
    assert an.c5["off"]["events"] == 3


def test_cli_refuses_a_missing_folder(tmp_path):
    assert confirm.main(["--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_report_judges_name_the_verdict_and_its_numbers(tmp_path):
    from analysis.claims import CONFIRMATORY, Judged

    an = confirm.analyze(load_grid(make_grid(tmp_path / "g")), n_boot=100)
    j = confirm.judge(an, "C1")
    assert isinstance(j, Judged) and j.design == CONFIRMATORY
    assert j.verdict == "reproduced" and "18 collapses in 36 runs" in j.ours and j.headline.startswith("HR ")
    assert confirm.judge(an, "C2").verdict == "reproduced"
    assert "answer: 18/18 above" in confirm.judge(an, "C3").headline
    missing = confirm.judge(None, "C1")
    assert missing.verdict == "not run" and "has not run" in missing.ours and missing.design == CONFIRMATORY
    assert confirm.STUDY.load(tmp_path / "nothing") is None
    (tmp_path / "empty").mkdir()
    assert confirm.STUDY.load(tmp_path / "empty") is None  # a round's folder before its first run: "not run"


def test_the_committed_report_labels_the_confirmatory_verdicts_c1_to_c5_and_says_they_are_confirmatory():
    """REPORT.md's first table keeps the confirmatory labels C1-C5 (and C-acc), then the frontier round's C6 rows,
    each with design "confirmatory" and a gloss under its heading, and no other row carries that design."""
    from analysis import frontier

    text = (Path(__file__).resolve().parent.parent / "results" / "REPORT.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and "](#" in line]
    confirmatory = [row[0] for row in rows if row[2] == "confirmatory"]
    assert [label for label, _ in confirm.LABELS.values()] == ["C1", "C2", "C3", "C4", "C5", "C-acc"]
    assert confirmatory == [label for label, _ in confirm.LABELS.values()] + list(frontier.CLAIMS)
    assert list(confirm.LABELS) == list(confirm.CLAIMS)
    for label in confirmatory:
        assert text.split(f"\n## {label} ", 1)[1].split("\n\n", 2)[1].startswith("*Terms:* "), label


def test_c2_is_the_cmh_test_the_rule_names_without_a_continuity_correction():
    """C2's rule names a Cochran-Mantel-Haenszel test and no continuity correction; the corrected p is kept beside it
    (docs/stability.md, "Deviations")."""
    from statsmodels.stats.contingency_tables import StratifiedTable

    rows = []
    hits = {(2.8e-4, confirm.GRPO): 4, (2.8e-4, confirm.DRMAS): 1, (4e-4, confirm.GRPO): 5, (4e-4, confirm.DRMAS): 3}
    for (lr, est), k in hits.items():
        rows += [{"lr": lr, "estimator": est, "abandoned": "answer" if i < k else "", "agents": "search,answer"}
                 for i in range(6)]
    c2 = confirm.abandonment(pd.DataFrame(rows)).set_index("agent")
    tables = [np.array([[4, 2], [1, 5]], float), np.array([[5, 1], [3, 3]], float)]
    st = StratifiedTable(tables)
    assert c2.loc["any", "p"] == pytest.approx(st.test_null_odds(correction=False).pvalue / 2, rel=1e-12)
    assert c2.loc["any", "p_continuity_corrected"] == pytest.approx(st.test_null_odds(correction=True).pvalue / 2)
    assert c2.loc["any", "p"] < c2.loc["any", "p_continuity_corrected"]


def test_the_committed_summary_records_what_the_round_measured_and_its_two_split_twin_pairs():
    """The Record section recomputes docs/stability.md's reading from the run folders: no run rose before its
    collapse, and the two twin pairs drawn on different machines are named."""
    text = (Path(__file__).resolve().parents[1] / "results/stability_confirm/summary.md").read_text()
    assert "slope > 0, one-sided p < 0.05): 0 of 48" in text
    assert "22 of 24; differing: clip_dial arm 0.0004 seed 1002, main arm 0.00057 seed 1002" in text
    assert "## Deviations from the written rules" in text
