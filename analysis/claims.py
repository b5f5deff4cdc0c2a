"""The contract every study builds on: the verdict words, the designs that judge a claim, what a verdict function
returns (:class:`Judged`), a claim with its rule (:class:`ClaimSpec`), a judged claim (:class:`Claim`), and a study
(:class:`Study`: what it reads, its analysis, claims, tables and figures) with what the report hands it
(:class:`Inputs`).

The studies (:mod:`analysis.main_grid`, :mod:`analysis.sweep`, :mod:`analysis.stability`, :mod:`analysis.confirm`)
spell their verdicts with these names and each exports one :class:`Study` as ``STUDY``; :mod:`analysis.report`
assembles their list. This module imports nothing from :mod:`analysis`, so any of them can build on it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# ------------------------------------------------------------------------------------------ verdict words
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run"
"""the claim's runs are missing (also the table cell of a setting without runs)"""
NOT_PRODUCED = "not produced"
"""the runs never reach the regime the claim is about (e.g. no Lemma factor large enough to test)"""
NEEDS_GPU = "needs GPU scale"
FINDING = "finding (no paper value)"
SUPPORTED = "supported"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
UNDERPOWERED = "inconclusive (underpowered)"
"""no effect found by a test without the power to find it"""
NO_DIFFERENCE = "no difference"
MIXED = "mixed"
DESCRIPTIVE = "descriptive (underpowered by design)"


def incomplete(finished: int, total: int) -> str:
    """The verdict of a grid with unfinished runs: ``incomplete (3 of 4 runs)``."""
    return f"incomplete ({finished} of {total} runs)"


def incomplete_so_far(finished: int, total: int, verdict: str) -> str:
    """``verdict`` computed on fewer runs than the design: ``incomplete (3 of 4 runs): reproduced so far``, or
    ``incomplete (0 of 4 runs): no data yet`` where the runs it has say nothing (``verdict`` is :data:`NOT_RUN`)."""
    if verdict == NOT_RUN:
        return f"{incomplete(finished, total)}: no data yet"
    return f"{incomplete(finished, total)}: {verdict} so far"


# ------------------------------------------------------------------------------------------ designs
MAIN_GRID = "main grid"
"""the pre-registered rules on the main grid"""
EXPLORATORY = "exploratory"
'''the stability grids: 3 seeds, rules that could only say "not reproduced"'''
CONFIRMATORY = "confirmatory"
"""the confirmatory round: fresh seeds, rules and power written first"""


# ------------------------------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Judged:
    """What a claim's verdict function returns: the claim as stated, the paper's value, ours, the verdict; and,
    optionally, what the report's layout shows of it. A judge that leaves the optional fields at their defaults
    still renders: the verdict table then shows the first clause of ``paper`` / ``ours``, and the claim's
    section lists the clauses of ``ours``.

    ``headline`` / ``paper_headline``: ours / the paper's in one number for the verdict table and the terminal
    summary; ``short``: the claim in a few words (terminal summary; default: ``claim`` up to its first
    bracket or colon); ``figures``: figure stems (``paper_figures/<stem>.png``) shown in the claim's section when they
    exist; ``details``: the section's statistics, one bullet each."""

    claim: str
    paper: str
    ours: str
    verdict: str
    headline: str = ""
    paper_headline: str = ""
    figures: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    short: str = ""
    design: str = MAIN_GRID
    """which test judged it: :data:`MAIN_GRID`, :data:`EXPLORATORY` or :data:`CONFIRMATORY`"""


@dataclass(frozen=True)
class Claim(Judged):
    """A judged claim: what its verdict function found (:class:`Judged`, with the layout's defaults filled in), its
    key and its rule."""

    key: str = ""
    rule: str = ""
    label: str = ""
    """the claim's label in REPORT.md, unique across the report (default: ``key``)"""
    gloss: str = ""
    """one line explaining the terms of the claim's numbers (REPORT.md, under the claim's heading)"""


@dataclass(frozen=True)
class ClaimSpec:
    """One claim of the paper, whole: its key (the REPORT.md row), the verdict rule in words (REPORT.md,
    claims.csv, docs/analysis.md), the verdict function (called with the report's :class:`analysis.report.Analysis`)
    and, optionally, the runs its design calls for (``design_runs``: the rows of a grid's ``runs`` frame its verdict
    reads, usable or not). Where some of them are not usable (not started, failed, partial, their folder gone, their
    records in conflict), the verdict is marked incomplete (:func:`incomplete_so_far`). Claims without
    ``design_runs`` (the stability and confirmatory ones) count their runs themselves."""

    key: str
    judge: Callable[[Any], Judged]
    rule: str
    design_runs: Callable[[Any], Any] | None = None
    label: str = ""
    """the REPORT.md label, unique across the report (``key`` may repeat: claims.csv groups verdicts by it)"""
    gloss: str = ""
    """one line glossing the terms of the claim's numbers"""

    def evaluate(self, an: Any) -> Claim:
        """The claim judged on ``an``, with the layout's defaults filled in (see :class:`Judged`)."""
        j = self.judge(an)
        verdict = j.verdict
        if self.design_runs is not None:
            runs = self.design_runs(an)
            used = int(runs["usable"].sum())
            if used < len(runs):
                verdict = incomplete_so_far(used, len(runs), verdict)
        return Claim(key=self.key, rule=self.rule, label=self.label or self.key, gloss=self.gloss, claim=j.claim,
                     paper=j.paper, ours=j.ours, verdict=verdict,
                     headline=j.headline or first_clause(j.ours), paper_headline=j.paper_headline or first_clause(j.paper),
                     figures=j.figures, details=j.details or tuple(clauses(j.ours)),
                     short=j.short or re.split(r"[(:]", j.claim)[0].strip(), design=j.design)


def clauses(text: str) -> list[str]:
    """``text`` split at the ``; `` that lie outside brackets (the clauses a judge joined into its ``ours``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def first_clause(text: str) -> str:
    """The first of :func:`clauses` of ``text`` ("" when it has none)."""
    return next(iter(clauses(text)), "")


# ------------------------------------------------------------------------------------------ studies
@dataclass(frozen=True)
class Option:
    """The report's command-line option that names a study's grid folder(s): ``--{flag} PATH`` (``many``: any
    number of paths, one grid each)."""

    flag: str
    help: str
    example: str
    """the folder to pass, named in the one-line error when a given folder does not exist"""
    many: bool = False


@dataclass(frozen=True)
class Inputs:
    """What the report hands every study: the main grid, the grids of the studies' options (by flag: the loaded value
    of each given folder, ``None`` / ``[]`` where none was given or nothing has run there), and the bootstrap's seed
    and replicates."""

    main: Any
    """the main grid (:class:`analysis.runs.GridData`)"""
    seed: int
    n_boot: int
    grids: dict[str, Any] = field(default_factory=dict)


def _no_files(an: Any, out: Path) -> list[Path]:
    return []


def _no_grids(an: Any) -> list[Any]:
    return []


@dataclass(frozen=True)
class Study:
    """One study of the report: a set of runs, the analysis computed on them once, and the claims judged on it.

    ``analyze(inputs)`` returns the study's own analysis object (any type; "not run" is the study's to say); each
    :class:`ClaimSpec` of ``claims`` is judged on that object; ``tables(an, dir)`` / ``figures(an, dir)`` write the
    study's tables / figures and return their paths; ``grids(an)`` the grids it read besides the main one (REPORT.md's
    "Data problems" lists theirs). ``option`` is the report's flag naming its grid folder(s) (None: it reads the main
    grid only) and ``load(path)`` what a given folder becomes in :attr:`Inputs.grids` (None: nothing has run there).
    The report runs the studies in its list's order: claims, tables and figures come out in that order."""

    name: str
    analyze: Callable[[Inputs], Any]
    claims: tuple[ClaimSpec, ...] = ()
    tables: Callable[[Any, Path], list[Path]] = _no_files
    figures: Callable[[Any, Path], list[Path]] = _no_files
    grids: Callable[[Any], list[Any]] = _no_grids
    option: Option | None = None
    load: Callable[[Path], Any] | None = None
