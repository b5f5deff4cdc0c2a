"""One run folder of a grid read into its records: :func:`load_run` turns an index entry and its folder into a
:class:`RunRecords` (the run's row of ``GridData.runs``, its step records, evaluation and assignment rows, the records
it dropped, its notes, its damaged files and schema breaks), and :func:`analysis.runs.assemble_grid` builds the
grid's frames from those of every run.

A run's JSONL files are read by :mod:`drmas.io`'s rule (:func:`read_jsonl`), its records checked against
:mod:`analysis.schema` and de-duplicated by the records rule (:func:`drmas.records.records_rule`); its settings come
from one source, its manifest's ``config`` (:func:`settings_of`), checked against its ``config.yaml``, cell and
listing by :func:`analysis.integrity.settings_problems`. Its tags come from its index entry, or from its manifest
where the grid has no index (:func:`tags_from_manifest`, with the setting tag of :func:`setting_of`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.integrity import settings_problems
from analysis.schema import degraded_note, record_problems, step_count_problems
from drmas.algos import ESTIMATOR_TERMS
from drmas.io import JsonlDamaged, read_jsonl_lines
from drmas.records import NOT_USED, records_rule

TAGS = ("task", "setting", "estimator", "assignment", "entry", "seed", "level")  # level: a sweep's knob value
EVAL_COLUMNS = ["run", "step", "benchmark", "avg", "pass", "k", "n_tasks", "successes"]

ESTIMATOR_SETTING = {key: terms.setting for key, terms in ESTIMATOR_TERMS.items() if terms.setting}
"""An estimator's registry key (``algo.estimator``, the grid's ``estimator`` tag) -> its spelling in the setting
tags (the names of analysis/data/paper_tables.csv), as declared in ``drmas.algos.ESTIMATOR_TERMS``; build a tag
with :func:`setting_of`."""


def setting_of(assignment: str, estimator: str) -> str:
    """The setting tag of a run: ``nonsharing_drmas``, ``sharing_grpo`` (the paper's two estimators) or
    ``nonsharing:(mu_k,sigma)`` (the ablation's); ``single_agent_grpo`` for one agent."""
    if assignment == "single":
        return "single_agent_grpo"
    suffix = ESTIMATOR_SETTING.get(estimator, estimator)
    return f"{assignment}_{suffix}" if suffix in ("grpo", "drmas") else f"{assignment}:{suffix}"


class GridLoadError(ValueError):
    """A grid directory or a run folder's manifest cannot be read as one (the message says what was expected)."""


# ------------------------------------------------------------------------------------------ files
def read_jsonl(path: Path, dropped: list[str] | None = None) -> list[dict[str, Any]]:
    """Records of a run's JSONL file by the project's one rule (:mod:`drmas.io`): a torn last line (a killed
    run) is dropped and described in ``dropped``; any other damage raises ``JsonlDamaged`` naming file and
    line. A missing file has no records."""
    path = Path(path)
    if not path.exists():
        return []
    got = read_jsonl_lines(path)
    if got.torn is not None and dropped is not None:
        dropped.append(f"{path}, line {got.torn_line_no}: torn last line dropped ({len(got.torn)} bytes, a killed run)")
    return got.records


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content (``index.json``, ``manifest.json``, ``DONE``); None where it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def settings_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """A run's settings as every analysis reads them: its manifest's ``config`` (the one source;
    :func:`analysis.integrity.settings_problems` checks its ``config.yaml``, cell and listing against it), {} when
    the manifest records none."""
    config = manifest.get("config") if isinstance(manifest, dict) else None
    return config if isinstance(config, dict) else {}


def run_settings(run_dir: Path) -> dict[str, Any]:
    """:func:`settings_of` the manifest in ``run_dir`` ({} without a readable one)."""
    return settings_of(read_json(Path(run_dir) / "manifest.json") or {})


def run_manifest(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``manifest.json``, with its ``config`` a mapping (the settings the run was made with); raises
    :class:`GridLoadError` naming the file when it cannot be read, is not a JSON object or records no config."""
    path = Path(run_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GridLoadError(f"{path}: unreadable ({getattr(exc, 'strerror', None) or str(exc)[:120]}); restore it "
                            "from the run (drmas train writes it when the run starts)") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise GridLoadError(f"{path}: records no `config` mapping (the settings the run was made with); restore it "
                            "from the run (drmas train writes it when the run starts)")
    return manifest


def tags_from_manifest(manifest: dict[str, Any], run: str) -> dict[str, Any]:
    """Tags of a run without an index entry: task from ``env.name``, estimator from ``algo.estimator``,
    assignment from the agent -> model map (one agent: single; one model: sharing; several presets: hetero), entry
    the run's name without its ``_s<seed>`` suffix (the grid names its runs ``<entry>_s<seed>``). A grid's own tags
    that the config does not show (a sweep's ``level``, an assignment named by the grid, e.g. ``homogeneous``) are
    only in index.json."""
    cfg = manifest.get("config", {})
    env = str(cfg.get("env", {}).get("name", ""))
    task = "math" if env.startswith("math") else "search" if env.startswith("search") else env or "unknown"
    estimator = cfg.get("algo", {}).get("estimator", "unknown")
    agents = cfg.get("agents", [])
    models = cfg.get("models", {})
    presets = {m.get("preset") for m in models.values() if isinstance(m, dict)}
    if len(agents) <= 1:
        assignment = "single"
    else:
        assignment = "sharing" if len({a.get("model") for a in agents}) == 1 else (
            "hetero" if len(presets) > 1 else "nonsharing")
    setting = setting_of(assignment, estimator)
    seed = int(manifest.get("seeds", {}).get("train", cfg.get("train", {}).get("seed", 0)))
    entry = run.removesuffix(f"_s{seed}") or run
    return {"task": task, "setting": setting, "estimator": estimator, "assignment": assignment,
            "entry": entry, "seed": seed}


# ------------------------------------------------------------------------------------------ one run
def _assignment_rows(run: str, manifest: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not manifest:
        return []
    cfg = manifest.get("config", {})
    models = cfg.get("models", {})
    rows = []
    for a in cfg.get("agents", []):
        model = a.get("model")
        preset = models.get(model, {}).get("preset") if isinstance(models.get(model), dict) else None
        rows.append({"run": run, "agent": a.get("name"), "model": model, "preset": preset})
    return rows


SETTINGS_NOT_USED = ("not used (its records are not those of the settings it is listed under: run it again under them, "
                     "`python -m experiments.grid run <spec> --stale rerun`, or list it under the settings it was made with)")
"""The end of the problem of a run whose settings disagree (:func:`analysis.integrity.settings_problems`)."""


@dataclass(frozen=True)
class RunRecords:
    """One index entry's run folder as :func:`load_run` read it.

    ``row``: the run's row of ``GridData.runs`` (None: the entry is skipped, or its files refuse); ``steps``: its
    step records, one row per step (None without any, and where its records conflict); ``evals`` / ``assignment``: its
    rows of ``GridData.evals`` / ``GridData.assignment``; ``dropped``: the records it dropped; ``notes``: its lines of
    ``GridData.problems`` that do not make it unusable; ``damaged`` / ``invalid``: damaged JSONL files / records that
    break the schema (:mod:`analysis.schema`), each of which makes :func:`load_grid` refuse."""

    row: dict[str, Any] | None = None
    steps: pd.DataFrame | None = None
    evals: tuple[dict[str, Any], ...] = ()
    assignment: tuple[dict[str, Any], ...] = ()
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    damaged: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()


def load_run(root: Path, entry: dict[str, Any]) -> RunRecords:
    """Read, check and de-duplicate (:func:`records_rule`) the run folder of one index entry and judge whether the
    run is usable (its row's ``usable`` / ``problem``). A run whose records conflict keeps its row (not usable) and
    contributes no records to any frame."""
    run = entry.get("run")
    if not run:
        return RunRecords(notes=(f"index entry without a 'run' name skipped: {entry}",))
    run_dir = root / entry.get("_dir", run)
    row = _index_row(run, entry, run_dir)
    if not run_dir.is_dir():
        return RunRecords(row={**row, **_missing_folder(row["status"])})
    row["status"], row["problem"] = _folder_status(run_dir, row["status"])
    dropped: list[str] = []
    try:
        records = read_jsonl(run_dir / "metrics.jsonl", dropped)
        raw_evals = read_jsonl(run_dir / "eval.jsonl", dropped)
    except JsonlDamaged as exc:
        return RunRecords(damaged=(str(exc).split(": not a JSON record")[0] + ": not a JSON record",))
    manifest = read_json(run_dir / "manifest.json") or {}
    config = settings_of(manifest)
    if invalid := _schema_problems(run_dir, row["status"], config, records, raw_evals):
        return RunRecords(invalid=tuple(invalid))  # docs/reliability.md §7
    evals = [e for e in raw_evals if "benchmark" in e and "step" in e]
    step_ruling = records_rule(run_dir / "metrics.jsonl", records, ("step",))
    eval_ruling = records_rule(run_dir / "eval.jsonl", evals, ("step", "benchmark"))
    records = [r for r, kept in zip(records, step_ruling.kept) if kept]
    evals = [e for e, kept in zip(evals, eval_ruling.kept) if kept]
    dropped += [n for n in (step_ruling.note, eval_ruling.note) if n]
    assignment = tuple(_assignment_rows(run, manifest))
    if records:
        row["n_steps"], row["last_step"] = len(records), float(max(r["step"] for r in records))
    if evals:
        row["last_eval_step"] = float(max(e["step"] for e in evals))
    conflicts = [c for c in (step_ruling.conflict, eval_ruling.conflict) if c]
    if conflicts:
        return RunRecords(row={**row, "usable": False, "problem": "; ".join([*conflicts, NOT_USED])}, assignment=assignment,
                          dropped=tuple(dropped))
    steps = _step_frame(run, records)
    eval_rows = _eval_rows(run, evals)
    row["problem"] = _usability_problem(row, config, has_steps=steps is not None, has_evals=bool(eval_rows))
    settings = settings_problems(run_dir, entry, manifest, tags_from_manifest(manifest, run))
    not_used = SETTINGS_NOT_USED
    if settings and (run_dir / "manifest.json").exists() and not manifest:
        try:  # a manifest that does not read: named as the loader names it
            run_manifest(run_dir)
        except GridLoadError as exc:
            settings, not_used = [str(exc)], "not used (its settings cannot be read)"
    if settings:
        row["problem"] = "; ".join([*([row["problem"]] if row["problem"] else []), *settings, not_used])
    row["usable"] = not row["problem"]
    degraded = degraded_note(run, records, evals)  # usable, but REPORT.md says where rewards count tool failures
    notes = tuple(n for n in (degraded, *_run_notes(run, run_dir, manifest)) if n)
    return RunRecords(row=row, steps=steps, evals=tuple(eval_rows), assignment=assignment, dropped=tuple(dropped),
                      notes=notes)


def _run_notes(run: str, run_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """Notes on a usable run that its records alone do not show: training its ``DONE`` marker calls degenerate
    (``drmas/trainer/health.py``), and config changes it was continued under (``--stale keep``: its records
    mix two configs)."""
    notes = []
    done = read_json(run_dir / "DONE") or {}
    if isinstance(done, dict) and done.get("degenerate"):
        notes.append(f"{run}: degenerate training: {'; '.join(map(str, done['degenerate']))}")
    kept = manifest.get("config_changes_kept")
    if kept:
        notes.append(f"{run}: mixed configs: continued under config changes ({'; '.join(map(str, kept))}) with "
                     "--stale keep, so its records before and after the change were made with different settings")
    return notes


NOT_STARTED = "todo"
"""The index status of a run the grid has not started yet."""
MISSING = "missing"
"""The status of a run that index.json lists as started (done, partial, failed) whose folder is gone."""


def _missing_folder(status: str) -> dict[str, Any]:
    """Status and problem of an index entry without a run folder: not started yet (``todo``), or ``missing``."""
    if status == NOT_STARTED:
        return {"status": NOT_STARTED, "problem": f"no run folder ({NOT_STARTED})"}
    return {"status": MISSING, "problem": f"no run folder (index.json says {status})"}


def _index_row(run: str, entry: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The run's row of ``GridData.runs`` from its index entry, before its folder is read."""
    row = {"run": run, **{t: entry.get(t) for t in TAGS}, "status": entry.get("status", "todo"),
           "seconds": entry.get("seconds"), "path": str(run_dir), "n_steps": 0, "last_step": np.nan,
           "last_eval_step": np.nan, "usable": False, "problem": ""}
    if row["entry"] is None:
        row["entry"] = run
    return row


def _folder_status(run_dir: Path, status: str) -> tuple[str, str]:
    """(status, problem) of a run folder: ``done`` where it has its DONE marker; an index that says done without
    the marker makes it ``partial``."""
    if (run_dir / "DONE").exists():
        return "done", ""
    if status == "done":
        return "partial", "index says done but DONE is missing"
    return status, ""


def _schema_problems(run_dir: Path, status: str, config: dict[str, Any], records: list[dict[str, Any]],
                     evals: list[dict[str, Any]]) -> list[str]:
    """The records of the run's files that break their schema; where none do and the run is done, the steps and
    evaluations its config calls for that it lacks (:mod:`analysis.schema`)."""
    bad = [p for f in ("metrics.jsonl", "eval.jsonl") if (run_dir / f).exists() for p in record_problems(run_dir / f)]
    if not bad and status == "done":
        bad = step_count_problems(run_dir, config, [r["step"] for r in records], [e["step"] for e in evals])
    return bad


def _step_frame(run: str, records: list[dict[str, Any]]) -> pd.DataFrame | None:
    """The step records (one column per ``metrics.jsonl`` key, every record's keys) sorted by step, with a leading
    ``run`` column; None without records."""
    if not records:
        return None
    frame = pd.DataFrame.from_records(records).sort_values("step")
    frame.insert(0, "run", run)
    return frame


def _eval_rows(run: str, evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's rows of ``GridData.evals`` (:data:`EVAL_COLUMNS`; ``successes`` an int array)."""
    rows = []
    for e in evals:
        succ = np.asarray(e.get("successes", []), dtype=np.int64)
        rows.append({"run": run, "step": int(e["step"]), "benchmark": str(e["benchmark"]),
                     "avg": float(e.get("avg", np.nan)), "pass": float(e.get("pass", np.nan)),
                     "k": int(e.get("k", 0)), "n_tasks": int(e.get("n_tasks", len(succ))), "successes": succ})
    return rows


def _usability_problem(row: dict[str, Any], config: dict[str, Any], has_steps: bool, has_evals: bool) -> str:
    """Why a read run is not usable ("" when it is): not done, no evaluation although its config evaluates
    (``train.evaluate = false``: no eval.jsonl by design), or its last evaluation before its last step."""
    evaluates = (config.get("train") or {}).get("evaluate", True) is not False
    if row["status"] != "done":
        return row["problem"] or f"status {row['status']}"
    if not has_evals and evaluates:
        return "no eval.jsonl records"
    if has_steps and row["last_eval_step"] < row["last_step"]:
        return f"last eval at step {row['last_eval_step']:.0f} < last step {row['last_step']:.0f}"
    return row["problem"]
