"""Math environment: loaders for the paper's sets, data preparation, and the ``math`` Env."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.base import Task, make_env
from envs.math.agreement import rerender_variants, wrong_answer
from envs.math.data import (MATH_SETS, benchmark_row_to_task, hub_row_to_task, load_benchmark, load_prepared,
                            read_tasks_jsonl, task_from_record, trusted_alt_answers, write_tasks_jsonl)
from envs.math.env import MathEnv
from envs.math.generated import generate_tasks, worked_solution
from envs.math.grader import MathGrader
from envs.math.prepare import add_arguments, dedupe_tasks, normalize_problem_text, remove_test_overlaps, run

EXPECTED_ROWS = {"dapo17k": 17917, "math_train": 7498, "gsm8k": 7473, "gsm8k_test": 1319, "aime24": 30,
                 "aime25": 30, "amc23": 40, "math500": 500, "math500_sampled": 50, "minerva_math": 272,
                 "olympiadbench": 675}


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(timeout_s=2.0, num_workers=1)
    yield g
    g.close()


# -- loaders -----------------------------------------------------------------------------------------------


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_load_benchmark_row_counts(shared_data, name):
    tasks = load_benchmark(name, shared_data)
    assert len(tasks) == EXPECTED_ROWS[name]
    assert all(isinstance(t, Task) and t.question and t.answers and all(a.strip() for a in t.answers) for t in tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)


@pytest.mark.data
def test_loader_details(shared_data):
    math_train_ids = {t.task_id for t in load_benchmark("math_train", shared_data)}
    assert not {"math-train-5341", "math-train-5343"} & math_train_ids  # the two empty-answer rows
    minerva = load_benchmark("minerva_math", shared_data)
    assert sum(t.meta["alt_answers"][0] != t.answers[0] for t in minerva) == 131  # as the data README says
    by_id = {t.task_id: t for t in minerva}
    assert by_id["minerva-0"].answers == ("1.6",)
    assert ("3.83e35", "3.83 \\times 10^{35}") in [t.answers for t in minerva]  # a single-part problem
    # a multi-part problem whose alt_answers belong to the previous subproblem (shown in its own text)
    assert by_id["minerva-57"].answers == ("0.53",) and "4.4e7" in by_id["minerva-57"].meta["alt_answers"]
    assert sum(len(t.answers) > 1 for t in minerva) == 102
    assert load_benchmark("math500_sampled", shared_data) == load_benchmark("math500", shared_data)[:50]
    assert load_benchmark("aime25", shared_data)[0].answers == ("70",)


def test_missing_files_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"aime24/test\.jsonl.*DRMAS_SHARED_DATA"):
        load_benchmark("aime24", tmp_path)
    with pytest.raises(FileNotFoundError, match="drmas data prepare math"):
        load_prepared("aime24", tmp_path)
    with pytest.raises(FileNotFoundError, match="hub"):
        load_benchmark("dapo_filter", tmp_path)
    with pytest.raises(KeyError, match="known"):
        load_benchmark("aime2099", tmp_path)


def test_alt_answers_of_multi_part_problems_must_match_the_main_answer():
    assert trusted_alt_answers("Find v.", "3.83e35", ["3.83 \\times 10^{35}"]) == ["3.83 \\times 10^{35}"]
    multi = "Subproblem 0: ... \\boxed{188}. Subproblem 1: the maximum wavelength?"
    assert trusted_alt_answers(multi, "566", ["188"]) == []
    forms = ["\\frac{t}{m}", "\\frac{1}{m}t"]
    assert trusted_alt_answers(multi, "\\frac{1}{m} t", forms) == forms


def test_row_mapping_and_jsonl_round_trip(tmp_path):
    task = benchmark_row_to_task({"id": "m-1", "problem": "P?", "answer": "3.83e35", "source": "minerva_math",
                                  "meta": {"alt_answers": ["3.83e35", "3.83 \\times 10^{35}"]}})
    assert task.answers == ("3.83e35", "3.83 \\times 10^{35}")
    path = tmp_path / "t.jsonl"
    assert write_tasks_jsonl([task], path) == 1
    assert read_tasks_jsonl(path) == [task] and read_tasks_jsonl(path)[0].meta == task.meta
    qa_style = {"id": "q1", "question": "Q?", "golden_answers": ["4"], "source": "s"}
    assert task_from_record(qa_style) == Task("q1", "Q?", ("4",), "s")


def test_hub_rows_of_each_layout_become_tasks():
    verl = {"prompt": [{"role": "user", "content": "Find x.\n\nLet's think step by step and output the final "
                                                   "answer within \\boxed{}."}],
            "reward_model": {"ground_truth": "12", "style": "rule"}, "ability": "math"}
    assert hub_row_to_task(verl, "dapo_filter", 0).question == "Find x."
    assert hub_row_to_task(verl, "dapo_filter", 0).answers == ("12",)
    gsm = hub_row_to_task({"question": "Q?", "answer": "3+4=7\n#### 1,007"}, "gsm8k", 3)
    assert gsm.answers == ("1007",) and gsm.meta["solution"].endswith("1,007") and gsm.task_id == "gsm8k-3"
    assert hub_row_to_task({"problem": "Q", "answer": 27.0}, "amc23", 0).answers == ("27",)
    assert hub_row_to_task({"problem": "Q", "answer": 70}, "aime25", 0).answers == ("70",)
    assert hub_row_to_task({"question": "Q", "final_answer": ["3", "4"]}, "olympiadbench", 0).answers == ("3, 4",)
    math_row = {"problem": "Q", "solution": "so \\boxed{\\frac12}."}
    assert hub_row_to_task(math_row, "math_train", 0).answers == ("\\frac12",)


# -- preparation -------------------------------------------------------------------------------------------


def _tasks(*pairs: tuple[str, str]) -> list[Task]:
    return [Task(f"t{i}", q, (a,)) for i, (q, a) in enumerate(pairs)]


def test_overlap_removal_and_dedupe_on_small_examples():
    train = _tasks(("What is  1+1?", "2"), ("what is 1+1?", "2"), ("Find y.", "3"), ("Find y.", "4"),
                   ("Find z.", "5"), ("Find z.", "5.0"), ("Test problem.", "9"))
    kept, overlaps = remove_test_overlaps(train, {"bench": _tasks(("test  PROBLEM.", "9"), ("Other.", "1"))})
    assert overlaps == {"bench": 1} and len(kept) == 6
    deduped, counts = dedupe_tasks(kept)
    # "What is 1+1?" twice (same answer) -> one copy; "Find y." disagrees -> both dropped;
    # "Find z." answers 5 and 5.0 normalize differently, so they conflict too
    assert [t.question for t in deduped] == ["What is  1+1?"]
    assert counts == {"duplicates_removed": 1, "conflicting_problems": 2, "conflicting_rows_removed": 4}
    kept_first, counts = dedupe_tasks(kept, drop_conflicting=False)
    assert [t.answers[0] for t in kept_first] == ["2", "3", "5"] and counts["duplicates_removed"] == 3
    assert normalize_problem_text("  A\n b\tC ") == "a b c"


@pytest.mark.data
def test_prepare_removes_exactly_the_known_overlaps(shared_data, tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    report = run(parser.parse_args(["--out", str(tmp_path), "--shared-dir", str(shared_data)]))
    dapo = report["train"]["dapo17k"]
    assert dapo["test_overlaps"] == {"aime24": 0, "aime25": 0, "amc23": 5, "math500": 4, "minerva_math": 0,
                                     "olympiadbench": 1}
    assert dapo["overlap_rows_removed"] == 10
    assert (dapo["duplicates_removed"], dapo["conflicting_problems"], dapo["conflicting_rows_removed"]) == (719, 12, 24)
    assert dapo["rows_out"] == 17917 - 10 - 719 - 24
    train = load_prepared("dapo17k", tmp_path)
    train_keys = [normalize_problem_text(t.question) for t in train]
    assert len(train) == dapo["rows_out"] and len(set(train_keys)) == len(train_keys)
    for name in ("aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"):
        test = load_prepared(name, tmp_path)
        assert len(test) == EXPECTED_ROWS[name]
        assert not {normalize_problem_text(t.question) for t in test} & set(train_keys)
    assert load_prepared("math500_sampled", tmp_path) == load_prepared("math500", tmp_path)[:50]
    assert (tmp_path / "prepare_report.json").is_file()


def test_prepare_hub_path_explains_missing_datasets(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ImportError, match="pip install datasets"):
        run(parser.parse_args(["--source", "hf", "--out", str(tmp_path), "--test", "aime24"]))


def test_every_set_has_a_source():
    assert all(spec.local_file or spec.hf_name for spec in MATH_SETS.values())


# -- the Env -----------------------------------------------------------------------------------------------


def test_env_rewards_validity_and_infos(grader):
    env = make_env("math", grader=grader)
    assert isinstance(env, MathEnv)
    tasks = [Task("a", "1/2 as decimal?", ("\\frac{1}{2}",)), Task("b", "2+2?", ("4",)), Task("c", "3+3?", ("6",))]
    assert env.reset(tasks) == [t.question for t in tasks]
    out = env.step(["It is \\boxed{0.5}.", "I think 5", "\\boxed{7}"])
    assert out.rewards.tolist() == [1.0, 0.0, 0.0] and out.rewards.dtype == np.float32
    assert out.valid.tolist() == [True, False, True] and out.dones.all()
    assert [i["extracted_answer"] for i in out.infos] == ["0.5", None, "7"]
    assert out.observations == ["", "", ""]
    sub = env.step(["\\boxed{6}"], idx=[2])  # act on one episode only
    assert sub.rewards.tolist() == [1.0] and sub.infos[0]["task_id"] == "c"
    with pytest.raises(ValueError, match="one action per index"):
        env.step(["x"], idx=[0, 1])


def test_env_on_generated_tasks(grader):
    tasks = generate_tasks(30, difficulty=3, seed=0)
    env = MathEnv(grader=grader)
    env.reset(tasks)
    out = env.step([worked_solution(t) for t in tasks])
    assert out.rewards.tolist() == [1.0] * len(tasks) and out.valid.all()


_LATEX_BITS = st.sampled_from(["\\boxed{", "\\fbox{", "{", "}", "\\frac", "\\left(", "\\right)", "^", "_", "1",
                               "23", "x", "\\sqrt", "$", " ", "\\{", "\\}", ",", "\\text{", "\\\\", "=", "ü", "\n"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(st.one_of(st.text(max_size=200), st.lists(_LATEX_BITS, max_size=40).map("".join)),
                        min_size=1, max_size=4))
def test_env_never_raises_on_garbage(grader, actions):
    env = MathEnv(grader=grader)
    env.reset([Task(f"t{i}", "q", ("1",)) for i in range(len(actions))])
    out = env.step(actions)
    assert set(out.rewards.tolist()) <= {0.0, 1.0} and out.valid.dtype == bool and len(out.infos) == len(actions)


# -- agreement script helpers ------------------------------------------------------------------------------


def test_rerendered_answers_are_accepted_and_wrong_ones_rejected(grader):
    answers = ["\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)", "6+9i", "13535", "90^\\circ", "(1,2]"]
    solutions, golds = [], []
    for answer in answers:
        for variant in rerender_variants(answer).values():
            solutions.append(f"\\boxed{{{variant}}}")
            golds.append(answer)
    assert grader.grade_batch(solutions, golds).tolist() == [1.0] * len(solutions)
    assert rerender_variants("\\frac{14}{3}")["slash_fraction"] == "14/3"
    wrong = grader.grade_batch([f"\\boxed{{{wrong_answer(a)}}}" for a in answers], answers)
    assert wrong.tolist() == [0.0] * len(answers)
