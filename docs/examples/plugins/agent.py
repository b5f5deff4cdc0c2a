"""An agent role: a critic that reads the Solver's solution and writes a short critique between
<critique> tags. Use it with an entry `{name: critic, role: math_critic, model: <a key of models>}` of `agents`."""
from drmas.agents import Agent, AgentView, Parsed, register_agent


@register_agent("math_critic")
class MathCritic(Agent):
    """Sees the problem and the solution (team context key `solution`); its action is the critique text."""

    control_tag = "<critique>"  # the update logs the probability of the critique's first token

    def render(self, view: AgentView) -> str:
        return (f"Problem: {view.task.question}\nSolution: {view.team.get('solution', '')}\n"
                "Critic: name the first mistake, as <critique>text</critique>.\nCritique:")

    def parse(self, text: str) -> Parsed:  # never raises: malformed output is an invalid action
        start, end = text.find("<critique>"), text.find("</critique>")
        if start < 0 or end < start:
            return Parsed(False)
        return Parsed(True, text[start + len("<critique>"):end].strip())
