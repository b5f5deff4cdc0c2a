"""The grid runner (experiments/grid.py): spec validation, sweeps, and a two-run miniature of the CPU grid
that is interrupted with SIGKILL and restarted (nothing finished is redone, nothing is corrupt), followed
by the analysis stage on its run directories."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from drmas.config import load_config
from drmas.config.identity import config_changes, saved_config_changes
from experiments.grid import GridOptions, auto_jobs, least_busy_gpu, main, parse_jobs, run_grid
from experiments.grid_runs import (ROOT, GridError, _split_values, finished_steps, load_grid, run_status,
                                   set_aside_stale, stale_changes, status_of, sweep_grid, warm_ups_needed)
from test_paper_configs import _data_paths


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_load_grid_expands_seeds_and_tags(tmp_path):
    spec = _write(tmp_path / "g.yaml", {
        "name": "g", "out_dir": str(tmp_path / "runs"), "defaults": {"seeds": [0, 1]},
        "runs": [{"name": "a", "config": "experiments/configs/cpu/math_base.yaml", "overrides": ["algo.estimator=drmas"],
                  "tags": {"task": "math", "setting": "nonsharing_drmas"}},
                 {"name": "b", "config": "experiments/configs/cpu/math_single.yaml", "seeds": [3]}]})
    grid = load_grid(spec)
    assert [r.name for r in grid.runs] == ["a_s0", "a_s1", "b_s3"]  # seed-major: a full table early
    assert grid.runs[1].tags == {"task": "math", "setting": "nonsharing_drmas", "entry": "a", "seed": 1}
    cmd = grid.runs[1].command(grid.out_dir)
    assert "train.seed=1" in cmd and "algo.estimator=drmas" in cmd and "name=a_s1" in cmd
    assert [r.name for r in load_grid(spec, seeds=3).runs] == ["a_s0", "b_s0", "a_s1", "b_s1", "a_s2", "b_s2"]


@pytest.mark.parametrize("spec, match", [
    ({"runs": [{"name": "a"}]}, r"runs\[0\] \(a\) lacks `config`"),
    ({"runs": [{"name": "a", "config": "nope.yaml"}]}, r"runs\[0\].config: nope.yaml does not exist"),
    ({"runs": [{"name": "a", "config": "experiments/configs/cpu/math_base.yaml"},
               {"name": "a", "config": "experiments/configs/cpu/math_base.yaml"}]}, "duplicate run names"),
    ({"runz": []}, r"runz: unknown key; fix: did you mean `runs`\?"),
])
def test_bad_grid_specs_name_the_problem(tmp_path, spec, match):
    with pytest.raises(GridError, match=match):
        load_grid(_write(tmp_path / "g.yaml", spec))


MATH = "experiments/configs/cpu/math_base.yaml"
BAD_SPECS = {  # spec text -> what the one error names: the key, the value and the fix
    "runs: [ {name: a": r"grid spec .*bad.yaml is not valid YAML: while parsing a flow mapping",
    "- a\n- b": r"bad.yaml must hold a mapping at the top level \(name, out_dir, sft, defaults, runs\), not list: \['a', 'b'\]",
    "runs: abc": r"invalid grid spec \(.*bad.yaml\):\n  runs: Input should be a valid list \(got 'abc'\); fix: write a list",
    "runs: []": r"runs: List should have at least 1 item .*; fix: give at least 1 item",
    "runs: [abc]": r"runs\[0\]: Input should be a valid dictionary .*\(got 'abc'\); fix: write a mapping",
    f"runs: [{{name: a, config: {MATH}, seeds: [1.5, 1]}}]":
        r"runs\[0\].seeds\[0\]: Input should be a valid integer \(got 1.5\); fix: write an integer",
    f"runs: [{{name: a, config: {MATH}, seeds: [1, 1]}}]": r"runs\[0\].seeds: seeds \[1, 1\]: \[1\] given more than once",
    f"runs: [{{name: a, config: {MATH}, seeds: [-1]}}]": r"runs\[0\].seeds\[0\]: .*\(got -1\); fix: use a value >= 0",
    f"runs: [{{name: a, config: {MATH}, seeds: 3}}]": r"runs\[0\].seeds: Input should be a valid list \(got 3\)",
    f"defaults: {{seeds: [0, 0]}}\nruns: [{{name: a, config: {MATH}}}]": r"defaults.seeds: seeds \[0, 0\]",
    f"runs: [{{name: a, config: {MATH}, tags: abc}}]": r"runs\[0\].tags: Input should be a valid dictionary \(got 'abc'\)",
    f"runs: [{{name: a, config: {MATH}, tags: {{seed: 3}}}}]": r"runs\[0\].tags: tags \['seed'\] are written by the runner",
    f"runs: [{{name: a, config: {MATH}, overrides: algo.estimator=drmas}}]":
        r"runs\[0\].overrides: Input should be a valid list \(got 'algo.estimator=drmas'\); fix: write a list",
    f"runs: [{{name: a, config: {MATH}, overrides: [algo.estimator]}}]":
        r"runs\[0\].overrides\[0\]: override 'algo.estimator' must look like key.sub=value",
    f"runs: [{{name: a, config: {MATH}, overrides: [train.seed=3]}}]": r"override 'train.seed=3' sets train.seed, which the grid",
    f"runs: [{{name: ../../escape, config: {MATH}}}]": r"runs\[0\].name: name = '../../escape' would put the run outside out_dir",
    f"runs: [{{name: a, config: {MATH}, overrides: [models.solver_model.optim.lr=0]}}]":
        r"1 run config\(s\) do not validate, nothing was run: run a_s0 .*models.solver_model.optim.lr: Input should be "
        r"greater than 0 \(got 0\); fix: use a value > 0",
    f"runs: [{{name: a, config: {MATH}, overrides: [train.steps=abc]}}]":
        r"run a_s0 .*train.steps: Input should be a valid integer.*\(got 'abc'\); fix: write an integer",
    f"sft: [{MATH}, 3]\nruns: [{{name: a, config: {MATH}}}]": r"sft\[1\]: Input should be a valid string \(got 3\)",
    f"requires_gpu: maybe\nruns: [{{name: a, config: {MATH}}}]": r"requires_gpu: Input should be a valid boolean",
    f"runs: [{{name: a, config: {MATH}, seedz: [1]}}]": r"runs\[0\].seedz: unknown key; fix: did you mean `seeds`\?",
}


@pytest.mark.parametrize("text", list(BAD_SPECS))
def test_a_bad_grid_spec_is_one_error_naming_the_key_the_value_and_the_fix_before_any_work(tmp_path, capsys, text):
    """Every malformed spec (YAML, types, seeds, names, overrides, a run's own config) stops ``list`` and ``run`` with
    one error (exit 2, no traceback) that names the file, the key, the value and the fix; nothing is written."""
    spec = tmp_path / "bad.yaml"
    spec.write_text(text + "\n" if text.startswith("-") else f"out_dir: {tmp_path / 'runs'}\n{text}\n")
    for command in ("list", "run"):
        assert main([command, str(spec)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("experiments.grid: ") and "Traceback" not in err
        assert re.search(BAD_SPECS[text], err), err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "escape_s0.log").exists()


def test_seeds_are_distinct_integers_and_cli_selections_that_select_nothing_are_errors(tmp_path, capsys):
    """``seeds: [1.5, 1]`` is refused (rather than two runs both of seed 1); ``--seeds`` below 1 (rather than ``-1``
    selecting no run and ``0`` the spec's seeds) and an ``--only`` matching no run are errors, exit 2, index.json
    untouched."""
    spec = _write(tmp_path / "g.yaml", {"name": "g", "out_dir": str(tmp_path / "runs"),
                                        "runs": [{"name": "a", "config": MATH, "seeds": [1.5, 1]}]})
    with pytest.raises(GridError, match=r"seeds\[0\]"):
        load_grid(spec)
    grid = _fake_done_runs(_mini_grid(tmp_path))
    index = {"grid": "mini", "runs": [{"run": r.name, "status": "done", "seconds": 12.5} for r in grid.runs]}
    (grid.out_dir / "index.json").write_text(json.dumps(index))
    for flags, said in ((["--seeds", "-1"], "--seeds '-1': give the number of seeds per entry, >= 1"),
                        (["--seeds", "0"], "--seeds '0': give the number of seeds per entry, >= 1"),
                        (["--only", "zzz*"], "--only 'zzz*' selects none of the 2 run(s) of grid 'mini'")):
        for command in ("run", "list"):
            if "--seeds" in flags:  # argparse: exit 2 with the message
                with pytest.raises(SystemExit, match="2"):
                    main([command, str(tmp_path / "grid.yaml"), *flags])
            else:
                assert main([command, str(tmp_path / "grid.yaml"), *flags]) == 2
            assert said in capsys.readouterr().err
    with pytest.raises(GridError, match="--seeds 0: give the number of seeds per entry"):
        load_grid(tmp_path / "grid.yaml", seeds=0)
    assert json.loads((grid.out_dir / "index.json").read_text()) == index


def test_index_json_only_grows_and_keeps_every_wall_time(tmp_path, capsys):
    """A call that gives fewer runs (``--seeds 1`` of a two-seed grid) rewrites index.json with every run it held and
    their wall times; an index that cannot be read stops the runner before any work, unchanged."""
    spec = _mini_grid(tmp_path)
    _edit(spec, ("defaults.seeds", [0, 1]))
    grid = _fake_done_runs(spec)
    seconds = {r.name: 10.0 + i for i, r in enumerate(grid.runs)}
    (grid.out_dir / "index.json").write_text(json.dumps({"grid": "mini", "runs": [
        {"run": r.name, "status": "done", "seconds": seconds[r.name]} for r in grid.runs]}))
    assert main(["run", str(spec), "--seeds", "1"]) == 0
    rows = json.loads((grid.out_dir / "index.json").read_text())["runs"]
    assert sorted(r["run"] for r in rows) == sorted(seconds) and {r["run"]: r["seconds"] for r in rows} == seconds
    assert {r["run"]: r["status"] for r in rows} == dict.fromkeys(seconds, "done")
    assert [r["run"] for r in rows if "config" in r] == [r.name for r in grid.runs if r.seed == 0]  # rewritten now
    (grid.out_dir / "index.json").write_text('{"grid": "mini", "runs": [')
    assert main(["run", str(spec)]) == 2
    assert "index.json cannot be read as a grid index" in capsys.readouterr().err
    assert (grid.out_dir / "index.json").read_text() == '{"grid": "mini", "runs": ['


def test_a_run_whose_checkpoints_no_warm_up_builds_stops_the_grid_before_any_work(tmp_path, capsys):
    """A spec without the `sft` config that builds its runs' base checkpoint: one error naming the run and the
    checkpoint, exit 2, before any run or warm-up starts (rather than a traceback once the queue stalls)."""
    spec = _mini_grid(tmp_path)
    _edit(spec, ("sft", []))
    assert main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "2 run(s) start from checkpoints that do not exist and that no config of the grid's `sft` list builds" in err
    assert f"math_nonsharing_grpo_s0: {tmp_path / 'sft/base'}" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # refused before the out_dir's lock: no folder, log or index


def test_shipped_grids_load():
    grid = load_grid(ROOT / "experiments/grids/cpu.yaml")
    settings = {(r.tags["task"], r.tags["setting"]) for r in grid.runs}
    for task in ("math", "search"):  # the paper's five settings on both tasks
        for s in ("single_agent_grpo", "sharing_grpo", "sharing_drmas", "nonsharing_grpo", "nonsharing_drmas"):
            assert (task, s) in settings
    assert ("search", "hetero_drmas") in settings and ("search", "homogeneous_drmas") in settings
    # the paper grid's configs name data files `drmas data prepare` writes: without them it stops before any work
    with pytest.raises(GridError, match=r"24 run config\(s\) do not validate, nothing was run: run math_qwen3-4b_single"
                                        r"_grpo_s0 .*data file not found.*drmas data prepare"):
        load_grid(ROOT / "experiments/grids/paper.yaml")
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as work:
        mp.chdir(work)  # with placeholder data files every paper-scale config validates and is referenced
        for config in sorted({e["config"] for e in yaml.safe_load((ROOT / "experiments/grids/paper.yaml").read_text())["runs"]}):
            for rel in _data_paths(ROOT / config):
                (Path(work) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(work) / rel).touch()
        paper = load_grid(ROOT / "experiments/grids/paper.yaml")
    assert paper.requires_gpu and len(paper.runs) == 24 and all("configs/paper/" in r.config for r in paper.runs)
    gpu = load_grid(ROOT / "experiments/grids/gpu.yaml")  # one GPU: the math table, 4 seeds, the paper's batch
    assert gpu.requires_gpu and len(gpu.runs) == 20 and {r.seed for r in gpu.runs} == {0, 1, 2, 3}
    for run in gpu.runs:
        cfg = load_config(ROOT / run.config, run.overrides)
        assert (cfg.train.batch_tasks, cfg.train.group_size, cfg.train.device) == (32, 8, "auto")
        assert {m.preset for m in cfg.models.values()} == {"base"}


def test_auto_jobs_from_the_hardware():
    assert auto_jobs(cores=2, gpus=0) == 2  # CPU: one run per core (the 2-core default is unchanged)
    assert auto_jobs(cores=16, gpus=1) == 8  # one GPU: RUNS_PER_GPU runs share it
    assert auto_jobs(cores=4, gpus=1) == 4  # ... but never more runs than cores
    assert auto_jobs(cores=64, gpus=4, runs_per_gpu=6) == 24
    with pytest.raises(GridError, match="cores >= 1"):
        auto_jobs(cores=0, gpus=1)
    assert parse_jobs("auto") == "auto" and parse_jobs("3") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(Exception, match="number >= 1 or 'auto'"):
            parse_jobs(bad)
    assert [least_busy_gpu(2, busy) for busy in ([], [0], [0, 1], [0, 1, 1])] == [0, 1, 0, 0]


def test_device_reaches_every_run_but_does_not_make_a_folder_stale(tmp_path, capsys):
    grid = _fake_done_runs(_mini_grid(tmp_path))
    assert "train.device=cpu" in grid.runs[0].command(grid.out_dir, "cpu")
    assert not any("train.device" in a for a in grid.runs[0].command(grid.out_dir))  # auto: the config decides
    folder = grid.out_dir / grid.runs[0].name
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    saved["train"]["device"] = "cuda"  # the same run, made on a GPU
    _write(folder / "config.yaml", saved)
    assert stale_changes(grid, grid.runs[0]) == []
    assert main(["run", str(tmp_path / "grid.yaml"), "--jobs", "auto", "--device", "cpu", "--dry-run"]) == 0
    if not __import__("torch").cuda.is_available():  # a GPU that is not there: one clear error, nothing runs
        assert main(["run", str(tmp_path / "grid.yaml"), "--device", "cuda"]) == 2
        assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_sweep_is_a_cartesian_product():
    grid = sweep_grid("experiments/configs/cpu/math_base.yaml",
                      ["algo.estimator=drmas,trajectory_grpo", "train.group_size=4,8"], seeds=2, name="s", out="/tmp/x")
    assert len(grid.runs) == 8
    assert {tuple(r.overrides) for r in grid.runs} == {
        (f"algo.estimator={e}", f"train.group_size={g}") for e in ("drmas", "trajectory_grpo") for g in (4, 8)}
    assert _split_values("a,[1, 2],{x: 1, y: 2},b") == ["a", "[1, 2]", "{x: 1, y: 2}", "b"]
    with pytest.raises(GridError, match="must look like"):
        sweep_grid("experiments/configs/cpu/math_base.yaml", ["algo.estimator"], 1, "s", "/tmp/x")


# ------------------------------------------------------------------ miniature grid, killed and restarted
def _mini_grid(tmp: Path) -> Path:
    config = _write(tmp / "mini.yaml", {
        "base": str(ROOT / "experiments/configs/cpu/math_base.yaml"),
        "env": {"args": {"difficulty": 1}},
        "models": {"_replace": True,
                   "solver_model": {"preset": "nano", "path": str(tmp / "sft/base"),
                                    "sft_roles": ["math_solver", "math_verifier"], "optim": {"lr": 2e-4}},
                   "verifier_model": {"preset": "nano", "path": str(tmp / "sft/base"),
                                      "sft_roles": ["math_solver", "math_verifier"], "optim": {"lr": 2e-4}}},
        "train": {"steps": 6, "batch_tasks": 4, "group_size": 4, "eval_every": 0, "eval_tasks": 12,
                  "eval_samples": 2, "save_every": 1},
        "sft": {"traces": 300, "steps": 40, "tokenizer_dir": str(tmp / "sft/tok")}})
    return _write(tmp / "grid.yaml", {
        "name": "mini", "out_dir": str(tmp / "runs"), "sft": [str(config)], "defaults": {"seeds": [0]},
        "runs": [{"name": f"math_nonsharing_{e}", "config": str(config), "overrides": [f"algo.estimator={est}"],
                  "tags": {"task": "math", "setting": f"nonsharing_{e}", "estimator": est, "assignment": "nonsharing"}}
                 for e, est in (("grpo", "trajectory_grpo"), ("drmas", "drmas"))]})


def _fake_done_runs(spec: Path) -> tuple:
    """Run folders holding DONE and the config.yaml the grid gives now (no training)."""
    from drmas.config import dump_config, load_config

    grid = load_grid(spec)
    for run in grid.runs:
        folder = grid.out_dir / run.name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(dump_config(load_config(run.config, run.train_overrides(grid.out_dir))))
        (folder / "DONE").write_text("{}")
    return grid


def _edit(path: Path, *changes: tuple[str, object]) -> None:
    """Set the dotted keys of the YAML file ``path`` to the given values."""
    data = yaml.safe_load(path.read_text())
    for key, value in changes:
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    _write(path, data)


def test_run_folders_made_with_another_config_are_not_taken_as_results(tmp_path):
    grid = _fake_done_runs(_mini_grid(tmp_path))
    assert all(stale_changes(grid, r) == [] for r in grid.runs)
    assert run_grid(grid) == {}  # everything complete: nothing runs

    _edit(tmp_path / "mini.yaml", ("train.steps", 7), ("models.solver_model.optim.lr", 1e-4))
    grid = load_grid(tmp_path / "grid.yaml")
    assert stale_changes(grid, grid.runs[0]) == ["models.solver_model.optim.lr (0.0002 -> 0.0001)"]  # steps may grow
    with pytest.raises(GridError, match=r"2 run folder\(s\).*math_nonsharing_grpo_s0: models.solver_model.optim.lr "
                                        r"\(0.0002 -> 0.0001\).*--stale rerun"):
        run_grid(grid)
    assert all(run_status(grid.out_dir / r.name) == "done" for r in grid.runs)  # nothing touched

    set_aside_stale(grid, grid.runs[:1], "keep")  # kept as they are
    assert run_status(grid.out_dir / grid.runs[0].name) == "done"
    set_aside_stale(grid, grid.runs[:1], "rerun")  # moved aside, nothing deleted: the run starts afresh
    name = grid.runs[0].name
    assert run_status(grid.out_dir / name) == "todo"
    assert (grid.out_dir / f"{name}.stale-1" / "DONE").exists()
    assert not (grid.out_dir / f"{name}.stale-1" / ".lock").exists()
    assert run_status(grid.out_dir / grid.runs[1].name) == "done"


def test_stale_keep_keeps_a_finished_run_only_under_the_settings_it_was_made_with(tmp_path, capsys):
    """``--stale keep`` leaves a finished run folder made at another learning rate as it is, and index.json lists it
    ``stale`` with the changed keys (the settings it was made with -> the grid's), not ``done`` as a result of the
    grid's settings; the call does not count it as reused and says so."""
    grid = _fake_done_runs(_mini_grid(tmp_path))
    saved = {r.name: (grid.out_dir / r.name / "config.yaml").read_text() for r in grid.runs}
    assert main(["run", str(tmp_path / "grid.yaml")]) == 0
    _edit(tmp_path / "mini.yaml", ("models.solver_model.optim.lr", 4e-4))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "grid.yaml"), "--stale", "keep"]) == 0
    out = capsys.readouterr().out
    assert "except 2 finished run(s) made with another config and kept as they are (--stale keep)" in out
    rows = json.loads((grid.out_dir / "index.json").read_text())["runs"]
    assert [(r["status"], r["stale"]) for r in rows] == [("stale", ["models.solver_model.optim.lr (0.0002 -> 0.0004)"])] * 2
    assert {r.name: (grid.out_dir / r.name / "config.yaml").read_text() for r in grid.runs} == saved  # kept as they are
    assert main(["list", str(tmp_path / "grid.yaml")]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["stale", "stale"]
    _edit(tmp_path / "mini.yaml", ("models.solver_model.optim.lr", 2e-4))  # back to the settings they were made with
    assert main(["run", str(tmp_path / "grid.yaml")]) == 0
    assert [r["status"] for r in json.loads((grid.out_dir / "index.json").read_text())["runs"]] == ["done", "done"]


def test_the_grid_and_drmas_train_decide_a_runs_identity_by_one_rule(tmp_path, capsys):
    """The grid asks drmas/config/identity.py whether a run folder holds its run: a finished run whose config
    differs only in keys drmas train ignores (backend, threads, device, checkpoint cadence) is reused; one asked
    for more ``train.steps`` is no change but not complete either: it is started again and resumes from its
    checkpoint (as ``drmas train`` continues it); fewer steps is a change."""
    grid = _fake_done_runs(_mini_grid(tmp_path))
    for run in grid.runs:
        folder = grid.out_dir / run.name
        (folder / "checkpoints" / "latest").mkdir(parents=True)
        _edit(folder / "config.yaml", ("train.backend", "ray"), ("train.threads", 4), ("train.device", "cuda"),
              ("train.save_every", 3))
        saved = load_config(folder / "config.yaml", [])
        assert stale_changes(grid, run) == config_changes(saved, run.effective_config(grid.out_dir)) == []
        assert stale_changes(grid, run) == saved_config_changes(run.effective_config(grid.out_dir))
    assert [status_of(grid, r) for r in grid.runs] == ["done", "done"]
    assert run_grid(grid, GridOptions(dry_run=True)) == {} and capsys.readouterr().out == ""  # reused: nothing to run
    assert run_grid(grid) == {}
    assert [r["status"] for r in json.loads((grid.out_dir / "index.json").read_text())["runs"]] == ["done", "done"]

    _edit(tmp_path / "mini.yaml", ("train.steps", 8))
    grid = load_grid(tmp_path / "grid.yaml")
    folder = grid.out_dir / grid.runs[0].name
    assert finished_steps(folder) == 6 and run_status(folder) == "done"  # DONE of 6 steps (from its config.yaml)
    assert [stale_changes(grid, r) for r in grid.runs] == [[], []]
    assert [status_of(grid, r) for r in grid.runs] == ["partial", "partial"]  # resumed from the step-6 checkpoint
    set_aside_stale(grid, grid.runs, "error")  # no change: nothing refused, nothing moved
    assert run_grid(grid, GridOptions(dry_run=True)) == {}
    commands = capsys.readouterr().out.splitlines()
    assert [c.split(" name=")[1].split()[0] for c in commands] == [r.name for r in grid.runs]
    assert all("--stale keep" in c for c in commands)
    assert [p.name for p in grid.out_dir.iterdir() if ".stale-" in p.name] == []

    (folder / "DONE").write_text(json.dumps({"steps": 8}))  # the DONE record's own count decides
    assert finished_steps(folder) == 8 and status_of(grid, grid.runs[0]) == "done"
    (folder / "DONE").write_text(json.dumps({"steps": 6}))  # a continuation to 8 killed after rewriting config.yaml
    _edit(folder / "config.yaml", ("train.steps", 8))
    assert finished_steps(folder) == 6 and status_of(grid, grid.runs[0]) == "partial"

    _edit(tmp_path / "mini.yaml", ("train.steps", 5))
    grid = load_grid(tmp_path / "grid.yaml")
    assert stale_changes(grid, grid.runs[1]) == ["train.steps (6 -> 5)"]
    with pytest.raises(GridError, match=r"train.steps \(6 -> 5\)"):
        set_aside_stale(grid, grid.runs[1:], "error")


@pytest.mark.slow
def test_a_finished_run_asked_for_more_steps_resumes_under_the_grid(tmp_path):
    """End to end: a finished grid run whose ``train.steps`` is raised is started again and continues from its
    checkpoint (its first records stay as they were); then a changed ``train.threads`` reuses it."""
    def spec(*overrides: str) -> Path:
        return _write(tmp_path / "g.yaml", {"name": "g", "out_dir": str(tmp_path / "runs"), "runs": [
            {"name": "r", "config": "experiments/configs/cpu/search_base.yaml", "tags": {"task": "search"},
             "overrides": ["train.batch_tasks=2", "train.group_size=2", "train.evaluate=false", *overrides]}]})

    summary, folder = tmp_path / "summary.txt", tmp_path / "runs" / "r_s0"
    assert run_grid(load_grid(spec("train.steps=2")), GridOptions(jobs=1, device="cpu", summary=summary)) == {}
    first = (folder / "metrics.jsonl").read_bytes()
    assert run_grid(load_grid(spec("train.steps=3")), GridOptions(jobs=1, device="cpu", summary=summary)) == {}
    metrics = (folder / "metrics.jsonl").read_bytes()
    assert metrics.startswith(first) and [json.loads(line)["step"] for line in metrics.splitlines()] == [0, 1, 2]
    assert json.loads((folder / "DONE").read_text())["steps"] == 3
    assert run_grid(load_grid(spec("train.steps=3", "train.threads=0")), GridOptions(jobs=1, summary=summary)) == {}
    assert [line.split(": ", 2)[2] for line in summary.read_text().splitlines()] == [
        "1 computed now, 0 reused (complete before)", "1 computed now, 0 reused (complete before)",
        "0 computed now, 1 reused (complete before)"]
    assert not list((tmp_path / "runs").glob("*.stale-*"))


def test_grid_options_refuse_unknown_policies(tmp_path):
    with pytest.raises(GridError, match="stale='redo'"):
        GridOptions(stale="redo")
    with pytest.raises(GridError, match="stale='redo'"):  # not taken for rerun
        set_aside_stale(load_grid(_mini_grid(tmp_path)), [], "redo")
    with pytest.raises(GridError, match="device='tpu'"):
        GridOptions(device="tpu")


def _runner(spec: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "experiments.grid", "run", str(spec), "--jobs", "1"], cwd=ROOT,
                            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


def test_mini_grid_survives_sigkill_and_restart(tmp_path):
    spec = _mini_grid(tmp_path)
    runs = tmp_path / "runs"
    first, second = runs / "math_nonsharing_grpo_s0", runs / "math_nonsharing_drmas_s0"
    proc = _runner(spec, tmp_path / "runner.log")
    deadline = time.time() + 300
    # kill the whole runner (and its training subprocess) once the first run is done and the second has a checkpoint
    while time.time() < deadline and not (run_status(first) == "done" and run_status(second) == "partial"):
        assert proc.poll() is None, (tmp_path / "runner.log").read_text()[-3000:]
        time.sleep(0.2)
    assert run_status(first) == "done", "the first run did not finish in time"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    assert run_status(second) == "partial"

    proc = _runner(spec, tmp_path / "runner2.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "runner2.log").read_text()[-3000:]
    log = (tmp_path / "runner2.log").read_text()
    assert "1 computed now, 1 reused (complete before)" in log
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == finished  # nothing redone
    index = json.loads((runs / "index.json").read_text())
    assert [(r["run"], r["status"]) for r in index["runs"]] == [
        ("math_nonsharing_grpo_s0", "done"), ("math_nonsharing_drmas_s0", "done")]
    steps = [json.loads(line)["step"] for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5]  # resumed: each step exactly once, no torn or duplicate lines
    evals = [json.loads(line) for line in (second / "eval.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in evals}) == [0, 6]
    # a third invocation does no training at all
    proc = _runner(spec, tmp_path / "runner3.log")
    assert proc.wait(timeout=120) == 0
    assert "2 run(s) in" in (log3 := (tmp_path / "runner3.log").read_text()) and "0 computed now, 2 reused" in log3

    # the analysis stage on the miniature: tables, figures and REPORT.md from the two run directories
    from analysis.report import main as report_main

    assert report_main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "figs"),
                        "--n-boot", "200"]) == 0
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "nonsharing" in report and "search" in report  # the math claims measured, the search ones "not run"
    assert (tmp_path / "out" / "tables").is_dir() and any((tmp_path / "figs").glob("*.png"))


def test_only_warms_up_the_bases_its_runs_need(tmp_path):
    """`--only math_*` starts the math warm-up only, not the search warm-ups; a base that
    exists is not warmed up again."""
    sft = tmp_path / "sft"
    spec = _write(tmp_path / "g.yaml", {
        "name": "g", "out_dir": str(tmp_path / "runs"),
        "sft": ["experiments/configs/cpu/math_base.yaml", "experiments/configs/cpu/search_base.yaml"],
        "runs": [{"name": "m", "config": "experiments/configs/cpu/math_base.yaml"},
                 {"name": "s", "config": "experiments/configs/cpu/search_base.yaml"}]})
    grid = load_grid(spec)
    math_run = [r for r in grid.runs if r.name == "m_s0"]
    needed = warm_ups_needed(grid, math_run)
    base = ROOT / "results/sft/math/base_tiny/config.json"
    assert needed == ([] if base.exists() else ["experiments/configs/cpu/math_base.yaml"])
    search_base = ROOT / "results/sft/search/base_nano/config.json"
    assert warm_ups_needed(grid, grid.runs) == [c for c, b in zip(grid.sft, (base, search_base)) if not b.exists()]
    del sft


@pytest.mark.slow
def test_grid_on_a_local_ray_head_runs_two_runs_at_once(tmp_path):
    """``--ray ADDRESS``: the same runs, index and run folders, each run a Ray task (1 CPU) on a local head with
    2 CPUs: both runs go at once (their training intervals overlap), both complete, and a second invocation
    skips them."""
    ray = pytest.importorskip("ray")
    spec = _mini_grid(tmp_path)
    runs = tmp_path / "runs"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        assert run_grid(load_grid(spec), GridOptions(jobs="auto", ray_address="local")) == {}
        index = json.loads((runs / "index.json").read_text())
        assert [(r["run"], r["status"]) for r in index["runs"]] == [
            ("math_nonsharing_grpo_s0", "done"), ("math_nonsharing_drmas_s0", "done")]
        for r in index["runs"]:
            steps = [json.loads(line)["step"] for line in (runs / r["run"] / "metrics.jsonl").read_text().splitlines()]
            assert steps == [0, 1, 2, 3, 4, 5]
        # each run trains from its manifest (written at the start) to its DONE: the two intervals overlap
        (a0, a1), (b0, b1) = [((runs / r["run"] / "manifest.json").stat().st_mtime, (runs / r["run"] / "DONE").stat().st_mtime)
                              for r in index["runs"]]
        assert a0 < b1 and b0 < a1, "the two runs did not run at once"
        assert run_grid(load_grid(spec), GridOptions(jobs="auto", ray_address="local")) == {}  # complete: skipped
    finally:
        ray.shutdown()



def test_twins_start_side_by_side_when_the_spec_asks(tmp_path):
    """With ``twins_together``, a lane freed while the other still runs waits, and the next twin pair starts on two
    lanes at once; without it the first twin starts alone. The launcher runs ``sleep`` in place of training (the
    scheduling is what is tested; the mini grid tests train for real)."""
    from experiments.grid import Lanes, LocalLauncher, _run_todo, unstarted_twins
    from experiments.grid_runs import Grid, Run

    class Sleeper(LocalLauncher):
        def __init__(self):
            self.started: dict[str, float] = {}

        def start(self, cmd, log, env):
            name = next(a.split("=", 1)[1] for a in cmd if a.startswith("name="))
            self.started[name] = time.perf_counter()
            return subprocess.Popen(["sleep", "0.1" if name == "a_grpo_s0" else "5"])

    def runs():
        tag = lambda cell, est: {"task": "search", "level": cell, "estimator": est}  # noqa: E731
        return [Run(f"{cell}_{e}_s0", "experiments/configs/cpu/search_base.yaml", [], 0, tag(cell, est))
                for cell in ("a", "b") for e, est in (("grpo", "trajectory_grpo"), ("drmas", "drmas"))]

    gaps = {}
    for together in (False, True):
        grid = Grid("twins", tmp_path / f"runs_{together}", [], runs(), twins_together=together)
        launcher = Sleeper()
        assert _run_todo(grid, list(grid.runs), Lanes(jobs=2, gpus=0, device="auto", launcher=launcher)) == {}
        gaps[together] = abs(launcher.started["b_drmas_s0"] - launcher.started["b_grpo_s0"])
        assert unstarted_twins(grid, grid.runs[2], grid.runs[3:]) == ([grid.runs[3]] if together else [])
    assert gaps[True] < 0.5 < 2.5 < gaps[False]


def test_sigusr1_lets_the_running_runs_finish_and_starts_no_new_one(tmp_path, caplog):
    """``kill -USR1`` ends a sitting without losing a run in flight: the runs started before it run to their end,
    the queue's others do not start, and the grid stops. The launcher runs ``sleep`` in place of training (the
    scheduling is what is tested)."""
    from experiments.grid import DRAIN_SIGNAL, Lanes, LocalLauncher, _run_todo, drain_on_signal
    from experiments.grid_runs import Grid, Run

    class Sleeper(LocalLauncher):
        def __init__(self):
            self.procs: dict[str, subprocess.Popen] = {}

        def start(self, cmd, log, env):
            name = next(a.split("=", 1)[1] for a in cmd if a.startswith("name="))
            self.procs[name] = subprocess.Popen(["sleep", "2"])
            return self.procs[name]

    runs = [Run(f"r{i}_s0", "experiments/configs/cpu/search_base.yaml", [], 0, {"task": "search", "level": i})
            for i in range(4)]
    grid = Grid("drain", tmp_path / "runs", [], runs)
    launcher = Sleeper()
    with drain_on_signal() as drain:
        threading.Timer(0.5, os.kill, (os.getpid(), DRAIN_SIGNAL)).start()
        t0 = time.perf_counter()
        with caplog.at_level("WARNING", logger="experiments.grid"):
            assert _run_todo(grid, list(grid.runs), Lanes(jobs=2, gpus=0, device="auto", launcher=launcher),
                             drain) == {}
    assert drain.is_set() and "SIGUSR1: no new run starts" in caplog.text
    assert sorted(launcher.procs) == ["r0_s0", "r1_s0"]  # the first two ran; r2 and r3 never started
    assert all(proc.returncode == 0 for proc in launcher.procs.values())  # to their end, not killed
    assert 1.9 < time.perf_counter() - t0
    assert signal.getsignal(DRAIN_SIGNAL) is signal.SIG_DFL  # the handler is gone on the way out
