"""Nothing misleads (docs/reliability.md, "The records rule" and "Missing runs"): repeated records and missing runs
of every grid the report reads (the main grid, the stability grids, the confirmatory round) are named under "Data
problems", and every verdict computed on fewer runs than its design says "incomplete".

The grid folders are synthetic fixtures (tests/test_analysis.py, tests/stability_fixture.py, tests/test_confirm.py)
built in ``tmp_path``; committed results are never touched.
"""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import confirm
from analysis import stability as S
from analysis.run_records import GridLoadError
from analysis.runs import load_grid
from drmas.records import records_rule
from stability_fixture import make_stability_grid
from test_analysis import _write_run, make_grid
from test_confirm import make_grid as make_confirm_grid

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ helpers
def _repeat_line(path: Path, line_no: int, change: dict | None = None) -> None:
    """Append a copy of line ``line_no`` (1-based) of a JSONL file, with the fields of ``change`` replaced."""
    lines = path.read_text().splitlines()
    record = json.loads(lines[line_no - 1])
    record.update(change or {})
    path.write_text("\n".join([*lines, json.dumps(record)]) + "\n")


def _report(grid: Path, out: Path, **kw) -> tuple[str, dict[str, list[str]]]:
    """REPORT.md's text and the verdicts per claim key (claims.csv), without figures."""
    from analysis.report import make_report

    text = make_report(grid, out / "out", out / "figs", n_boot=50, with_figures=False, **kw).read_text()
    claims = pd.read_csv(out / "out" / "tables" / "claims.csv")
    return text, claims.groupby("key")["verdict"].apply(list).to_dict()


def _problems(text: str) -> str:
    return text.split("## Data problems", 1)[1]


# ------------------------------------------------------------------------------------------ the records rule
def test_the_records_rule_collapses_identical_repeats_and_names_the_fields_of_conflicting_ones():
    """Identical repeats (NaN equal to NaN) collapse into one and are noted; repeats that differ are a conflict
    naming the key and each differing field with both values; keys of eval records read "step S, benchmark B"."""
    same = [{"step": 0, "reward/mean": 0.1}, {"step": 1, "reward/mean": math.nan}, {"step": 1, "reward/mean": math.nan}]
    ruling = records_rule(Path("m.jsonl"), same, ("step",))
    assert ruling.kept.tolist() == [True, False, True] and ruling.conflict is None
    assert ruling.note == ("m.jsonl: 1 step value(s) recorded more than once ((1,)), each time with identical values: "
                           "collapsed into one (a resume that kept records, or two writers)")
    differ = [{"step": 0, "benchmark": "b", "avg": 0.25, "k": 4}, {"step": 0, "benchmark": "b", "avg": 0.5, "k": 4},
              {"step": 4, "benchmark": "b", "avg": 0.5}]
    ruling = records_rule(Path("e.jsonl"), differ, ("step", "benchmark"))
    assert ruling.note is None and ruling.conflict == (
        "conflicting records in e.jsonl: step 0, benchmark b recorded 2 times with different values (avg: 0.25 vs 0.5)")
    extra = records_rule(Path("m.jsonl"), [{"step": 2, "a": 1.0}, {"step": 2, "a": 1.0, "b": 2.0}], ("step",))
    assert "(b: absent vs 2.0)" in extra.conflict
    assert records_rule(Path("m.jsonl"), same[:2], ("step",)).note is None


# ------------------------------------------------------------------------------------------ the main grid
@pytest.mark.parametrize("file, line_no", [("metrics.jsonl", 4), ("eval.jsonl", 2)])
def test_identical_repeated_records_collapse_into_one_and_are_noted(tmp_path, file, line_no):
    """A step (metrics.jsonl) or an evaluation (eval.jsonl) recorded twice with the same values: one row in the
    frames, the run usable, the collapse listed under Data problems as a note."""
    from analysis.integrity import data_problems_section

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    target = grid / "math_sharing_grpo_s0" / file
    _repeat_line(target, line_no)
    data = load_grid(grid)
    assert data.runs["usable"].all() and data.problems == []
    assert not data.steps.duplicated(["run", "step"]).any()
    assert not data.evals.duplicated(["run", "step", "benchmark"]).any()
    assert len(data.steps[data.steps["run"] == "math_sharing_grpo_s0"]) == 30
    key = "(3,)" if file == "metrics.jsonl" else "(0, 'd1-expr')"
    section = "\n".join(data_problems_section(data))
    assert (f"- record dropped: {target}: 1 {'step' if file == 'metrics.jsonl' else 'step/benchmark'} value(s) recorded "
            f"more than once ({key}), each time with identical values: collapsed into one") in section


@pytest.mark.parametrize("file, line_no, change, named", [
    ("metrics.jsonl", 4, {"reward/mean": 0.99}, "step 3 recorded 2 times with different values (reward/mean: "),
    ("eval.jsonl", 4, {"avg": 0.0, "pass": 0.0, "successes": [0] * 40},
     "step 30, benchmark d1-expr recorded 2 times with different values (avg: "),
])
def test_conflicting_repeated_records_make_the_run_unusable_and_its_verdicts_incomplete(tmp_path, file, line_no, change,
                                                                                         named):
    """A key recorded twice with different values: the run is not used (none of its records is in a frame), Data
    problems names it with the key and the differing fields, and every verdict whose design holds it says incomplete
    (the math GRPO / Dr. MAS pairs: 7 of 8 runs), while the others do not."""
    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    target = grid / "math_nonsharing_drmas_s1" / file
    _repeat_line(target, line_no, change)
    data = load_grid(grid)
    run = data.runs.set_index("run").loc["math_nonsharing_drmas_s1"]
    assert not run["usable"] and run["status"] == "done" and named in run["problem"] and str(target) in run["problem"]
    assert run["problem"].endswith("; not used (which record is right cannot be told: rerun the run, or remove the "
                                   "wrong records)")
    assert "math_nonsharing_drmas_s1" not in set(data.steps["run"]) | set(data.evals["run"]) | set(data.agents["run"])
    text, verdicts = _report(grid, tmp_path)
    assert f"- math_nonsharing_drmas_s1: conflicting records in {target}: {named}" in _problems(text)
    assert verdicts["c"][0].startswith("incomplete (7 of 8 runs): ") and verdicts["b"][0].startswith("incomplete (7 of 8")
    assert verdicts["c"][1] == "not run"  # search: nothing of its design is there


# ------------------------------------------------------------------------------------------ the stability grids
def test_the_stability_summary_names_repeated_records_and_a_conflict_makes_its_verdicts_incomplete(tmp_path):
    """The stability grid follows the same rule: an identical repeat is a note of its summary's Data problems (the
    verdicts stay complete); a conflicting one leaves the run out of every verdict, which says incomplete."""
    grid = make_stability_grid(tmp_path / "stab", seeds=(0,))
    _repeat_line(grid / "stab_grpo_lr5e-05_s0" / "metrics.jsonl", 10)
    noted = S.analyze_stability(load_grid(grid), n_boot=50)
    summary = S.summary_markdown(noted, grid)
    assert "Runs finished: 4 of 4." in summary and "incomplete" not in summary
    assert "## Data problems" in summary and "each time with identical values: collapsed into one" in summary
    evals = grid / "stab_drmas_lr0.0008_s0" / "eval.jsonl"
    _repeat_line(evals, 2, {"avg": 0.0, "pass": 0.0, "successes": [0] * 24})
    an = S.analyze_stability(load_grid(grid), n_boot=50)
    summary = S.summary_markdown(an, grid)
    assert (an.finished, an.total) == (3, 4) and "Runs finished: 3 of 4." in summary
    assert f"- stab_drmas_lr0.0008_s0: conflicting records in {evals}: step 20, benchmark kb recorded 2 times" in summary
    for key, judge, _ in S.judges("search"):
        assert judge(an).verdict.startswith("incomplete (3 of 4 runs)"), key


def test_the_confirmatory_round_leaves_a_conflicting_run_out_and_says_so(tmp_path):
    """The confirmatory round too: its run with conflicting records is not finished (5 of 6), every verdict says
    incomplete, and its summary lists the run under Data problems."""
    grid = make_confirm_grid(tmp_path / "conf", seeds=[0])
    target = grid / "conf_grpo_lr0.0004_s0" / "metrics.jsonl"
    _repeat_line(target, 3, {"reward/mean": 0.9})
    an = confirm.analyze(load_grid(grid), n_boot=50)
    assert (an.finished, an.total) == (5, 6) and "conf_grpo_lr0.0004_s0" not in set(an.events["run"])
    assert an.verdicts and all(v.startswith("incomplete (5 of 6 runs): ") for v in an.verdicts.values())
    summary = confirm.summary_markdown(an, grid)
    assert "Finished runs: 5 of 6 (verdicts incomplete)." in summary
    assert f"- conf_grpo_lr0.0004_s0: conflicting records in {target}: step 2 recorded 2 times" in summary


# ------------------------------------------------------------------------------------------ missing runs
def test_a_main_grid_run_whose_folder_is_gone_is_missing_and_its_verdicts_are_incomplete(tmp_path):
    """index.json says done, the folder is gone: the run is ``missing`` (the scale line says so), Data problems names
    it, and the verdicts whose design holds it say incomplete."""
    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    shutil.rmtree(grid / "math_nonsharing_grpo_s1")
    text, verdicts = _report(grid, tmp_path)
    assert "- math_nonsharing_grpo_s1: no run folder (index.json says done)" in _problems(text)
    assert "Grid `synthetic`: 10 runs (9 done, 1 missing)" in text
    assert verdicts["c"][0].startswith("incomplete (7 of 8 runs): ") and verdicts["a"][0].startswith("incomplete (7 of 8")


def test_a_stability_run_whose_folder_is_gone_is_missing_in_its_summary_its_terminal_lines_and_the_report(tmp_path,
                                                                                                         capsys):
    """The stability grid with a run folder gone: its summary and the lines the command prints say 3 of 4 runs
    finished and every verdict incomplete, its Data problems names the run, and so do REPORT.md's."""
    grid = make_stability_grid(tmp_path / "stab", seeds=(0,))
    pilot = make_stability_grid(tmp_path / "pilot", seeds=(0,))
    shutil.rmtree(grid / "stab_grpo_lr0.0008_s0")
    out = tmp_path / "summary"
    assert S.main(["--runs", str(grid), "--pilot", str(pilot), "--out", str(out), "--figures", str(tmp_path / "f")]) == 0
    printed = capsys.readouterr().out
    for text in (printed, (out / "summary.md").read_text()):
        assert "Runs finished: 3 of 4." in text and "- stab_grpo_lr0.0008_s0: no run folder (index.json says done)" in text
        assert text.count("**incomplete (3 of 4 runs)") == 3
    main = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    report, verdicts = _report(main, tmp_path, stability=[grid])
    assert f"- {grid}: stab_grpo_lr0.0008_s0: no run folder (index.json says done)" in _problems(report)
    assert all(verdicts[k][0].startswith("incomplete (3 of 4 runs)") for k in ("b-revisited", "g", "accuracy-over-time"))


def test_a_confirmatory_run_whose_folder_is_gone_counts_as_unfinished(tmp_path):
    """A confirmatory run that index.json says is done, its folder gone, is a missing run (5 of 6; not
    counted finished, and the analysis does not stop at its absent manifest)."""
    grid = make_confirm_grid(tmp_path / "conf", seeds=[0])
    shutil.rmtree(grid / "conf_drmas_lr0.00057_s0")
    an = confirm.analyze(load_grid(grid), n_boot=50)
    assert (an.finished, an.total) == (5, 6) and all(v.startswith("incomplete (5 of 6 runs)") for v in an.verdicts.values())
    assert "- conf_drmas_lr0.00057_s0: no run folder (index.json says done)" in confirm.summary_markdown(an, grid)


def test_run_folders_the_index_does_not_list_are_noted(tmp_path):
    """A run folder index.json does not list (one the grid does not know, one ``--stale rerun`` moved aside) is a
    note: named, not used, and no run becomes unusable; in the main grid and in a stability grid's summary."""
    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    shutil.copytree(grid / "math_sharing_grpo_s0", grid / "math_sharing_grpo_s7")
    shutil.copytree(grid / "math_sharing_grpo_s0", grid / "math_sharing_grpo_s0.stale-1")
    (grid / "logs").mkdir()  # not a run folder: no note
    data = load_grid(grid)
    assert data.runs["usable"].all() and len(data.runs) == 5 and "math_sharing_grpo_s7" not in set(data.steps["run"])
    assert data.problems == [f"{grid / 'math_sharing_grpo_s0.stale-1'}: the folder `--stale rerun` moved "
                             "math_sharing_grpo_s0 to; not used",
                             f"{grid / 'math_sharing_grpo_s7'}: a run folder not in index.json; not used"]
    stab = make_stability_grid(tmp_path / "stab", seeds=(0,))
    shutil.copytree(stab / "stab_grpo_lr5e-05_s0", stab / "stab_grpo_lr5e-05_s1")
    summary = S.summary_markdown(S.analyze_stability(load_grid(stab), n_boot=50), stab)
    assert "Runs finished: 4 of 4." in summary
    assert f"- {stab / 'stab_grpo_lr5e-05_s1'}: a run folder not in index.json; not used" in summary


# ------------------------------------------------------------------------------------------ the command lines
def _cli(module: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    """(exit code, the stderr lines that are not log lines) of ``python -m analysis.<module>`` run in this process."""
    from analysis import report

    code = (S.main if module == "stability" else report.main)(argv)
    err = capsys.readouterr().err.splitlines()
    return code, [line for line in err if not line.startswith(("INFO ", "WARNING ", "DEBUG "))]


@pytest.mark.parametrize("module, flag", [("stability", "--runs"), ("stability", "--pilot"), ("report", "--runs"),
                                          ("report", "--stability"), ("report", "--confirm"), ("report", "--mechanism")])
def test_the_clis_refuse_a_folder_that_does_not_exist_in_one_line_and_write_nothing(tmp_path, capsys, module, flag):
    """A given grid folder that does not exist: exit 2, one line naming it, nothing written (neither the report nor the
    summary is written with those claims "not run")."""
    absent = tmp_path / "no" / "such_grid"
    out = tmp_path / "out"
    out.mkdir()
    (out / "REPORT.md").write_text("kept")
    (out / "summary.md").write_text("kept")
    if module == "stability":
        stab = make_stability_grid(tmp_path / "stab", seeds=(0,))
        paths = {"--runs": stab, "--pilot": stab, flag: absent}
        argv = [a for f, p in paths.items() for a in (f, str(p))] + ["--out", str(out), "--figures", str(out / "f")]
    else:
        grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
        argv = ["--runs", str(absent if flag == "--runs" else grid), "--out", str(out), "--figures", str(out / "f"),
                "--no-figures", *([flag, str(absent)] if flag != "--runs" else [])]
    code, lines = _cli(module, argv, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"analysis.{module}: ") and f"{flag} {absent} does not exist" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md", "summary.md"]
    assert (out / "REPORT.md").read_text() == "kept" and (out / "summary.md").read_text() == "kept"


# ------------------------------------------------------------------------------------------ without index.json
def test_without_index_the_grid_is_built_from_the_manifests_or_the_report_says_in_one_line_why_not(tmp_path, capsys):
    """Without index.json: the run folders' manifests give the tags of the index (entry included), and the report is
    built from them; where two runs differ only by a tag of the grid's (an assignment the presets do not show), the
    report says so in one line naming both runs (rather than stopping with a pandas reindex error)."""
    grid = make_grid(tmp_path / "grid", tasks=("math", "search"), seeds=(0,), extras=True)
    shutil.rmtree(grid / "math_partial_s6")
    indexed = load_grid(grid).runs.set_index("run")
    (grid / "index.json").unlink()
    found = load_grid(grid).runs.set_index("run")
    tags = ["task", "setting", "estimator", "assignment", "entry", "seed"]
    built = indexed.loc[found.index]
    pd.testing.assert_frame_equal(found[tags], built[tags], check_dtype=False)
    assert found["usable"].all()
    out = tmp_path / "report"
    code, lines = _cli("report", ["--runs", str(grid), "--out", str(out), "--no-figures", "--n-boot", "50"], capsys)
    assert code == 0 and lines == [] and (out / "REPORT.md").exists()
    _write_run(grid, "search_homogeneous_drmas_s0", "search", "nonsharing_drmas", "drmas", "nonsharing", 0)
    code, lines = _cli("report", ["--runs", str(grid), "--out", str(tmp_path / "again"), "--no-figures"], capsys)
    assert code == 2 and len(lines) == 1 and not (tmp_path / "again").exists()
    assert lines[0].startswith(f"analysis.report: {grid} has no index.json, and the tags its run folders' manifests "
                               "give do not tell runs apart: search_homogeneous_drmas_s0 and search_nonsharing_drmas_s0 "
                               "(task=search, setting=nonsharing_drmas, seed=0)")
    assert "python -m experiments.grid run" in lines[0]
    with pytest.raises(GridLoadError, match="without a level tag"):  # a stability grid's levels are only in its index
        stab = make_stability_grid(tmp_path / "stab", seeds=(0,))
        for run in list(stab.iterdir()):
            if run.is_dir() and "lr5e-05" in run.name:
                shutil.rmtree(run)
        (stab / "index.json").unlink()
        S.analyze_stability(load_grid(stab), n_boot=20)


# ------------------------------------------------------------------------------------------ the notebooks
def test_the_notebooks_read_run_records_only_through_load_grid():
    """The notebooks' loaders follow the same rule because they read grids only through analysis.runs.load_grid:
    no notebook opens a run's JSONL files or index.json itself."""
    for nb in sorted((ROOT / "analysis" / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert not any(word in code for word in ("jsonl", "index.json", "read_jsonl", "json.load")), nb.name
        if "GRID" in code:
            assert "load_grid(GRID)" in code, nb.name


def test_committed_grids_have_no_repeated_records_and_their_index_agrees_with_their_folders():
    """The committed grids read without a problem: no repeated record, no folder outside the index, every run of the
    index there or not started yet (the frontier round's todo runs). The one note allowed is an outcome: training
    its DONE marker calls degenerate (a collapsed run's agent with an exactly zero gradient for 10 steps)."""
    for index in sorted((ROOT / "results" / "runs").glob("*/index.json")):
        data = load_grid(index.parent)
        problems = [p for p in data.problems if not re.fullmatch(r"\S+: degenerate training: .+", p)]
        assert problems == [] and data.dropped == [], index.parent.name
        gone = data.runs[~data.runs["usable"]]
        assert set(gone["status"]) <= {"todo"}, index.parent.name



def test_degenerate_and_mixed_config_runs_are_noted_under_data_problems(tmp_path):
    """A run whose DONE marker calls it degenerate (drmas/trainer/health.py), and one continued under config
    changes with --stale keep: both usable, both named under Data problems with the cause."""
    from analysis.integrity import data_problems_section

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0,), extras=False)
    done = grid / "math_sharing_grpo_s0" / "DONE"
    done.write_text(json.dumps({"steps": 30, "degenerate": [
        "agent solver: gradient norm exactly 0 for 10 steps in a row (from step 4)"]}))
    manifest_path = grid / "math_sharing_drmas_s0" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "config_changes_kept": ["algo.clip_high (0.28 -> 0.2)"]}))
    data = load_grid(grid)
    assert data.runs["usable"].all()
    section = "\n".join(data_problems_section(data))
    assert ("math_sharing_grpo_s0: degenerate training: agent solver: gradient norm exactly 0 for 10 steps in a row "
            "(from step 4)") in section
    assert ("math_sharing_drmas_s0: mixed configs: continued under config changes (algo.clip_high (0.28 -> 0.2)) "
            "with --stale keep") in section
