"""Math grader: boxed extraction, the normalization fast path, math-verify in bounded worker processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from envs.math.answers import extract_boxed, fast_match, normalize_answer, parse_rational
from envs.math.grader import MathGrader, grade_batch

PATHOLOGICAL = "10^{10^{10}}"  # sympy computes this integer exactly: minutes of C-level work, no signal helps


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(timeout_s=3.0, num_workers=2)
    yield g
    g.close()


# -- extraction --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "2"),  # the last one
    ("\\boxed{a} \\fbox{b}", "b"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
    ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),
    ("$\\boxed 5$", "5"),
    ("\\boxed 42 apples", "42"),
    ("\\boxed {  7 }", "7"),
    ("\\boxed{unclosed", None),
    ("\\boxed{1} \\boxed{", None),  # the last box is unclosed
    ("no box here", None),
    ("", None),
    ("\\boxed", None),
    ("\\boxedx{3}", None),  # another command name
    ("\\boxed{}", ""),
    ("\\boxed{١٢}", "١٢"),  # unicode is kept as it is
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_never_raises_and_stays_cheap_on_huge_input():
    assert extract_boxed(None) is None
    start = time.perf_counter()
    assert extract_boxed("\\boxed{" + "{" * 200_000) is None  # unclosed and longer than the cap
    assert extract_boxed("x" * 2_000_000 + "\\boxed{3}") == "3"
    assert time.perf_counter() - start < 2.0


# -- fast path ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer, normal", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\dfrac12", "\\frac{1}{2}"),
    ("5\\text{ cm}", "5"),
    ("15\\mbox{ cm}^2", "15"),
    ("1.6 \\mathrm{~cm}", "1.6"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("10\\%", "10"),
    ("\\$18.90", "18.90"),
    ("10,\\!080", "10080"),
    ("1,000", "1000"),
    (".5", "0.5"),
    ("x = 5", "5"),
    ("\\text{(C)}", "C"),
    ("\\text{Evelyn}", "Evelyn"),
    ("1,2", "1,2"),  # not a thousands separator
    ("3+4\\mathrm{i}", "3+4i"),  # the imaginary unit is not a unit of measure
    ("x\\text{ cm}", "xcm"),  # units are dropped only after a number
    ("7.", "7"),
])
def test_normalize_answer(answer, normal):
    assert normalize_answer(answer) == normal


def test_parse_rational():
    assert parse_rational("033") == (33, True)
    assert parse_rational("-0.25") == (-0.25, False)
    assert parse_rational("\\frac{3}{4}") == (0.75, False)
    assert parse_rational("-3/4") == (-0.75, False)
    assert parse_rational("\\frac{1}{0}") is None
    assert parse_rational("3.83e35") == parse_rational("3.83\\times10^{35}") == (Fraction(383) * 10**33, False)
    assert parse_rational("2\\cdot10^5") == (200000, False)
    assert parse_rational("x") is None
    assert parse_rational("9" * 5000) is None  # beyond the digit cap: left to math-verify's length cap


@pytest.mark.parametrize("pred, gold, decision", [
    ("0.5", "\\frac{1}{2}", True),
    ("033", "33", True),
    ("27.0", "27", True),
    ("34", "33", False),  # two different integers: certain
    ("", "3", False),
    ("0.333", "\\frac13", None),  # tolerance: math-verify decides
    ("\\{2,1\\}", "\\{1,2\\}", None),
])
def test_fast_match(pred, gold, decision):
    assert fast_match(pred, gold) is decision


# -- full grader -------------------------------------------------------------------------------------------

GRADING_CASES = [
    # (solution, gold answers, expected)
    ("We get \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),
    ("\\boxed{(1, 2]}", "(1,2]", 1.0),
    ("\\boxed{\\left(1,2\\right]}", "(1,2]", 1.0),
    ("\\boxed{(1, 2)}", "(1,2]", 0.0),  # open vs half-open interval
    ("\\boxed{5}", "5\\text{ cm}", 1.0),
    ("\\boxed{3+4i}", "3+4\\mathrm{i}", 1.0),
    ("\\boxed{5\\text{ cm}}", "5", 1.0),
    ("\\boxed{90}", "90^\\circ", 1.0),
    ("\\boxed{033}", "33", 1.0),  # AIME style
    ("\\boxed{34}", "33", 0.0),
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", 1.0),  # sets ignore order (math-verify)
    ("\\boxed{(2, 1)}", "(1,2)", 0.0),  # tuples do not
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{1+x^2}", "x^2+1", 1.0),
    ("\\boxed{3\\sqrt{13}}", "3\\sqrt{13}", 1.0),
    ("\\boxed{\\sqrt{117}}", "3\\sqrt{13}", 1.0),
    ("\\boxed{2\\sqrt{13}}", "3\\sqrt{13}", 0.0),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1.0),
    ("\\boxed{3.83 \\times 10^{35}}", ("3.83e35", "3.83 \\times 10^{35}"), 1.0),  # Minerva alt answer
    ("\\boxed{7}", ("3.83e35", "3.83 \\times 10^{35}"), 0.0),
    ("\\boxed{3.83 \\times 10^{35}}", "3.83e35", 1.0),  # scientific notation (math-verify reads e as Euler's e)
    ("the answer is 0.5", "\\frac{1}{2}", 0.0),  # no box
    ("\\boxed{}", "1", 0.0),
    ("\\boxed{???}", "1", 0.0),
]


def test_grade_batch_matches_expected(grader):
    solutions = [c[0] for c in GRADING_CASES]
    golds = [c[1] for c in GRADING_CASES]
    scores = grader.grade_batch(solutions, golds)
    assert scores.dtype == np.float32 and scores.shape == (len(GRADING_CASES),)
    wrong = [(s, g, e, got) for (s, g, e), got in zip(GRADING_CASES, scores) if got != e]
    assert not wrong, wrong


def test_stats_count_fast_path_and_verify(grader):
    grader.reset_stats()
    scores = grader.grade_batch(["\\boxed{033}", "\\boxed{\\{2,1\\}}", "none"], ["33", "\\{1,2\\}", "1"])
    assert scores.tolist() == [1.0, 1.0, 0.0]
    stats = grader.reset_stats()
    assert (stats.calls, stats.fast_path_hits, stats.verify_calls, stats.no_answer) == (3, 1, 1, 1)


def test_outcomes_name_how_each_answer_was_graded(grader):
    scores, outcomes = grader.grade_answers_with_outcomes(["7", None, "\\{2,1\\}", "x" * 5000],
                                                          ["7", "7", "\\{1,2\\}", "7"])
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert outcomes == ["fast", "no_answer", "verify", "too_long"]


def test_grading_never_raises_on_odd_input(grader):
    odd = ["", "\\boxed{", "\\boxed{}}}}", "\\boxed{\\frac{", "\\boxed{\x00\ud800}", "\\boxed{" + "x^" * 400 + "}",
           "\\boxed{\\begin{pmatrix}}", "\\boxed{\\\\\\\\}", "\\boxed{ü∑∫}", None, 123]
    scores = grader.grade_batch(odd, ["1"] * len(odd))
    assert scores.tolist() == [0.0] * len(odd)
    assert grader.grade_batch(["\\boxed{1}"], [()]).tolist() == [0.0]  # no gold answer at all


def test_timeout_scores_zero_is_counted_and_the_worker_restarts():
    grader = MathGrader(timeout_s=1.0, num_workers=1)
    try:
        assert grader.grade("\\boxed{\\{2,1\\}}", "\\{1,2\\}") == 1.0  # warm: the worker is running
        starts = grader.stats.worker_starts
        begin = time.perf_counter()
        scores, outcomes = grader.grade_answers_with_outcomes([PATHOLOGICAL], ["5"])
        elapsed = time.perf_counter() - begin
        assert scores.tolist() == [0.0] and outcomes == ["timeout"]
        assert elapsed < 1.0 + 2.0, f"a 1 s timeout took {elapsed:.1f}s"
        assert grader.stats.timeouts == 1
        # the comparisons after a timeout in the same batch still run (on a fresh worker)
        scores = grader.grade_batch([f"\\boxed{{{PATHOLOGICAL}}}", "\\boxed{\\{2,1\\}}"], ["5", "\\{1,2\\}"])
        assert scores.tolist() == [0.0, 1.0]
        assert grader.stats.timeouts == 2 and grader.stats.worker_starts >= starts + 1
    finally:
        grader.close()


def test_grading_from_a_non_main_thread(grader):
    results, errors = [], []

    def work():
        try:
            results.append(grader.grade_batch(["\\boxed{\\{2,1\\}}", "\\boxed{(1,2]}"], ["\\{1,2\\}", "(1,2]"]))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(results) == 3
    assert all(r.tolist() == [1.0, 1.0] for r in results)


def test_a_killed_worker_is_replaced(grader):
    grader.grade_batch(["\\boxed{\\{2,1\\}}"], ["\\{1,2\\}"])
    for pid in grader.worker_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert grader.grade_batch(["\\boxed{\\{2,1\\}}"], ["\\{1,2\\}"]).tolist() == [1.0]


def test_module_level_grade_batch_and_pickling(grader):
    import pickle

    clone = pickle.loads(pickle.dumps(grader))
    assert clone.timeout_s == grader.timeout_s and clone.worker_pids() == []
    assert grade_batch(["\\boxed{12}"], ["12"], grader=clone).tolist() == [1.0]  # fast path: no worker started
    assert clone.worker_pids() == []


def test_mismatched_lengths_raise_a_clear_error(grader):
    with pytest.raises(ValueError, match="gold"):
        grader.grade_batch(["\\boxed{1}"], ["1", "2"])


def test_a_worker_that_cannot_start_scores_zero_and_counts_errors(monkeypatch, tmp_path):
    import envs.math.grader as grader_module

    monkeypatch.setattr(grader_module, "_WORKER_SCRIPT", tmp_path / "missing_worker.py")
    broken = MathGrader(timeout_s=1.0, num_workers=1, startup_timeout_s=10.0)
    try:
        scores = broken.grade_batch(["\\boxed{\\{2,1\\}}", "\\boxed{7}"], ["\\{1,2\\}", "7"])
        assert scores.tolist() == [0.0, 1.0]  # the fast path still works
        assert broken.stats.errors == 1 and broken.stats.worker_starts == 0
    finally:
        broken.close()


@pytest.mark.parametrize("n_jobs, workers", [(1, 4), (4, 2), (5, 2), (8, 2), (8, 4), (7, 3), (3, 8)])
def test_a_batch_is_spread_over_every_worker(n_jobs, workers):
    """A batch of n pathological answers is bounded by timeout x ceil(n / workers): every worker
    gets a chunk (a batch under 8 answers on one worker would run one timeout after another)."""
    import math

    from envs.math.grader import chunk_bounds

    bounds = chunk_bounds(n_jobs, workers)
    assert [a for a, _ in bounds] == [0, *(b for _, b in bounds[:-1])] and bounds[-1][1] == n_jobs  # a partition
    assert len(bounds) == min(workers, n_jobs)
    assert max(b - a for a, b in bounds) == math.ceil(n_jobs / min(workers, n_jobs))



def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's (prctl)")
def test_the_verify_worker_dies_with_its_parent():
    """A grader process SIGKILLed (no cleanup runs) in the middle of a comparison that takes minutes leaves no
    math-verify worker behind: busy in C code, the worker reads no end of input, but it asked the kernel for
    SIGKILL on its parent's death (drmas.shutdown.die_with_parent)."""
    code = ("import time; from envs.math.grader import _VerifyWorker; "
            f"w = _VerifyWorker(1500, 300); w.send_jobs([({PATHOLOGICAL!r}, '5')]); time.sleep(1); "
            "print(w.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                              stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert _alive(worker)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), f"math-verify worker {worker} outlived its parent"
