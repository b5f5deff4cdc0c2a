"""The studies of analysis/ stand side by side (docs/analysis.md, "Studies"): each is one module exporting one
``STUDY`` (with its own rules module, ``<study>_rules.py``, where it has one), none imports another study's modules,
the report assembles exactly their list, and a new study is one module and one entry in that list (its command-line
flag, claims and grids follow from the entry)."""
from __future__ import annotations

import ast
from pathlib import Path

from analysis import report
from analysis.claims import FINDING, ClaimSpec, Inputs, Judged, Option, Study
from analysis.runs import load_grid
from test_analysis import make_grid

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


def analysis_imports(source: str) -> set[str]:
    """The analysis modules a module's source imports (``from analysis import x`` resolved to ``analysis.x``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "analysis":
            out |= ({f"analysis.{a.name}" for a in node.names} if node.module == "analysis" else {node.module})
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "analysis"}
    return out


def defines_study(source: str) -> bool:
    """Whether a module's source assigns ``STUDY`` at its top level, however the value is built (``Study(...)``,
    :func:`analysis.cli.one_grid_study`, an annotated assignment)."""
    targets = [t for node in ast.parse(source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    return any(isinstance(t, ast.Name) and t.id == "STUDY" for t in targets)


def study_modules() -> dict[str, str]:
    """Module name -> source of every analysis module that defines a ``STUDY``."""
    return {f"analysis.{p.stem}": p.read_text() for p in sorted(ANALYSIS.glob("*.py")) if defines_study(p.read_text())}


RULES_SUFFIX = "_rules"
"""A study's own rules module is named after it: ``analysis/<study>_rules.py`` (docs/analysis.md, "Studies")."""


def owned_modules(studies: dict[str, str]) -> dict[str, str]:
    """Module name -> source of every study module and of each study's own rules module, where it has one."""
    rules = {f"{m}{RULES_SUFFIX}": ANALYSIS / f"{m.rpartition('.')[2]}{RULES_SUFFIX}.py" for m in studies}
    return {**studies, **{m: path.read_text() for m, path in rules.items() if path.exists()}}


def studies_importing_studies(modules: dict[str, str]) -> list[str]:
    """``m imports t`` for each module of one study (its own module or its rules module) that imports a module of
    another study."""
    def study(module: str) -> str:
        return module.removesuffix(RULES_SUFFIX)

    return [f"{m} imports {t}" for m, src in modules.items()
            for t in sorted(analysis_imports(src) & set(modules)) if study(t) != study(m)]


def test_no_study_imports_another_study():
    modules = owned_modules(study_modules())
    assert {"analysis.main_grid", "analysis.sweep", "analysis.stability", "analysis.confirm", "analysis.frontier",
            "analysis.stability_rules", "analysis.confirm_rules", "analysis.frontier_rules"} <= set(modules)
    assert studies_importing_studies(modules) == []


def test_the_check_finds_a_study_that_imports_another():
    """The check above can fail: a study, or its rules module, that reads another study's names (either import form,
    from the study's own module or from its rules module) is named; a study reading its own rules is not."""
    modules = owned_modules(study_modules())
    planted = dict(modules, **{
        "analysis.confirm": modules["analysis.confirm"] + "\nfrom analysis.stability import TASKS\n",
        "analysis.sweep": modules["analysis.sweep"] + "\nfrom analysis import main_grid\n",
        "analysis.confirm_rules": (modules["analysis.confirm_rules"]
                                   + "\nfrom analysis.stability_rules import TWIN_RATIO\n"),
        "analysis.main_grid": modules["analysis.main_grid"] + "\nfrom analysis import stability_rules\n"})
    assert studies_importing_studies(planted) == ["analysis.confirm imports analysis.stability",
                                                  "analysis.main_grid imports analysis.stability_rules",
                                                  "analysis.sweep imports analysis.main_grid",
                                                  "analysis.confirm_rules imports analysis.stability_rules"]


def test_the_report_assembles_exactly_the_studies():
    import importlib

    assert list(report.STUDIES) == [importlib.import_module(m).STUDY for m in
                                    ("analysis.main_grid", "analysis.sweep", "analysis.stability", "analysis.confirm",
                                     "analysis.frontier")]
    assert set(report.STUDIES) == {importlib.import_module(m).STUDY for m in study_modules()}


def test_a_new_study_is_one_entry_in_the_list(tmp_path):
    """A study appended to the list gets its flag on the report's command line, its grid loaded and handed to it, its
    claims judged after the others and its grid in the data problems."""
    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    toy = Study(name="toy", analyze=lambda inputs: inputs.grids["toy"],
                claims=(ClaimSpec("t", judge=lambda data: Judged("toy claim", "-", f"{len(data.runs)} runs", FINDING),
                                  rule="count the runs"),),
                grids=lambda data: [data],
                option=Option("toy", "a toy grid", "pass a grid"), load=load_grid)
    studies = (*report.STUDIES, toy)
    args = report.study_args(studies)
    assert "toy" in args.__dataclass_fields__
    inputs, given = report.load_inputs(grid, 0, 50, studies=studies, toy=grid)
    assert isinstance(inputs, Inputs) and given[-1] == ("toy", [grid])
    assembled = report.assemble(inputs, studies, given)
    claims = assembled.claims()
    assert claims[-1].label == "t" and claims[-1].ours == f"{len(load_grid(grid).runs)} runs"
    assert assembled.other_grids()[-1].root == grid
