"""The "Data problems" section of REPORT.md: every run the tables leave out and every record the loader
dropped or chose between, so that no table changes without the report saying why."""
from __future__ import annotations

from analysis.runs import GridData


def data_problems_section(data: GridData) -> list[str]:
    """Markdown lines of the section (a heading and one bullet per problem; "none" when there are none)."""
    items = [*data.problems, *(f"record dropped: {d}" for d in data.dropped)]
    return ["", "## Data problems", "",
            *([f"- {item}" for item in items] or ["None: every run is complete and every record was read."])]
