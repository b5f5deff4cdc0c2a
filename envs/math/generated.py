"""CPU-scale math task: short generated arithmetic / algebra problems with exact integer answers.

Small enough for a 1-5M-parameter transformer with a byte-level tokenizer trained from scratch:

    word    "Tom has 23 apples and buys 14 more. How many apples now?"   -> 37
    expr    "Compute 23+14*2."                                           -> 51
    linear  "Solve 3x+4=25."                                             -> 7

Difficulty (``difficulty_spec``; operands have ``operand_digits`` digits, 2 by default):

    d | word / expr operations   | linear form
    1 | 1 op: +                  | x+a=b
    2 | 1 op: + -                | x+a=b, x-a=b
    3 | 2 ops: + -               | ... , ax=b
    d | d-1 ops: + - *  (d >= 4) | ... , ax+b=c, ax-b=c   (d >= 4)

Answers are never negative. Generation is deterministic given the seed (numpy ``Generator``). Each Task keeps
its program in ``meta`` so that worked solutions can be written for it.

The module also writes **role traces** for SFT warm-up, as structured records (prompts are rendered by the
agents): Solver records (with a tunable rate of plausible mistakes, and retry rounds that see a rejected
solution), Verifier records (approve/reject, always right w.r.t. the gold answer) and single-agent records.
Solutions are short worked computations ending in ``\\boxed{}``, e.g. ``14*2=28, 23+28=51. \\boxed{51}``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypedDict

import numpy as np

from envs.base import Task
from envs.math.answers import extract_boxed

KINDS = ("word", "expr", "linear")
MAX_TRIES = 1000

_NAMES = (("Tom", "He"), ("Ann", "She"), ("Sam", "He"), ("Mia", "She"), ("Leo", "He"), ("Eva", "She"))
_ITEMS = ("apples", "pens", "cards", "coins", "books", "eggs", "stamps", "shells")
_PHRASES = {"+": ("buys {n} more", "finds {n} more", "gets {n} more"),
            "-": ("gives away {n}", "loses {n}", "sells {n}")}
_TIMES_PHRASES = {2: "doubles them", 3: "triples them"}


@dataclass(frozen=True)
class DifficultySpec:
    """What a difficulty level means (see the module docstring's table)."""

    num_ops: int  # operations in word / expr problems
    ops: tuple[str, ...]  # operators drawn from
    linear_forms: tuple[str, ...]  # equation shapes for linear problems
    operand_digits: int  # digits of the operands (multipliers are 2-9)


def difficulty_spec(difficulty: int, operand_digits: int = 2) -> DifficultySpec:
    """The spec of a difficulty level (1 = one 2-digit addition)."""
    if difficulty < 1 or operand_digits < 1:
        raise ValueError(f"difficulty={difficulty} and operand_digits={operand_digits} must both be >= 1")
    ops = ("+",) if difficulty == 1 else ("+", "-") if difficulty <= 3 else ("+", "-", "*")
    forms = ["x+a=b"] + ["x-a=b"] * (difficulty >= 2) + ["ax=b"] * (difficulty >= 3)
    forms += ["ax+b=c", "ax-b=c"] * (difficulty >= 4)
    return DifficultySpec(max(1, difficulty - 1), ops, tuple(forms), operand_digits)


# ----------------------------------------------------------------------------------------------------------
# Problems
# ----------------------------------------------------------------------------------------------------------


def _operand(rng: np.random.Generator, digits: int) -> int:
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10 ** digits))


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b


def _max_value(spec: DifficultySpec) -> int:
    """Bound on every intermediate result (keeps numbers short for a tiny model)."""
    return 10 ** (spec.operand_digits + 2) - 1


def _word_problem(rng: np.random.Generator, spec: DifficultySpec) -> tuple[str, dict[str, Any]]:
    name, pronoun = _NAMES[rng.integers(len(_NAMES))]
    items = _ITEMS[rng.integers(len(_ITEMS))]
    value = start = _operand(rng, spec.operand_digits)
    steps, phrases = [], []
    for _ in range(spec.num_ops):
        op = spec.ops[rng.integers(len(spec.ops))]
        if op == "-" and value < 2:
            op = "+"
        if op == "*" and value * 3 > _max_value(spec):
            op = "-"
        if op == "*":
            n = int(rng.integers(2, 4))
            phrase = _TIMES_PHRASES[n]
        else:
            largest = min(value, 10 ** spec.operand_digits)  # never take away more than there is
            n = _operand(rng, spec.operand_digits) if op == "+" else int(rng.integers(1, largest))
            options = _PHRASES[op]
            phrase = options[rng.integers(len(options))].format(n=n)
        value = _apply(op, value, n)
        steps.append([op, n])
        phrases.append(phrase)
    if len(phrases) == 1:
        question = f"{name} has {start} {items} and {phrases[0]}. How many {items} now?"
    else:
        actions = ", ".join(phrases[:-1]) + " and " + phrases[-1]
        question = f"{name} has {start} {items}. {pronoun} {actions}. How many {items} now?"
    return question, {"kind": "word", "start": start, "steps": steps}


def _expr_problem(rng: np.random.Generator, spec: DifficultySpec) -> tuple[str, dict[str, Any]]:
    for _ in range(MAX_TRIES):
        ops = [spec.ops[rng.integers(len(spec.ops))] for _ in range(spec.num_ops)]
        numbers = [_operand(rng, spec.operand_digits)]
        numbers += [int(rng.integers(2, 10)) if op == "*" else _operand(rng, spec.operand_digits) for op in ops]
        meta = {"kind": "expr", "numbers": numbers, "ops": ops}
        results = _evaluate(_expr_steps(numbers, ops), None)
        if 0 <= min(results) and max(results) <= _max_value(spec):
            break
    text = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(ops, numbers[1:]))
    return f"Compute {text}.", meta


def _linear_problem(rng: np.random.Generator, spec: DifficultySpec) -> tuple[str, dict[str, Any]]:
    form = spec.linear_forms[rng.integers(len(spec.linear_forms))]
    x = _operand(rng, spec.operand_digits)  # the answer, chosen first
    b = 0
    if form == "x+a=b":
        a = _operand(rng, spec.operand_digits)
        lhs, rhs = f"x+{a}", x + a
    elif form == "x-a=b":
        a = int(rng.integers(1, x + 1))
        lhs, rhs = f"x-{a}", x - a
    else:
        a = int(rng.integers(2, 10))
        if form == "ax=b":
            lhs, rhs = f"{a}x", a * x
        elif form == "ax+b=c":
            b = _operand(rng, spec.operand_digits)
            lhs, rhs = f"{a}x+{b}", a * x + b
        else:  # ax-b=c
            b = int(rng.integers(1, a * x + 1))
            lhs, rhs = f"{a}x-{b}", a * x - b
    return f"Solve {lhs}={rhs}.", {"kind": "linear", "form": form, "a": a, "b": b, "rhs": rhs}


_MAKERS = {"word": _word_problem, "expr": _expr_problem, "linear": _linear_problem}


def generate_tasks(n: int, difficulty: int = 1, seed: int = 0, kinds: Sequence[str] = KINDS,
                   operand_digits: int = 2) -> list[Task]:
    """``n`` generated problems, kinds drawn uniformly from ``kinds``; the same arguments give the same tasks."""
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds={list(kinds)}: choose a non-empty subset of {KINDS}")
    spec = difficulty_spec(difficulty, operand_digits)
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        kind = kinds[rng.integers(len(kinds))]
        question, meta = _MAKERS[kind](rng, spec)
        meta["difficulty"] = difficulty
        answer = solve(meta)
        tasks.append(Task(task_id=f"gen-d{difficulty}-s{seed}-{i}", question=question, answers=(str(answer),),
                          source="generated", meta=meta))
    return tasks


# ----------------------------------------------------------------------------------------------------------
# Worked solutions: a program of steps, evaluated with an optional mistake
# ----------------------------------------------------------------------------------------------------------
# A step is (left, op, right, prefix): left/right are ints or ("s", j) for the result of step j; prefix is
# written before the step ("x=" in "x=19-7=12"). The last step's result is the answer.


def _expr_steps(numbers: Sequence[int], ops: Sequence[str], precedence: bool = True) -> list[tuple]:
    terms: list[Any] = [numbers[0]]
    rest: list[str] = []
    steps: list[tuple] = []
    for op, n in zip(ops, numbers[1:]):
        if op == "*" and precedence:
            steps.append((terms[-1], "*", n, ""))
            terms[-1] = ("s", len(steps) - 1)
        else:
            terms.append(n)
            rest.append(op)
    value = terms[0]
    for op, term in zip(rest, terms[1:]):
        steps.append((value, op, term, ""))
        value = ("s", len(steps) - 1)
    return steps


def _steps(meta: dict[str, Any], variant: str = "") -> list[tuple]:
    """Steps of a task's solution; ``variant`` selects a method error ("precedence", "inverse")."""
    kind = meta["kind"]
    if kind == "word":
        steps: list[tuple] = []
        value: Any = meta["start"]
        for op, n in meta["steps"]:
            steps.append((value, op, n, ""))
            value = ("s", len(steps) - 1)
        return steps
    if kind == "expr":
        return _expr_steps(meta["numbers"], meta["ops"], precedence=variant != "precedence")
    form, a, b, rhs = meta["form"], meta["a"], meta["b"], meta["rhs"]
    inverse = {"+": "-", "-": "+"}
    if variant == "inverse":  # moves a term across "=" without changing its sign
        inverse = {"+": "+", "-": "-"}
    if form in ("x+a=b", "x-a=b"):
        return [(rhs, inverse[form[1]], a, "x=")]
    if form == "ax=b":
        return [(rhs, "/", a, "x=")]
    return [(rhs, inverse[form[2]], b, f"{a}x="), (("s", 0), "/", a, "x=")]


def _evaluate(steps: Sequence[tuple], mistake: tuple[int, str, int] | None) -> list[int]:
    """Results of the steps; ``mistake = (step, "slip"|"swap", delta)`` corrupts one step (and what follows)."""
    results: list[int] = []
    for j, (left, op, right, _) in enumerate(steps):
        a = results[left[1]] if isinstance(left, tuple) else left
        b = results[right[1]] if isinstance(right, tuple) else right
        if mistake is not None and mistake[0] == j and mistake[1] == "swap":
            op = {"+": "-", "-": "+", "*": "+", "/": "*"}[op]
        value = _apply(op, a, b)
        if mistake is not None and mistake[0] == j and mistake[1] == "slip":
            value += mistake[2]
        results.append(value)
    return results


def _render(steps: Sequence[tuple], results: Sequence[int], mistake: tuple[int, str, int] | None) -> str:
    parts = []
    for j, (left, op, right, prefix) in enumerate(steps):
        a = results[left[1]] if isinstance(left, tuple) else left
        b = results[right[1]] if isinstance(right, tuple) else right
        if mistake is not None and mistake[0] == j and mistake[1] == "swap":
            op = {"+": "-", "-": "+", "*": "+", "/": "*"}[op]
        parts.append(f"{prefix}{a}{op}{b}={results[j]}")
    return ", ".join(parts) + f". \\boxed{{{results[-1]}}}"


def solve(meta: dict[str, Any]) -> int:
    """The exact answer of a generated task's program (``task.meta``)."""
    return _evaluate(_steps(meta), None)[-1]


def worked_solution(task: Task) -> str:
    """The correct short solution, e.g. ``14*2=28, 23+28=51. \\boxed{51}``."""
    steps = _steps(_program(task))
    return _render(steps, _evaluate(steps, None), None)


def wrong_solution(task: Task, rng: np.random.Generator) -> str:
    """A plausible wrong solution: an arithmetic slip (off by 1, 2 or 10, carried forward), a swapped
    operator, ignoring operator precedence (expr) or moving a term across ``=`` without flipping its sign
    (linear). Its boxed answer always differs from the gold answer, and every division in it is exact."""
    meta = _program(task)
    truth = solve(meta)
    for _ in range(MAX_TRIES):
        variant = rng.choice(["slip", "slip", "swap", "method"])
        method = {"expr": "precedence", "linear": "inverse"}.get(meta["kind"], "") if variant == "method" else ""
        steps = _steps(meta, method)
        step = int(rng.integers(len(steps)))
        delta = int(rng.choice([-10, -2, -1, 1, 2, 10]))
        mistake = None if method else (step, str(variant), delta)
        results = _evaluate(steps, mistake)
        if _divisions_exact(steps, results, mistake) and results[-1] != truth and results[-1] >= 0:
            return _render(steps, results, mistake)
    steps = _steps(meta)  # fallback (not reached in practice): slip the last step by one
    mistake = (len(steps) - 1, "slip", 1)
    return _render(steps, _evaluate(steps, mistake), mistake)


def _value(ref: Any, results: Sequence[int]) -> int:
    return results[ref[1]] if isinstance(ref, tuple) else ref


def _divisions_exact(steps: Sequence[tuple], results: Sequence[int], mistake: tuple[int, str, int] | None) -> bool:
    """Every division step, except the one with the deliberate mistake, divides exactly."""
    return all(op != "/" or (mistake is not None and mistake[0] == j)
               or results[j] * _value(right, results) == _value(left, results)
               for j, (left, op, right, _) in enumerate(steps))


def _program(task: Task) -> dict[str, Any]:
    if task.meta.get("kind") not in KINDS:
        raise ValueError(f"task {task.task_id!r} is not a generated task (meta has no program); worked solutions "
                         "exist only for tasks from envs.math.generated.generate_tasks")
    return task.meta


# ----------------------------------------------------------------------------------------------------------
# Role traces for SFT warm-up
# ----------------------------------------------------------------------------------------------------------


class RoleTrace(TypedDict):
    """One SFT example; agents render ``task`` + ``context`` into their prompt and learn ``target``.

    context keys: solver retry round: ``previous_solution``, ``verifier_output`` (empty in round 1);
    verifier: ``solution``.
    """

    role: str  # "solver" or "verifier"
    system: str  # "solver_verifier" (multi-agent) or "single_agent"
    task: Task
    context: dict[str, str]
    target: str
    correct: bool  # solver: the target's answer is right; verifier: the judged solution is right


def verifier_output(task: Task, solution: str) -> tuple[str, bool]:
    """The right verdict text on ``solution`` and whether the solution is correct."""
    truth = task.answers[0]
    answer = extract_boxed(solution)
    if answer == truth:
        return f"Correct, it is {truth}. <verify>approve</verify>", True
    if answer is None:
        return f"No boxed answer; it is {truth}. <verify>reject</verify>", False
    return f"Wrong, it is {truth}, not {answer}. <verify>reject</verify>", False


def solver_traces(tasks: Sequence[Task], seed: int = 0, error_rate: float = 0.2,
                  retry_fraction: float = 0.25) -> list[RoleTrace]:
    """One Solver record per task. A ``retry_fraction`` of them are round-2 records whose context holds a
    wrong solution and the Verifier's rejection; each target is wrong with probability ``error_rate``."""
    _check_rate(error_rate=error_rate, retry_fraction=retry_fraction)
    rng = np.random.default_rng(seed)
    records: list[RoleTrace] = []
    for task in tasks:
        context: dict[str, str] = {}
        if rng.random() < retry_fraction:
            previous = wrong_solution(task, rng)
            context = {"previous_solution": previous, "verifier_output": verifier_output(task, previous)[0]}
        wrong = rng.random() < error_rate
        target = wrong_solution(task, rng) if wrong else worked_solution(task)
        records.append(RoleTrace(role="solver", system="solver_verifier", task=task, context=context,
                                 target=target, correct=not wrong))
    return records


def verifier_traces(tasks: Sequence[Task], seed: int = 0, wrong_fraction: float = 0.5) -> list[RoleTrace]:
    """One Verifier record per task, judging a wrong solution with probability ``wrong_fraction``; the
    target's verdict is always right."""
    _check_rate(wrong_fraction=wrong_fraction)
    rng = np.random.default_rng(seed)
    records: list[RoleTrace] = []
    for task in tasks:
        solution = wrong_solution(task, rng) if rng.random() < wrong_fraction else worked_solution(task)
        target, correct = verifier_output(task, solution)
        records.append(RoleTrace(role="verifier", system="solver_verifier", task=task,
                                 context={"solution": solution}, target=target, correct=correct))
    return records


def single_agent_traces(tasks: Sequence[Task], seed: int = 0, error_rate: float = 0.0) -> list[RoleTrace]:
    """One single-agent solver record per task (no context); the target is wrong with probability ``error_rate``."""
    _check_rate(error_rate=error_rate)
    rng = np.random.default_rng(seed)
    records: list[RoleTrace] = []
    for task in tasks:
        wrong = rng.random() < error_rate
        target = wrong_solution(task, rng) if wrong else worked_solution(task)
        records.append(RoleTrace(role="solver", system="single_agent", task=task, context={}, target=target,
                                 correct=not wrong))
    return records


def _check_rate(**rates: float) -> None:
    for name, value in rates.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value} must be a probability in [0, 1]")
