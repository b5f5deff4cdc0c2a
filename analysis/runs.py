"""Load a grid output directory (``experiments/grid.py``) into tidy pandas DataFrames.

A grid directory holds ``index.json`` (one entry per run: tags, status, wall time) and one folder per run
with ``metrics.jsonl`` (one line per RL step), ``eval.jsonl`` (one line per eval step and benchmark),
``manifest.json`` and ``DONE``. :func:`load_grid` returns a :class:`GridData` of five frames:

=========== =====================================================================================================
frame       one row per
=========== =====================================================================================================
runs        run: the index tags (task, setting, estimator, assignment, entry, seed, level), status, seconds, path,
            n_steps, last_step, last_eval_step, usable (done, with a final eval unless
            its config says train.evaluate=false), problem (why not usable)
steps       (run, step): every ``metrics.jsonl`` key as a column (wide; keys a run lacks are NaN)
agents      (run, step, agent): grad_norm, spike, spike_ratio, reward_mean (μk), reward_std (σk), lemma_factor,
            adv_m2, invalid_rate, response_len, steps, tokens, ... (``agent/{k}/*`` and ``tokens/{k}``)
groups      (run, step, wg): grad_norm, spike, loss, ..., generate_s (``wg/{w}/*`` and ``timing/generate/{w}``)
evals       (run, step, benchmark): avg, pass, k, n_tasks, successes (int array, task order fixed per task family)
assignment  (run, agent): model (worker group), preset (tiny / nano / small, from ``manifest.json``)
=========== =====================================================================================================

Robustness: JSONL files are read by :mod:`drmas.io`'s rule: a torn last line (a killed run) is dropped and
listed in ``GridData.dropped`` (REPORT.md's "Data problems"); damage anywhere else makes :func:`load_grid` refuse
with every damaged file and line, and so does a record that breaks the schema of :mod:`analysis.schema` (types,
required keys; a finished run's step count against its config). Repeated step/eval records follow the records rule
(:func:`records_rule`, docs/reliability.md "The records rule"): identical repeats collapse into one and are noted
in ``GridData.dropped``; repeats that differ make the run unusable, its problem names the key and the differing
fields, and none of its records enters a frame. A run with ``train.evaluate = false`` has no ``eval.jsonl`` by
design and is usable. A run whose folder is missing (status ``missing``; ``todo`` while the grid has not started
it), that is not ``done`` or has no final eval is kept in ``runs`` with ``usable = False`` and a ``problem``
message, and is left out of :func:`final_evals` (tables compare finished runs only). Index, folders and runs used
agree or the difference is listed in ``GridData.problems``: an index entry without its folder is a problem, a run
folder the index does not list a note (:func:`unindexed_folders`). A run's settings come from one source, its
manifest's ``config``; where they disagree with its ``config.yaml``, its cell or the settings the index lists it
under, it is not used and its problem names the keys (:func:`analysis.integrity.settings_problems`). Without ``index.json`` the run folders are
discovered and tagged from their manifests (:func:`tags_from_manifest`); where those tags do not tell two runs
apart, :func:`load_grid` refuses in one line.

:func:`load_grid` reads each run folder with :func:`load_run` (one run: its records and problems, a
:class:`RunRecords`) and builds the frames with :func:`assemble_grid`.

The paper's *Average* row of a run is the mean over its benchmarks (:func:`analysis.views.run_averages`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from analysis.integrity import settings_problems
from analysis.schema import degraded_note, record_problems, step_count_problems
from drmas.algos import ESTIMATOR_TERMS
from drmas.io import JsonlDamaged, read_jsonl_lines
from drmas.records import NOT_USED, RecordsRuling, records_rule  # noqa: F401 -- the records rule (drmas/records.py)

logger = logging.getLogger(__name__)

TAGS = ("task", "setting", "estimator", "assignment", "entry", "seed", "level")  # level: a sweep's knob value
RUN_COLUMNS = ["run", *TAGS, "status", "seconds", "path", "n_steps", "last_step", "last_eval_step", "usable", "problem"]
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
    """The directory is not a grid output directory (the message says what was expected)."""


@dataclass
class GridData:
    """Tidy frames of one grid directory (see the module docstring for the columns)."""

    root: Path
    name: str
    runs: pd.DataFrame
    steps: pd.DataFrame
    agents: pd.DataFrame
    groups: pd.DataFrame
    evals: pd.DataFrame
    assignment: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    """``run: problem`` of every run not used (except runs not started yet), notes on usable runs (degraded tool
    calls) and run folders the index does not list: REPORT.md lists every one under "Data problems"."""
    dropped: list[str] = field(default_factory=list)
    """Records the loader dropped (torn last lines, identical repeats collapsed into one by :func:`records_rule`):
    REPORT.md lists every one under "Data problems" (:mod:`analysis.integrity`)."""

    def usable_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["usable"]]

    def tagged(self, frame: pd.DataFrame, tags: Iterable[str] = TAGS) -> pd.DataFrame:
        """``frame`` (with a ``run`` column) joined with the run tags."""
        return frame.merge(self.runs[["run", *tags]], on="run", how="left")


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


def _read_json(path: Path) -> dict[str, Any] | None:
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
    return settings_of(_read_json(Path(run_dir) / "manifest.json") or {})


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


RUN_FILES = ("metrics.jsonl", "manifest.json")
"""A folder holding one of these is a run folder."""


def _is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in RUN_FILES)


def _index_entries(root: Path) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(grid name, run entries, notes) from ``index.json``, or from the run folders when there is none. The notes
    name the run folders index.json does not list (not used)."""
    index = root / "index.json"
    if index.exists():
        data = _read_json(index)
        if not data or not isinstance(data.get("runs"), list):
            raise GridLoadError(f"{index} is not a grid index (expected {{'grid': name, 'runs': [...]}}); "
                                "regenerate it with `python -m experiments.grid run <spec>`")
        return str(data.get("grid", root.name)), data["runs"], unindexed_folders(root, data["runs"])
    candidates = [root] if (root / "metrics.jsonl").exists() else sorted(p for p in root.iterdir() if _is_run_folder(p))
    if not candidates:
        raise GridLoadError(f"{root} has no index.json and no run folders (folders with metrics.jsonl); pass the "
                            "out_dir of a grid (e.g. results/runs/cpu) or a run directory")
    logger.warning("%s has no index.json: tagging %d run folder(s) from their manifests", root, len(candidates))
    entries = []
    for path in candidates:
        manifest = _read_json(path / "manifest.json") or {}
        status = "done" if (path / "DONE").exists() else "partial"
        rel = "." if path == root else path.name
        entries.append({"run": path.name, **tags_from_manifest(manifest, path.name), "status": status,
                        "seconds": None, "_dir": rel})
    _refuse_indistinct(root, entries)
    return root.name, entries, []


def unindexed_folders(root: Path, entries: Sequence[dict[str, Any]]) -> list[str]:
    """A note per run folder under ``root`` that no index entry names (its records are not used): one that
    ``--stale rerun`` moved aside (``<run>.stale-<k>``), or one the index does not know."""
    named = {str(e.get("_dir", e.get("run"))) for e in entries}
    notes = []
    for path in sorted(p for p in root.iterdir() if _is_run_folder(p) and p.name not in named):
        base, _, k = path.name.rpartition(".stale-")
        why = (f"the folder `--stale rerun` moved {base} to" if base and k.isdigit() else "a run folder not in index.json")
        notes.append(f"{path}: {why}; not used")
    return notes


def _refuse_indistinct(root: Path, entries: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`GridLoadError` where the tags of discovered run folders do not tell two runs apart (the tables
    would merge them): the grid's own tags are only in index.json."""
    key = ("task", "setting", "seed")
    seen: dict[tuple, str] = {}
    clashes = []
    for e in entries:
        tags = tuple(e.get(k) for k in key)
        if tags in seen:
            clashes.append(f"{seen[tags]} and {e['run']} ({', '.join(f'{k}={v}' for k, v in zip(key, tags))})")
        seen.setdefault(tags, e["run"])
    if clashes:
        raise GridLoadError(
            f"{root} has no index.json, and the tags its run folders' manifests give do not tell runs apart: "
            + "; ".join(clashes[:3]) + (f"; ... ({len(clashes) - 3} more)" if len(clashes) > 3 else "")
            + ". A grid's own tags (a sweep's level, an assignment such as homogeneous) are only in index.json: regenerate it with "
            "`python -m experiments.grid run <the grid's spec>` (finished runs are reused, not rerun)")


# ------------------------------------------------------------------------------------------ frames
def _split_keys(steps: pd.DataFrame, prefix: str, id_name: str, extra: dict[str, str]) -> pd.DataFrame:
    """Long frame (run, step, <id_name>, metric columns) from the wide step columns ``{prefix}/{id}/{metric}``
    and the ``extra`` patterns (``"tokens/"`` -> metric ``tokens``: columns ``tokens/{id}``)."""
    cols: dict[str, tuple[str, str]] = {}
    for c in steps.columns:
        if c.startswith(prefix + "/"):
            parts = c[len(prefix) + 1:].split("/", 1)
            if len(parts) == 2:
                cols[c] = (parts[0], parts[1])
        for pat, metric in extra.items():
            if c.startswith(pat) and "/" not in c[len(pat):]:
                cols[c] = (c[len(pat):], metric)
    if not cols:
        return pd.DataFrame(columns=["run", "step", id_name])
    long = steps[["run", "step", *cols]].melt(id_vars=["run", "step"], var_name="key", value_name="value")
    long[id_name] = long["key"].map(lambda k: cols[k][0])
    long["metric"] = long["key"].map(lambda k: cols[k][1])
    # NaN is kept: a logged NaN (e.g. a non-finite gradient norm) is data; rows where every metric of an
    # agent / group is NaN (the agent did not act in that step, or the run never logged it) are dropped
    wide = long.drop_duplicates(["run", "step", id_name, "metric"]).set_index(
        ["run", "step", id_name, "metric"])["value"].unstack("metric")
    wide = wide.dropna(how="all")
    wide.columns.name = None
    return wide.reset_index().sort_values(["run", id_name, "step"], ignore_index=True)


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


# ------------------------------------------------------------------------------------------ one run
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
    manifest = _read_json(run_dir / "manifest.json") or {}
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
    if settings := settings_problems(run_dir, entry, manifest, tags_from_manifest(manifest, run)):
        row["problem"] = "; ".join([*([row["problem"]] if row["problem"] else []), *settings, SETTINGS_NOT_USED])
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
    done = _read_json(run_dir / "DONE") or {}
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


# ------------------------------------------------------------------------------------------ the grid
def load_grid(path: str | Path) -> GridData:
    """Read a grid output directory (or a single run directory) into :class:`GridData`: each run by
    :func:`load_run`, the grid by :func:`assemble_grid`."""
    root = Path(path)
    if not root.is_dir():
        raise GridLoadError(f"{root} is not a directory; pass the out_dir of a grid, e.g. results/runs/cpu")
    name, entries, notes = _index_entries(root)
    return assemble_grid(root, name, [load_run(root, entry) for entry in entries], notes)


def assemble_grid(root: Path, name: str, loaded: Sequence[RunRecords], notes: Sequence[str] = ()) -> GridData:
    """The grid's frames and problem lists from its runs' :class:`RunRecords` (index order) and the grid's own
    ``notes`` (run folders the index does not list). Refuses with a :class:`GridLoadError` where any run has damaged
    files or records that break the schema."""
    _refuse_damaged(root, loaded)
    runs = pd.DataFrame([r.row for r in loaded if r.row is not None], columns=RUN_COLUMNS)
    runs["seed"] = pd.to_numeric(runs["seed"], errors="coerce").fillna(0).astype(int)
    runs["usable"] = runs["usable"].astype(bool)
    problems = [note for r in loaded for note in r.notes] + _unusable_runs(root, runs) + list(notes)
    if problems:
        logger.warning("%s: %d data problem(s): %s", root, len(problems), "; ".join(problems))
    frames = [r.steps for r in loaded if r.steps is not None]
    steps = pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame(columns=["run", "step"])
    for c in steps.columns:
        if c != "run":
            steps[c] = pd.to_numeric(steps[c], errors="coerce")
    evals = pd.DataFrame([e for r in loaded for e in r.evals], columns=EVAL_COLUMNS)
    _check_task_order(evals, runs, problems)
    return GridData(root=root, name=name, runs=runs, steps=steps,
                    agents=_split_keys(steps, "agent", "agent", {"tokens/": "tokens"}),
                    groups=_split_keys(steps, "wg", "wg", {"timing/generate/": "generate_s"}), evals=evals,
                    assignment=pd.DataFrame([a for r in loaded for a in r.assignment],
                                            columns=["run", "agent", "model", "preset"]),
                    problems=problems, dropped=[d for r in loaded for d in r.dropped])


def _refuse_damaged(root: Path, loaded: Sequence[RunRecords]) -> None:
    """Raise :class:`GridLoadError` naming every damaged JSONL file, else every record that breaks the schema."""
    damaged = [d for r in loaded for d in r.damaged]
    invalid = [p for r in loaded for p in r.invalid]
    if damaged:
        raise GridLoadError(f"{len(damaged)} damaged JSONL file(s) (a line before the last is not a JSON record, so "
                            "dropping it would silently change the tables): " + "; ".join(damaged)
                            + ". Restore these files, or delete or rerun the runs")
    if invalid:
        raise GridLoadError(f"{len(invalid)} problem(s) in the records of {root} (the tables and verdicts built from "
                            "them would silently mean something else): " + "; ".join(invalid[:20])
                            + (f"; ... ({len(invalid) - 20} more)" if len(invalid) > 20 else "")
                            + ". Restore these files, or delete or rerun the runs")


def _unusable_runs(root: Path, runs: pd.DataFrame) -> list[str]:
    """``run: problem`` for every run that is not usable, except runs of a grid in progress not started yet (logged,
    not a data problem: the verdicts say "incomplete")."""
    not_started = runs[~runs["usable"] & (runs["status"] == NOT_STARTED) & runs["problem"].str.startswith("no run folder")]
    if len(not_started):
        logger.info("%s: %d of %d run(s) not started yet", root, len(not_started), len(runs))
    return [f"{r.run}: {r.problem}" for r in runs[~runs["usable"] & ~runs.index.isin(not_started.index)].itertuples()]


def _check_task_order(evals: pd.DataFrame, runs: pd.DataFrame, problems: list[str]) -> None:
    """Paired statistics need the same task count per (task family, benchmark); flag a mismatch."""
    if evals.empty:
        return
    sizes = evals.assign(n=evals["successes"].map(len)).merge(runs[["run", "task"]], on="run")
    bad = sizes[sizes["n"] != sizes["n_tasks"]]
    for r in bad.drop_duplicates(["run", "benchmark"]).itertuples():
        problems.append(f"{r.run}/{r.benchmark}: {r.n} success counts but n_tasks = {r.n_tasks}")
    spread = sizes.groupby(["task", "benchmark"])["n"].nunique()
    for (task, bench), n in spread[spread > 1].items():
        problems.append(f"{task}/{bench}: runs evaluated different numbers of tasks; paired tests use the shortest")
