"""The rules a run's records follow, for every reader of a run folder (``drmas summary``, the analysis):

- **the record schema** (pydantic): :class:`StepRecord` (one ``metrics.jsonl`` line): ``step`` an integer >= 0,
  ``reward/mean`` a number, every other value a number or null (NaN is a number: a logged non-finite value is
  data); :class:`EvalRecord` (one ``eval.jsonl`` line): ``step`` >= 0, ``benchmark`` a name, ``k`` >= 1,
  ``successes`` n_tasks integers in [0, k], and ``avg``/``pass`` equal to what the successes give.
  :func:`record_problems` names the file, line and field of every record that breaks it. pydantic, because the run
  config is already a pydantic schema (drmas/config/schema.py), its strict types tell an int from a float from a
  bool from a string, and each error carries the field it is about.
- **the records rule** (:func:`records_rule`, docs/reliability.md "The records rule"): a key (``step``; ``step``
  and ``benchmark``) recorded more than once with identical values collapses into one, noted; with values that
  differ, nothing tells which record is right, and the conflict names the key and the differing fields.

Lines that are not JSON records are :mod:`drmas.io`'s JSONL rule, applied before these.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, model_validator


class RecordsRefused(ValueError):
    """A run file whose records break the schema or conflict (the message names the file and the lines)."""


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


@dataclass(frozen=True)
class RecordsRuling:
    """What :func:`records_rule` decided on the records of one JSONL file of one run.

    ``kept``: mask of the records kept (file order); ``note``: the repeated keys whose records are identical, collapsed
    into one (a line of ``GridData.dropped``; the run stays usable), None without any; ``conflict``: the repeated keys
    whose records differ, with the differing fields (the run's ``problem``: it is not usable), None without any."""

    kept: np.ndarray
    note: str | None = None
    conflict: str | None = None


SHOWN_KEYS = 5
"""Repeated keys a note or conflict names before it says '...'."""
SHOWN_FIELDS = 3
"""Differing fields a conflict names per key before it says '...'."""


def records_rule(path: Path, records: list[dict[str, Any]], keys: tuple[str, ...],
                 line_nos: Sequence[int] | None = None) -> RecordsRuling:
    """The records rule, on the records of one JSONL file of one run (``keys``: ``("step",)`` in ``metrics.jsonl``,
    ``("step", "benchmark")`` in ``eval.jsonl``). Records that repeat a key with identical values (a resume that kept
    records, or two writers that computed the same) collapse into one, and the collapse is noted; records that repeat
    a key with different values make the run unusable, since nothing tells which of them is right, and the conflict
    names each key and the fields that differ (and, given ``line_nos``, the file's line of each record, their lines).
    This is the one place where records are de-duplicated (the analysis's loader, ``drmas summary``)."""
    by_key: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        by_key.setdefault(tuple(r.get(k) for k in keys), []).append(i)
    repeated = {key: rows for key, rows in by_key.items() if len(rows) > 1}
    kept = np.ones(len(records), bool)
    if not repeated:
        return RecordsRuling(kept)
    identical, differing = [], []
    for key, rows in sorted(repeated.items(), key=lambda item: str(item[0])):
        kept[rows[:-1]] = False
        texts = {_canonical(records[i]) for i in rows}
        (identical if len(texts) == 1 else differing).append((key, rows))
    note = conflict = None
    if identical:
        shown = ", ".join(str(key) for key, _ in identical[:SHOWN_KEYS]) + (" ..." if len(identical) > SHOWN_KEYS else "")
        note = (f"{path}: {len(identical)} {'/'.join(keys)} value(s) recorded more than once ({shown}), each time with "
                "identical values: collapsed into one (a resume that kept records, or two writers)")
    if differing:
        shown = "; ".join(f"{_key_text(keys, key)} recorded {len(rows)} times with different values "
                          f"({_differing_fields([records[i] for i in rows])}"
                          + (f"; lines {', '.join(str(line_nos[i]) for i in rows)}" if line_nos is not None else "")
                          + ")"
                          for key, rows in differing[:SHOWN_KEYS])
        conflict = f"conflicting records in {path}: {shown}" + (" ..." if len(differing) > SHOWN_KEYS else "")
    return RecordsRuling(kept, note, conflict)


NOT_USED = "not used (which record is right cannot be told: rerun the run, or remove the wrong records)"
"""The end of the problem of a run whose records conflict."""


def _canonical(record: dict[str, Any]) -> str:
    """A record as canonical JSON: equal for records with the same keys and values (NaN equal to NaN)."""
    return json.dumps(record, sort_keys=True)


def _key_text(keys: tuple[str, ...], key: tuple) -> str:
    """``step 3`` / ``step 25, benchmark kb-1hop``."""
    return ", ".join(f"{name} {value}" for name, value in zip(keys, key))


def _differing_fields(records: list[dict[str, Any]]) -> str:
    """``field: value vs value`` for the fields in which ``records`` differ (a field a record lacks: ``absent``)."""
    names = list(dict.fromkeys(k for r in records for k in r))
    differ = [k for k in names if len({_canonical({"v": r.get(k, _ABSENT)}) for r in records}) > 1]
    shown = ", ".join(f"{k}: " + " vs ".join(_short(r.get(k, _ABSENT)) for r in records) for k in differ[:SHOWN_FIELDS])
    return shown + (f", ... ({len(differ) - SHOWN_FIELDS} more fields)" if len(differ) > SHOWN_FIELDS else "")


_ABSENT = "<absent>"


def _short(value: Any, width: int = 40) -> str:
    """A field value for a conflict line, cut at ``width`` characters."""
    text = "absent" if value is _ABSENT else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."
