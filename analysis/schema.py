"""The record schema the analysis checks a run's ``metrics.jsonl`` and ``eval.jsonl`` against (pydantic).

pydantic, because the run config is already a pydantic schema (drmas/config/schema.py), its strict types tell
an int from a float from a bool from a string, and each error carries the field it is about; the records are
flat JSON objects, so a dataframe schema (pandera) would only check them after they were merged into frames,
where the file and line are gone.

- :class:`StepRecord` (one ``metrics.jsonl`` line): ``step`` an integer >= 0, ``reward/mean`` a number, every
  other value a number or null (NaN is a number: a logged non-finite value is data);
- :class:`EvalRecord` (one ``eval.jsonl`` line): ``step`` >= 0, ``benchmark`` a name, ``k`` >= 1,
  ``successes`` n_tasks integers in [0, k], and ``avg``/``pass`` equal to what the successes give;
- :func:`step_count_problems`: a finished run records every step 0 .. train.steps - 1 of its config, none
  beyond, and (when it evaluates) an evaluation at step 0 and at train.steps.

The rule (docs/reliability.md §7): a problem in the records of a finished run makes the analysis refuse,
listing every file and line, as it refuses a garbled line: a table or verdict built from a damaged run
would silently mean something else. Runs that are not finished are left out of the tables and listed
under REPORT.md's "Data problems" as before.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, model_validator

Number = StrictFloat  # strict: an int is a number, a bool or a string is not


class StepRecord(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    step: StrictInt = Field(ge=0)
    reward_mean: Number = Field(alias="reward/mean")

    @model_validator(mode="after")
    def _numbers_only(self) -> "StepRecord":
        bad = [k for k, v in (self.__pydantic_extra__ or {}).items()
               if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
        if bad:
            raise ValueError(f"{', '.join(f'{k!r}' for k in bad[:5])}: not a number "
                             f"(got {type((self.__pydantic_extra__ or {})[bad[0]]).__name__})")
        return self


class EvalRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    step: StrictInt = Field(ge=0)
    benchmark: StrictStr = Field(min_length=1)
    avg: Number = Field(ge=0, le=1)
    pass_: Number = Field(alias="pass", ge=0, le=1)
    k: StrictInt = Field(ge=1)
    n_tasks: StrictInt = Field(ge=0)
    successes: list[StrictInt]
    tool_failures: Optional[dict[str, StrictInt]] = None

    @model_validator(mode="after")
    def _consistent(self) -> "EvalRecord":
        s = self.successes
        if len(s) != self.n_tasks:
            raise ValueError(f"{len(s)} successes for n_tasks = {self.n_tasks}")
        if any(not 0 <= c <= self.k for c in s):
            raise ValueError(f"a success count outside [0, k = {self.k}]")
        if s and not math.isclose(self.avg, sum(s) / (len(s) * self.k), abs_tol=1e-6):
            raise ValueError(f"avg = {self.avg} but the successes give {sum(s) / (len(s) * self.k):.6g}")
        if s and not math.isclose(self.pass_, sum(c > 0 for c in s) / len(s), abs_tol=1e-6):
            raise ValueError(f"pass = {self.pass_} but the successes give {sum(c > 0 for c in s) / len(s):.6g}")
        return self


SCHEMAS: dict[str, type[BaseModel]] = {"metrics.jsonl": StepRecord, "eval.jsonl": EvalRecord}


def _describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "record"
        parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}" + (f" (got {e['input']!r})" if "input" in e and e["loc"] else ""))
    return "; ".join(parts)


def record_problems(path: Path) -> list[str]:
    """``file, line N: field: what is wrong`` for every record of ``path`` (``metrics.jsonl`` or ``eval.jsonl``)
    that breaks its schema. Lines that are not JSON records are :mod:`drmas.io`'s rule, not checked here."""
    schema = SCHEMAS[path.name]
    out = []
    for n, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        try:
            schema.model_validate(record)
        except ValidationError as exc:
            out.append(f"{path}, line {n}: {_describe(exc)}")
    return out


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
