"""The paper's two multi-agent systems, their single-agent baselines, and an example user workflow."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from drmas.agents.base import AgentView
from drmas.orchestra.base import CallFn, Episodes, Orchestra, register_orchestra
from drmas.step_table import StepTable
from envs.base import HistoryEnv

if TYPE_CHECKING:
    import pandas as pd


def _share(mask: np.ndarray) -> float:
    return float(mask.mean()) if mask.size else float("nan")


@register_orchestra("math")
class MathLoop(Orchestra):
    """Solver <-> Verifier loop (docs/paper.md §4): up to ``max_loops`` rounds. The Solver writes a solution
    ending in \\boxed{}; the Verifier approves or rejects; a rejection sends the episode to another
    Solver round, which sees the rejected solution. The Verifier is not called after the last Solver
    round. The answer is the last Solver output. An invalid verdict ends the loop like an approval
    (and is penalized as an invalid action)."""

    slots = ("solver", "verifier")

    def __init__(self, max_loops: int = 2):
        if max_loops < 1:
            raise ValueError(f"max_loops must be >= 1, got {max_loops}")
        self.max_loops = max_loops

    def run(self, episodes: Episodes, call: CallFn) -> None:
        solution = [""] * len(episodes)
        verdict = [""] * len(episodes)
        active = np.arange(len(episodes))
        for loop in range(self.max_loops):
            views = [AgentView(episodes.tasks[i], team={"previous_solution": solution[i], "verifier_output": verdict[i]}
                               if loop else {}) for i in active]
            texts, _ = call("solver", active, views, turn=2 * loop)
            for i, text in zip(active, texts):
                solution[i] = text
            if loop == self.max_loops - 1:
                break
            views = [AgentView(episodes.tasks[i], team={"solution": solution[i]}) for i in active]
            texts, verdicts = call("verifier", active, views, turn=2 * loop + 1)
            for i, text in zip(active, texts):
                verdict[i] = text
            rejected = np.array([v.valid and v.action == "reject" for v in verdicts], bool)
            active = active[rejected]
            if active.size == 0:
                break
        everyone = np.arange(len(episodes))
        episodes.act(everyone, solution)

    def behavior_metrics(self, table: StepTable, n_traj: int, step_infos: list[list[dict[str, Any]]]) -> dict[str, float]:
        """``math/reject_rate``: share of the Verifier's calls that rejected (a valid <verify>reject</verify>);
        ``math/solver_rounds``: Solver calls per trajectory (1 .. ``max_loops``)."""
        verifier = table.agent == "verifier"
        return {"math/reject_rate": _share(table.action[verifier] == "reject"),
                "math/solver_rounds": float((table.agent == "solver").sum() / max(n_traj, 1))}


@register_orchestra("math_single")
class MathSingle(Orchestra):
    """Single-agent baseline: one solver call per episode."""

    slots = ("solver",)

    def run(self, episodes: Episodes, call: CallFn) -> None:
        everyone = np.arange(len(episodes))
        texts, _ = call("solver", everyone, [AgentView(t) for t in episodes.tasks], turn=0)
        episodes.act(everyone, texts)


def _search_views(episodes: Episodes, idx: np.ndarray) -> list[AgentView]:
    """Each episode's task with its search history (queries and <information> blocks so far)."""
    env = episodes.env
    if not isinstance(env, HistoryEnv):
        raise TypeError(f"the search orchestras need an environment with history(i) (envs.base.HistoryEnv); "
                        f"{type(env).__name__} has none")
    return [AgentView(episodes.tasks[i], history=env.history(i)) for i in idx]


def env_steps_frame(step_infos: list[list[dict[str, Any]]]) -> pd.DataFrame:
    """The search environment's step infos as one frame: ``traj``, ``env_turn`` (1-based: the episode's
    n-th env step), ``action`` (search / answer / invalid), ``missed`` (a retrieval that returned ranks
    k+1..2k; NaN where nothing was retrieved), ``obs_valid`` (the retrieval succeeded)."""
    import pandas as pd  # here, not at the top: validating a config imports this module, and pandas costs 0.5 s

    records = [(i, info.get("turn", 0), info.get("action", ""), info.get("missed", np.nan), info.get("obs_valid", False))
               for i, infos in enumerate(step_infos) for info in infos]
    return pd.DataFrame.from_records(records, columns=["traj", "env_turn", "action", "missed", "obs_valid"])


class _TurnLimited(Orchestra):
    def __init__(self, max_turns: int = 4):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns

    def behavior_metrics(self, table: StepTable, n_traj: int, step_infos: list[list[dict[str, Any]]]) -> dict[str, float]:
        """``search/answered_without_search``: share of trajectories answered with no search step;
        ``search/unanswered``: share that ended without an answer (budget used up)."""
        steps = env_steps_frame(step_infos)
        answered, searched = np.zeros(n_traj, bool), np.zeros(n_traj, bool)
        answered[steps["traj"][steps["action"] == "answer"].to_numpy(int)] = True
        searched[steps["traj"][steps["action"] == "search"].to_numpy(int)] = True
        return {"search/answered_without_search": _share(answered & ~searched), "search/unanswered": _share(~answered)}


@register_orchestra("search")
class SearchHierarchy(_TurnLimited):
    """Verifier -> Search / Answer hierarchy (docs/paper.md §4), at most ``max_turns`` turns. Each turn the
    Verifier says <verify>yes</verify> (-> the Answer agent answers, episode ends) or
    <verify>no</verify> (-> the Search agent writes a query; top-k passages come back in the history).
    If the last turn still says no, the episode ends with reward 0 (the Search agent is not called on
    the last turn: nothing could use its result). An invalid verdict counts as no."""

    slots = ("verifier", "search", "answer")

    def run(self, episodes: Episodes, call: CallFn) -> None:
        active = np.arange(len(episodes))
        for turn in range(self.max_turns):
            views = _search_views(episodes, active)
            _, verdicts = call("verifier", active, views, turn=turn)
            enough = np.array([v.valid and v.action == "yes" for v in verdicts], bool)
            answering, searching = active[enough], active[~enough]
            if answering.size:
                views = _search_views(episodes, answering)
                texts, _ = call("answer", answering, views, turn=turn)
                episodes.act(answering, texts)
            if turn == self.max_turns - 1 or searching.size == 0:
                break
            views = _search_views(episodes, searching)
            texts, _ = call("search", searching, views, turn=turn)
            dones = episodes.act(searching, texts)
            active = searching[~dones]
            if active.size == 0:
                break
        episodes.done[:] = True  # unanswered episodes end with reward 0

    def behavior_metrics(self, table: StepTable, n_traj: int, step_infos: list[list[dict[str, Any]]]) -> dict[str, float]:
        """Besides the shares of :class:`_TurnLimited`: ``search/verifier_yes_turn{t}``, the Verifier's yes
        rate at turn t; ``search/verifier_yes_after_miss`` / ``_after_hit``: its yes rate at a turn t >= 1
        whose preceding search (turn t − 1, the episode's t-th env step) missed / retrieved the top k (a
        failed or invalid search counts as neither)."""
        out = super().behavior_metrics(table, n_traj, step_infos)
        verifier = table.agent == "verifier"
        yes, turn, traj = table.action[verifier] == "yes", table.turn[verifier], table.traj[verifier]
        for t in range(self.max_turns):
            out[f"search/verifier_yes_turn{t}"] = _share(yes[turn == t])
        import pandas as pd  # as in env_steps_frame

        steps = env_steps_frame(step_infos)
        retrieved = steps[(steps["action"] == "search") & steps["obs_valid"].astype(bool) & steps["missed"].notna()]
        missed = retrieved.set_index(["traj", "env_turn"])["missed"]
        before = missed.reindex(pd.MultiIndex.from_arrays([traj, turn])).to_numpy(float)  # NaN: no retrieval before
        out["search/verifier_yes_after_miss"] = _share(yes[before == 1])
        out["search/verifier_yes_after_hit"] = _share(yes[before == 0])
        return out


@register_orchestra("search_single")
class SearchSingleAgent(_TurnLimited):
    """Single-agent baseline (Search-R1 style): each turn the agent searches or answers."""

    slots = ("agent",)

    def run(self, episodes: Episodes, call: CallFn) -> None:
        active = np.arange(len(episodes))
        for turn in range(self.max_turns):
            views = _search_views(episodes, active)
            texts, _ = call("agent", active, views, turn=turn)
            dones = episodes.act(active, texts)
            active = active[~dones]
            if active.size == 0:
                break
        episodes.done[:] = True


@register_orchestra("math_sequential")
class SolveThenCheck(Orchestra):
    """Example of a user-defined workflow (docs/extending.md): a sequential pipeline in which a drafter
    writes a solution and a reviser always rewrites it once, seeing the draft; the reviser's answer is
    graded. No verifier, no loop: shows how little an orchestra needs."""

    slots = ("drafter", "reviser")

    def run(self, episodes: Episodes, call: CallFn) -> None:
        everyone = np.arange(len(episodes))
        drafts, _ = call("drafter", everyone, [AgentView(t) for t in episodes.tasks], turn=0)
        views = [AgentView(t, team={"previous_solution": d}) for t, d in zip(episodes.tasks, drafts)]
        final, _ = call("reviser", everyone, views, turn=1)
        episodes.act(everyone, final)
