"""Result integrity, part 1 (no trained models): fault injection on run-folder locks, JSONL
files read by the analysis, pre-work checks, and clean shutdown of child processes.

Each test injects one fault a careful user met (two writers on one folder, a killed lock holder, a garbled
or torn JSONL line, an empty agent list, a run name that escapes ``out_dir``, an unwritable folder, SIGTERM
to a command with children) and checks the documented reaction (docs/reliability.md §6).
Part 2, with trained nano models (checkpoint manifests, base-checkpoint build records), is in
``test_reliability_training.py``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from test_analysis import make_grid

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

HOLD = """
import os, sys, time
from drmas.locks import folder_lock
with folder_lock(sys.argv[1], "run folder"):
    print("held", flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), 9)
    time.sleep(float(sys.argv[2]))
"""


def _hold(folder: Path, how: str = "120") -> subprocess.Popen:
    """A real process holding ``folder``'s lock (``how``: seconds to hold it, or ``die``: SIGKILL itself)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), how], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


# ============================================================================================ locks
def test_a_second_writer_stops_at_once_naming_the_holder(tmp_path):
    """Two real processes on one run folder: the second gets ``FolderLocked`` at once, naming the first's pid,
    host and start time; once the first is done, the folder is free again."""
    holder = _hold(tmp_path / "run")
    try:
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "run"), "0"], cwd=ROOT, env=ENV,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode != 0 and "held" not in second.stdout
        message = second.stderr.strip().splitlines()[-1]
        assert "FolderLocked" in message and f"pid {holder.pid} on host {socket.gethostname()}, started 20" in message
        assert time.monotonic() - t0 < 60  # at once: no waiting for the holder (its import time aside)
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    """A holder SIGKILLed while holding the lock leaves its marker; the next writer sees that the pid is gone
    on this host, takes the lock over and says whose lock it replaced."""
    from drmas.locks import folder_lock

    dead = _hold(tmp_path / "run", "die")
    dead.wait()
    assert dead.returncode == -signal.SIGKILL and (tmp_path / "run" / ".lock").exists()
    with folder_lock(tmp_path / "run", "run folder"):
        assert json.loads((tmp_path / "run" / ".lock.json").read_text())["pid"] == os.getpid()
    assert f"took over the lock of pid {dead.pid} on host" in caplog.text
    assert not (tmp_path / "run" / ".lock").exists()


def test_a_second_grid_runner_on_one_out_dir_stops_at_once(tmp_path):
    """``experiments.grid run`` on an out_dir another process holds exits 1 naming the holder, before it
    looks at a run (a second runner would run every run again, interleaving metrics.jsonl)."""
    out = tmp_path / "grid"
    spec = tmp_path / "g.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "out_dir": str(out), "runs": [
        {"name": "r", "config": "experiments/configs/cpu/math_base.yaml", "tags": {}}]}))
    holder = _hold(out)
    try:
        proc = subprocess.run([sys.executable, "-m", "experiments.grid", "run", str(spec), "--only", "none"], cwd=ROOT,
                              env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"grid out_dir {out} is in use by pid {holder.pid}" in proc.stderr
    assert not (out / "index.json").exists()


def test_drmas_train_on_a_locked_run_folder_stops_before_any_work(tmp_path, capsys):
    from drmas.cli import main

    config = _config(tmp_path)
    holder = _hold(tmp_path / "runs" / "r")
    try:
        assert main(["train", str(config), "--no-progress"]) == 1
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run folder {tmp_path / 'runs' / 'r'} is in use by pid {holder.pid}" in err[0]
    assert not (tmp_path / "sft").exists()  # no tokenizer, no SFT


# ================================================================================ JSONL and analysis
def test_the_one_jsonl_rule(tmp_path, caplog):
    """A torn last line is dropped with a warning (and reported); a bad line before the last is an error
    naming file and line; blank lines are skipped."""
    from drmas.io import JsonlDamaged, read_jsonl, read_jsonl_lines

    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n\n{"step": 1}\n{"step": 2, "x"')
    got = read_jsonl_lines(path)
    assert got.records == [{"step": 0}, {"step": 1}] and got.torn_line_no == 4 and "torn last line" in caplog.text
    path.write_text('{"step": 0}\n{"step": 1, GARBLED\n{"step": 2}\n')
    with pytest.raises(JsonlDamaged, match=r"m\.jsonl, line 2: not a JSON record"):
        read_jsonl(path)
    path.write_text('{"step": 0}\n[1, 2]\n{"step": 2}\n')  # valid JSON, not a record
    with pytest.raises(JsonlDamaged, match="line 2"):
        read_jsonl(path)


def _garble(path: Path, line_no: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[line_no - 1] = lines[line_no - 1][: len(lines[line_no - 1]) // 2] + "\x00\x00 garbled\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("file, line_no", [("metrics.jsonl", 3), ("eval.jsonl", 2)])
def test_the_analysis_refuses_a_garbled_line_instead_of_changing_the_tables(tmp_path, file, line_no):
    """A garbled line in the middle of a finished run's metrics.jsonl or eval.jsonl: the loader and the report
    refuse, naming the file and line (dropping it with a warning would print other numbers)."""
    from analysis.report import make_report
    from analysis.run_records import GridLoadError
    from analysis.runs import load_grid

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    target = grid / "math_sharing_drmas_s0" / file
    _garble(target, line_no)
    with pytest.raises(GridLoadError, match=rf"{target}, line {line_no}: not a JSON record"):
        load_grid(grid)
    with pytest.raises(GridLoadError, match=f"line {line_no}"):
        make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=50, with_figures=False)
    assert not (tmp_path / "out" / "REPORT.md").exists()


def test_the_report_lists_every_dropped_record_under_data_problems(tmp_path):
    """A torn last line of a run and a step recorded twice are read by the rule and named in REPORT.md's
    "Data problems" section, with the partial run the tables leave out."""
    from analysis.report import make_report

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=True)
    metrics = grid / "math_sharing_grpo_s1" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:3] + lines[1:2] + lines[3:]))  # step 1 twice (two writers)
    text = make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=50, with_figures=False).read_text()
    section = text.split("## Data problems", 1)[1]
    partial = grid / "math_partial_s6" / "metrics.jsonl"
    assert f"record dropped: {partial}, line" in section and "torn last line dropped" in section
    assert f"record dropped: {metrics}: 1 step value(s) recorded more than once ((1,))" in section
    assert "math_partial_s6: status partial" in section and "math_failed_s5: no run folder" in section


# ================================================================================ checks before work
def _config(tmp_path: Path, **changes) -> Path:
    cfg = {"name": "r", "out_dir": str(tmp_path / "runs"),
           "models": {"a": {"preset": "nano", "path": str(tmp_path / "sft" / "a")},
                      "b": {"preset": "nano", "path": str(tmp_path / "sft" / "b")}},
           "agents": [{"name": "solver", "role": "math_solver", "model": "a"},
                      {"name": "verifier", "role": "math_verifier", "model": "b"}],
           "sft": {"tokenizer_dir": str(tmp_path / "sft" / "tok"), "traces": 200, "steps": 20000, "batch_size": 8}}
    cfg.update(changes)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("case", ["empty agents", "name ../x", "absolute name", "out_dir under a file",
                                  "tokenizer_dir under a file", "model path under a file"])
def test_problems_found_before_any_work_name_their_key(tmp_path, capsys, case):
    """Exit 2 and one line naming the key; no tokenizer, no SFT checkpoint, no run folder is written (an empty
    agent list must not start an SFT warm-up that then fails with a traceback; ``name=../x`` must not write the
    run outside out_dir; an unwritable folder must not give a raw traceback)."""
    from drmas.cli import main

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    config = {"empty agents": dict(agents=[], models={"a": {"preset": "nano", "path": str(tmp_path / "sft" / "a")}}),
              "name ../x": dict(name="../x"), "absolute name": dict(name=str(tmp_path / "elsewhere")),
              "out_dir under a file": dict(out_dir=str(blocker / "runs")),
              "tokenizer_dir under a file": dict(sft={"tokenizer_dir": str(blocker / "tok")}),
              "model path under a file": dict(models={"a": {"preset": "nano", "path": str(blocker / "a")},
                                                      "b": {"preset": "nano", "path": str(tmp_path / "b")}}),
              }[case]
    key = {"empty agents": "agents:", "name ../x": "name =", "absolute name": "name =",
           "out_dir under a file": "out_dir =", "tokenizer_dir under a file": "sft.tokenizer_dir =",
           "model path under a file": "models.a.path ="}[case]
    assert main(["train", str(_config(tmp_path, **config)), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].strip().startswith(key), err  # header + one line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "run.yaml"]


# ==================================================================================== clean shutdown
def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_for_workers(proc: subprocess.Popen, n: int, timeout: float = 300) -> list[psutil.Process]:
    """The descendants of ``proc`` once at least ``n`` of them run the SFT warm-up's spawn workers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = _descendants(proc.pid)
        workers = [k for k in kids if _is_spawn_worker(k)]
        if len(workers) >= n:
            return kids
        assert proc.poll() is None, f"exited early with {proc.returncode}"
        time.sleep(0.5)
    raise AssertionError(f"no {n} SFT workers after {timeout} s")


def _is_spawn_worker(p: psutil.Process) -> bool:
    try:
        return "spawn_main" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _assert_all_end(proc: subprocess.Popen, kids: list[psutil.Process], sig: int) -> None:
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(kids, timeout=30)
        assert not alive, f"orphans left running: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
        assert proc.returncode == 128 + sig, proc.returncode
    finally:  # whatever the outcome, leave no process behind
        if proc.poll() is None:
            proc.kill()
        for p in kids:
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_drmas_sft_ends_its_parallel_workers(tmp_path, sig):
    """``drmas sft`` warming up two checkpoints in two spawn processes: SIGTERM/SIGINT to it ends both
    (they must not keep both cores busy after their parent is gone)."""
    proc = subprocess.Popen([sys.executable, "-m", "drmas.cli", "--log-level", "warning", "sft", str(_config(tmp_path)),
                             "--no-progress"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _assert_all_end(proc, _wait_for_workers(proc, 2), sig)


@pytest.mark.slow
def test_sigterm_to_the_grid_runner_ends_its_runs_and_warm_ups(tmp_path):
    """The grid runner's ``drmas sft`` child and that child's workers all end with the runner."""
    config = _config(tmp_path)
    spec = tmp_path / "g.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "out_dir": str(tmp_path / "grid"), "sft": [str(config)],
                                    "runs": [{"name": "r", "config": str(config), "tags": {}}]}))
    proc = subprocess.Popen([sys.executable, "-m", "experiments.grid", "run", str(spec), "--jobs", "1"], cwd=ROOT,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _assert_all_end(proc, _wait_for_workers(proc, 2), signal.SIGTERM)
    assert not (tmp_path / "grid" / ".lock").exists()  # released on the way out
