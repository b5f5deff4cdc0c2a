"""Stand-alone math-verify worker process (started by ``envs.math.grader``; not imported).

Protocol (JSON lines): after importing math-verify it writes ``{"ready": true}`` (or ``{"fatal": msg}``).
Then, for each input line ``{"jobs": [[gold, pred], ...]}`` it writes one line per job, in order:
``{"i": k, "match": bool}`` or ``{"i": k, "error": msg}``. It exits on end of input.

math-verify's own timeouts use ``signal.alarm`` (main thread only, and unable to interrupt long C-level
big-integer arithmetic), so they are disabled here; the parent enforces the timeout by killing this process.
"""
from __future__ import annotations

import json
import os
import sys

# Run as a script, Python puts this file's folder first on sys.path; its module names (env, data, ...)
# must not shadow anything that sympy or the standard library imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import functools  # noqa: E402
import logging  # noqa: E402


def _limit_memory(limit_mb: int) -> None:
    if limit_mb <= 0:
        return
    try:
        import resource

        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except Exception:
        pass


def _write(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    import signal

    from drmas.shutdown import die_with_parent

    die_with_parent(os.getppid(), signal.SIGKILL)  # the grader's timeout kills this process; so does its death
    memory_limit_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    _limit_memory(memory_limit_mb)
    try:
        from math_verify import parse, verify
    except Exception as exc:  # math-verify missing or broken: the parent reports it
        _write({"fatal": f"{type(exc).__name__}: {exc}"})
        return
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    @functools.lru_cache(maxsize=4096)
    def parse_boxed(answer: str) -> tuple:
        return tuple(parse("\\boxed{" + answer + "}", parsing_timeout=None, raise_on_error=True))

    def match(gold: str, pred: str) -> bool:
        gold_parsed, pred_parsed = parse_boxed(gold), parse_boxed(pred)
        if not gold_parsed:
            raise ValueError("gold answer could not be parsed")
        if not pred_parsed:
            raise ValueError("predicted answer could not be parsed")
        # Compare pair by pair, so that one failing comparison cannot hide a match of another pair.
        first_error: Exception | None = None
        for g in gold_parsed:
            for p in pred_parsed:
                try:
                    if verify(g, p, timeout_seconds=None, raise_on_error=True):
                        return True
                except Exception as exc:
                    first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return False

    _write({"ready": True})
    for line in sys.stdin:
        try:
            jobs = json.loads(line)["jobs"]
        except Exception as exc:
            _write({"i": -1, "error": f"bad request: {exc}"})
            continue
        for i, (gold, pred) in enumerate(jobs):
            try:
                _write({"i": i, "match": bool(match(gold, pred))})
            except Exception as exc:
                _write({"i": i, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})


if __name__ == "__main__":
    main()
