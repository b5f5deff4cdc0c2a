"""experiments.publish: a grid's finished runs leave the folder where it runs with an index that agrees with them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.runs import load_grid
from experiments.grid_runs import GridError
from experiments.publish import main, publish

ROOT = Path(__file__).resolve().parent.parent
PILOT = ROOT / "results" / "runs" / "frontier_pilot"
RUNS = ("pilot_non_grpo_lr7.07e-05_s2000", "pilot_non_drmas_lr7.07e-05_s2000", "pilot_sha_grpo_lr7.07e-05_s2000")


@pytest.fixture()
def source(tmp_path) -> Path:
    """A grid in flight, made of committed pilot runs: two finished, one partial (its DONE removed, a checkpoint
    folder and a log beside its records), and the rest of the pilot's index not started."""
    src = tmp_path / "src"
    for name in RUNS:
        shutil.copytree(PILOT / name, src / name)
    partial = src / RUNS[2]
    (partial / "DONE").unlink()
    (partial / "checkpoints" / "latest").mkdir(parents=True)
    index = json.loads((PILOT / "index.json").read_text())
    for row in index["runs"]:
        row["status"] = {RUNS[0]: "done", RUNS[1]: "done", RUNS[2]: "partial"}.get(row["run"], "todo")
    (src / "index.json").write_text(json.dumps(index, indent=1))
    for name in RUNS[:2]:
        (src / name / "checkpoints" / "latest").mkdir(parents=True)
        (src / name / "train.log").write_text("a log\n")
        (src / name / "summary.md").write_text("# a summary\n")
    return src


def test_finished_runs_are_copied_records_only_and_the_index_agrees(source, tmp_path):
    dst = tmp_path / "dst"
    assert publish(source, dst) == {"copied": 2, "already": 0, "finished": 2, "listed": 32}
    assert sorted(p.name for p in dst.iterdir()) == sorted([*RUNS[:2], "index.json"])
    assert sorted(p.name for p in (dst / RUNS[0]).iterdir()) == ["DONE", "config.yaml", "eval.jsonl",
                                                                 "manifest.json", "metrics.jsonl"]
    rows = {r["run"]: r for r in json.loads((dst / "index.json").read_text())["runs"]}
    assert rows[RUNS[2]]["status"] == "todo" and rows[RUNS[2]]["seconds"] is None  # partial in the source
    assert rows[RUNS[0]]["status"] == "done"
    data = load_grid(dst)
    assert data.problems == [] and sorted(data.runs[data.runs.usable].run) == sorted(RUNS[:2])
    # a second publish once the partial run has finished copies it alone
    (source / RUNS[2] / "DONE").write_text("{}")
    assert publish(source, dst) == {"copied": 1, "already": 2, "finished": 3, "listed": 32}
    row, = (r for r in json.loads((dst / "index.json").read_text())["runs"] if r["run"] == RUNS[2])
    was, = (r for r in json.loads((source / "index.json").read_text())["runs"] if r["run"] == RUNS[2])
    assert was["status"] == "partial"  # finished after its runner last wrote the index
    assert row == {**was, "status": "done"}  # done, and nothing else changed (the wall time: the source's)


def test_a_destination_that_disagrees_is_refused_before_anything_is_copied(source, tmp_path):
    dst = tmp_path / "dst"
    publish(source, dst)
    index_before = (dst / "index.json").read_text()
    with (dst / RUNS[0] / "metrics.jsonl").open("a") as f:
        f.write('{"step": 999}\n')
    (source / RUNS[2] / "DONE").write_text("{}")  # would be copied, but the conflict stops everything
    with pytest.raises(GridError, match=rf"nothing copied: 1 run\(s\).*{RUNS[0]}: its records .* differ.*metrics"):
        publish(source, dst)
    assert not (dst / RUNS[2]).exists() and (dst / "index.json").read_text() == index_before
    shutil.rmtree(dst / RUNS[0])
    shutil.copytree(source / RUNS[2], dst / f"{RUNS[1]}_extra")
    (source / RUNS[2] / "DONE").unlink()
    shutil.copytree(source / RUNS[2], dst / RUNS[2])
    with pytest.raises(GridError) as err:
        publish(source, dst)
    assert f"{RUNS[2]}: {dst / RUNS[2]} exists but the run is not finished" in str(err.value)
    assert f"{RUNS[1]}_extra: a folder of {dst} that {source}'s index does not list" in str(err.value)


def test_a_note_on_a_usable_run_is_logged_and_an_unusable_run_refused(source, tmp_path, caplog):
    """A collapsed run's DONE often calls its training degenerate: a note the report lists, not a copy fault; a
    finished run that cannot be used (here its metrics cut to nothing) stops the command with its problem."""
    dst = tmp_path / "dst"
    (source / RUNS[0] / "DONE").write_text(json.dumps({"degenerate": ["agent verifier: gradient norm exactly 0 for "
                                                                      "10 steps in a row (from step 72)"]}))
    with caplog.at_level("INFO", logger="experiments.publish"):
        assert publish(source, dst)["copied"] == 2
    assert f"{RUNS[0]}: degenerate training: agent verifier: gradient norm exactly 0" in caplog.text
    index_before = (dst / "index.json").read_text()
    (source / RUNS[2] / "DONE").write_text("{}")
    (source / RUNS[2] / "config.yaml").unlink()
    with pytest.raises(GridError, match=rf"nothing copied: 1 of the finished run\(s\) cannot be used: {RUNS[2]}: "
                                        "its config.yaml is missing"):
        publish(source, dst)
    # the destination is as it was: no half-published run, the index unchanged, no staging folder left behind
    assert not (dst / RUNS[2]).exists() and (dst / "index.json").read_text() == index_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    (source / RUNS[2] / "metrics.jsonl").write_text("")
    with pytest.raises(GridError, match=r"nothing copied: the grid would not read: .*0 of train.steps = 200 steps "
                                        "recorded") as err:
        publish(source, dst)
    assert str(tmp_path / "dst") in str(err.value) and ".publish-" not in str(err.value)
    assert not (dst / RUNS[2]).exists() and (dst / "index.json").read_text() == index_before


def test_the_command_line_names_the_problem_in_one_line(source, tmp_path, capsys):
    assert main([str(source), str(source)]) == 2
    assert "are the same folder" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "dst")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no index.json" in err
    assert main([str(source), str(tmp_path / "dst")]) == 0
