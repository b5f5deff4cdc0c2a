"""The record schema the analysis checks a run's ``metrics.jsonl`` and ``eval.jsonl`` against: the one record
schema of :mod:`drmas.records` (:class:`StepRecord`, :class:`EvalRecord`, :func:`record_problems`, which
``drmas summary`` applies too), and what only the analysis asks of a finished run. The records are checked line by
line: a dataframe schema (pandera) would only check them after they were merged into frames, where the file and
line are gone.

- :func:`step_count_problems`: a finished run records every step 0 .. train.steps - 1 of its config, none
  beyond, and (when it evaluates) an evaluation at step 0 and at train.steps.

The rule (docs/reliability.md §7): a problem in the records of a finished run makes the analysis refuse,
listing every file and line, as it refuses a garbled line: a table or verdict built from a damaged run
would silently mean something else. Runs that are not finished are left out of the tables and listed
under REPORT.md's "Data problems" as before.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from drmas.records import SCHEMAS, EvalRecord, StepRecord, record_problems  # noqa: F401 -- the one record schema


def _ranges(values: list[int]) -> str:
    spans, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            spans.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(spans[:5]) + (" ..." if len(spans) > 5 else "")


def step_count_problems(run_dir: Path, config: dict[str, Any], steps_recorded: list[int],
                        eval_steps: list[int]) -> list[str]:
    """What a finished run's records lack against its config's ``train`` block (steps unknown: only that
    there are step records at all)."""
    train = config.get("train") or {}
    metrics, evals = run_dir / "metrics.jsonl", run_dir / "eval.jsonl"
    steps = train.get("steps")
    if not isinstance(steps, int):
        return [] if steps_recorded else [f"{metrics}: no step records in a finished run"]
    out = []
    have = set(steps_recorded)
    if missing := sorted(set(range(steps)) - have):
        out.append(f"{metrics}: {len(have & set(range(steps)))} of train.steps = {steps} steps recorded (missing "
                   f"{_ranges(missing)}) in a finished run")
    if beyond := sorted(s for s in have if s >= steps):
        out.append(f"{metrics}: steps {_ranges(beyond)} beyond train.steps = {steps}")
    if train.get("evaluate", True):
        for step in (0, steps):
            if step not in eval_steps:
                out.append(f"{evals}: no evaluation at step {step} in a finished run that evaluates")
    return out


def degraded_note(run: str, records: list[dict[str, Any]], evals: list[dict[str, Any]]) -> str | None:
    """A line for REPORT.md's "Data problems" when a run's steps or evaluations had tool failures below
    ``train.max_tool_failure_rate`` (``tools/{tool}/failures``, ``tool_failures``): its rewards there count
    those calls as failed answers. None when there were none."""
    failures: Counter[str] = Counter()
    n_steps = 0
    for r in records:
        failed = {k.split("/")[1]: int(v) for k, v in r.items() if k.startswith("tools/") and k.endswith("/failures")
                  and isinstance(v, (int, float)) and v > 0}
        n_steps += bool(failed)
        failures.update(failed)
    n_evals = sum(bool(e.get("tool_failures")) for e in evals)
    if not n_steps and not n_evals:
        return None
    counts = ", ".join(f"{tool} {n}" for tool, n in sorted(failures.items()))
    return (f"{run}: degraded: tool calls failed in {n_steps} step(s) ({counts or 'none'}) and {n_evals} evaluation "
            "record(s), below train.max_tool_failure_rate; those rewards count the failed calls as failures")
