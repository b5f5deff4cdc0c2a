"""The mechanism sweep's study (``experiments/grids/mechanism.yaml``, docs/mechanism.md): its (level, seed, agent)
points (:func:`analysis.class_aware.class_points`), their table per (baseline, miss rate, agent) and the two figures
of the factor against the grad-norm ratio. Claim a, decided on these points, is judged by the main grid's study
(:mod:`analysis.main_grid`), whose rule falls back on the main grid without a sweep; :data:`STUDY` is this study in the
report's list (:mod:`analysis.report`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.claims import Inputs, Option, Study
from analysis.class_aware import class_points
from analysis.figures import fig_class_aware, fig_mechanism
from analysis.formatting import write_table
from analysis.mechanism import level_table
from analysis.plotting import save
from analysis.runs import GridData, load_grid


@dataclass
class Sweep:
    """The sweep's grid (None: not given) and its points (empty without a sweep)."""

    data: GridData | None
    points: pd.DataFrame


def analyze(inputs: Inputs) -> Sweep:
    data = inputs.grids.get("mechanism")
    return Sweep(data, class_points(data) if data is not None else pd.DataFrame())


def write_tables(an: Sweep, out: Path) -> list[Path]:
    if not len(an.points):
        return []
    return write_table(out, "mechanism", level_table(an.points).set_index(["baseline", "level", "agent"]), an.points,
                       "Mechanism sweep: per (baseline, miss rate, agent), mean over seeds of the Lemma 4.2 factor "
                       "under the baseline and the grad-norm / E_k[A²] ratios baseline / Dr. MAS (CSV: every point)")


def write_figures(an: Sweep, out: Path) -> list[Path]:
    return save(fig_mechanism(an.points), out, "mechanism") + save(fig_class_aware(an.points), out, "mechanism_class_aware")


STUDY = Study(
    name="mechanism sweep", analyze=analyze, tables=write_tables, figures=write_figures,
    grids=lambda an: [an.data] if an.data is not None else [],
    option=Option("mechanism", "the mechanism sweep's grid directory, e.g. results/runs/mechanism (claim a)",
                  "pass the out_dir of a grid, e.g. results/runs/cpu"),
    load=load_grid)
"""The mechanism sweep as a study of the report (:mod:`analysis.report`)."""
