"""Reliability of the tools around a run (docs/reliability.md §8): ``drmas eval`` evaluates only the folder it is
given, after checking the model shapes, the plug-in sources and the evaluation's memory, and keeps its result on a
full disk; plug-in identity covers the modules a plug-in loads, and a plug-in that exits at import stops the run;
the smaller faults (a full disk at the TensorBoard writer's start and at the SFT base save, a short degenerate run,
the confirmatory round on a bad manifest, a request whose headers never finish). ``drmas summary``'s record rules
and the lock of a dead holder are in tests/test_summary.py.

The runs are 3-step search runs from the shipped nano base (``results/sft/search/base_nano``, no SFT warm-up, a
few seconds each); a full disk is simulated portably: the write raises ``OSError(ENOSPC)``.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from drmas.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEARCH = str(ROOT / "experiments/configs/cpu/search_base.yaml")
NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _train(tmp: Path, name: str = "r", *overrides: str, plugin: Path | None = None) -> list[str]:
    """``drmas train`` arguments of a 3-step search run from the shipped nano base, with a checkpoint."""
    return ["train", SEARCH, f"name={name}", f"out_dir={tmp}/runs", "train.steps=3", "train.batch_tasks=2",
            "train.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "train.save_every=0", *overrides,
            "--no-progress", *(["--plugin", str(plugin)] if plugin else [])]


def _run(args: list[str], capsys) -> tuple[int, str, list[str]]:
    """``drmas ARGS`` in this process: (exit code, stdout, the stderr lines that are not log lines)."""
    code = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.out, [line for line in captured.err.splitlines() if line.startswith(("drmas: ", "  "))]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step run folder with its checkpoint (step 3)."""
    tmp = tmp_path_factory.mktemp("eval")
    assert main(_train(tmp, "a")) == 0
    assert main(_train(tmp, "b")) == 0
    return tmp / "runs" / "a"


# ================================================================================ drmas eval
def test_eval_refuses_an_override_that_points_to_another_run_folder(finished, capsys):
    """``drmas eval RUN name=other`` evaluated the other run's checkpoint and wrote the result into RUN as RUN's:
    refused in one line, nothing written."""
    before = sorted(p.name for p in finished.iterdir())
    for override in ("name=b", f"out_dir={finished.parent.parent}"):
        code, out, err = _run(["eval", str(finished), override], capsys)
        assert code == 2 and err == [f"drmas: drmas eval evaluates the run folder it is given ({finished}); the "
                                     f"override(s) {override} would point to another one; fix: drop them and pass "
                                     "that folder instead (drmas eval OUT_DIR/NAME)"], err
    assert sorted(p.name for p in finished.iterdir()) == before


def test_eval_checks_the_model_shapes_before_loading_the_checkpoint(finished, capsys):
    """A model of another size than the checkpoint's (the tiny base for a run trained from the nano one) was a raw
    size-mismatch traceback: one line naming the key and the sizes, before any model is loaded."""
    tiny = ROOT / "results/sft/search/base_tiny"
    code, _, err = _run(["eval", str(finished), f"models.verifier_model.path={tiny}"], capsys)
    assert code == 2 and err[0] == "drmas: cannot evaluate:" and len(err) == 2, err
    assert err[1].startswith(f"  models.verifier_model.path = '{tiny}': a model of another size than the run's "
                             "checkpoint (hidden_size 64 -> 128")


def test_eval_from_another_working_directory_names_the_relative_model_path(finished, capsys, monkeypatch, tmp_path):
    """The shipped configs name their bases by paths relative to the repository root; ``drmas eval RUN`` from another
    directory was a raw ValueError from the worker: one line naming the model, its path and the fix."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in finished.iterdir())
    code, _, err = _run(["eval", str(finished)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("drmas: model 'verifier_model': path 'results/sft/search/base_nano' (from ") and \
        f"does not exist from the working directory {tmp_path}" in err[0] and "ABSOLUTE_PATH" in err[0], err
    assert sorted(p.name for p in finished.iterdir()) == before


def test_eval_applies_the_memory_preflight_of_drmas_train(finished, capsys, monkeypatch):
    """``train.eval_samples`` of 1e8 skipped the memory preflight that ``drmas train`` applies and ran until the
    process was killed for memory: one line with the estimate and the limit, before any model is loaded (the
    memory available is fixed at 16 GiB here, so the line is the same on every machine)."""
    import drmas.preflight

    monkeypatch.setattr(drmas.preflight, "_available_memory", lambda: 16 << 30)
    code, _, err = _run(["eval", str(finished), "train.eval_samples=100000000"], capsys)
    assert code == 2 and err == [
        "drmas: cannot evaluate:",
        "  train.eval_tasks, train.eval_samples: 2 tasks x 100000000 samples x 1 benchmark(s) x 3 agents x 512 B = "
        "286 GiB (estimate, a lower bound) in memory; the limit is 0.5 x the 16 GiB available = 8 GiB; fix: lower "
        "them"], err


def test_eval_keeps_its_result_when_the_disk_is_full(finished, capsys, monkeypatch):
    """A full disk at the end of an evaluation discarded the finished result (a raw WriteFailed after the work):
    the result is printed first, the file of the previous evaluation is kept as it was, and one line says so."""
    import drmas.io

    code, out, _ = _run(["eval", str(finished)], capsys)
    written = finished / "eval_cli_step3.json"
    assert code == 0 and json.loads(written.read_text()) == json.loads(out)
    before = written.read_bytes()

    def no_space(*args, **kwargs):
        raise NO_SPACE

    monkeypatch.setattr(drmas.io, "write_all", no_space)
    code, out, err = _run(["eval", str(finished)], capsys)
    assert code == 1 and json.loads(out)["step"] == 3, out
    assert err == [f"drmas: {written}: could not be written (No space left on device); the previous file is "
                   "unchanged; the evaluation's result is the one printed above"], err
    assert written.read_bytes() == before
    assert not [p for p in finished.iterdir() if p.name.endswith(".tmp")]


# ================================================================================ plug-in identity
def _plugin_files(tmp: Path) -> tuple[Path, Path]:
    """A plug-in file that imports a helper module of its own folder (put on sys.path by the plug-in, as a
    researcher's code does), and that helper."""
    helper = tmp / "plugin_helper_mod.py"
    helper.write_text("SCALE = 1.0\n")
    plugin = tmp / "my_plugin.py"
    plugin.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(tmp)!r})
        import plugin_helper_mod  # noqa: E402
        """))
    return plugin, helper


def test_editing_a_module_the_plugin_loads_is_refused_like_editing_the_plugin(tmp_path, capsys):
    """Only the plug-in file was hashed: a helper module it imports, edited between a run and its resume, let the
    run resume with steps made by other code. Its source is part of the plug-in's sha256: the resume and
    ``drmas eval`` refuse (ConfigDrift), and the restored helper is the same run again."""
    plugin, helper = _plugin_files(tmp_path)
    assert main(_train(tmp_path, "p", plugin=plugin)) == 0
    run = tmp_path / "runs" / "p"
    recorded = json.loads((run / "manifest.json").read_text())["plugin_sources"][str(plugin)]
    helper.write_text("SCALE = 2.0\n")
    try:
        code, _, err = _run(_train(tmp_path, "p", "train.steps=4", plugin=plugin), capsys)
        assert code == 2 and len(err) == 1 and f"(plugin {plugin} (source sha256 {recorded[:12]} -> " in err[0], err
        code, _, err = _run(["eval", str(run), "--plugin", str(plugin)], capsys)
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"drmas: run folder {run} was trained with other plug-in code (plugin {plugin} "
                                 f"(source sha256 {recorded[:12]} -> ")
    finally:
        helper.write_text("SCALE = 1.0\n")
    code, out, err = _run(["eval", str(run), "--plugin", str(plugin)], capsys)
    assert code == 0 and json.loads(out)["step"] == 3, err


@pytest.mark.parametrize("body, what", [("import sys\nsys.exit(0)\n", "called sys.exit(0) while it was imported"),
                                        ("raise SystemExit\n", "called sys.exit(None) while it was imported"),
                                        ("x = {}['key']\n", "failed to import: KeyError: 'key'")])
def test_a_plugin_that_exits_or_raises_at_import_stops_the_run_in_one_line(tmp_path, capsys, body, what):
    """A plug-in calling ``sys.exit(0)`` at import made ``drmas train`` exit 0 with nothing done: exit 2, one line
    naming the file and the line, nothing written."""
    plugin = tmp_path / "exits.py"
    plugin.write_text(body)
    code, _, err = _run(_train(tmp_path, "x", plugin=plugin), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"drmas: plugin {str(plugin)!r} {what}"), err
    assert f"(at {plugin}:" in err[0]
    assert not (tmp_path / "runs").exists()


# ================================================================================ the smaller faults
def test_a_full_disk_at_the_tensorboard_writers_start_is_one_line(tmp_path, monkeypatch):
    from torch.utils import tensorboard

    from drmas.io import WriteFailed
    from drmas.loggers import MetricsSink

    def no_space(self, *args, **kwargs):
        raise NO_SPACE

    monkeypatch.setattr(tensorboard.SummaryWriter, "__init__", no_space)
    with pytest.raises(WriteFailed) as caught:
        MetricsSink(tmp_path, ["tensorboard"]).open()
    assert str(caught.value) == (f"{tmp_path / 'tb'}: the TensorBoard writer could not start (No space left on "
                                 "device); nothing was run; free space (or drop tensorboard from train.loggers) and "
                                 "run the same command again")
    assert caught.value.errno == errno.ENOSPC


def test_a_full_disk_at_the_tensorboard_writers_first_write_prints_no_thread_traceback(tmp_path):
    """On a real full disk TensorBoard's writer starts, and its event writer thread fails to write the file's first
    record: besides the one WriteFailed line, the thread printed its own ``Exception in thread`` traceback as it
    ended. ``drmas train`` in a subprocess (the thread's end as Python reports it) with that write failing: exit 1,
    the one line, no traceback."""
    script = textwrap.dedent(f"""\
        import errno, os, sys
        from tensorboard.summary.writer import record_writer

        def no_space(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        record_writer.RecordWriter.write = no_space
        from drmas.cli import main
        sys.exit(main({_train(tmp_path, "tb")!r}))
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr
    tb = tmp_path / "runs" / "tb" / "tb"
    assert [line for line in proc.stderr.splitlines() if line.startswith("drmas: ")] == [
        f"drmas: {tb}: the TensorBoard writer could not start (No space left on device); nothing was run; free space "
        "(or drop tensorboard from train.loggers) and run the same command again"], proc.stderr


@pytest.mark.parametrize("raised", ["OSError", "SafetensorError"])
def test_a_full_disk_at_the_sft_base_save_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, raised):
    """A full disk while the SFT warm-up saves a base: a WriteFailed naming the folder (exit 1 and one line on the
    command line) instead of a raw OSError or safetensors traceback; no half-written base, no temporary folder.
    safetensors reports a failed write as its own error, not an OSError."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    from drmas.io import WriteFailed
    from drmas.models.factory import build_policy, save_policy
    from drmas.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ROOT / "results/sft/search/tokenizer")
    model = build_policy("nano", tokenizer, seed=0)
    error = NO_SPACE if raised == "OSError" else SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)")

    def no_space(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", no_space)
    target = tmp_path / "base"
    with pytest.raises(WriteFailed) as caught:
        save_policy(model, tokenizer, target)
    assert str(caught.value).startswith(f"{target}: the checkpoint could not be written (")
    assert "No space left on device" in str(caught.value) and "nothing was written there" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_at_the_sft_tokenizer_save_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """A full disk while the SFT warm-up saves the tokenizer it trained (before any base is trained) was a raw
    OSError traceback from transformers' save_pretrained: one line naming the folder, exit 1, no tokenizer folder
    and no temporary folder left."""
    from transformers import PreTrainedTokenizerFast

    def no_space(self, *args, **kwargs):
        raise NO_SPACE

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", no_space)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "name": "r", "out_dir": str(tmp_path / "runs"),
        "models": {"a": {"preset": "nano", "path": str(tmp_path / "sft" / "a")}},
        "agents": [{"name": "solver", "role": "math_solver", "model": "a"},
                   {"name": "verifier", "role": "math_verifier", "model": "a"}],
        "sft": {"tokenizer_dir": str(tmp_path / "sft" / "tok"), "traces": 50, "steps": 2, "batch_size": 4}}))
    code, _, err = _run(["sft", str(config), "--no-progress"], capsys)
    tok = tmp_path / "sft" / "tok"
    assert code == 1 and err == [f"drmas: {tok}: the checkpoint could not be written (No space left on device); "
                                 "nothing was written there (the temporary folder is removed); free space and run the "
                                 "same command again"], err
    assert sorted(p.name for p in (tmp_path / "sft").iterdir()) == [".warmup.lock"]


@pytest.mark.parametrize("command", ["sft", "train"])
def test_models_sharing_a_path_with_other_roles_are_one_config_error(tmp_path, capsys, command):
    """Two models naming one base path that they would warm up with different roles were a raw ValueError
    traceback from ``drmas sft`` and ``drmas train``: one config error line, exit 2, no base built."""
    config = tmp_path / "run.yaml"
    base = tmp_path / "sft" / "a"
    config.write_text(yaml.safe_dump({
        "name": "r", "out_dir": str(tmp_path / "runs"),
        "models": {"a": {"preset": "nano", "path": str(base)}, "b": {"preset": "nano", "path": str(base)}},
        "agents": [{"name": "solver", "role": "math_solver", "model": "a"},
                   {"name": "verifier", "role": "math_verifier", "model": "b"}],
        "sft": {"tokenizer_dir": str(tmp_path / "sft" / "tok"), "traces": 50, "steps": 2, "batch_size": 4}}))
    code, _, err = _run([command, str(config), "--no-progress"], capsys)
    assert code == 2 and err == [f"drmas: models 'a' and 'b' share path {base} but would warm it up differently "
                                 "(preset nano vs nano, roles ['math_solver'] vs ['math_verifier']); give them the "
                                 "same `preset` and `sft_roles`, or different paths"], err
    assert not base.exists() and not (tmp_path / "sft" / "tok").exists()
    assert not (tmp_path / "runs").exists()  # drmas train: refused before the run folder is claimed


def test_a_degenerate_run_shorter_than_ten_steps_is_flagged(tmp_path):
    """Every agent's gradient norm exactly 0 in every step of a 3-step run (lr 0 is refused, so: identical
    samples at temperature 0 are the sign): a run shorter than DEGENERATE_STEPS was never flagged."""
    from drmas.trainer.health import DEGENERATE_STEPS, DegenerateWatch

    assert DEGENERATE_STEPS > 3
    watch = DegenerateWatch.for_run(3)
    for step in range(3):
        watch.observe(step, {"agent/solver/grad_norm": 0.0}, identical=False)
    assert list(watch.causes.values()) == ["agent solver: gradient norm exactly 0 for 3 steps in a row (from step 0)"]
    watch = DegenerateWatch.for_run(3)
    for step, norm in enumerate([0.0, 0.1, 0.0]):
        watch.observe(step, {"agent/solver/grad_norm": norm}, identical=False)
    assert watch.causes == {}
    assert DegenerateWatch.for_run(50).steps == DEGENERATE_STEPS


def test_a_short_run_at_temperature_zero_is_marked_degenerate_in_done(tmp_path):
    """The trainer's watch: a 3-step run at temperature 0 (the samples of a task group are identical, so are their
    scores: every advantage, and the gradient of the agents whose groups see the same context, is 0) ends with the
    causes in DONE; before, a run shorter than DEGENERATE_STEPS never was."""
    overrides = [f"agents.{a}.sampling.temperature=0" for a in ("verifier", "search", "answer")]
    assert main(_train(tmp_path, "t0", "train.evaluate=false", *overrides)) == 0
    done = json.loads((tmp_path / "runs" / "t0" / "DONE").read_text())
    assert "agent verifier: gradient norm exactly 0 for 3 steps in a row (from step 0)" in done["degenerate"], done
    assert all(cause.endswith(" for 3 steps in a row (from step 0)") for cause in done["degenerate"])


@pytest.mark.parametrize("manifest, expected", [
    ("{ not json", "manifest.json: unreadable (Expecting property name enclosed in double quotes"),
    (json.dumps({"name": "r"}), "manifest.json: records no `config` mapping"),
])
def test_the_confirmatory_round_names_a_bad_manifest(tmp_path, caplog, manifest, expected):
    """``python -m analysis.confirm`` on a garbled manifest said only ``Expecting value ...`` (no file), and on a
    manifest without ``config`` raised KeyError: one line naming the file, exit 2, nothing written."""
    from analysis import confirm
    from test_confirm import make_grid

    grid = make_grid(tmp_path / "grid")
    victim = sorted(p for p in grid.iterdir() if (p / "manifest.json").exists())[0]
    (victim / "manifest.json").write_text(manifest)
    assert confirm.main(["--runs", str(grid), "--out", str(tmp_path / "out")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"{victim / 'manifest.json'}: " in errors[0] and expected in errors[0], errors
    assert not (tmp_path / "out").exists()


def test_the_retrieval_server_times_out_a_request_whose_headers_never_finish(tmp_path):
    """A client that sends half a request line and then nothing held its connection for good (uvicorn waits for
    headers forever): 408 after ``header_timeout_s`` and the connection closed. A complete request is answered as
    before, and so is one whose headers arrive in pieces within the limit."""
    from envs.search.generated import KBConfig, generate_kb
    from envs.search.retriever import build_retriever
    from envs.search.server import ServerLimits, ServerThread, create_app

    kb = generate_kb(KBConfig(n_people=10, n_cities=5, n_companies=5, seed=7))
    app = create_app(build_retriever(kb.corpus(), "bm25", cache_root=tmp_path), ServerLimits(header_timeout_s=1.5))
    with ServerThread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            t0 = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):  # ends when the server hangs up (before: the socket timeout, 20 s)
                answer += chunk
            waited = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408") and b"request headers not received within 1.5 s" in answer
        assert 1.0 < waited < 10, waited
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            time.sleep(0.5)
            sock.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in answer


@pytest.mark.slow
def test_ctrl_c_during_the_sft_warm_up_prints_no_traceback(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground process group) while ``drmas sft`` warms up two checkpoints in two
    spawn workers: exit 130 with the one warning line, and every process gone. Before, the shutdown killed
    multiprocessing's resource tracker with the workers, and the exit printed a ``KeyError`` traceback per
    semaphore from a relaunched tracker."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "name": "r", "out_dir": str(tmp_path / "runs"),
        "models": {"a": {"preset": "nano", "path": str(tmp_path / "sft" / "a")},
                   "b": {"preset": "nano", "path": str(tmp_path / "sft" / "b")}},
        "agents": [{"name": "solver", "role": "math_solver", "model": "a"},
                   {"name": "verifier", "role": "math_verifier", "model": "b"}],
        "sft": {"tokenizer_dir": str(tmp_path / "sft" / "tok"), "traces": 200, "steps": 20000, "batch_size": 8}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "drmas.cli", "--log-level", "warning", "sft", str(config),
                             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # its own group: the terminal's Ctrl-C, to it alone
    kids: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while sum("spawn_main" in " ".join(_cmdline(k)) for k in kids) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "no two SFT workers"
            time.sleep(0.5)
            kids = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(3)  # the workers are training
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        _, alive = psutil.wait_procs(kids, timeout=30)
        assert not alive, [_cmdline(p)[:3] for p in alive]
    finally:
        for p in [proc, *kids]:
            try:
                p.kill()
            except (OSError, psutil.Error):
                pass
    assert proc.returncode == 130 and "Traceback" not in err and "KeyError" not in err, err
    assert [line.split(" ", 1)[1] for line in err.splitlines() if line.strip()] == [
        "WARNING drmas.shutdown: SIGINT: stopped 2 child process(es); exiting"], err


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_a_garbled_manifest_in_a_run_folder_drmas_train_wrote_is_named_as_unreadable(tmp_path):
    """A run folder ``drmas train`` wrote (config.yaml beside its manifest) with a garbled manifest.json was left out
    as "records no config": the wrong fault. It is left out as unreadable, the file and the parser's message named."""
    import shutil

    from analysis.runs import load_grid

    grid = tmp_path / "g"
    shutil.copytree(ROOT / "results/runs/stability_confirm", grid, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    victim = sorted(p for p in grid.iterdir() if (p / "config.yaml").exists())[0]
    (victim / "manifest.json").write_text("{ not json")
    runs = load_grid(grid).runs.set_index("run")
    problem = runs.loc[victim.name, "problem"]
    assert not runs.loc[victim.name, "usable"]
    assert problem.startswith(f"{victim / 'manifest.json'}: unreadable (Expecting property name") and \
        problem.endswith("not used (its settings cannot be read)"), problem
