"""One run, readable: the end-of-run summary of ``drmas train`` and ``drmas summary RUN`` (drmas/summary.py), the
progress lines off a terminal (drmas/progress.py) and what the TensorBoard logger writes besides the scalars
(the config as text, ``eval/avg``). One real 2-step search run from the shipped nano base (no SFT warm-up), and
synthetic run folders whose numbers are known."""
from __future__ import annotations

import io
import logging
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from conftest import held_by_another_process

from drmas.cli import main
from drmas.config import ConfigError, dump_config, load_config
from drmas.io import append_jsonl, atomic_write_json, atomic_write_text
from drmas.progress import Progress, format_duration, interval_from_env, progress_line, wants_bar
from drmas.summary import CURVES_PNG, SUMMARY_MD, benchmark_evals, read_summary, summary_text

ROOT = Path(__file__).resolve().parents[1]
SEARCH = str(ROOT / "experiments/configs/cpu/search_base.yaml")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished 2-step ``drmas train`` run (evaluations at steps 0, 1 and 2, a checkpoint, TensorBoard on) and
    what it printed to stdout."""
    tmp = tmp_path_factory.mktemp("summary")
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["train", SEARCH, "name=r", f"out_dir={tmp}/runs", "train.steps=2", "train.batch_tasks=2",
                     "train.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "train.eval_every=1",
                     "train.save_every=0", "--no-progress"])
    assert code == 0, out.getvalue()
    return tmp / "runs" / "r", out.getvalue()


def eval_record(step: int, benchmark: str, avg: float, k: int = 4, n_tasks: int = 10) -> dict:
    """An ``eval.jsonl`` record by the record schema: ``successes`` per task (as full as they go, task by task)
    that give ``avg``, and the ``pass`` they give."""
    total = round(avg * k * n_tasks)
    successes = [min(k, max(0, total - k * i)) for i in range(n_tasks)]
    return {"step": step, "benchmark": benchmark, "avg": total / (k * n_tasks),
            "pass": sum(c > 0 for c in successes) / n_tasks, "k": k, "n_tasks": n_tasks, "successes": successes}


def _synthetic(tmp: Path, done: bool, steps: int = 5) -> Path:
    """A run folder with the project's own config dump, 3 step records and evaluations at steps 0 and 2."""
    cfg = load_config(SEARCH, [f"out_dir={tmp}", "name=syn", f"train.steps={steps}", "train.eval_samples=4"])
    run = cfg.run_dir
    run.mkdir(parents=True)
    atomic_write_text(run / "config.yaml", dump_config(cfg))
    for step, (reward, seconds) in enumerate([(0.2, 1.0), (0.4, 2.0), (0.3, 3.0)]):
        append_jsonl(run / "metrics.jsonl", {"step": step, "reward/mean": reward, "timing/step": seconds})
    for step, a, b in ((0, 0.5, 0.1), (2, 0.4, 0.4)):
        for name, avg in (("kb-1hop", a), ("kb-2hop", b)):
            append_jsonl(run / "eval.jsonl", eval_record(step, name, avg))
    if done:
        atomic_write_json(run / "DONE", {"steps": 3})
    return run


# ================================================================================== the summary
def test_the_summary_of_a_stopped_run_gives_final_best_average_and_step_time(tmp_path):
    s = read_summary(_synthetic(tmp_path, done=False))
    assert (s.state, s.steps_done, s.steps_total) == ("stopped", 3, 5)
    assert s.progress == "stopped at step 3 of 5"
    by_name = {b.name: b for b in s.benchmarks}
    assert (by_name["kb-1hop"].final, by_name["kb-1hop"].best, by_name["kb-1hop"].best_step) == (0.4, 0.5, 0)
    assert (by_name["kb-2hop"].final, by_name["kb-2hop"].best, by_name["kb-2hop"].best_step) == (0.4, 0.4, 2)
    assert s.eval_curve == ((0, pytest.approx(0.3)), (2, pytest.approx(0.4)))
    assert s.final_average == (2, pytest.approx(0.4)) and s.best_average == (2, pytest.approx(0.4))
    assert s.mean_step_seconds == pytest.approx(2.0) and s.eval_k == 4
    assert s.checkpoint_step is None and not s.tensorboard
    text = summary_text(s)
    assert text.splitlines()[0] == "run syn: stopped at step 3 of 5"
    assert "  average    0.400 (step 2)  0.400 (step 2)" in text
    assert "mean 2.00 s/step over 3 steps" in text and "to resume" in text
    assert "drmas eval" not in text and "tensorboard --logdir" not in text  # no checkpoint, no tb/
    assert text.rstrip().endswith("(to resume: run the same `drmas train` command again)")


def test_a_finished_run_reads_as_finished_with_the_steps_of_done(tmp_path):
    s = read_summary(_synthetic(tmp_path, done=True, steps=3))
    assert s.state == "finished" and s.progress == "finished: 3 of 3 steps"
    assert "to resume" not in summary_text(s)


def test_a_later_record_of_the_same_evaluation_replaces_the_earlier_one():
    recs = [{"step": 0, "benchmark": "a", "avg": 0.1}, {"step": 0, "benchmark": "a", "avg": 0.3},
            {"step": 1, "benchmark": "a", "avg": 0.2}]
    benchmarks, curve = benchmark_evals(recs)
    assert curve == ((0, 0.3), (1, 0.2)) and (benchmarks[0].best, benchmarks[0].final) == (0.3, 0.2)


def test_a_run_held_by_a_live_process_reads_as_in_progress(tmp_path):
    run = _synthetic(tmp_path, done=False)
    with held_by_another_process(run) as holder:
        s = read_summary(run)
        assert s.state == "in progress" and f"pid {holder.pid}" in s.holder
        assert s.progress.startswith("in progress: step 3 of 5 (pid ")
    assert read_summary(run).state == "stopped"


def test_drmas_train_ends_with_the_summary(tiny_run):
    run, printed = tiny_run
    assert "run complete" not in printed
    lines = printed.splitlines()
    start = lines.index("run r: finished: 2 of 2 steps")
    assert "\n".join(lines[start:]) == summary_text(read_summary(run))  # the same function as `drmas summary`
    assert "  average  " in printed and "s/step over 2 steps" in printed
    for shown in (f"  checkpoint   {run}/checkpoints/latest (step 2)", f"  tensorboard  {run}/tb",
                  f"  metrics      {run}/metrics.jsonl", f"  tensorboard --logdir {run}/tb", f"  drmas eval {run}",
                  f"  drmas export {run}",
                  f"  drmas summary {run}"):
        assert shown in lines, shown
    s = read_summary(run)
    assert [step for step, _ in s.eval_curve] == [0, 1, 2] and [step for step, _ in s.reward_curve] == [0, 1]
    assert {b.name for b in s.benchmarks} == {"kb-1hop", "kb-2hop"}


def test_drmas_summary_prints_it_and_writes_summary_md_with_the_curves(tiny_run, capsys):
    run, _ = tiny_run
    assert main(["summary", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run r: finished: 2 of 2 steps\n") and out.rstrip().endswith(f"wrote {run / SUMMARY_MD}")
    md = (run / SUMMARY_MD).read_text()
    assert f"![training reward and evaluation average over the steps]({CURVES_PNG})" in md
    assert "| average |" in md and f"drmas eval {run}" in md
    assert (run / CURVES_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"  summary      {run / SUMMARY_MD}" in out.splitlines()


def test_a_folder_that_is_not_a_run_folder_is_one_drmas_line(tmp_path, capsys):
    assert main(["summary", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"drmas: {tmp_path} is not a run folder (no config.yaml); pass the folder `drmas train` wrote"]
    assert main(["summary", str(tmp_path / "missing")]) == 2
    assert "is not a run folder (no such folder)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="not a run config"):
        read_summary(tmp_path)
    assert not (tmp_path / SUMMARY_MD).exists()


def test_importing_the_summary_module_stays_light():
    probe = ("import sys, drmas.summary, drmas.progress\n"
             "print(sorted(m for m in ('torch', 'pandas', 'matplotlib', 'tqdm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ================================================================================== progress
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_a_line_with_rate_and_eta_at_the_interval(caplog):
    clock = FakeClock()
    log = logging.getLogger("test_summary.progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        bar = Progress(10, "rl", bar=False, every=30, clock=clock, log=log)
        for _ in bar.iterate(range(10)):
            clock.now += 12  # 12 s a step: a line after steps 3, 6 and 9 (36, 72, 108 s) and the last one
            bar.set_postfix(reward="0.500")
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert lines == ["rl 3/10 (30%) 12.00 s/step, elapsed 0:36, ETA 1:24, reward=0.500",
                     "rl 6/10 (60%) 12.00 s/step, elapsed 1:12, ETA 0:48, reward=0.500",
                     "rl 9/10 (90%) 12.00 s/step, elapsed 1:48, ETA 0:12, reward=0.500",
                     "rl 10/10 (100%) 12.00 s/step, elapsed 2:00, ETA 0:00, reward=0.500"]


def test_a_resumed_loop_rates_only_its_own_steps_and_a_short_loop_stays_quiet(caplog):
    clock = FakeClock()
    log = logging.getLogger("test_summary.progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        bar = Progress(100, "rl", bar=False, every=30, clock=clock, log=log, initial=50)
        clock.now += 40
        bar.update(2)  # 2 steps in 40 s since the resume at step 50
        quiet = Progress(5, "eval step 0", unit="episode", bar=False, every=30, clock=clock, log=log)
        clock.now += 1
        quiet.advance_to(5)
        off = Progress(5, "sft", enabled=False, bar=False, every=0.001, clock=clock, log=log)
        clock.now += 60
        off.update(5)
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert lines == ["rl 52/100 (52%) 20.00 s/step, elapsed 0:40, ETA 16:00"]


def test_progress_format_and_environment():
    assert progress_line("eval", 30, 40, 3.0, 10.0, unit="episode") == \
        "eval 30/40 (75%) 10.00 episode/s, elapsed 0:03, ETA 0:01"
    assert progress_line("rl", 0, 5, 1.0, 0.0) == "rl 0/5 (0%) ? s/step, elapsed 0:01, ETA ?"
    assert format_duration(3725) == "1:02:05" and format_duration(float("nan")) == "?"
    assert interval_from_env({}) == 30 and interval_from_env({"DRMAS_PROGRESS_EVERY": "5"}) == 5
    assert interval_from_env({"DRMAS_PROGRESS_EVERY": "soon"}) == 30
    assert interval_from_env({"DRMAS_PROGRESS_EVERY": "-1"}) == 30

    class Pipe:
        def isatty(self) -> bool:
            return False

    assert not wants_bar({}, Pipe()) and wants_bar({"DRMAS_PROGRESS": "1"}, Pipe())
    assert not wants_bar({"DRMAS_PROGRESS": "0"}, Pipe())


# ================================================================================== TensorBoard
def test_tensorboard_holds_the_config_as_text_and_the_eval_average(tiny_run):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        pytest.skip("tensorboard is not installed (pip install 'drmas[analysis]'); its events cannot be read back")
    import yaml

    run, _ = tiny_run
    events = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    text = events.Tensors("config/text_summary")
    assert len(text) == 1
    shown = text[0].tensor_proto.string_val[0].decode()
    assert shown.startswith("```yaml\n") and shown.endswith("```")
    assert yaml.safe_load(shown[len("```yaml\n"):-3]) == yaml.safe_load((run / "config.yaml").read_text())
    expected = read_summary(run).eval_curve
    assert [(e.step, pytest.approx(e.value, abs=1e-6)) for e in events.Scalars("eval/avg")] == \
        [(step, value) for step, value in expected]


# ================================================================================== the report's record rules
def _one_error(capsys, run: Path, code: int = 1) -> str:
    """``drmas summary RUN`` exits ``code`` with one ``drmas:`` line and no traceback; that line."""
    assert main(["summary", str(run)]) == code
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("drmas: ") and "Traceback" not in captured.err, captured.err
    assert not (run / SUMMARY_MD).exists()
    return err[0]


def test_a_conflicting_duplicate_evaluation_is_an_error_naming_the_file_and_lines(tmp_path, capsys):
    """The probe: eval.jsonl records step 2 of kb-1hop twice, 0.9 where training recorded 0.0. ``drmas summary``
    printed 0.900 without a word, though the report refuses the same conflict (the records rule,
    drmas/records.py): one line naming the file, the key, the values and the lines, exit 1."""
    run = _synthetic(tmp_path, done=True, steps=3)
    append_jsonl(run / "eval.jsonl", eval_record(2, "kb-1hop", 0.0))
    append_jsonl(run / "eval.jsonl", eval_record(2, "kb-1hop", 0.9))
    line = _one_error(capsys, run)
    assert line.startswith(f"drmas: conflicting records in {run / 'eval.jsonl'}: step 2, benchmark kb-1hop recorded "
                           "3 times with different values (avg: 0.4 vs 0.0 vs 0.9")
    assert "lines 3, 5, 6)" in line and "remove the wrong record" in line


def test_an_identical_repeat_collapses_into_one_with_a_warning(tmp_path, caplog):
    run = _synthetic(tmp_path, done=True, steps=3)
    append_jsonl(run / "metrics.jsonl", {"step": 2, "reward/mean": 0.3, "timing/step": 3.0})
    with caplog.at_level(logging.WARNING):
        s = read_summary(run)
    assert s.reward_curve == ((0, 0.2), (1, 0.4), (2, 0.3)) and s.mean_step_seconds == pytest.approx(2.0)
    assert "1 step value(s) recorded more than once ((2,)), each time with identical values" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["summary", str(run)]) == 0  # reads the folder once: the note is said once
    assert caplog.text.count("recorded more than once") == 1


@pytest.mark.parametrize("fault, expected", [
    ("bad record", "eval.jsonl, line 2: avg: Input should be a valid number"),
    ("bad eval numbers", "eval.jsonl, line 1: record: avg = 0.9 but the successes give 0.5"),
    ("metrics.jsonl is a folder", "metrics.jsonl is not a file (a folder?)"),
    ("bad train.steps", "config.yaml: train.steps = 'abc' is not a number of steps"),
    ("train not a mapping", "config.yaml: train = [1, 2] is not a mapping"),
])
def test_bad_records_and_values_are_one_line_never_a_traceback(tmp_path, capsys, fault, expected):
    """A record the report's schema refuses, a metrics.jsonl that is a folder, a config value that is no step
    count: one ``drmas:`` line naming the file (and line), no traceback (they were ValueError, KeyError,
    IsADirectoryError tracebacks)."""
    run = _synthetic(tmp_path, done=False)
    lines = (run / "eval.jsonl").read_text().splitlines()
    if fault == "bad record":
        lines[1] = lines[1].replace('"avg": 0.1', '"avg": "high"')
        (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
    elif fault == "bad eval numbers":
        lines[0] = lines[0].replace('"avg": 0.5', '"avg": 0.9')
        (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
    elif fault == "metrics.jsonl is a folder":
        (run / "metrics.jsonl").unlink()
        (run / "metrics.jsonl").mkdir()
    else:
        text = (run / "config.yaml").read_text()
        if fault == "bad train.steps":
            (run / "config.yaml").write_text(text.replace("  steps: 5\n", "  steps: abc\n", 1))
        else:
            (run / "config.yaml").write_text(text + "train: [1, 2]\n")
    line = _one_error(capsys, run, code=2 if "config" in expected else 1)
    assert expected in line, line


def test_a_done_marker_with_a_bad_value_is_finished_with_a_warning(tmp_path, caplog):
    run = _synthetic(tmp_path, done=True, steps=3)
    atomic_write_json(run / "DONE", {"steps": "three"})
    with caplog.at_level(logging.WARNING):
        s = read_summary(run)
    assert s.state == "finished" and s.steps_done == 3
    assert f"{run / 'DONE'}: not the record `drmas train` writes (steps = 'three')" in caplog.text


@pytest.mark.parametrize("content", [b"", b"\x00\xffgarbage"])
def test_an_empty_or_unreadable_lock_is_dead_as_the_message_says(tmp_path, caplog, content):
    """An empty ``.lock`` (a holder killed between creating it and writing its pid) read "in progress, pid None"
    and made ``drmas train`` refuse the folder for good, while the message says a dead lock is taken over: it is a
    stopped run, and the next writer takes the lock over with a warning. A fresh one (a holder writing its record
    right now) is left alone."""
    import os
    import time

    from drmas.locks import LOCK_NAME, RECORDLESS_AGE_S, FolderLocked, folder_lock

    run = _synthetic(tmp_path, done=False)
    (run / LOCK_NAME).write_bytes(content)
    with pytest.raises(FolderLocked):  # fresh: maybe a live holder that has not written its pid yet
        with folder_lock(run, "run folder"):
            pass
    old = time.time() - 2 * RECORDLESS_AGE_S
    os.utime(run / LOCK_NAME, (old, old))
    s = read_summary(run)
    assert s.state == "stopped" and "pid None" not in summary_text(s)
    (run / LOCK_NAME).write_bytes(content)
    os.utime(run / LOCK_NAME, (old, old))
    with caplog.at_level(logging.WARNING):
        with folder_lock(run, "run folder"):
            assert (run / LOCK_NAME).read_bytes() != content  # ours now
    assert "named no holder (empty or unreadable): the lock of a process that died, taken over" in caplog.text
