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
listed in ``GridData.dropped`` (REPORT.md's "Data problems"), as are duplicate step/eval records (the last
is used); damage anywhere else makes :func:`load_grid` refuse with every damaged file and line, and so does a
record that breaks the schema of :mod:`analysis.schema` (types, required keys; a finished run's step count against
its config). A run with ``train.evaluate = false`` has no ``eval.jsonl`` by design and is usable. A run folder
that is missing, a run that is not ``done`` or has no final eval is kept in ``runs`` with ``usable = False`` and a ``problem`` message, and is left
out of :func:`final_evals` (tables compare finished runs only). Without ``index.json`` the run folders are
discovered and tagged from their manifests (:func:`tags_from_manifest`).

The paper's *Average* row of a run is the mean over its benchmarks (:func:`run_averages`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from analysis.schema import degraded_note, record_problems, step_count_problems
from drmas.io import JsonlDamaged, read_jsonl_lines

logger = logging.getLogger(__name__)

TAGS = ("task", "setting", "estimator", "assignment", "entry", "seed", "level")  # level: a sweep's knob value
RUN_COLUMNS = ["run", *TAGS, "status", "seconds", "path", "n_steps", "last_step", "last_eval_step", "usable", "problem"]
EVAL_COLUMNS = ["run", "step", "benchmark", "avg", "pass", "k", "n_tasks", "successes"]

ESTIMATOR_SETTING = {"trajectory_grpo": "grpo", "drmas": "drmas", "drmas_mean_only": "(mu_k,sigma)",
                     "drmas_std_only": "(mu,sigma_k)", "pooled_grpo": "pooled_step"}
"""The one map from an estimator's registry key (``algo.estimator``, the grid's ``estimator`` tag) to the spelling
of the setting tags (the names of analysis/data/paper_tables.csv); build a tag with :func:`setting_of`."""


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
    dropped: list[str] = field(default_factory=list)
    """Records the loader dropped or chose between (torn last lines, duplicate step/eval records): REPORT.md
    lists every one under "Data problems" (:mod:`analysis.integrity`)."""

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


def _duplicates(records: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple]:
    """The ``keys`` values that occur more than once among ``records`` (a resumed run that kept records, or two
    writers on one run folder)."""
    seen = pd.Series([tuple(r.get(k) for k in keys) for r in records], dtype=object)
    return sorted(set(seen[seen.duplicated()]), key=str)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def tags_from_manifest(manifest: dict[str, Any], run: str) -> dict[str, Any]:
    """Tags of a run without an index entry: task from ``env.name``, estimator from ``algo.estimator``,
    assignment from the agent -> model map (one agent: single; one model: sharing; several presets: hetero)."""
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
    seed = manifest.get("seeds", {}).get("train", cfg.get("train", {}).get("seed", 0))
    return {"task": task, "setting": setting, "estimator": estimator, "assignment": assignment,
            "entry": run, "seed": int(seed)}


def _index_entries(root: Path) -> tuple[str, list[dict[str, Any]]]:
    """(grid name, run entries) from ``index.json``, or discovered run folders when there is none."""
    index = root / "index.json"
    if index.exists():
        data = _read_json(index)
        if not data or not isinstance(data.get("runs"), list):
            raise GridLoadError(f"{index} is not a grid index (expected {{'grid': name, 'runs': [...]}}); "
                                "regenerate it with `python -m experiments.grid run <spec>`")
        return str(data.get("grid", root.name)), data["runs"]
    candidates = [root] if (root / "metrics.jsonl").exists() else sorted(
        p for p in root.iterdir() if p.is_dir() and ((p / "metrics.jsonl").exists() or (p / "manifest.json").exists()))
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
    return root.name, entries


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


def load_grid(path: str | Path) -> GridData:
    """Read a grid output directory (or a single run directory) into :class:`GridData`."""
    root = Path(path)
    if not root.is_dir():
        raise GridLoadError(f"{root} is not a directory; pass the out_dir of a grid, e.g. results/runs/cpu")
    name, entries = _index_entries(root)
    run_rows, step_frames, eval_rows, assign_rows, problems = [], [], [], [], []
    dropped: list[str] = []
    damaged: list[str] = []
    invalid: list[str] = []  # schema and step-count problems (analysis.schema)
    for entry in entries:
        run = entry.get("run")
        if not run:
            problems.append(f"index entry without a 'run' name skipped: {entry}")
            continue
        run_dir = root / entry.get("_dir", run)
        row = {"run": run, **{t: entry.get(t) for t in TAGS}, "status": entry.get("status", "todo"),
               "seconds": entry.get("seconds"), "path": str(run_dir), "n_steps": 0, "last_step": np.nan,
               "last_eval_step": np.nan, "usable": False, "problem": ""}
        if row["entry"] is None:
            row["entry"] = run
        if not run_dir.is_dir():
            row["problem"] = f"no run folder ({row['status']})"
            run_rows.append(row)
            continue
        if (run_dir / "DONE").exists():
            row["status"] = "done"
        elif row["status"] == "done":
            row["status"] = "partial"
            row["problem"] = "index says done but DONE is missing"
        try:
            records = read_jsonl(run_dir / "metrics.jsonl", dropped)
            raw_evals = read_jsonl(run_dir / "eval.jsonl", dropped)
        except JsonlDamaged as exc:  # refuse below, after every damaged file is known
            damaged.append(str(exc).split(": not a JSON record")[0] + ": not a JSON record")
            continue
        manifest = _read_json(run_dir / "manifest.json") or {}
        config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        bad = [p for f in ("metrics.jsonl", "eval.jsonl") if (run_dir / f).exists() for p in record_problems(run_dir / f)]
        if not bad and row["status"] == "done":
            bad = step_count_problems(run_dir, config, [r["step"] for r in records],
                                      [e["step"] for e in raw_evals])
        if bad:  # refuse below (docs/reliability.md §7), after every run's problems are known
            invalid += bad
            continue
        for what, recs, keys in (("metrics.jsonl", records, ("step",)), ("eval.jsonl", raw_evals, ("step", "benchmark"))):
            if dups := _duplicates(recs, keys):
                dropped.append(f"{run_dir / what}: {len(dups)} {'/'.join(keys)} value(s) recorded more than once "
                               f"({', '.join(map(str, dups[:5]))}{' ...' if len(dups) > 5 else ''}); the last record "
                               "of each is used (two writers, or a resume that kept records)")
        if records:
            frame = pd.DataFrame.from_records(records)
            if "step" not in frame:
                frame["step"] = np.arange(len(frame))
            frame = frame.drop_duplicates("step", keep="last").sort_values("step")
            frame.insert(0, "run", run)
            step_frames.append(frame)
            row["n_steps"] = len(frame)
            row["last_step"] = float(frame["step"].max())
        evals = [e for e in raw_evals if "benchmark" in e and "step" in e]
        for e in evals:
            succ = np.asarray(e.get("successes", []), dtype=np.int64)
            eval_rows.append({"run": run, "step": int(e["step"]), "benchmark": str(e["benchmark"]),
                              "avg": float(e.get("avg", np.nan)), "pass": float(e.get("pass", np.nan)),
                              "k": int(e.get("k", 0)), "n_tasks": int(e.get("n_tasks", len(succ))), "successes": succ})
        if evals:
            row["last_eval_step"] = float(max(int(e["step"]) for e in evals))
        assign_rows += _assignment_rows(run, manifest)
        if note := degraded_note(run, records, raw_evals):
            problems.append(note)  # usable, but REPORT.md says where its rewards count tool failures
        evaluates = (config.get("train") or {}).get("evaluate", True) is not False  # false: no eval.jsonl by design
        if row["status"] != "done":
            row["problem"] = row["problem"] or f"status {row['status']}"
        elif not evals and evaluates:
            row["problem"] = "no eval.jsonl records"
        elif records and row["last_eval_step"] < row["last_step"]:
            row["problem"] = f"last eval at step {row['last_eval_step']:.0f} < last step {row['last_step']:.0f}"
        row["usable"] = not row["problem"]
        run_rows.append(row)
    if damaged:
        raise GridLoadError(f"{len(damaged)} damaged JSONL file(s) (a line before the last is not a JSON record, so "
                            "dropping it would silently change the tables): " + "; ".join(damaged)
                            + ". Restore these files, or delete or rerun the runs")
    if invalid:
        raise GridLoadError(f"{len(invalid)} problem(s) in the records of {root} (the tables and verdicts built from "
                            "them would silently mean something else): " + "; ".join(invalid[:20])
                            + (f"; ... ({len(invalid) - 20} more)" if len(invalid) > 20 else "")
                            + ". Restore these files, or delete or rerun the runs")
    runs = pd.DataFrame(run_rows, columns=RUN_COLUMNS)
    runs["seed"] = pd.to_numeric(runs["seed"], errors="coerce").fillna(0).astype(int)
    runs["usable"] = runs["usable"].astype(bool)
    not_started = runs[~runs["usable"] & (runs["status"] == "todo") & runs["problem"].str.startswith("no run folder")]
    if len(not_started):  # a grid in progress: not a data problem (the verdicts say "incomplete")
        logger.info("%s: %d of %d run(s) not started yet", root, len(not_started), len(runs))
    for r in runs[~runs["usable"] & ~runs.index.isin(not_started.index)].itertuples():
        problems.append(f"{r.run}: {r.problem}")
    if problems:
        logger.warning("%s: %d run(s) not usable: %s", root, len(problems), "; ".join(problems))
    steps = pd.concat(step_frames, ignore_index=True, sort=False) if step_frames else pd.DataFrame(columns=["run", "step"])
    for c in steps.columns:
        if c != "run":
            steps[c] = pd.to_numeric(steps[c], errors="coerce")
    evals = pd.DataFrame(eval_rows, columns=EVAL_COLUMNS)
    evals = evals.drop_duplicates(["run", "step", "benchmark"], keep="last").reset_index(drop=True)  # a resumed eval
    _check_task_order(evals, runs, problems)
    return GridData(root=root, name=name, runs=runs, steps=steps,
                    agents=_split_keys(steps, "agent", "agent", {"tokens/": "tokens"}),
                    groups=_split_keys(steps, "wg", "wg", {"timing/generate/": "generate_s"}),
                    evals=evals, assignment=pd.DataFrame(assign_rows, columns=["run", "agent", "model", "preset"]),
                    problems=problems, dropped=dropped)


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


# ------------------------------------------------------------------------------------------ views
def final_evals(data: GridData, usable_only: bool = True) -> pd.DataFrame:
    """Eval rows at each run's last eval step (the final model), joined with the run tags."""
    ev = data.evals
    if usable_only:
        ev = ev[ev["run"].isin(data.usable_runs()["run"])]
    if ev.empty:
        return data.tagged(ev.iloc[0:0])
    last = ev.groupby("run")["step"].transform("max")
    return data.tagged(ev[ev["step"] == last].reset_index(drop=True))


def initial_evals(data: GridData) -> pd.DataFrame:
    """Eval rows at step 0 (the SFT'd start), joined with the run tags."""
    ev = data.evals[data.evals["step"] == 0]
    return data.tagged(ev.reset_index(drop=True))


def run_averages(evals: pd.DataFrame) -> pd.DataFrame:
    """The paper's *Average* row per run and eval step: mean of avg and pass over the run's benchmarks."""
    if evals.empty:
        return evals.assign(n_benchmarks=pd.Series(dtype=int))
    keys = [c for c in ("run", "step", *TAGS) if c in evals.columns]
    out = evals.groupby(keys, dropna=False).agg(avg=("avg", "mean"), **{"pass": ("pass", "mean")},
                                                n_benchmarks=("benchmark", "nunique")).reset_index()
    return out.assign(benchmark="average")


def benchmarks_of(evals: pd.DataFrame, task: str) -> list[str]:
    """Benchmarks of a task family in first-seen order."""
    return list(dict.fromkeys(evals.loc[evals["task"] == task, "benchmark"]))


def describe_scale(data: GridData) -> dict[str, Any]:
    """What the runs are: presets, steps, seeds, eval tasks and samples per task family (for the report)."""
    runs = data.usable_runs()
    out: dict[str, Any] = {"grid": data.name, "n_runs": len(data.runs),
                           "status": data.runs["status"].value_counts().to_dict(), "n_usable": len(runs)}
    per_task = {}
    for task, g in runs.groupby("task"):
        ev = data.evals[data.evals["run"].isin(g["run"])]
        presets = data.assignment[data.assignment["run"].isin(g["run"])]["preset"].dropna().unique().tolist()
        per_task[task] = {
            "runs": len(g), "settings": sorted(g["setting"].dropna().unique()),
            "seeds": sorted(int(s) for s in g["seed"].unique()),
            "steps": sorted({int(s) + 1 for s in g["last_step"].dropna()}),
            "benchmarks": list(dict.fromkeys(ev["benchmark"])),
            "n_tasks": sorted({int(n) for n in ev["n_tasks"]}), "k": sorted({int(k) for k in ev["k"]}),
            "presets": sorted(p for p in presets if p),
            "hours": float(np.nansum(pd.to_numeric(g["seconds"], errors="coerce"))) / 3600,
        }
    out["tasks"] = per_task
    return out

