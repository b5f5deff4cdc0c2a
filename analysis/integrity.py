"""The "Data problems" section of REPORT.md (and of the stability and confirmatory summaries): every run the
verdicts leave out, every run folder the index does not list and every record the loader dropped, of every grid
the report reads, so that no table or verdict changes without the report saying why."""
from __future__ import annotations

from typing import Sequence

from analysis.runs import GridData


def problem_lines(data: GridData) -> list[str]:
    """One line per problem of one grid (:attr:`GridData.problems`, then :attr:`GridData.dropped`)."""
    return [*data.problems, *(f"record dropped: {d}" for d in data.dropped)]


def data_problems_section(data: GridData, others: Sequence[GridData] = ()) -> list[str]:
    """Markdown lines of the section (a heading and one bullet per problem; "none" when there are none): the main
    grid's ``data`` as they are, those of the ``others`` (the mechanism sweep, the stability grids, the confirmatory
    round) after their grid's folder."""
    items = [*problem_lines(data), *(f"{other.root}: {line}" for other in others for line in problem_lines(other))]
    return ["", "## Data problems", "",
            *([f"- {item}" for item in items] or ["None: every run is complete and every record was read."])]
