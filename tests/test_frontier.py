"""The frontier round's analysis (analysis/frontier.py, analysis/frontier_rules.py) on synthetic grids whose
outcomes are known, and its statistics against slow references written here."""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from analysis import frontier, frontier_rules
from analysis.frontier_design import ladder_level
from analysis.runs import load_grid
from analysis.stats import lognormal_aft

AGENTS = ("verifier", "search", "answer")
STEPS = 200
GRPO, DRMAS = "trajectory_grpo", "drmas"


def write_run(root: Path, arm: str, est: str, lr: float, seed: int, onset: int | None, learn: bool = False,
              share_answer: float = 0.5) -> dict:
    """One search run folder: reward flat near 0.3 until ``onset`` (then 0.02, so the reward clause's onset is
    there), 32 eval questions every 25 steps (``learn``: every question +1 success from step 25 on), a shared
    model's per-agent shares (Answer ``share_answer``, the rest split)."""
    tag = "non" if arm == "nonsharing" else "sha"
    name = f"t_{tag}_{'grpo' if est == GRPO else 'drmas'}_lr{lr:g}_s{seed}"
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    run = root / name
    run.mkdir(parents=True)
    models = ({"shared": {"preset": "nano", "optim": {"lr": lr}}} if arm == "sharing" else
              {f"{a}_model": {"preset": "nano", "optim": {"lr": lr}} for a in AGENTS})
    agents = [{"name": a, "model": "shared" if arm == "sharing" else f"{a}_model"} for a in AGENTS]
    (run / "manifest.json").write_text(json.dumps({"name": name, "git_commit": "abc123", "config": {
        "env": {"name": "search_generated", "orchestra": "search"}, "models": models, "agents": agents,
        "algo": {"estimator": est}, "train": {"seed": seed}}, "seeds": {"train": seed}}))
    lines = []
    for step in range(STEPS):
        late = onset is not None and step >= onset + 9  # the 10-step mean crosses half its peak at ``onset``
        m = {"step": step, "train/nonfinite": 0, "timing/step": 2.0,
             "reward/mean": 0.02 if late else 0.3 + 0.02 * rng.random()}
        for a in AGENTS:
            m[f"agent/{a}/calls_per_traj"] = 1.0 + 0.1 * rng.random()
            m[f"agent/{a}/grad_norm"] = 1.0
        if arm == "sharing":
            rest = (1 - share_answer) / 2
            m.update({"agent/answer/grad_share": share_answer, "agent/search/grad_share": rest,
                      "agent/verifier/grad_share": rest, "wg/shared/grad_norm": 1.0, "wg/shared/skipped": 0.0,
                      "wg/shared/grad_cos/answer~search": 0.1, "wg/shared/grad_cos/answer~verifier": -0.2,
                      "wg/shared/grad_cos/search~verifier": 0.0})
        else:
            m.update({f"wg/{a}_model/grad_norm": 1.0 for a in AGENTS} | {f"wg/{a}_model/skipped": 0.0 for a in AGENTS})
        lines.append(json.dumps(m))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    base = np.random.default_rng(zlib.crc32(f"{name}q".encode())).binomial(3, 0.4, size=32)
    evals = []
    for step in range(0, STEPS + 1, 25):
        succ = np.minimum(base + (1 if learn and step > 0 else 0), 4)
        for bench, part in (("kb-1hop", succ[:18]), ("kb-2hop", succ[18:])):
            evals.append(json.dumps({"step": step, "benchmark": bench, "avg": float(part.mean() / 4),
                                     "pass": float((part > 0).mean()), "k": 4, "n_tasks": len(part),
                                     "successes": part.tolist()}))
    (run / "eval.jsonl").write_text("\n".join(evals) + "\n")
    (run / "DONE").write_text("")
    return {"run": name, "config": "x.yaml", "overrides": [], "task": "search", "setting": f"frontier:lr={lr:g}",
            "estimator": est, "assignment": arm, "entry": name.rsplit("_s", 1)[0], "seed": seed, "level": lr,
            "status": "done", "seconds": 60.0}


def make_grid(root: Path, thresholds: dict[tuple[str, str], float], levels: list[float],
              seeds=frontier_rules.ROUND_SEEDS, learn_seeds=frontier_rules.LEARN_SEEDS) -> Path:
    """A round whose runs collapse (onset 100) exactly at and above each (arm, estimator)'s threshold lr, plus the
    "where both learn" runs at 5e-5 (Dr. MAS learns, GRPO does not; none collapses)."""
    entries = []
    for (arm, est), thr in thresholds.items():
        for lr in levels:
            for seed in seeds:
                entries.append(write_run(root, arm, est, lr, seed, 100 if lr >= thr * 0.999 else None, learn=True,
                                         share_answer=0.7 if est == DRMAS else 0.4))
    for est in (GRPO, DRMAS):
        for seed in learn_seeds:
            entries.append(write_run(root, "nonsharing", est, 5e-5, seed, None, learn=est == DRMAS))
    (root / "index.json").write_text(json.dumps({"grid": "frontier", "runs": entries}))
    return root


LEVELS = [ladder_level(j) for j in range(-2, 5)]  # 7.07e-5 .. 2e-4, quarter octaves


@pytest.fixture(scope="module")
def shifted(tmp_path_factory) -> frontier.Round:
    """Non-sharing: Dr. MAS's threshold one octave above GRPO's; shared: the same threshold for both."""
    root = make_grid(tmp_path_factory.mktemp("frontier"), {
        ("nonsharing", GRPO): ladder_level(-1), ("nonsharing", DRMAS): ladder_level(3),
        ("sharing", GRPO): ladder_level(1), ("sharing", DRMAS): ladder_level(1)}, LEVELS, seeds=(3000, 3001))
    return frontier.analyze(load_grid(root), draws=60, n_boot=200)


def test_events_collapse_by_each_horizon_from_the_onset(shifted):
    ev = shifted.events
    hit = ev[ev["onset"].notna()]
    assert len(hit) and (hit["reason"] == "reward").all()
    # onset 100: confirmed by 150 and 200, not by 100 (onset must be <= H - 20)
    assert hit["collapsed_200"].all() and hit["collapsed_150"].all() and not hit["collapsed_100"].any()
    assert set(ev["part"]) == {"round", "learn"}
    # every round run learned (+1 success on every question from step 25), so each collapse learned first
    rnd = ev[ev["part"] == "round"]
    assert (rnd["learned"] == 25).all()
    assert (rnd["learned_then_broke"] == rnd["collapsed_200"]).all()


def test_the_shift_reads_as_the_design_says(shifted):
    n = shifted.fronts[("nonsharing", 200)]
    s = shifted.fronts[("sharing", 200)]
    assert 2 ** n.x50_grpo < 1e-4 < 2 ** n.x50_drmas  # thresholds 8.41e-5 and 1.68e-4
    assert n.delta == pytest.approx(1.0, abs=0.3) and n.ci[0] > 0
    assert abs(s.delta) < 1e-9
    assert shifted.verdicts["C6-n"] == "moves up"
    assert shifted.verdicts["C6-s"] == "differs; shared arm no shift (equivalent)"
    # by 100 steps nothing has collapsed (onsets at 100): both LR50s sit at the span's top edge, Δ = 0
    assert shifted.fronts[("nonsharing", 100)].delta == 0
    i = shifted.interactions[200]
    assert i["estimate"] == pytest.approx(s.delta - n.delta)
    assert i["low"] <= i["estimate"] <= i["high"] and 0 <= i["p"] <= 1
    assert shifted.tests["p_holm_C6-n"] >= shifted.tests["p_C6-n"] and shifted.tests["p_C6-s"] > 0
    aft = shifted.aft["nonsharing"]
    assert aft["ratio"] < 1 and aft["high"] < 1 and aft["events"] == 16  # GRPO collapses at lower lrs: sooner
    words = "; ".join(frontier.arm_words(shifted, "nonsharing"))
    assert "H = 100: LR50 GRPO above the levels (no collapse up to 0.0002)" in words


def test_shares_and_cosines_are_summarised_per_estimator_and_twin(shifted):
    sh = shifted.shares["by_estimator"]
    answer = sh[(sh["measure"] == "share") & (sh["agent"] == "answer")].set_index(["lr", "estimator"])["median"]
    assert set(answer.xs(DRMAS, level="estimator").round(6)) == {0.7}
    assert set(answer.xs(GRPO, level="estimator").round(6)) == {0.4}
    paired = shifted.shares["paired"]
    diff = paired[(paired["measure"] == "share") & (paired["agent"] == "answer")]
    assert np.allclose(diff["median_diff"], 0.3) and (diff["pairs"] == 2).all()
    assert set(sh.loc[sh["measure"] == "cosine", "agent"]) == {"answer~search", "answer~verifier", "search~verifier"}
    pooled = shifted.shares["pooled"].set_index(["measure", "agent", "estimator"])
    assert pooled.loc[("share", "answer", DRMAS), "median"] == pytest.approx(0.7)
    assert pooled.loc[("share", "search", GRPO), "median"] == pytest.approx(0.3)  # (1 - 0.4) / 2
    assert pooled.loc[("share", "answer", GRPO), "pairs"] == 2 * len(LEVELS)
    assert pooled.loc[("share", "verifier", GRPO), "median_diff"] == pytest.approx(-0.15)
    words = frontier.judge(shifted, "C6-s").ours
    assert ("shares of the shared update, steps 0-39, every level (median per run): answer GRPO 0.40 / Dr. MAS 0.70 "
            f"(Dr. MAS − GRPO +0.30, median of {2 * len(LEVELS)} twin pairs); search GRPO 0.30 / Dr. MAS 0.15") in words


def test_where_both_learn_and_the_false_alarm_rate(shifted):
    fa = shifted.false_alarm
    ref = stats.binomtest(0, 12).proportion_ci(method="exact")
    assert (fa["fired"], fa["runs"]) == (0, 12) and fa["high"] == pytest.approx(ref.high)
    auc = shifted.learn_accuracy[shifted.learn_accuracy["measure"] == "auc"].iloc[0]
    assert auc["diff"] > 0 and auc["low"] > 0 and auc["seeds"] == 6
    assert shifted.verdicts["C6-acc"] == frontier.ESTIMATE


def test_the_summary_gives_the_cost_of_each_part_and_arm(shifted, tmp_path):
    """Every run of the fixture records 2 s per step and 60 s of wall time in the index: the cost table counts each
    part's and arm's runs and sums their hours."""
    cost = shifted.data.step_seconds(shifted.events["run"])
    table = frontier.cost_table(shifted.events, shifted.data.runs, cost).set_index(["part", "arm"])
    round_runs = 2 * len(LEVELS) * 2  # estimators x levels x seeds
    expected = {("round", "nonsharing"): round_runs, ("round", "sharing"): round_runs,
                ("learn", "nonsharing"): 2 * len(frontier_rules.LEARN_SEEDS)}
    assert table["runs"].to_dict() == expected
    for key, n in expected.items():
        assert table.loc[key, "step_h"] == pytest.approx(round(n * 2.0 * STEPS / 3600, 2))
        assert table.loc[key, "wall_h"] == pytest.approx(round(n * 60.0 / 3600, 2)) and table.loc[key, "wall_runs"] == n
        assert table.loc[key, "step_median_s"] == 2.0 * STEPS and table.loc[key, "wall_median_s"] == 60.0
    text = frontier.summary_markdown(shifted, tmp_path)
    assert f"Step time of the {sum(expected.values())} finished runs" in text and "| round | sharing |" in text


def test_the_learned_statistic_is_the_paired_t_statistic():
    rng = np.random.default_rng(3)
    shares = rng.integers(0, 5, size=(9, 32)) / 4
    z = frontier_rules.learned_z(shares)
    ref = [stats.ttest_rel(shares[t], shares[0]).statistic for t in range(1, 9)]
    assert np.allclose(z, ref)
    assert frontier_rules.first_learned(np.arange(0, 201, 25), np.vstack([np.zeros(32), np.full((8, 32), 0.25)])) == 25
    assert math.isnan(frontier_rules.first_learned(np.arange(0, 201, 25), np.zeros((9, 32))))


def test_lognormal_aft_matches_least_squares_and_a_direct_likelihood():
    rng = np.random.default_rng(0)
    n = 80
    x = np.column_stack([rng.normal(size=n), rng.integers(0, 2, n)])
    logt = 3 + 0.5 * x[:, 0] - 0.7 * x[:, 1] + 0.4 * rng.normal(size=n)
    full = lognormal_aft(np.exp(logt), np.ones(n, bool), x)
    design = np.column_stack([np.ones(n), x])
    assert np.allclose(full.params, np.linalg.lstsq(design, logt, rcond=None)[0], atol=1e-5)
    cut = 3.3
    event = logt < cut
    t = np.exp(np.minimum(logt, cut))
    fit = lognormal_aft(t, event, x)

    def nll(p):
        z = (np.log(t) - design @ p[:3]) / math.exp(p[3])
        return -np.sum(np.where(event, stats.norm.logpdf(z) - p[3] - np.log(t), stats.norm.logsf(z)))
    ref = optimize.minimize(nll, np.zeros(4), method="Nelder-Mead", options={"maxiter": 20000, "xatol": 1e-8,
                                                                           "fatol": 1e-10})
    assert np.allclose(fit.params, ref.x[:3], atol=1e-3) and fit.sigma == pytest.approx(math.exp(ref.x[3]), rel=1e-3)
    ratio, low, high = fit.time_ratio(2)
    assert low < ratio < high and ratio == pytest.approx(math.exp(fit.params[2]))


def test_the_time_ratio_is_said_in_words_where_one_estimator_never_collapses(tmp_path):
    """With no GRPO collapse the AFT likelihood has no maximum (β2 → ∞): the note says so and gives no number."""
    levels = [ladder_level(j) for j in (0, 2)]
    root = make_grid(tmp_path, {("nonsharing", GRPO): 1.0, ("nonsharing", DRMAS): levels[1]}, levels,
                     seeds=(3000, 3001), learn_seeds=())
    aft = frontier_rules.aft_time_ratio(frontier_rules.event_table(load_grid(root)), "nonsharing")
    assert "ratio" not in aft and aft["events"] == 2 and aft["runs"] == 8
    assert aft["note"] == ("no finite time ratio: no GRPO run collapsed by step 180 (0 of 4; Dr. MAS 2 of 4), so the "
                           "ratio is unbounded above 1")
    assert frontier._aft_words(aft) == f"AFT: {aft['note']}"


def test_pilot_next_names_the_extension_and_then_the_levels(tmp_path):
    levels = [ladder_level(j) for j in (-2, 0, 2, 4)]
    calm = make_grid(tmp_path / "calm", {("nonsharing", GRPO): 1.0, ("nonsharing", DRMAS): 1.0}, levels,
                     seeds=frontier.PILOT_SEEDS, learn_seeds=())
    rnd = frontier.analyze(load_grid(calm), draws=10, pilot=True)
    assert frontier.pilot_next(rnd.events, "nonsharing", 16) == "extend upwards to 0.000283"
    assert frontier.pilot_next(rnd.events, "nonsharing", 17).startswith("pilot incomplete (16 of 17")
    steep = make_grid(tmp_path / "steep", {("nonsharing", GRPO): levels[2], ("nonsharing", DRMAS): levels[2]}, levels,
                      seeds=frontier.PILOT_SEEDS, learn_seeds=())
    rnd = frontier.analyze(load_grid(steep), draws=10, pilot=True)
    words = frontier.pilot_next(rnd.events, "nonsharing", 16)
    assert words.startswith("levels ")
    chosen = [float(v) for v in words.removeprefix("levels ").split(", ")]
    assert 5 <= len(chosen) <= 8 and chosen[0] < levels[2] <= chosen[-1]
    assert rnd.verdicts == {}  # the pilot never gives a verdict
    text = frontier.summary_markdown(rnd, steep, pilot=True)  # the pilot's runs are labelled pilot, not round
    assert "| pilot | nonsharing |" in text and "| round |" not in text


def test_a_partial_round_draws_no_curve_from_one_level_and_says_where_it_has_no_runs(tmp_path):
    """The round's first runs: non-sharing at one level only (the Firth curve's slope is not identified there, so no
    curve or band is drawn), no shared-model run yet (its panel says so), and every title says "incomplete"."""
    root = make_grid(tmp_path, {("nonsharing", GRPO): ladder_level(0), ("nonsharing", DRMAS): 1.0}, [ladder_level(0)],
                     seeds=(3000,), learn_seeds=())
    index = json.loads((root / "index.json").read_text())
    index["runs"].append({**index["runs"][0], "run": "t_sha_grpo_lr0.0001_s3000", "assignment": "sharing",
                          "status": "todo", "seconds": None})
    (root / "index.json").write_text(json.dumps(index))
    rnd = frontier.analyze(load_grid(root), draws=20, n_boot=50)
    assert (rnd.finished, rnd.total) == (2, 3) and not rnd.complete
    for fig in (frontier.fig_frontier(rnd), frontier.fig_accuracy(rnd)):
        non, shared = fig.axes
        assert all("(incomplete: 2 of 3 runs)" in ax.get_title() for ax in fig.axes)
        assert [t.get_text() for t in shared.texts] == ["no finished runs"] and not shared.lines
        assert non.lines and "no finished runs" not in [t.get_text() for t in non.texts]
    non = frontier.fig_frontier(rnd).axes[0]
    assert all(line.get_linestyle() == "None" for line in non.lines)  # markers only: no fitted curve
    assert not non.collections  # and no band


def test_the_report_says_not_run_without_the_round_and_the_command_line_refuses_a_missing_folder(tmp_path, caplog):
    j = frontier.judge(None, "C6-n")
    assert j.verdict == "not run" and j.design == "confirmatory"
    assert frontier.main(["--runs", str(tmp_path / "absent")]) == 2
    assert "is not a grid folder" in caplog.text


def test_the_grid_writer_reproduces_the_pilot_and_writes_a_valid_round(tmp_path):
    """experiments/frontier_grid.py: its entries for the pilot's levels are the committed pilot spec's, byte for byte,
    and a round written from levels validates and holds every pre-registered cell."""
    from experiments import frontier_grid as fg
    from experiments.grid_runs import load_grid as load_spec

    pilot = "".join(fg.entry("pilot", arm, est, lr, "frontier_pilot") for lr in (7.07e-5, 1e-4, 1.41e-4, 2e-4)
                    for arm in frontier_rules.ARMS for est, _ in fg.ESTIMATORS)
    assert pilot == fg.PILOT_YAML.read_text().split("runs:\n", 1)[1]
    levels = {"nonsharing": [ladder_level(j) for j in range(-1, 4)], "sharing": [ladder_level(j) for j in range(0, 6)]}
    spec = tmp_path / "frontier.yaml"
    spec.write_text(fg.round_yaml(levels, "commit abc1234"))
    grid = load_spec(spec)
    assert len(grid.runs) == (5 + 6) * 2 * 6 + 12 and grid.twins_together
    cells = {(r.tags["assignment"], r.tags["estimator"], r.tags["level"]) for r in grid.runs}
    assert len(cells) == (5 + 6) * 2 + 2
    assert {r.seed for r in grid.runs if r.tags["study"] == "frontier"} == set(frontier_rules.ROUND_SEEDS)
    assert {r.seed for r in grid.runs if r.tags["study"] == "frontier_learn"} == set(frontier_rules.LEARN_SEEDS)
    assert fg.extension_level("extend upwards to 0.000283") == 0.000283 and fg.extension_level("levels 1e-4") is None


def test_shifts_and_learning_rates_are_written_one_way_at_every_size():
    """A shift in octaves keeps its sign and two decimals however near 0 a bound is, and a learning rate is
    positional with 3 significant digits above and below 1e-4 (one interval, one notation)."""
    from analysis.formatting import fmt_lr, fmt_octaves

    assert fmt_octaves(0.4412, 0.000585, 1.1) == "+0.44 octave [+0.00, +1.10]"
    assert fmt_octaves(-0.3, -1.234, 0.02) == "-0.30 octave [-1.23, +0.02]"
    assert [fmt_lr(x) for x in (8.61e-05, 0.000173, 1e-4, 0.00028349, 5e-5)] == \
        ["0.0000861", "0.000173", "0.0001", "0.000283", "0.00005"]
