"""The paper's two multi-agent systems, their single-agent baselines, and an example user workflow."""
from __future__ import annotations

import numpy as np

from drmas.agents.base import AgentView
from drmas.orchestra.base import CallFn, Episodes, Orchestra, register_orchestra
from envs.base import HistoryEnv


@register_orchestra("math")
class MathLoop(Orchestra):
    """Solver <-> Verifier loop (NOTES §4): up to ``max_loops`` rounds. The Solver writes a solution
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


class _TurnLimited(Orchestra):
    def __init__(self, max_turns: int = 4):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns


@register_orchestra("search")
class SearchHierarchy(_TurnLimited):
    """Verifier -> Search / Answer hierarchy (NOTES §4), at most ``max_turns`` turns. Each turn the
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
