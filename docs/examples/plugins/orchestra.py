"""An orchestra: the Solver writes a solution, the Critic comments on it, the Solver rewrites it once seeing the
critique; the rewrite is graded. Use it with `env.orchestra: math_critique` and one agent per slot."""
import numpy as np

from drmas.agents import AgentView
from drmas.orchestra import CallFn, Episodes, Orchestra, register_orchestra


@register_orchestra("math_critique")
class SolveCritiqueRevise(Orchestra):
    slots = ("solver", "critic")

    def run(self, episodes: Episodes, call: CallFn) -> None:
        everyone = np.arange(len(episodes))
        drafts, _ = call("solver", everyone, [AgentView(t) for t in episodes.tasks], turn=0)
        views = [AgentView(t, team={"solution": d}) for t, d in zip(episodes.tasks, drafts)]
        critiques, _ = call("critic", everyone, views, turn=1)
        views = [AgentView(t, team={"previous_solution": d, "verifier_output": c})  # the Solver's retry prompt
                 for t, d, c in zip(episodes.tasks, drafts, critiques)]
        final, _ = call("solver", everyone, views, turn=2)
        episodes.act(everyone, final)  # the environment grades the rewrites and sets episodes.reward
