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
(:func:`drmas.records.records_rule`, docs/reliability.md "The records rule"): identical repeats collapse into one
and are noted in ``GridData.dropped``; repeats that differ make the run unusable, its problem names the key and the
differing fields, and none of its records enters a frame. A run with ``train.evaluate = false`` has no ``eval.jsonl`` by
design and is usable. A run whose folder is missing (status ``missing``; ``todo`` while the grid has not started
it), that is not ``done`` or has no final eval is kept in ``runs`` with ``usable = False`` and a ``problem``
message, and is left out of :func:`final_evals` (tables compare finished runs only). Index, folders and runs used
agree or the difference is listed in ``GridData.problems``: an index entry without its folder is a problem, a run
folder the index does not list a note (:func:`unindexed_folders`). A run's settings come from one source, its
manifest's ``config``; where they disagree with its ``config.yaml``, its cell or the settings the index lists it
under, it is not used and its problem names the keys (:func:`analysis.integrity.settings_problems`). Without ``index.json`` the run folders are
discovered and tagged from their manifests (:func:`tags_from_manifest`); where those tags do not tell two runs
apart, :func:`load_grid` refuses in one line.

:func:`load_grid` reads each run folder with :func:`analysis.run_records.load_run` (one run: its records and
problems, a :class:`~analysis.run_records.RunRecords`) and builds the frames with :func:`assemble_grid`.

The paper's *Average* row of a run is the mean over its benchmarks (:func:`analysis.views.run_averages`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from analysis.run_records import (EVAL_COLUMNS, NOT_STARTED, TAGS, GridLoadError, RunRecords, load_run, read_json,
                                  tags_from_manifest)

logger = logging.getLogger(__name__)

RUN_COLUMNS = ["run", *TAGS, "status", "seconds", "path", "n_steps", "last_step", "last_eval_step", "usable", "problem"]


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
    """Records the loader dropped (torn last lines, identical repeats collapsed into one by the records rule,
    :func:`drmas.records.records_rule`): REPORT.md lists every one under "Data problems" (:mod:`analysis.integrity`)."""

    def usable_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["usable"]]

    def tagged(self, frame: pd.DataFrame, tags: Iterable[str] = TAGS) -> pd.DataFrame:
        """``frame`` (with a ``run`` column) joined with the run tags."""
        return frame.merge(self.runs[["run", *tags]], on="run", how="left")

    def step_seconds(self, runs: Iterable[str]) -> pd.Series:
        """Seconds of RL steps of each of ``runs`` (the sum of its ``timing/step`` records, every sitting of a
        resumed run included; evaluations and start-up not counted), indexed by run; empty where the records carry
        no step time."""
        if "timing/step" not in self.steps.columns:
            return pd.Series(dtype=float)
        return self.steps[self.steps["run"].isin(list(runs))].groupby("run")["timing/step"].sum()


# ------------------------------------------------------------------------------------------ the index
RUN_FILES = ("metrics.jsonl", "manifest.json")
"""A folder holding one of these is a run folder."""


def _is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in RUN_FILES)


def _index_entries(root: Path) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(grid name, run entries, notes) from ``index.json``, or from the run folders when there is none. The notes
    name the run folders index.json does not list (not used)."""
    index = root / "index.json"
    if index.exists():
        data = read_json(index)
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
        manifest = read_json(path / "manifest.json") or {}
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
