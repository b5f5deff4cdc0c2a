"""Stability analysis (analysis/stability.py, docs/stability.md) and the collapse metrics of the orchestras.

The grid folders are synthetic (tests/stability_fixture.py): fixtures for the analysis code, never results;
each vector shows its arithmetic."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import events as E
from analysis import stability as S
from analysis import stability_rules as R
from analysis import twins as T
from analysis.runs import load_grid
from drmas.algos import ControlTokens, control_positions
from drmas.orchestra.systems import MathLoop, SearchHierarchy
from drmas.step_table import StepTable
from notebooks import execute_notebook
from stability_fixture import LRS, make_stability_grid

ROOT = Path(__file__).resolve().parent.parent


def _steps(reward, calls=None, skipped=None):
    n = len(reward)
    frame = pd.DataFrame({"step": np.arange(n), "reward/mean": reward, "wg/m/grad_norm": np.ones(n),
                          "wg/m/skipped": np.zeros(n) if skipped is None else skipped})
    if calls is not None:
        frame[E.SEARCH_CALLS] = calls
    return frame


# ------------------------------------------------------------------------------------------ rule (g)
def test_collapse_clauses():
    flat = np.full(60, 0.4)
    assert E.collapse_of(_steps(flat, np.full(60, 1.5))).step is None
    # reward 0.4 then 0.1 from step 20: the 10-step mean (steps t-9..t) at step 25 is (4 x 0.4 + 6 x 0.1) / 10
    # = 0.22 > 0.2 (half the peak 0.4), at step 26 (3 x 0.4 + 7 x 0.1) / 10 = 0.19, and stays below
    drop = np.r_[np.full(20, 0.4), np.full(40, 0.1)]
    c = E.collapse_of(_steps(drop))
    assert (c.step, c.reason) == (26, "reward")
    # a drop that lasts 15 steps only: no collapse (M = 20)
    brief = np.r_[np.full(20, 0.4), np.full(15, 0.0), np.full(25, 0.4)]
    assert E.collapse_of(_steps(brief)).step is None
    # Search calls 2.0 for 20 steps, then 0: the 10-step mean at step t holds 29 - t values of 2.0, so it is
    # 0.6 at step 26 and 0.4 < 0.5 (a quarter of 2.0) from step 27
    calls = np.r_[np.full(20, 2.0), np.zeros(40)]
    c = E.collapse_of(_steps(flat, calls))
    assert (c.step, c.reason) == (27, "search")
    # a run that logged no Search-calls key in the steps it never called the Search agent: the same
    assert E.collapse_of(_steps(flat, np.where(calls > 0, calls, np.nan))).step == 27
    skipped = np.zeros(60)
    skipped[45] = 1
    c = E.collapse_of(_steps(flat, calls, skipped))
    assert (c.step, c.reason) == (27, "search")  # the earliest clause wins
    c = E.collapse_of(_steps(flat, None, skipped))
    assert (c.step, c.reason) == (45, "non-finite")


def test_a_missing_norm_is_no_update():
    """A worker group without rows in a step logs no grad norm (NaN in the frame): not a non-finite norm."""
    frame = _steps(np.full(60, 0.4), np.full(60, 1.5))
    frame.loc[10:40, "wg/m/grad_norm"] = np.nan  # e.g. the Answer agent never called
    frame.loc[10:40, "wg/m/skipped"] = np.nan
    frame["train/nonfinite"] = 0
    assert E.collapse_of(frame).step is None
    frame.loc[50, "train/nonfinite"] = 1
    assert (E.collapse_of(frame).step, E.collapse_of(frame).reason) == (50, "non-finite")
    # first movers: a missing norm moves nothing; a logged non-finite one (spike flag 1) does
    agents = pd.DataFrame({"step": np.arange(60), "agent": "answer", "grad_norm": np.ones(60), "spike": 0})
    agents.loc[20:30, ["grad_norm", "spike"]] = np.nan
    assert R.moved_first(frame, agents)["grad_norm"] is None
    agents.loc[45, ["grad_norm", "spike"]] = (np.nan, 1)
    assert R.moved_first(frame, agents)["grad_norm"] == 45


@pytest.mark.parametrize("unstable, levels", [
    ({5e-5: False, 2e-4: False, 8e-4: True, 3.2e-3: True}, [5e-5, 2e-4, 8e-4]),
    ({5e-5: False, 2e-4: True, 8e-4: True, 3.2e-3: True}, [5e-5, 1e-4, 2e-4]),
    ({5e-5: False, 2e-4: False, 8e-4: False, 3.2e-3: True}, [5e-5, 8e-4, 3.2e-3]),
    ({5e-5: False, 2e-4: False, 8e-4: False, 3.2e-3: False}, [5e-5, 8e-4, 3.2e-3]),
])
def test_dial_levels(unstable, levels):
    assert R.dial_levels(unstable)[0] == pytest.approx(levels)


# ------------------------------------------------------------------------------------------ on a grid
@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return make_stability_grid(tmp_path_factory.mktemp("stability"))


def test_grid_verdicts(grid):
    an = S.analyze_stability(load_grid(grid), n_boot=200)
    assert (an.finished, an.total) == (12, 12)
    top = an.collapses[an.collapses["lr"] == max(LRS)].iloc[0]
    # GRPO 3/3 collapsed vs Dr. MAS 0/3: one-sided Fisher p = 1 / C(6, 3) = 0.05
    assert (top.grpo_collapsed, top.drmas_collapsed) == (3, 0)
    assert top.fisher_p == pytest.approx(0.05)
    assert an.frontier == {"trajectory_grpo": min(LRS), "drmas": max(LRS)}
    assert set(an.runs.loc[an.runs["collapsed"], "collapse_reason"]) == {"search"}
    # twin spikes: GRPO's Search agent at steps 25 and 40 of its 3 top-lr seeds = 6, Dr. MAS none;
    # binomial p = 2 / 2^6, Holm over 3 agents (the two others: 0 vs 0, p = 1)
    row = an.spike_agents.set_index("agent").loc["search"]
    assert (row.grpo, row.drmas) == (6, 0)
    assert row.p_holm == pytest.approx(3 * 2 / 64)
    assert an.spike_verdict == "inconclusive"  # 0.094 > 0.05
    # the Search agent's norm jumps at step 25 (10x its early median); the Verifier's control-token
    # probability and the Search calls move at step 30
    moved = an.movers[an.movers["collapsed"]]
    assert set(moved["moved_first"]) == {"grad_norm"}
    assert set(moved["first_control_prob"]) == set(moved["first_search_calls"]) == {30}
    assert (~an.movers["collapsed"]).sum() == 9 and set(an.movers.loc[~an.movers["collapsed"], "moved_first"]) == {"never"}
    # a twin whose agent was not called at a step (no norm logged) is no reference: nothing counted there
    data = load_grid(grid)
    drmas_search = (data.agents["run"].str.startswith("stab_drmas") & (data.agents["agent"] == "search")
                    & data.agents["step"].isin([25, 40]))
    data.agents.loc[drmas_search, "grad_norm"] = np.nan
    assert S.twin_spikes(data, S.finished_runs(data)).query("agent == 'search'")["grpo"].sum() == 0
    # accuracy: Dr. MAS 0.3 -> 0.5 over the run vs GRPO 0.3; time-averaged difference ~ +0.1, last ~ +0.2
    auc = an.accuracy[(an.accuracy["measure"] == "auc")]
    assert len(auc) == len(LRS) and (auc["diff"] > 0.03).all()
    judged = dict((key, judge(an)) for key, judge, _ in S.JUDGES)
    # pooled over the two levels: GRPO 3/6 vs Dr. MAS 0/6, one-sided Fisher p = C(6,3) / C(12,3) = 20/220 > 0.05
    pooled = an.collapses[an.collapses["lr"].isna()].iloc[0]
    assert pooled.fisher_p == pytest.approx(20 / 220)
    # 6 runs per estimator have power 0.56 against collapse rates 0.8 vs 0.2: no difference found is no evidence
    assert S.fisher_power(6, 6) == pytest.approx(0.56, abs=0.01)
    assert judged["g"].verdict == "inconclusive (underpowered)" and "power of the pooled test" in judged["g"].ours
    assert "frontier GRPO 5e-05, Dr. MAS 0.0008" in judged["g"].ours


def test_fisher_power_equals_a_simulation():
    rng = np.random.default_rng(0)
    from scipy.stats import fisher_exact

    hits = [fisher_exact([[g, 9 - g], [d, 9 - d]], alternative="greater").pvalue < 0.05
            for g, d in zip(rng.binomial(9, 0.8, 4000), rng.binomial(9, 0.2, 4000))]
    assert S.fisher_power(9, 9) == pytest.approx(np.mean(hits), abs=0.025)
    assert S.fisher_power(3, 3) == 0.0  # 3 vs 3 can never reach p < 0.05 (best: 0.05)


def test_incomplete_and_absent_grids(tmp_path):
    an = S.analyze_stability(load_grid(make_stability_grid(tmp_path / "g", seeds=(0,), unfinished=1)), n_boot=50)
    assert (an.finished, an.total) == (3, 4)
    for _, judge, _ in S.JUDGES:
        assert judge(an).verdict.startswith("incomplete (3 of 4 runs)")
    none = S.analyze_stability(S.load_optional(tmp_path / "absent"))
    assert all(judge(none).verdict == "not run" for _, judge, _ in S.JUDGES)


def test_figure(grid):
    data = load_grid(grid)
    fig = S.fig_gradnorm_over_steps(data, S.finished_runs(data))
    assert len(fig.axes) == 3 * len(LRS)
    assert fig._suptitle.get_text().startswith("Search system")


def test_math_grid(tmp_path):
    """The math system: the reward clause fires (no Search calls to lose), the Solver's spikes are counted, the
    claims carry the system's name, and the figure has a panel per (Solver, Verifier) x lr."""
    data = load_grid(make_stability_grid(tmp_path / "math", task="math"))
    an = S.analyze_stability(data, n_boot=100)
    assert an.task == "math"
    # reward in [0.30, 0.32) up to step 29, then 0.02: the running peak of the 10-step mean is in [0.30, 0.32).
    # At step 34 the window holds 5 early values: mean >= (5 x 0.30 + 5 x 0.02) / 10 = 0.16 > 0.32 / 2; at step 35
    # it holds 4: mean < (4 x 0.32 + 6 x 0.02) / 10 = 0.14 < 0.30 / 2, and it stays there for the 25 steps left
    collapsed = an.runs[an.runs["collapsed"]]
    assert set(collapsed["collapse_reason"]) == {"reward"} and set(collapsed["collapse_step"]) == {35}
    assert set(collapsed["estimator"]) == {"trajectory_grpo"} and len(collapsed) == 3
    assert an.movers["first_search_calls"].isna().all()  # math has no Search calls: never moves
    solver = an.spike_agents.set_index("agent").loc["solver"]
    assert (solver.grpo, solver.drmas) == (6, 0)
    keys = [k for k, _, _ in S.judges("math")]
    assert keys == ["b-revisited-math", "g-math", "accuracy-over-time-math"]
    g = dict((k, j(an)) for k, j, _ in S.judges("math"))["g-math"]
    assert "[math system]" in g.claim and "Search" not in g.claim and g.paper == S.PAPER["math"]["g"]
    fig = S.fig_gradnorm_over_steps(data, an.runs)
    assert len(fig.axes) == 2 * len(LRS) and fig._suptitle.get_text().startswith("Math system")
    assert S.figure_stem(an.task) == "stability_gradnorm_math_nonsharing"


def test_report_takes_one_grid_per_system(grid, tmp_path):
    from analysis.stability import by_task as stability_by_task

    math = load_grid(make_stability_grid(tmp_path / "math", seeds=(0,), task="math"))
    both = stability_by_task([load_grid(grid), math], n_boot=50)
    assert (both["search"].finished, both["math"].finished) == (12, 4)
    assert stability_by_task([math], n_boot=50)["search"].data is None  # the search grid not given: "not run"
    with pytest.raises(ValueError, match="two stability grids of the math system"):
        stability_by_task([math, math], n_boot=50)


# ------------------------------------------------------------------------------------ collapse metrics
def test_control_positions():
    pieces = np.array(["<", "verify", ">yes", "</", " ", "<search", ">", "q"], object)
    # "<verify>yes</": the verdict's first character 'y' is in token 2 (">yes")
    # " <search> q": tag ends in token 2 ('>'), the query's first non-blank char 'q' is token 4
    out = control_positions(pieces, [[0, 1, 2, 3], [4, 5, 6, 4, 7], [0, 1, 2], [4, 7]], ["<verify>", "<search>", "", "<search>"])
    assert out.tolist() == [2, 4, -1, -1]


def test_control_tokens_decode_each_tokenizer_once():
    class Tok:  # counts the decoding of its vocabulary (8 pieces above)
        calls = 0

        def __len__(self):
            return 8

        def batch_decode(self, ids):
            Tok.calls += 1
            return ["<", "verify", ">yes", "</", " ", "<search", ">", "q"]

    find = ControlTokens(Tok())
    assert find([[0, 1, 2]], None).tolist() == [-1] and Tok.calls == 0  # an untagged batch decodes nothing
    assert find([[0, 1, 2, 3]], ["<verify>"]).tolist() == [2]
    assert find([[4, 5, 6, 4, 7]], ["<search>"]).tolist() == [4] and Tok.calls == 1


def _table(rows):
    traj, agent, turn, action = map(np.array, zip(*rows))
    n = len(rows)
    return StepTable(task=np.zeros(n, np.int64), traj=traj.astype(np.int64), agent=agent.astype(object),
                     wg=agent.astype(object), turn=turn.astype(np.int64), valid=np.ones(n, bool), truncated=np.zeros(n, bool),
                     reward=np.zeros(n), score=np.zeros(n), advantage=np.zeros(n), action=action.astype(object))


def test_search_behavior_metrics():
    # traj 0: yes at turn 0, answers (no search). traj 1: no, search (missed), yes, answer.
    # traj 2: no, search (hit), no, search (hit), ... budget used up, no answer (max_turns 3).
    rows = [(0, "verifier", 0, "yes"), (0, "answer", 0, "<answer>a</answer>"),
            (1, "verifier", 0, "no"), (1, "search", 0, "<search>q</search>"), (1, "verifier", 1, "yes"),
            (1, "answer", 1, "<answer>b</answer>"),
            (2, "verifier", 0, "no"), (2, "search", 0, "q"), (2, "verifier", 1, "no"), (2, "search", 1, "q"),
            (2, "verifier", 2, "no")]
    infos = [[{"turn": 1, "action": "answer"}],
             [{"turn": 1, "action": "search", "missed": True, "obs_valid": True}, {"turn": 2, "action": "answer"}],
             [{"turn": 1, "action": "search", "missed": False, "obs_valid": True},
              {"turn": 2, "action": "search", "missed": False, "obs_valid": True}]]
    m = SearchHierarchy(max_turns=3).behavior_metrics(_table(rows), 3, infos)
    assert m["search/answered_without_search"] == pytest.approx(1 / 3)
    assert m["search/unanswered"] == pytest.approx(1 / 3)
    assert [m[f"search/verifier_yes_turn{t}"] for t in range(3)] == pytest.approx([1 / 3, 1 / 2, 0.0])
    # after a miss: traj 1 turn 1 (yes) -> 1.0; after a hit: traj 2 turns 1 and 2 (no, no) -> 0.0
    assert (m["search/verifier_yes_after_miss"], m["search/verifier_yes_after_hit"]) == (1.0, 0.0)


def test_math_behavior_metrics():
    rows = [(0, "solver", 0, "1"), (0, "verifier", 1, "reject"), (0, "solver", 2, "2"),
            (1, "solver", 0, "3"), (1, "verifier", 1, "approve")]
    m = MathLoop(max_loops=2).behavior_metrics(_table(rows), 2, [[], []])
    assert (m["math/reject_rate"], m["math/solver_rounds"]) == (0.5, 1.5)


# ------------------------------------------------------------------------------------------ notebook
@pytest.mark.parametrize("task", ["search", "math"])
def test_notebook_executes_on_a_fixture(task, grid, tmp_path, monkeypatch):
    """The notebook on a search and a math grid (its default agent, search, falls back to the math grid's first)."""
    grid = grid if task == "search" else make_stability_grid(tmp_path / "math", task="math")
    monkeypatch.setenv("DRMAS_STABILITY_GRID", str(grid))  # inherited by the kernel process
    text, outputs = execute_notebook(ROOT / "analysis/notebooks/stability.ipynb")
    assert f"grid: {grid}" in text and "12 runs" in text
    assert (f"agent 'search' is not in this grid (math system: ['solver', 'verifier']); showing 'solver'" in text) == (task == "math")
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3


def test_episodes_keep_every_step_info():
    """``Episodes.info`` merges an episode's step infos (the last wins); ``step_infos`` keeps each, in order."""
    import envs.math  # noqa: F401
    from drmas.orchestra.base import Episodes
    from envs.base import Task, make_env

    episodes = Episodes([Task("a", "2+2", ("4",)), Task("b", "3+3", ("6",))], make_env("math"))
    episodes.act(np.array([0, 1]), ["\\boxed{5}", "\\boxed{6}"])
    episodes.act(np.array([0]), ["\\boxed{4}"])
    assert [i["correct"] for i in episodes.step_infos[0]] == [False, True]
    assert [i["correct"] for i in episodes.step_infos[1]] == [True]


def test_zero_reward_signal():
    """Steps whose training reward is 0: their share, and there the mean adv_m2 per agent and the mean score."""
    from types import SimpleNamespace

    steps = pd.DataFrame({"run": ["r"] * 4, "step": range(4), "reward/mean": [0, 0, 0.5, 0],
                          "score/mean": [-0.01, 0.0, 0.5, -0.02]})
    agents = pd.DataFrame({"run": ["r"] * 4, "step": range(4), "agent": ["x"] * 4, "adv_m2": [1.0, 3.0, 9.0, 5.0]})
    runs = pd.DataFrame({"run": ["r"], "estimator": ["drmas"], "lr": [1e-4]})
    got = S.zero_reward_signal(SimpleNamespace(steps=steps, agents=agents), runs).iloc[0]
    assert got["zero_share"] == 0.75 and got["adv_m2_x"] == 3.0  # (1 + 3 + 5) / 3
    assert got["score_at_zero"] == pytest.approx(-0.01)           # (-0.01 + 0 - 0.02) / 3


def test_zero_reward_clause_of_the_collapse_verdict():
    from types import SimpleNamespace

    z = pd.DataFrame({"estimator": ["trajectory_grpo", "trajectory_grpo", "drmas"], "lr": [1e-4, 2e-4, 1e-4],
                      "zero_share": [0.5, 0.9, 0.0], "adv_m2_a": [1.0, 3.0, 9.0], "adv_m2_b": [0.5, 0.5, 9.0]})
    text = S._zero_reward_clause(SimpleNamespace(zero_reward=z))
    # GRPO: mean over its two levels (2.00, 0.50); Dr. MAS has no zero-reward step: none
    assert "per agent (a/b) is GRPO 2.00/0.50 vs Dr. MAS none" in text
    assert S._zero_reward_clause(SimpleNamespace(zero_reward=z.assign(zero_share=0.0))) == ""
    assert S._zero_reward_clause(SimpleNamespace(zero_reward=pd.DataFrame())) == ""


def test_the_figure_tells_not_called_from_non_finite():
    norms = np.array([[1.0, np.nan], [np.nan, np.inf], [np.nan, 2.0]])
    spikes = np.array([[0, np.nan], [1, 1], [np.nan, 0]])  # a logged NaN norm is a spike; a missing one has no flag
    not_called, nonfinite = T.norm_marks(norms, spikes)
    assert not_called.tolist() == [[False, True], [False, False], [True, False]]
    assert nonfinite.tolist() == [[False, False], [True, True], [False, False]]


def test_the_stability_claims_get_labels_of_their_own_in_the_report():
    """The stability claims' keys (b-revisited, g, ... and their -math forms) become REPORT.md labels that no main-grid
    claim has: S-b, S-g, S-acc, S-b-math, ...; the committed report's table marks them exploratory."""
    from analysis.report import STUDIES
    from analysis.stability import label_of as stability_label

    CLAIMS = [spec for study in STUDIES for spec in study.claims]

    keys = [key for task in S.TASKS for key, _, _ in S.judges(task)]
    labels = [stability_label(key)[0] for key in keys]
    assert labels[:3] == ["S-b", "S-g", "S-acc"] and "S-g-math" in labels
    every = [spec.label or spec.key for spec in CLAIMS]
    assert len(every) == len(set(every)) and set(labels) <= set(every)
    text = (ROOT / "results" / "REPORT.md").read_text()
    rows = {row[0]: row for row in ([c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()
                                    if line.startswith("| ") and "](#" in line)}
    assert all(rows[label][2] == "exploratory" for label in labels)
