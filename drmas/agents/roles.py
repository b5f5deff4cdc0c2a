"""The agents of the paper's two systems and their single-agent baselines (docs/paper.md §4).

Prompts are short on purpose: the CPU default trains tiny models from scratch, and the SFT warm-up
renders the environments' role traces with these same prompts, so the formats the RL phase sees are
the formats SFT taught. For real chat models the worker group wraps the prompt in the chat template.
"""
from __future__ import annotations

from drmas.agents.base import Agent, AgentView, Parsed, register_agent

_OPEN_VERIFY, _CLOSE_VERIFY = "<verify>", "</verify>"


def parse_verdict(text: str, allowed: tuple[str, str]) -> Parsed:
    """Exactly one ``<verify>x</verify>`` pair (tags in any case, nothing tag-like inside) with x in
    ``allowed`` (surrounding whitespace ignored) -> valid, action x (lower case).

    Plain string scanning, linear in the text: the former regex ``<verify>\\s*([^<]*?)\\s*</verify>``
    backtracked polynomially, so ``<verify>`` followed by a few thousand spaces (a common output of a
    tiny model) took seconds (found by the fuzz tests in tests/test_reliability.py)."""
    if not isinstance(text, str):
        return Parsed(False)
    low = text.lower()  # may change the length of non-ASCII text: slice `low` only, never `text`
    if low.count(_OPEN_VERIFY) != 1 or low.count(_CLOSE_VERIFY) != 1:
        return Parsed(False)
    start = low.index(_OPEN_VERIFY) + len(_OPEN_VERIFY)
    end = low.find(_CLOSE_VERIFY, start)
    word = low[start:end].strip() if end >= 0 else ""
    if "<" in word or word not in allowed:
        return Parsed(False)
    return Parsed(True, word)


def _boxed(text: str) -> Parsed:
    from envs.math.answers import extract_boxed

    answer = extract_boxed(text) if isinstance(text, str) else None
    return Parsed(answer is not None and answer.strip() != "", answer or "")


def _search_action(text: str, kinds: tuple[str, ...]) -> Parsed:
    from envs.search.env import parse_action

    action = parse_action(text)
    return Parsed(action.kind in kinds, f"<{action.kind}>{action.content}</{action.kind}>" if action.kind in kinds else "")


# ------------------------------------------------------------------------------------------------ math
@register_agent("math_solver")
class MathSolver(Agent):
    """Writes a solution ending in \\boxed{answer}; in a retry round it sees its previous solution and
    the Verifier's output (team context keys ``previous_solution``, ``verifier_output``)."""

    control_tag = "\\boxed{"

    def render(self, view: AgentView) -> str:
        retry = ""
        if view.team.get("previous_solution"):
            retry = f"Previous solution: {view.team['previous_solution']}\nVerifier: {view.team.get('verifier_output', '')}\n"
        return f"Problem: {view.task.question}\n{retry}Solver: solve it, end with \\boxed{{answer}}.\nSolution:"

    def parse(self, text: str) -> Parsed:
        return _boxed(text)


@register_agent("math_verifier")
class MathVerifier(Agent):
    """Checks the Solver's solution; ends with <verify>approve</verify> or <verify>reject</verify>."""

    control_tag = _OPEN_VERIFY

    def render(self, view: AgentView) -> str:
        return (f"Problem: {view.task.question}\nSolution: {view.team.get('solution', '')}\n"
                "Verifier: check it, end with <verify>approve</verify> or <verify>reject</verify>.\nVerdict:")

    def parse(self, text: str) -> Parsed:
        return parse_verdict(text, ("approve", "reject"))


@register_agent("math_single")
class MathSingle(MathSolver):
    """Single-agent baseline: the solver alone, one attempt."""


# ---------------------------------------------------------------------------------------------- search
def _search_context(view: AgentView) -> str:
    history = f"{view.history}\n" if view.history else ""
    return f"Question: {view.task.question}\n{history}"


@register_agent("search_verifier")
class SearchVerifier(Agent):
    """Router: enough information to answer (<verify>yes</verify>) or search more (<verify>no</verify>)."""

    control_tag = _OPEN_VERIFY

    def render(self, view: AgentView) -> str:
        return (f"{_search_context(view)}Verifier: is the information enough to answer? "
                "Say <verify>yes</verify> or <verify>no</verify>.\nVerdict:")

    def parse(self, text: str) -> Parsed:
        return parse_verdict(text, ("yes", "no"))


@register_agent("search_searcher")
class SearchAgent(Agent):
    """Writes <think>...</think><search>query</search>."""

    control_tag = "<search>"

    def render(self, view: AgentView) -> str:
        return f"{_search_context(view)}Search agent: write <search>query</search>.\nQuery:"

    def parse(self, text: str) -> Parsed:
        return _search_action(text, ("search",))


@register_agent("search_answerer")
class AnswerAgent(Agent):
    """Writes <think>...</think><answer>answer</answer>."""

    control_tag = "<answer>"

    def render(self, view: AgentView) -> str:
        return f"{_search_context(view)}Answer agent: write <answer>answer</answer>.\nAnswer:"

    def parse(self, text: str) -> Parsed:
        return _search_action(text, ("answer",))


@register_agent("search_single")
class SearchSingle(Agent):
    """Single-agent baseline (Search-R1 style): each turn either searches or answers."""

    def render(self, view: AgentView) -> str:
        return (f"{_search_context(view)}Assistant: write <search>query</search> to search, "
                "or <answer>answer</answer> to answer.\nOutput:")

    def parse(self, text: str) -> Parsed:
        return _search_action(text, ("search", "answer"))
