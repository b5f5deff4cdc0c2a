"""Reliability, part 3: no run ends as an ordinary ``DONE`` whose records are wrong (docs/reliability.md §7).

One section per fault class: failing tools (a retrieval server with no listener, or killed mid-run), writes
on a full disk (a real small tmpfs), config drift on a run folder, unverified artifacts, analysis input
that breaks the record schema, sizes past their memory/time bound, and grid runners killed with their
children. The training runs use the shipped search base (``results/sft/search/base_nano``) on a few tasks,
so no SFT warm-up runs here.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
SEARCH = str(ROOT / "experiments/configs/cpu/search_base.yaml")


def _search(tmp: Path, name: str = "r", *extra: str) -> list[str]:
    """``drmas train`` arguments of a 3-step search run from the shipped nano base (~5 s in process)."""
    return ["train", SEARCH, f"name={name}", f"out_dir={tmp}/runs", "train.steps=3", "train.batch_tasks=2",
            "train.group_size=2", "train.eval_tasks=4", "train.eval_samples=1", "train.save_every=1", *extra]


def _main(args: list[str], capsys, *flags: str) -> tuple[int, list[str]]:
    """``drmas ARGS [--no-progress] FLAGS`` in this process: (exit code, the stderr lines that are not log lines)."""
    from drmas.cli import main

    code = main([*args, *(["--no-progress"] if args[0] == "train" else []), *flags])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("drmas: ", "  "))]
    return code, err


def _records(path: Path) -> list[dict]:
    from drmas.io import read_jsonl

    return read_jsonl(path)


# ====================================================================================== 2. full disk
@pytest.fixture
def small_disk(tmp_path, request):
    """A real tmpfs at ``tmp_path/disk`` (256 KiB, or the size the test's ``disk_size`` mark gives; unmounted
    afterwards); skipped where mounting is not permitted (not root, or no CAP_SYS_ADMIN)."""
    mark = request.node.get_closest_marker("disk_size")
    mount = tmp_path / "disk"
    mount.mkdir()
    size = mark.args[0] if mark else "256k"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or 'mount failed'}): the full-disk "
                    "tests need root with CAP_SYS_ADMIN")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` up to ``leave`` bytes (tmpfs counts whole 4 KiB pages)."""
    filler = disk / "filler"
    with open(filler, "ab") as fh:
        while shutil.disk_usage(disk).free > leave:
            fh.write(b"\0" * min(1 << 20, max(1, shutil.disk_usage(disk).free - leave)))
            fh.flush()
    return filler


def test_an_append_on_a_full_disk_raises_naming_the_path_and_keeps_complete_records(small_disk):
    """The disk fills during a metrics append: one error naming the file and the cause; the file holds the
    records before it, complete (the append must not write half a line and return as if it had written it)."""
    from drmas.io import WriteFailed, append_jsonl

    path = small_disk / "metrics.jsonl"
    append_jsonl(path, {"step": 0, "x": 1.0})
    _fill(small_disk, leave=4096)  # one page left; the record needs three
    with pytest.raises(WriteFailed, match=rf"{path}: .*No space left on device.*complete records"):
        append_jsonl(path, {"step": 1, "blob": "y" * 12_000})
    assert path.read_text() == '{"step": 0, "x": 1.0}\n'


def test_an_atomic_write_on_a_full_disk_names_the_path_and_keeps_the_old_file(small_disk):
    from drmas.io import WriteFailed, atomic_write_json

    path = small_disk / "index.json"
    atomic_write_json(path, {"v": 1})
    _fill(small_disk)
    with pytest.raises(WriteFailed, match=rf"{path}: .*No space left on device.*previous file is unchanged"):
        atomic_write_json(path, {"v": 2, "blob": "z" * 20_000})
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "index.json"]  # no temporary file left


@pytest.mark.disk_size("96m")
def test_a_checkpoint_on_a_full_disk_stops_with_one_line_and_keeps_the_previous_one(tmp_path, small_disk, capsys,
                                                                                   monkeypatch):
    """A search run whose run folder is on a tmpfs that fills before the checkpoint of step 2: exit 1 and one
    line naming the checkpoint folder and the cause (not a raw torch traceback); the checkpoint of
    step 1 verifies, metrics.jsonl holds complete records; freed, the same command resumes and finishes."""
    from drmas.checkpoints import verify_checkpoint
    from drmas.trainer.trainer import Trainer

    real = Trainer._checkpoint
    state = {"filler": None}

    def fill_before_step_2(self, step):
        if step == 2 and state["filler"] is None:
            state["filler"] = _fill(small_disk, leave=8192)
        return real(self, step)

    monkeypatch.setattr(Trainer, "_checkpoint", fill_before_step_2)
    args = _search(small_disk, "r", "train.evaluate=false")
    code, err = _main(args, capsys)
    run = small_disk / "runs" / "r"
    assert code == 1 and len(err) == 1, err
    assert f"{run}/checkpoints/latest.tmp: the checkpoint of step 2 could not be written (" in err[0]
    assert "no space left on device" in err[0].lower() and "(step 1) is intact" in err[0]
    assert verify_checkpoint(run / "checkpoints" / "latest")["step"] == 1
    assert [r["step"] for r in _records(run / "metrics.jsonl")] == [0, 1]
    assert not (run / "DONE").exists()
    state["filler"].unlink()
    assert _main(args, capsys)[0] == 0
    assert [r["step"] for r in _records(run / "metrics.jsonl")] == [0, 1, 2] and (run / "DONE").exists()


# ================================================================================== 3. config identity
def test_drmas_train_on_a_folder_made_with_another_config_stops_naming_the_keys(tmp_path, capsys):
    """A finished run, then ``drmas train`` with another estimator on its folder: exit 2 and one line naming
    the key with both values; config.yaml, manifest.json and metrics.jsonl stay as they were (no
    "run complete" printed, no records relabelled). A partial run (no DONE) with another seed and batch
    size is refused alike (no steps made under the new settings appended to it)."""
    base = _search(tmp_path, "r", "train.evaluate=false", "train.steps=2")
    assert _main(base, capsys)[0] == 0
    run = tmp_path / "runs" / "r"
    before = {f: (run / f).read_bytes() for f in ("config.yaml", "manifest.json", "metrics.jsonl")}
    assert json.loads(before["manifest.json"])["config_hash"]

    code, err = _main([*base, "algo.estimator=trajectory_grpo"], capsys)
    assert code == 2 and len(err) == 1, err
    assert f"run folder {run} was made with another config (algo.estimator ('drmas' -> 'trajectory_grpo'))" in err[0]
    assert "--stale rerun" in err[0] and {f: (run / f).read_bytes() for f in before} == before

    (run / "DONE").unlink()
    code, err = _main([*base, "train.seed=1", "train.batch_tasks=3"], capsys)
    assert code == 2 and "(train.batch_tasks (2 -> 3); train.seed (0 -> 1))" in err[0]
    assert {f: (run / f).read_bytes() for f in before} == before


def test_more_steps_continue_a_run_and_the_stale_options_are_explicit(tmp_path, capsys):
    """``train.steps`` may grow (the run continues; speed and checkpoint settings are not part of the
    identity), not shrink; ``--stale rerun`` moves the old files aside and starts afresh; ``--stale keep``
    continues under the new config and lists the changes in the manifest."""
    base = _search(tmp_path, "r", "train.evaluate=false", "train.steps=2")
    run = tmp_path / "runs" / "r"
    assert _main(base, capsys)[0] == 0
    assert _main([*base, "train.steps=3", "train.save_every=2", "train.threads=0"], capsys)[0] == 0
    assert [r["step"] for r in _records(run / "metrics.jsonl")] == [0, 1, 2]
    code, err = _main([*base, "train.steps=1"], capsys)
    assert code == 2 and "train.steps (3 -> 1)" in err[0]

    assert _main([*base, "algo.estimator=trajectory_grpo"], capsys, "--stale", "rerun")[0] == 0
    assert [r["step"] for r in _records(tmp_path / "runs" / "r.stale-1" / "metrics.jsonl")] == [0, 1, 2]
    assert [r["step"] for r in _records(run / "metrics.jsonl")] == [0, 1]
    assert yaml.safe_load((run / "config.yaml").read_text())["algo"]["estimator"] == "trajectory_grpo"

    assert _main([*base, "algo.estimator=trajectory_grpo", "train.steps=3", "algo.clip_high=0.2"], capsys, "--stale",
                 "keep")[0] == 0
    assert json.loads((run / "manifest.json").read_text())["config_changes_kept"] == ["algo.clip_high (0.28 -> 0.2)"]


# ====================================================================================== 1. failing tools
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def retrieval_server(tmp_path):
    """A real retrieval server process (``python -m envs.search.server``) over the knowledge base of
    search_base.yaml; yields (url, process)."""
    from envs.search.corpus import write_jsonl
    from envs.search.generated import KBConfig, generate_kb

    kb_args = yaml.safe_load(Path(SEARCH).read_text())["env"]["args"]["kb"]
    corpus = write_jsonl(generate_kb(KBConfig(**kb_args)).passages, tmp_path / "corpus.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "envs.search.server", "--corpus", str(corpus), "--port", "0",
                             "--no-cache"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("RETRIEVAL_SERVER_URL="), line
        yield line.split("=", 1)[1], proc
    finally:
        proc.kill()
        proc.wait()


def test_a_search_run_whose_server_has_no_listener_stops_before_step_0(tmp_path, capsys):
    """``env.args.server_url`` with no listener: exit 1 and one line naming the URL, before step 0, not a
    run trained to DONE on rewards of 0 with warnings only."""
    url = f"http://127.0.0.1:{_free_port()}"
    code, err = _main(_search(tmp_path, "r", f"env.args.server_url={url}"), capsys)
    assert code == 1 and len(err) == 1, err
    assert f"env.args.server_url: retrieval service {url}/retrieve does not answer" in err[0]
    run = tmp_path / "runs" / "r"
    assert not (run / "metrics.jsonl").exists() and not (run / "eval.jsonl").exists() and not (run / "DONE").exists()


def test_a_retrieval_server_killed_mid_run_stops_the_run_and_failures_are_counted(tmp_path, capsys, monkeypatch,
                                                                                  retrieval_server):
    """A real server, killed after step 0: step 1's queries fail after the client's retries, the run stops with
    one line (the failure share, the threshold, the last error) before recording or learning from step 1;
    step 0's record counts its retrieval calls (none failed). Below the threshold a run goes on, each step's
    failures in its record."""
    from drmas.trainer.trainer import Trainer

    url, server = retrieval_server
    real = Trainer.train_step

    def kill_server_before_step_1(self, step):
        if step == 1:
            server.kill()
            server.wait()
        return real(self, step)

    monkeypatch.setattr(Trainer, "train_step", kill_server_before_step_1)
    args = _search(tmp_path, "r", f"env.args.server_url={url}", "train.evaluate=false")
    code, err = _main(args, capsys)
    assert code == 1 and len(err) == 1, err
    assert "step 1: retrieval failed on" in err[0] and "(100% > train.max_tool_failure_rate=0.1; last error: " \
        "retrieval failed after 3 attempt(s) at " in err[0] and "the last checkpoint is step 1" in err[0]
    run = tmp_path / "runs" / "r"
    (step0,) = _records(run / "metrics.jsonl")
    assert step0["tools/retrieval/calls"] > 0 and step0["tools/retrieval/failures"] == 0
    assert not (run / "DONE").exists()
    code, err = _main([*args, "train.max_tool_failure_rate=1"], capsys)  # the service is checked before step 0
    assert code == 1 and f"retrieval service {url}/retrieve does not answer" in err[0]


def test_grader_failures_are_counted_by_the_task_source(monkeypatch, tmp_path):
    """A math-verify worker that cannot start: its answers score 0 and count as grader failures
    (``tools/grader/failures``), apart from answers the grader judged."""
    import envs.math.grader as grader_module
    from drmas.tasks import make_task_source

    monkeypatch.setattr(grader_module, "_WORKER_SCRIPT", tmp_path / "missing_worker.py")
    source = make_task_source("math_generated", difficulty=1, grader_timeout_s=1.0)
    try:
        assert source.tool_counts() == {}  # no grader built yet
        scores = source.grader.grade_batch(["\\boxed{\\{2,1\\}}", "\\boxed{7}"], ["\\{1,2\\}", "7"])
        assert scores.tolist() == [0.0, 1.0]
        counts = source.tool_counts()["grader"]
        assert (counts.calls, counts.failures) == (2, 1)
    finally:
        source.close()


# ================================================================================ 4. unverified artifacts
BASE = ROOT / "results/sft/search/base_nano"
MODELS = ("verifier_model", "search_model", "answer_model")


def _eval_folder(tmp: Path, base: Path, *extra: str) -> Path:
    """A run folder (config.yaml only) whose three models load ``base``: ``drmas eval`` evaluates them."""
    from drmas.config import dump_config, load_config

    cfg = load_config(SEARCH, [o for o in _search(tmp, "ev")[2:]] + [f"models.{m}.path={base}" for m in MODELS]
                      + list(extra))
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    return cfg.run_dir


def _swap_two_vocab_ids(tokenizer_json: Path) -> None:
    """Swap the ids of two tokens of the same length: the file keeps its size, every text maps to other ids."""
    text = tokenizer_json.read_text()
    vocab = json.loads(text)["model"]["vocab"]
    (ka, ia), (kb, ib) = [(json.dumps(tok), i) for tok, i in vocab.items() if len(str(i)) == 3 and tok.isalpha()
                          and tok.isascii()][:2]
    assert text.count(f"{ka}: {ia},") == 1 and text.count(f"{kb}: {ib},") == 1
    swapped = text.replace(f"{ka}: {ia},", "\0").replace(f"{kb}: {ib},", f"{kb}: {ia},").replace("\0", f"{ka}: {ib},")
    assert swapped != text and len(swapped) == len(text)
    tokenizer_json.write_text(swapped)


@pytest.mark.parametrize("fault", ["swapped ids", "truncated"])
def test_drmas_eval_refuses_a_base_whose_tokenizer_was_altered(tmp_path, capsys, fault):
    """``drmas eval`` on models whose base's tokenizer.json had two vocab ids swapped (same size), or was
    truncated: exit 1 and one line naming the file and the key, before a model is loaded (rather than
    evaluating with the altered tokenizer without a word, or printing a traceback that does not name the file)."""
    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    tok = base / "tokenizer.json"
    if fault == "truncated":
        tok.write_bytes(tok.read_bytes()[:1000])
    else:
        _swap_two_vocab_ids(tok)
    run = _eval_folder(tmp_path, base)
    code, err = _main(["eval", str(run)], capsys)
    assert code == 1 and len(err) == 1, err
    why = "sha256 differs from manifest.sha256.json" if fault == "swapped ids" else "1000 bytes, manifest.sha256.json says"
    assert err[0].startswith(f"drmas: models.verifier_model.path: {tok}: {why}")


def test_an_artifact_without_a_manifest_is_an_error_unless_the_user_opts_out(tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    (base / "manifest.sha256.json").unlink()
    code, err = _main(["eval", str(_eval_folder(tmp_path / "a", base))], capsys)
    assert code == 1 and f"models.verifier_model.path={base} has no manifest.sha256.json" in err[0]
    assert "train.verify_artifacts=false" in err[0]
    folder = _eval_folder(tmp_path / "b", base, "train.verify_artifacts=false")
    code, err = _main(["eval", str(folder)], capsys)  # no checkpoint: an error, unless asked for the initial models
    assert code == 2 and len(err) == 1 and "has no checkpoint; pass --initial-models" in err[0]
    code, err = _main(["eval", str(folder), "--initial-models"], capsys)
    assert code == 0 and len(err) == 1 and "has no checkpoint; evaluating the initial models" in err[0]


def test_a_damaged_tokenizer_folder_is_refused_before_the_sft_warm_up(tmp_path, capsys):
    """A missing base makes ``drmas train`` build it from ``sft.tokenizer_dir``; a flipped byte there stops
    it with one line naming the file, before any SFT step."""
    tok_dir = tmp_path / "tok"
    shutil.copytree(ROOT / "results/sft/search/tokenizer", tok_dir)
    data = bytearray((tok_dir / "tokenizer.json").read_bytes())
    data[5000] ^= 0x01
    (tok_dir / "tokenizer.json").write_bytes(bytes(data))
    args = _search(tmp_path, "r", f"sft.tokenizer_dir={tok_dir}", *[f"models.{m}.path={tmp_path}/new_base" for m in MODELS])
    code, err = _main(args, capsys)
    assert code == 1 and err == [f"drmas: sft.tokenizer_dir: {tok_dir / 'tokenizer.json'}: sha256 differs from "
                                 "manifest.sha256.json (the file was damaged after it was written)"]
    assert not (tmp_path / "new_base").exists()


def test_a_damaged_retriever_index_cache_is_rebuilt_not_used(tmp_path, caplog):
    """The BM25 index cache carries a manifest; a damaged cache file is named in a warning and the index is
    built again (not loaded as it is), answering as a fresh one."""
    from envs.search.generated import KBConfig, generate_kb
    from envs.search.retriever import build_retriever

    corpus = generate_kb(KBConfig(n_people=40, n_cities=10, n_companies=10, n_countries=4)).corpus()
    fresh = build_retriever(corpus, "bm25", cache_root=tmp_path)
    cache = fresh.index.cache_dir
    assert (cache / "manifest.sha256.json").is_file()
    victim = max((p for p in cache.iterdir() if p.suffix == ".npy"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-8:] = b"\xff" * 8
    victim.write_bytes(bytes(data))
    again = build_retriever(corpus, "bm25", cache_root=tmp_path)
    assert f"index cache not used: {victim}: sha256 differs" in caplog.text
    queries = [p["contents"].split("\n")[0] for p in corpus.passages[:20]] if hasattr(corpus, "passages") else ["a"]
    assert again.search(queries, 3)[0].tolist() == fresh.search(queries, 3)[0].tolist()
    build_retriever(corpus, "bm25", cache_root=tmp_path)  # the rebuilt cache verifies
    assert caplog.text.count("index cache not used") == 1


# ==================================================================================== 6. sizes bounded
@pytest.mark.parametrize("override, key, what", [
    ("train.eval_samples=100000000", "train.eval_tasks, train.eval_samples", "4 tasks x 100000000 samples x 1 benchmark(s) x 3 agents x 512 B"),
    ("train.batch_tasks=100000000", "train.batch_tasks, train.group_size", "100000000 tasks x 2 trajectories x 3 agents x 512 B"),
    ("train.eval_tasks=100000000", "train.eval_tasks, train.eval_samples", "100000000 tasks x 1 samples"),
    ("sft.traces=1000000000", "sft.traces", "1000000000 traces x 512 B"),
    ("agents.answer.sampling.max_new_tokens=4000", "agents[2].sampling.max_new_tokens",
     "max_new_tokens=4000 exceeds the context length 2048 of model 'answer_model' (the limit)"),
])
def test_a_size_past_its_bound_stops_before_any_work_naming_the_estimate_and_the_limit(tmp_path, capsys, override,
                                                                                      key, what):
    """Sizes no machine here can hold: exit 2 with a line naming the keys, the estimate and the limit, before
    a run folder exists (``train.eval_samples=1e8`` must not be accepted and then OOM-killed at 24 GB)."""
    code, err = _main(_search(tmp_path, "r", override), capsys)
    assert code == 2 and err[0] == "drmas: cannot start:" and len(err) == 2, err
    assert err[1].startswith(f"  {key}: ") and what in err[1] and ("the limit is" in err[1] or "(the limit)" in err[1])
    assert not (tmp_path / "runs").exists()


def test_size_problems_name_the_estimate_and_the_limit(tmp_path):
    from drmas.config import load_config
    from drmas.preflight import size_problems

    cfg = load_config(SEARCH, _search(tmp_path, "r", "train.eval_samples=100000000")[2:])
    (line,) = size_problems(cfg, available=16 * 2**30, free_disk=2**30)
    assert line.strip() == ("train.eval_tasks, train.eval_samples: 4 tasks x 100000000 samples x 1 benchmark(s) x 3 "
                            "agents x 512 B = 572 GiB (estimate, a lower bound) in memory; the limit is 0.5 x the 16 "
                            "GiB available = 8 GiB; fix: lower them")
    cfg = load_config(SEARCH, _search(tmp_path, "r", "train.steps=10000000")[2:])
    (line,) = size_problems(cfg, available=16 * 2**30, free_disk=2**30)
    assert "train.steps: 10000000 steps x 400 B of metrics records = 3.73 GiB" in line and "the 1 GiB free" in line
    assert size_problems(load_config(SEARCH, []), available=16 * 2**30, free_disk=2**30) == []  # the CPU default fits


# ============================================================================================ 7. orphans
def _grid_spec(tmp: Path, *overrides: str) -> Path:
    spec = tmp / "grid.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "out_dir": str(tmp / "grid"), "runs": [
        {"name": "r", "config": "experiments/configs/cpu/search_base.yaml", "tags": {"task": "search"},
         "overrides": ["train.batch_tasks=2", "train.group_size=2", "train.evaluate=false", *overrides]}]}))
    return spec


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := predicate()):
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_a_grid_runner_killed_with_sigkill_takes_its_runs_with_it(tmp_path):
    """``kill -9`` of a grid runner: its ``drmas train`` child ends too (the kernel sends it SIGTERM, it ends
    its own children), instead of running on as an orphan."""
    runner = subprocess.Popen([sys.executable, "-m", "experiments.grid", "run", str(_grid_spec(tmp_path, "train.steps=500")),
                               "--jobs", "1", "--device", "cpu"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        child = _wait_for(lambda: [c for c in psutil.Process(runner.pid).children() if "drmas.cli" in " ".join(c.cmdline())],
                          120, "the runner's drmas train")[0]
        runner.kill()
        runner.wait()
        gone, alive = psutil.wait_procs([child], timeout=30)
        assert not alive, f"drmas train (pid {child.pid}) outlived its grid runner"
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()


HOLD_AND_FINISH = """
import json, sys, time
from pathlib import Path
from drmas.locks import folder_lock
with folder_lock(sys.argv[1], "run folder"):
    print("held", flush=True)
    release = Path(sys.argv[2])
    deadline = time.monotonic() + 240
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (Path(sys.argv[1]) / "DONE").write_text(json.dumps({"steps": 1}))
"""


def test_a_restarted_grid_runner_waits_for_a_run_a_live_process_holds(tmp_path):
    """A run folder held by a live process (a run an earlier runner left going): the new runner neither
    starts it a second time nor marks it failed with the second writer's FolderLocked line;
    it waits, and once the holder finished the run, the grid is complete."""
    spec = _grid_spec(tmp_path, "train.steps=1")
    release = tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_FINISH, str(tmp_path / "grid" / "r_s0"), str(release)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        runner = subprocess.Popen([sys.executable, "-m", "experiments.grid", "run", str(spec), "--jobs", "1", "--device",
                                   "cpu"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in runner.stderr:  # the holder finishes the run once the runner has seen it held
            lines.append(line)
            if "is being run by" in line:
                release.touch()
        runner.wait(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    proc = subprocess.CompletedProcess(runner.args, runner.returncode, "", "".join(lines))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"r_s0 is being run by pid {holder.pid} on host" in proc.stderr
    assert "was completed by the process that held it" in proc.stderr
    index = json.loads((tmp_path / "grid" / "index.json").read_text())
    assert [(r["run"], r["status"]) for r in index["runs"]] == [("r_s0", "done")]
    assert not (tmp_path / "grid" / "logs" / "r_s0.log").exists()  # never started here


# ========================================================================== 5. the analysis checks its input
def _edit_line(path: Path, line_no: int, **changes) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[line_no - 1])
    record.update(changes)
    lines[line_no - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def _refusal(grid: Path, tmp_path: Path) -> str:
    from analysis.report import make_report
    from analysis.run_records import GridLoadError
    from analysis.runs import load_grid

    with pytest.raises(GridLoadError) as got:
        load_grid(grid)
    with pytest.raises(GridLoadError):
        make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=50, with_figures=False)
    assert not (tmp_path / "out" / "REPORT.md").exists()
    return str(got.value)


def test_the_analysis_refuses_a_finished_run_with_an_emptied_metrics_file(tmp_path):
    """The metrics.jsonl of a finished run emptied: the loader and the report refuse, naming the file, rather
    than changing claims (a)/(b) and eight tables while REPORT.md says "Data problems: None"."""
    from test_analysis import make_grid

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    target = grid / "math_nonsharing_drmas_s0" / "metrics.jsonl"
    target.write_text("")
    assert f"{target}: no step records in a finished run" in _refusal(grid, tmp_path)


@pytest.mark.parametrize("file, line_no, change, expect", [
    ("metrics.jsonl", 4, {"reward/mean": "0.41"}, "line 4: reward/mean: Input should be a valid number (got '0.41')"),
    ("metrics.jsonl", 2, {"agent/solver/grad_norm": [1.0]}, "line 2: record: 'agent/solver/grad_norm': not a number (got list)"),
    ("metrics.jsonl", 7, {"step": 6.0}, "line 7: step: Input should be a valid integer"),
    ("eval.jsonl", 2, {"avg": 0.99}, "line 2: record: avg = 0.99 but the successes give"),
    ("eval.jsonl", 1, {"n_tasks": 3}, "line 1: record: 40 successes for n_tasks = 3"),
    ("eval.jsonl", 3, {"benchmark": None}, "line 3: benchmark: Input should be a valid string"),
])
def test_the_analysis_refuses_records_that_break_the_schema_naming_file_and_line(tmp_path, file, line_no, change,
                                                                                expect):
    from test_analysis import make_grid

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    target = grid / "math_sharing_grpo_s1" / file
    _edit_line(target, line_no, **change)
    assert f"{target}, {expect}" in _refusal(grid, tmp_path)


def test_the_step_count_is_checked_against_the_config_and_no_eval_by_design_is_not_a_problem(tmp_path):
    """A finished run whose config asks for more steps than it recorded is refused, naming the missing steps;
    a run made with ``train.evaluate = false`` (the mechanism sweep) has no eval.jsonl by design and is no
    problem at all."""
    from analysis.report import make_report
    from analysis.runs import load_grid
    from test_analysis import STEPS, make_grid

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    run = grid / "math_single_grpo_s0"
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["train"]["steps"] = STEPS + 4
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert f"{run / 'metrics.jsonl'}: {STEPS} of train.steps = {STEPS + 4} steps recorded (missing {STEPS}-{STEPS + 3})" \
        in _refusal(grid, tmp_path)

    manifest["config"]["train"].update(steps=STEPS, evaluate=False)
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "eval.jsonl").unlink()
    data = load_grid(grid)
    assert data.runs.set_index("run").loc["math_single_grpo_s0", "usable"] and not data.problems
    text = make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=50, with_figures=False).read_text()
    assert "None: every run is complete and every record was read." in text.split("## Data problems", 1)[1]


def test_steps_with_tool_failures_below_the_threshold_are_marked_degraded_in_the_report(tmp_path):
    """A run that went on with a few failed retrieval calls (below train.max_tool_failure_rate) is usable,
    and REPORT.md's "Data problems" says which of its steps were degraded."""
    from analysis.report import make_report
    from test_analysis import make_grid

    grid = make_grid(tmp_path / "grid", tasks=("math",), seeds=(0, 1), extras=False)
    target = grid / "math_sharing_drmas_s0" / "metrics.jsonl"
    _edit_line(target, 3, **{"tools/grader/calls": 64, "tools/grader/failures": 2})
    _edit_line(target, 5, **{"tools/grader/calls": 64, "tools/grader/failures": 1})
    text = make_report(grid, tmp_path / "out", tmp_path / "figs", n_boot=50, with_figures=False).read_text()
    assert ("math_sharing_drmas_s0: degraded: tool calls failed in 2 step(s) (grader 3) and 0 evaluation record(s)"
            in text.split("## Data problems", 1)[1])
