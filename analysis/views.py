"""What the studies read off a loaded grid (:class:`analysis.runs.GridData`): each run's final and initial evaluations
with its tags, the paper's *Average* row per run, the benchmarks of a task family, and the grid's scale (presets,
steps, seeds, eval tasks) for the report."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.run_records import TAGS
from analysis.runs import GridData


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

