"""Math answer grading: extract the last ``\\boxed{}`` answer and compare it to the gold answer(s).

Two stages, cheapest first:

1. **Fast path** (in process, pure string work, :mod:`envs.math.answers`): both answers are normalized (``normalize_answer``:
   spaces, ``\\left``/``\\right``, ``\\!``, ``\\dfrac``, ``$``, degrees, percent, ``\\text{}`` units, trailing
   ``.`` ...). Equal normal forms are correct; two plain rational numbers are compared exactly (``033`` = ``33``,
   ``0.5`` = ``\\frac12``), and two different integers are wrong.
2. **math-verify** for everything the fast path leaves open (intervals, sets, expressions ...). Every call runs
   in a persistent worker *subprocess* (``_verify_worker.py``) and is bounded by ``timeout_s``: on timeout the
   worker is killed and started again. math-verify's own ``signal.alarm`` timeouts are disabled (they raise
   outside the main thread and cannot interrupt C-level big-integer arithmetic such as ``10^{10^{10}}``), so
   grading works from any thread, inside Ray actors, and a pathological answer never hangs the caller.

A timeout or a parse/comparison error scores 0 and is counted in ``MathGrader.stats``. No input text makes
grading raise.

    grader = MathGrader(timeout_s=5.0)
    scores = grader.grade_batch(["... so \\boxed{\\frac12}"], [("0.5",)])   # array([1.], dtype=float32)
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from envs.math.answers import extract_boxed, fast_match

logger = logging.getLogger(__name__)

GoldAnswers = Union[str, Sequence[str]]
"""One gold answer, or every accepted gold answer of a task."""

_WORKER_SCRIPT = Path(__file__).with_name("_verify_worker.py")

# ----------------------------------------------------------------------------------------------------------
# math-verify worker subprocesses
# ----------------------------------------------------------------------------------------------------------


class _WorkerDied(Exception):
    """The worker process exited or stopped speaking the protocol."""


class _VerifyWorker:
    """One ``_verify_worker.py`` subprocess; JSON lines over stdin/stdout, reads bounded by a timeout."""

    def __init__(self, memory_limit_mb: int, startup_timeout_s: float):
        self.process = subprocess.Popen(
            [sys.executable, str(_WORKER_SCRIPT), str(memory_limit_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,  # no Ctrl-C noise
        )
        self._selector = selectors.DefaultSelector()  # epoll: works for file descriptors above 1024
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._buffer = b""
        try:
            reply = self.read_message(startup_timeout_s)
        except _WorkerDied:
            reply = {"fatal": "it exited while starting"}
        if reply is None or "fatal" in reply or not reply.get("ready"):
            self.kill()
            why = "did not start in time" if reply is None else reply.get("fatal", reply)
            raise _WorkerDied(f"math-verify worker failed to start: {why}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def send_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        try:
            self.process.stdin.write(json.dumps({"jobs": list(jobs)}).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise _WorkerDied(f"cannot write to worker: {exc}") from exc

    def read_message(self, timeout_s: float) -> dict | None:
        """Next JSON line, or None when none arrives within ``timeout_s``; raises _WorkerDied on exit."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                return None
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                raise _WorkerDied("worker exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError as exc:
            raise _WorkerDied(f"unreadable worker output {line[:80]!r}") from exc

    def kill(self) -> None:
        """Stop the process (SIGKILL) and release its pipes; safe to call twice."""
        self._selector.close()
        if self.process.poll() is None:
            self.process.kill()
        for cleanup in (lambda: self.process.wait(timeout=10), self.process.stdin.close, self.process.stdout.close):
            try:
                cleanup()
            except (OSError, ValueError, subprocess.TimeoutExpired):  # broken pipe, already closed, unkillable
                pass


def _kill_workers(workers: set) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()


# ----------------------------------------------------------------------------------------------------------
# Grader
# ----------------------------------------------------------------------------------------------------------


@dataclass
class GraderStats:
    """Counters since the grader was built (or last ``reset_stats``)."""

    calls: int = 0  # answers graded
    no_answer: int = 0  # answers missing (no \boxed{} found) -> 0
    fast_path_hits: int = 0  # answers decided by the fast path alone
    verify_calls: int = 0  # (answer, gold) comparisons sent to math-verify
    timeouts: int = 0  # comparisons that ran past timeout_s (worker killed) -> 0
    errors: int = 0  # parse/comparison errors and worker failures -> 0
    too_long: int = 0  # answers longer than max_answer_chars, scored 0 without math-verify
    worker_starts: int = 0
    failures: int = 0  # the grader failed, not the answer: workers that died or could not start -> 0 (a timeout
    # is the answer's: a comparison no worker finishes, e.g. 10^{10^{10}}, counted in ``timeouts``)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# Outcome of one graded answer (also reported in the math env's infos).
OUTCOME_NO_ANSWER, OUTCOME_FAST, OUTCOME_VERIFY = "no_answer", "fast", "verify"
OUTCOME_TIMEOUT, OUTCOME_ERROR, OUTCOME_TOO_LONG = "timeout", "error", "too_long"


def _gold_tuple(gold: GoldAnswers) -> tuple[str, ...]:
    if isinstance(gold, str):
        return (gold,)
    try:
        return tuple(g for g in gold if isinstance(g, str))
    except TypeError:
        return ()


class MathGrader:
    """Batched, thread-safe math grader with a bounded math-verify stage (see the module docstring).

    Worker subprocesses start lazily (a batch the fast path decides starts none) and are reused. Safe to
    call from several threads at once; pickling keeps only the settings (fresh workers on the other side).
    """

    def __init__(self, timeout_s: float = 5.0, num_workers: int | None = None, max_answer_chars: int = 1000,
                 memory_limit_mb: int = 4096, startup_timeout_s: float = 60.0, fast_path: bool = True):
        """
        Args:
            timeout_s: wall-clock limit of one math-verify comparison (parse both answers + verify).
            fast_path: decide what ``fast_match`` can before math-verify (off: math-verify judges every answer).
            num_workers: math-verify subprocesses used in parallel (default: min(4, CPU count)).
            max_answer_chars: answers longer than this are scored 0 without math-verify (counted).
            memory_limit_mb: address-space limit of each worker (0 = none); an answer that exhausts it is an error.
            startup_timeout_s: time allowed for a worker to import math-verify.
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 (seconds per math-verify comparison)")
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError("MathGrader needs math-verify: `pip install math-verify==0.9.0` "
                              "(or `pip install -e .[envs]`)")
        self.timeout_s = float(timeout_s)
        self.num_workers = max(1, num_workers or min(4, os.cpu_count() or 1))
        self.max_answer_chars = int(max_answer_chars)
        self.memory_limit_mb = int(memory_limit_mb)
        self.startup_timeout_s = float(startup_timeout_s)
        self.fast_path = bool(fast_path)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.stats = GraderStats()
        self._stats_lock = threading.Lock()
        self._slots: queue.LifoQueue[_VerifyWorker | None] = queue.LifoQueue()
        for _ in range(self.num_workers):
            self._slots.put(None)  # a free slot; its worker starts on first use
        self._live_workers: set[_VerifyWorker] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._finalizer = weakref.finalize(self, _kill_workers, self._live_workers)

    def __getstate__(self) -> dict:
        return {"timeout_s": self.timeout_s, "num_workers": self.num_workers,
                "max_answer_chars": self.max_answer_chars, "memory_limit_mb": self.memory_limit_mb,
                "startup_timeout_s": self.startup_timeout_s, "fast_path": self.fast_path}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        _kill_workers(self._live_workers)

    def worker_pids(self) -> list[int]:
        """Process ids of the running math-verify workers."""
        return sorted(worker.pid for worker in list(self._live_workers))

    def reset_stats(self) -> GraderStats:
        """Return the current counters and start new ones."""
        with self._stats_lock:
            stats, self.stats = self.stats, GraderStats()
        return stats

    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            for name, value in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    # -- public API ----------------------------------------------------------------------------------------

    def grade_batch(self, solutions: Sequence[str], gold_answers_list: Sequence[GoldAnswers]) -> np.ndarray:
        """Score full solution texts: 1.0 when the last boxed answer equals any gold answer, else 0.0.

        Returns float32 ``[len(solutions)]``. Never raises on the text.
        """
        return self.grade_answers([extract_boxed(s) for s in solutions], gold_answers_list)

    def grade(self, solution: str, gold_answers: GoldAnswers) -> float:
        """Score one solution text (see ``grade_batch``)."""
        return float(self.grade_batch([solution], [gold_answers])[0])

    def grade_answers(self, answers: Sequence[str | None], gold_answers_list: Sequence[GoldAnswers]) -> np.ndarray:
        """Score already-extracted answers (None = no answer found); float32 ``[len(answers)]``."""
        return self.grade_answers_with_outcomes(answers, gold_answers_list)[0]

    def grade_answers_with_outcomes(self, answers: Sequence[str | None],
                                    gold_answers_list: Sequence[GoldAnswers]) -> tuple[np.ndarray, list[str]]:
        """Like ``grade_answers``, plus one outcome per answer: ``no_answer``, ``fast``, ``verify``,
        ``timeout``, ``error`` or ``too_long``."""
        if len(answers) != len(gold_answers_list):
            raise ValueError(f"{len(answers)} answers but {len(gold_answers_list)} gold entries; pass one "
                             "gold answer (or tuple of accepted answers) per answer")
        scores = np.zeros(len(answers), dtype=np.float32)
        outcomes = [OUTCOME_NO_ANSWER] * len(answers)
        jobs: list[tuple[str, str]] = []
        job_owner: list[int] = []
        for i, (answer, gold) in enumerate(zip(answers, gold_answers_list)):
            golds = _gold_tuple(gold)
            if not isinstance(answer, str) or not answer.strip() or not golds:
                continue
            if len(answer) > self.max_answer_chars:
                outcomes[i] = OUTCOME_TOO_LONG
                continue
            decisions = [self._fast_match(answer, g) for g in golds]
            if any(d is True for d in decisions) or all(d is False for d in decisions):
                scores[i] = float(any(decisions))
                outcomes[i] = OUTCOME_FAST
                continue
            outcomes[i] = OUTCOME_VERIFY
            for g, decision in zip(golds, decisions):
                if decision is None:
                    jobs.append((g, answer))
                    job_owner.append(i)
        self._count(calls=len(answers), no_answer=outcomes.count(OUTCOME_NO_ANSWER),
                    fast_path_hits=outcomes.count(OUTCOME_FAST), too_long=outcomes.count(OUTCOME_TOO_LONG))
        if jobs:
            results = self._verify_all(jobs)
            for owner, result in zip(job_owner, results):
                if result is True:
                    scores[owner] = 1.0
                    outcomes[owner] = OUTCOME_VERIFY
                elif result in (OUTCOME_TIMEOUT, OUTCOME_ERROR) and scores[owner] == 0.0:
                    outcomes[owner] = result
        return scores, outcomes

    def _fast_match(self, answer: str, gold: str) -> bool | None:
        if not self.fast_path:
            return None
        try:
            return fast_match(answer, gold)
        except Exception:  # a normalization bug must not lose the answer: let math-verify decide
            logger.exception("fast-path grading failed on %r vs %r", answer[:80], gold[:80])
            return None

    # -- math-verify stage ---------------------------------------------------------------------------------

    def _verify_all(self, jobs: list[tuple[str, str]]) -> list[bool | str]:
        """Run (gold, pred) comparisons on the workers; True/False, or OUTCOME_TIMEOUT / OUTCOME_ERROR."""
        self._count(verify_calls=len(jobs))
        chunks = [jobs[a:b] for a, b in chunk_bounds(len(jobs), self.num_workers)]
        if len(chunks) == 1:
            return self._verify_chunk(chunks[0])
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.num_workers, thread_name_prefix="math-verify")
        return [r for part in self._executor.map(self._verify_chunk, chunks) for r in part]

    def _verify_chunk(self, jobs: list[tuple[str, str]]) -> list[bool | str]:
        worker = self._slots.get()
        try:
            results, worker = self._run_on_worker(worker, jobs)
        finally:
            self._slots.put(worker)
        return results

    def _start_worker(self) -> _VerifyWorker | None:
        try:
            worker = _VerifyWorker(self.memory_limit_mb, self.startup_timeout_s)
        except (_WorkerDied, OSError) as exc:
            logger.error("%s; scoring the pending comparisons 0", exc)
            return None
        self._live_workers.add(worker)
        self._count(worker_starts=1)
        return worker

    def _retire(self, worker: _VerifyWorker) -> None:
        self._live_workers.discard(worker)
        worker.kill()

    def _run_on_worker(self, worker: _VerifyWorker | None,
                       jobs: list[tuple[str, str]]) -> tuple[list[bool | str], _VerifyWorker | None]:
        results: list[bool | str] = [OUTCOME_ERROR] * len(jobs)
        next_job = 0
        while next_job < len(jobs):
            if worker is None or worker.process.poll() is not None:
                if worker is not None:
                    self._retire(worker)
                worker = self._start_worker()
                if worker is None:
                    self._count(errors=len(jobs) - next_job, failures=len(jobs) - next_job)
                    break
            try:
                sent_from = next_job
                worker.send_jobs(jobs[sent_from:])
                while next_job < len(jobs):
                    reply = worker.read_message(self.timeout_s)
                    if reply is None:
                        logger.warning("math-verify timed out after %.1fs on %r vs gold %r; restarting its "
                                       "worker", self.timeout_s, jobs[next_job][1][:80], jobs[next_job][0][:80])
                        results[next_job] = OUTCOME_TIMEOUT
                        self._count(timeouts=1)
                        next_job += 1
                        self._retire(worker)
                        worker = None
                        break
                    if reply.get("i") != next_job - sent_from:
                        raise _WorkerDied(f"out-of-order reply {reply}")
                    if "match" in reply:
                        results[next_job] = bool(reply["match"])
                    else:
                        self._count(errors=1)
                        logger.debug("math-verify error on %r: %s", jobs[next_job][1][:80], reply.get("error"))
                    next_job += 1
            except _WorkerDied as exc:
                logger.warning("math-verify worker died (%s) on %r; restarting it", exc, jobs[next_job][1][:80])
                results[next_job] = OUTCOME_ERROR
                self._count(errors=1, failures=1)
                next_job += 1
                self._retire(worker)
                worker = None
        return results, worker


def chunk_bounds(n_jobs: int, workers: int) -> list[tuple[int, int]]:
    """(start, stop) of the per-worker chunks of a batch: one chunk per worker (at most one per job), sizes
    differing by at most one, so a batch of pathological answers takes at most ``ceil(n_jobs / workers)``
    timeouts in sequence (plus worker restarts), not ``n_jobs`` of them."""
    n_chunks = max(1, min(workers, n_jobs))
    bounds = np.linspace(0, n_jobs, n_chunks + 1).astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


# ----------------------------------------------------------------------------------------------------------
# Module-level convenience
# ----------------------------------------------------------------------------------------------------------

_DEFAULT_GRADER: MathGrader | None = None
_DEFAULT_GRADER_LOCK = threading.Lock()


def default_grader() -> MathGrader:
    """The process-wide grader with default settings (created on first use, thread-safe)."""
    global _DEFAULT_GRADER
    with _DEFAULT_GRADER_LOCK:
        if _DEFAULT_GRADER is None:
            _DEFAULT_GRADER = MathGrader()
        return _DEFAULT_GRADER


def grade_batch(solutions: Sequence[str], gold_answers_list: Sequence[GoldAnswers],
                grader: MathGrader | None = None) -> np.ndarray:
    """Score solution texts against gold answers with ``grader`` (default: ``default_grader()``)."""
    return (grader or default_grader()).grade_batch(solutions, gold_answers_list)
