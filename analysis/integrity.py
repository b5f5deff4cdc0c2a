"""What makes a run's records other than what they claim to be, and the "Data problems" section of REPORT.md (and of
the stability and confirmatory summaries).

:func:`settings_problems`: a run's settings are read from one source, its manifest's ``config`` (what
:func:`analysis.runs.load_grid` tags and counts a run by); where that disagrees with the run's ``config.yaml``, with
the cell the index puts it in (its task, estimator and seed tags) or with the settings the index lists it under
(config, overrides and seed, resolved as the grid runner resolves them,
:func:`drmas.config.identity.listed_config`), the run is not used and each disagreement is a data problem naming
the keys, by :mod:`drmas.config.identity`'s rule (the one ``drmas train`` and the grid runner apply).

:func:`data_problems_section`: every run the verdicts leave out, every run folder the index does not list and every
record the loader dropped, of every grid the report reads, so that no table or verdict changes without the report
saying why."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

CELL_TAGS = ("task", "estimator", "seed")
"""The index tags that a run's settings also say (env.name, algo.estimator, train.seed)."""
SHOWN_CHANGES = 6
"""Differing keys a settings problem names before it says how many more."""


class ProblemSource(Protocol):
    """What the Data problems section reads of one grid (:class:`analysis.runs.GridData`)."""

    root: Path
    problems: list[str]
    dropped: list[str]


def _listing(changes: list[str]) -> str:
    more = len(changes) - SHOWN_CHANGES
    return "; ".join(changes[:SHOWN_CHANGES]) + (f"; ... ({more} more)" if more > 0 else "")


def _last_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[-1].strip()


def settings_problems(run_dir: Path, entry: dict[str, Any], manifest: dict[str, Any], cell: dict[str, Any]) -> list[str]:
    """Where the settings of the run in ``run_dir`` (its ``manifest``'s ``config``) disagree with its ``config.yaml``,
    with the index ``entry``'s cell tags (:data:`CELL_TAGS`; ``cell``: those tags as its settings give them,
    :func:`analysis.run_records.tags_from_manifest`) or with the settings ``entry`` lists it under (its ``config``,
    ``overrides`` and ``seed``): one line each, the keys as ``key (the run's value -> the other's)``. Checked for run
    folders ``drmas train`` wrote (they hold ``config.yaml``, and its manifest records a ``config_hash``); every key
    of the identity counts, ``train.steps`` included (a finished run is a result of the steps it made)."""
    from drmas.config import ConfigError, load_config
    from drmas.config.identity import config_changes, listed_config
    from drmas.config.loader import validate_config

    saved_file = run_dir / "config.yaml"
    if not saved_file.is_file() and "config_hash" not in manifest:
        return []  # not a folder drmas train wrote (a synthetic one): no second record to check against
    if not isinstance(manifest.get("config"), dict):
        return ["its manifest.json records no config (the source of its settings); restore it or rerun the run"]
    try:
        made = validate_config(manifest["config"], f"{run_dir / 'manifest.json'} config")
    except ConfigError as exc:
        return [f"its manifest.json config (the source of its settings) does not load: {_last_line(exc)}"]
    problems = []
    try:
        saved = load_config(saved_file, []) if saved_file.is_file() else None
    except ConfigError as exc:
        problems.append(f"its config.yaml does not load: {_last_line(exc)}")
    else:
        if saved is None:
            problems.append("its config.yaml is missing (drmas train writes it with manifest.json); restore it")
        elif changes := config_changes(made, saved, growable=()):
            problems.append(f"its config.yaml disagrees with its manifest.json config ({_listing(changes)})")
    differing = [f"{tag} ({cell[tag]!r} -> {entry[tag]!r})" for tag in CELL_TAGS
                 if entry.get(tag) is not None and tag in cell and str(entry[tag]) != str(cell[tag])]
    if differing:
        problems.append(f"index.json puts it in another cell than its settings say ({_listing(differing)})")
    if entry.get("config") is not None:
        try:
            listed = listed_config(entry["config"], entry.get("overrides") or [], str(entry["run"]), run_dir.parent,
                                   int(entry.get("seed", made.train.seed)))
        except (ConfigError, ValueError, TypeError) as exc:
            problems.append(f"the settings index.json lists it under ({entry['config']} with its overrides) do not "
                            f"load, so its settings cannot be checked: {_last_line(exc)}")
        else:
            if changes := config_changes(made, listed, growable=()):
                problems.append(f"index.json lists it under other settings than it was made with ({_listing(changes)})")
    return problems


def problem_lines(data: ProblemSource) -> list[str]:
    """One line per problem of one grid (:attr:`GridData.problems`, then :attr:`GridData.dropped`)."""
    return [*data.problems, *(f"record dropped: {d}" for d in data.dropped)]


def data_problems_section(data: ProblemSource, others: Sequence[ProblemSource] = ()) -> list[str]:
    """Markdown lines of the section (a heading and one bullet per problem; "none" when there are none): the main
    grid's ``data`` as they are, those of the ``others`` (the mechanism sweep, the stability grids, the confirmatory
    round) after their grid's folder."""
    items = [*problem_lines(data), *(f"{other.root}: {line}" for other in others for line in problem_lines(other))]
    return ["", "## Data problems", "",
            *([f"- {item}" for item in items] or ["None: every run is complete and every record was read."])]
