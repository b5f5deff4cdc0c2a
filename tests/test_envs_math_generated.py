"""Generated CPU-scale math task and its SFT role traces."""
from __future__ import annotations

import re

import numpy as np
import pytest

from envs.base import Task
from envs.math.data import task_from_record, task_to_record
from envs.math.generated import (difficulty_spec, generate_tasks, single_agent_traces, solver_traces,
                                 verifier_traces, worked_solution, wrong_solution)
from envs.math.answers import extract_boxed

_WORD_OPS = [(r"(?:buys|finds|gets) (\d+) more", lambda v, n: v + n),
             (r"(?:gives away|loses|sells) (\d+)", lambda v, n: v - n),
             (r"doubles them", lambda v, n: 2 * v), (r"triples them", lambda v, n: 3 * v)]


def reference_answer(question: str) -> int:
    """Recompute an answer from the question text alone (independent of the generator's program)."""
    if question.startswith("Compute "):
        return eval(question[len("Compute "):-1])  # only digits and + - *
    if question.startswith("Solve "):
        lhs, rhs = question[len("Solve "):-1].split("=")
        match = re.fullmatch(r"(\d*)x(?:([+-])(\d+))?", lhs)
        a = int(match.group(1) or 1)
        b = int(match.group(3) or 0) * (-1 if match.group(2) == "-" else 1)
        assert (int(rhs) - b) % a == 0
        return (int(rhs) - b) // a
    start = int(re.search(r"has (\d+)", question).group(1))
    story = question.split(". ", 1)[1] if question.count(". ") > 1 else question.split(" and ", 1)[1]
    actions = re.split(r", | and ", story)
    value = start
    for action in actions:
        for pattern, apply in _WORD_OPS:
            found = re.search(pattern, action)
            if found:
                value = apply(value, int(found.group(1)) if found.groups() else 0)
                break
    return value


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_answers_are_correct_integers(difficulty):
    tasks = generate_tasks(300, difficulty=difficulty, seed=difficulty)
    for task in tasks:
        answer = int(task.answers[0])
        assert answer >= 0
        assert reference_answer(task.question) == answer, task


def test_same_seed_same_tasks_and_seeds_differ():
    a = [task_to_record(t) for t in generate_tasks(50, difficulty=3, seed=7)]
    b = [task_to_record(t) for t in generate_tasks(50, difficulty=3, seed=7)]
    c = [task_to_record(t) for t in generate_tasks(50, difficulty=3, seed=8)]
    assert a == b and a != c
    assert task_from_record(a[0]) == generate_tasks(1, difficulty=3, seed=7)[0]


def test_difficulty_one_is_a_single_two_digit_addition():
    spec = difficulty_spec(1)
    assert (spec.num_ops, spec.ops, spec.linear_forms) == (1, ("+",), ("x+a=b",))
    for task in generate_tasks(200, difficulty=1, seed=0, kinds=("expr",)):
        assert re.fullmatch(r"Compute [1-9]\d\+[1-9]\d\.", task.question)
    word = generate_tasks(1, difficulty=1, seed=0, kinds=("word",))[0].question
    assert re.fullmatch(r"\w+ has \d\d \w+ and \w+ \d\d more\. How many \w+ now\?", word)


def test_difficulty_knob_grows_the_problem():
    assert [difficulty_spec(d).num_ops for d in (1, 2, 3, 4, 5)] == [1, 1, 2, 3, 4]
    assert "*" in difficulty_spec(4).ops and "ax+b=c" in difficulty_spec(4).linear_forms
    three_digit = generate_tasks(50, difficulty=1, seed=0, kinds=("expr",), operand_digits=3)
    assert all(re.fullmatch(r"Compute \d{3}\+\d{3}\.", t.question) for t in three_digit)
    with pytest.raises(ValueError, match="kinds"):
        generate_tasks(1, kinds=("essay",))


def _check_steps(solution: str) -> None:
    """Every step ``a op b = r`` of a worked solution is right."""
    for a, op, b, r in re.findall(r"(-?\d+)([-+*/])(\d+)=(-?\d+)", solution):
        a, b, r = int(a), int(b), int(r)
        assert {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == r, solution


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_worked_and_wrong_solutions(difficulty):
    tasks = generate_tasks(300, difficulty=difficulty, seed=11)
    rng = np.random.default_rng(0)
    for task in tasks:
        right = worked_solution(task)
        assert extract_boxed(right) == task.answers[0]
        _check_steps(right)
        wrong = wrong_solution(task, rng)
        assert extract_boxed(wrong) != task.answers[0] and int(extract_boxed(wrong)) >= 0
        assert len(right) <= 70 and len(wrong) <= 75  # a tiny model writes these: ~40 byte-level BPE tokens
    assert max(len(worked_solution(t)) for t in generate_tasks(300, difficulty=1, seed=0)) <= 30


def test_solver_traces_error_rate_and_retry_context():
    tasks = generate_tasks(1000, difficulty=3, seed=2)
    records = solver_traces(tasks, seed=0, error_rate=0.3, retry_fraction=0.4)
    assert len(records) == len(tasks)
    assert all(r["role"] == "solver" and r["system"] == "solver_verifier" for r in records)
    correct = np.array([r["correct"] for r in records])
    assert abs((1 - correct.mean()) - 0.3) < 0.05
    for r in records:
        assert (extract_boxed(r["target"]) == r["task"].answers[0]) == r["correct"]
        if r["context"]:  # a retry round sees a wrong solution and its rejection
            assert extract_boxed(r["context"]["previous_solution"]) != r["task"].answers[0]
            assert r["context"]["verifier_output"].endswith("<verify>reject</verify>")
    retries = sum(bool(r["context"]) for r in records)
    assert abs(retries / len(records) - 0.4) < 0.05
    assert all(r["correct"] for r in solver_traces(tasks[:100], seed=0, error_rate=0.0))
    assert solver_traces(tasks[:20], seed=5) == solver_traces(tasks[:20], seed=5)


def test_verifier_traces_agree_with_ground_truth():
    tasks = generate_tasks(1000, difficulty=4, seed=3)
    records = verifier_traces(tasks, seed=1, wrong_fraction=0.5)
    for r in records:
        solution_right = extract_boxed(r["context"]["solution"]) == r["task"].answers[0]
        verdict = re.search(r"<verify>(approve|reject)</verify>$", r["target"]).group(1)
        assert (verdict == "approve") == solution_right == r["correct"]
    rejects = sum(not r["correct"] for r in records) / len(records)
    assert 0.45 < rejects < 0.55


def test_single_agent_traces():
    tasks = generate_tasks(20, difficulty=2, seed=4)
    records = single_agent_traces(tasks, seed=0)
    assert all(r["system"] == "single_agent" and r["context"] == {} and r["correct"] for r in records)
    assert [r["target"] for r in records] == [worked_solution(t) for t in tasks]


def test_traces_reject_tasks_without_a_program_and_bad_rates():
    with pytest.raises(ValueError, match="not a generated task"):
        worked_solution(Task("x", "What is 2+2?", ("4",)))
    with pytest.raises(ValueError, match="error_rate"):
        solver_traces(generate_tasks(2), error_rate=1.5)
