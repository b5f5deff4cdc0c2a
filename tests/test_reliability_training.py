"""Reliability, part 2 (real nano models): crash safety, non-finite rewards, dead Ray workers.

- SIGKILL at chosen points of a small training run in a subprocess (inside a worker-group update, in the
  middle of a metrics append, between an evaluation and its checkpoint, inside a checkpoint write, between
  the checkpoint renames, before the DONE marker) and at a random moment from outside; after each kill the
  same command resumes, and the final metrics and evaluations equal those of an uninterrupted run;
- a NaN reward from the environment stops the step before any update, with a clear error;
- a Ray worker-group actor SIGKILLed during an update: the run replaces its workers and goes on from the
  last checkpoint (same final metrics), or, past its restart budget, stops with a clear message and its
  checkpoint; the math grader's timeout holds inside a Ray actor.

Run as a script (``python tests/test_reliability_training.py child OVERRIDES_JSON KILL``), this file is
the child process: it trains with the given config overrides and SIGKILLs itself at ``KILL``.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("timing/",)
STEPS = 5


def _overrides(tmp: Path, name: str, *extra: str) -> list[str]:
    """A small non-sharing math run on two nano models (both warmed up once, see ``warm``)."""
    return [f"name={name}", f"out_dir={tmp}/runs", "env.name=math_generated", "env.orchestra=math",
            "env.args={difficulty: 1, grader_timeout_s: 1.0}",
            f"models={{solver_model: {{preset: nano, path: {tmp}/sft/solver}}, "
            f"verifier_model: {{preset: nano, path: {tmp}/sft/verifier}}}}",
            "agents=[{name: solver, role: math_solver, model: solver_model, sampling: {max_new_tokens: 24}},"
            " {name: verifier, role: math_verifier, model: verifier_model, sampling: {max_new_tokens: 16}}]",
            "train.batch_tasks=4", "train.group_size=4", "train.eval_tasks=4", "train.eval_samples=2",
            f"train.steps={STEPS}", "train.save_every=1", "train.eval_every=2",
            # trajectory-level advantages: the nano Verifier's steps share its trajectory's advantage, so both
            # models move every step (under per-agent Dr. MAS a Verifier that is always invalid gets 0)
            "algo.estimator=trajectory_grpo",
            "sft.traces=300", "sft.steps=60", "sft.batch_size=32", f"sft.tokenizer_dir={tmp}/sft/tok", *extra]


def _load(overrides: list[str]):
    from drmas.config import load_config

    return load_config(None, overrides)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def _train(overrides: list[str]) -> Path:
    from drmas.trainer.trainer import Trainer

    trainer = Trainer(_load(overrides))
    try:
        trainer.train(progress=False)
    finally:
        trainer.close()
    return trainer.run_dir


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """One SFT warm-up of a nano model on both roles, copied to the second model's path (each test then
    runs non-sharing: two worker groups, no further warm-up)."""
    from drmas.trainer.warmup import warmup

    tmp = tmp_path_factory.mktemp("reliability")
    warmup(_load(_overrides(tmp, "warm", f"models={{shared: {{preset: nano, path: {tmp}/sft/solver}}}}",
                            "agents.solver.model=shared", "agents.verifier.model=shared")), progress=False)
    shutil.copytree(tmp / "sft" / "solver", tmp / "sft" / "verifier")
    return tmp


@pytest.fixture(scope="module")
def reference(warm) -> tuple[list[dict], list[dict]]:
    """Metrics and evaluation records of the uninterrupted run."""
    run_dir = _train(_overrides(warm, "reference"))
    metrics, evals = _records(run_dir / "metrics.jsonl"), _records(run_dir / "eval.jsonl")
    assert [r["step"] for r in metrics] == list(range(STEPS))
    assert sorted({e["step"] for e in evals}) == [0, 2, 4, 5]
    moved = [r["wg/solver_model/grad_norm"] > 0 and r["wg/verifier_model/grad_norm"] > 0 for r in metrics]
    assert sum(moved) >= 2, "both models must learn in some steps, or the comparison would be weak"
    return metrics, evals


# ---------------------------------------------------------------------------------------- the child
def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _inject(kill: str) -> None:
    """Arrange for this process to SIGKILL itself at ``kill`` = ``site:step`` (or ``none``)."""
    import pathlib

    import torch

    import drmas.loggers as loggers_module
    import drmas.trainer.trainer as trainer_module
    from drmas.workers.local import LocalBackend

    site, _, arg = kill.partition(":")
    step = int(arg) if arg else -1
    Trainer = trainer_module.Trainer
    if site == "update":  # inside the update of `step`: the first worker group updated, the second not
        real_update = LocalBackend.update

        def update(self, batches, step_seed):
            if step_seed == step:  # seed 0: step_seed = step
                first = next(iter(batches))
                self.workers[first].update(batches[first], step_seed)
                _kill_self()
            return real_update(self, batches, step_seed)

        LocalBackend.update = update
    elif site == "append":  # half of the metrics line of `step` reaches the file
        real_append = loggers_module.append_jsonl

        def append(path, record):
            if path.name == "metrics.jsonl" and record.get("step") == step:
                data = json.dumps(record).encode()
                with open(path, "ab") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                _kill_self()
            real_append(path, record)

        loggers_module.append_jsonl = append
    elif site == "eval":  # the evaluation of `step` is recorded, its checkpoint not yet written
        real_evaluate = Trainer.evaluate

        def evaluate(self, at, record=True):
            out = real_evaluate(self, at, record)
            if at == step:
                _kill_self()
            return out

        Trainer.evaluate = evaluate
    elif site == "save":  # the checkpoint of `step` is half written (one worker file of two)
        real_checkpoint, real_save, current = Trainer._checkpoint, torch.save, {"step": None, "saves": 0}

        def checkpoint(self, at):
            current["step"] = at
            return real_checkpoint(self, at)

        def save(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            current["saves"] += current["step"] == step
            if current["saves"] == 1:
                _kill_self()

        Trainer._checkpoint, torch.save = checkpoint, save
    elif site == "rename":  # the old checkpoint moved aside, the new one not yet in place
        real_rename = pathlib.Path.rename

        def rename(self, target):
            if self.name == "latest.tmp" and json.loads((self / "trainer.json").read_text())["step"] == step:
                _kill_self()
            return real_rename(self, target)

        pathlib.Path.rename = rename
    elif site == "done":  # the final checkpoint written, the DONE marker not
        real_write = trainer_module.atomic_write_json

        def atomic_write_json(path, obj, **kw):
            if path.name == "DONE":
                _kill_self()
            return real_write(path, obj, **kw)

        trainer_module.atomic_write_json = atomic_write_json
    elif site != "none":
        raise ValueError(f"unknown kill site {site!r}")


def _child_main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    overrides, kill = json.loads(argv[0]), argv[1]
    _inject(kill)
    _train(overrides)


def _spawn(overrides: list[str], kill: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DRMAS_PROGRESS": ""}
    return subprocess.Popen([sys.executable, __file__, "child", json.dumps(overrides), kill], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _run_child(overrides: list[str], kill: str, expect_log: str = "") -> int:
    """Run the child to its end or its kill; returns the exit code (-9: killed). ``expect_log``: a text its
    log (warnings and up) must contain."""
    proc = _spawn(overrides, kill)
    _, err = proc.communicate(timeout=600)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child ({kill}) failed with {proc.returncode}:\n{err[-3000:]}")
    assert expect_log in err, f"{expect_log!r} not in the child's log:\n{err[-3000:]}"
    return proc.returncode


def _assert_same_as_reference(run_dir: Path, reference) -> None:
    metrics, evals = reference
    assert _stable(_records(run_dir / "metrics.jsonl")) == _stable(metrics)
    assert _records(run_dir / "eval.jsonl") == evals
    assert json.loads((run_dir / "checkpoints" / "latest" / "trainer.json").read_text())["step"] == STEPS
    assert (run_dir / "DONE").exists()
    assert not (run_dir / "checkpoints" / "latest.tmp").exists() and not (run_dir / "checkpoints" / "latest.old").exists()


# ------------------------------------------------------------------------------------ crash safety
@pytest.mark.slow
def test_sigkill_inside_update_append_and_checkpoint_rename_then_resume(warm, reference):
    """Three kills in a row, each resumed by the same command; each leaves the state it should."""
    overrides = _overrides(warm, "killed_a")
    run_dir = _load(overrides).run_dir
    ckpt = run_dir / "checkpoints"

    assert _run_child(overrides, "update:1") == -signal.SIGKILL
    assert json.loads((ckpt / "latest" / "trainer.json").read_text())["step"] == 1
    assert [r["step"] for r in _records(run_dir / "metrics.jsonl")] == [0]

    assert _run_child(overrides, "append:2") == -signal.SIGKILL
    last = (run_dir / "metrics.jsonl").read_text().split("\n")[-1]
    assert last.startswith('{"step": 2') and not last.endswith("}"), "the kill must leave a torn last line"

    assert _run_child(overrides, "rename:3", expect_log="dropping a torn last line") == -signal.SIGKILL
    assert not (ckpt / "latest").exists() and (ckpt / "latest.tmp").exists() and (ckpt / "latest.old").exists()

    assert _run_child(overrides, "none", expect_log="recovered the checkpoint of step 3") == 0
    _assert_same_as_reference(run_dir, reference)


@pytest.mark.slow
def test_sigkill_inside_checkpoint_write_after_eval_and_before_done_then_resume(warm, reference):
    overrides = _overrides(warm, "killed_b")
    run_dir = _load(overrides).run_dir
    ckpt = run_dir / "checkpoints"

    assert _run_child(overrides, "save:2") == -signal.SIGKILL
    assert json.loads((ckpt / "latest" / "trainer.json").read_text())["step"] == 1
    assert (ckpt / "latest.tmp").is_dir() and not (ckpt / "latest.tmp" / "trainer.json").exists()

    assert _run_child(overrides, "eval:4") == -signal.SIGKILL
    assert [e["step"] for e in _records(run_dir / "eval.jsonl")][-1] == 4  # recorded, but no checkpoint 4
    assert json.loads((ckpt / "latest" / "trainer.json").read_text())["step"] == 3

    assert _run_child(overrides, "done:0") == -signal.SIGKILL
    assert not (run_dir / "DONE").exists()

    assert _run_child(overrides, "none") == 0
    _assert_same_as_reference(run_dir, reference)


@pytest.mark.slow
def test_sigkill_at_random_moments_from_outside_then_resume(warm, reference):
    """The realistic fault: ``kill -9`` at an arbitrary moment (seeded delays after the run's first metrics
    line), twice, then the same command until it completes."""
    overrides = _overrides(warm, "killed_random")
    run_dir = _load(overrides).run_dir
    rng, kills = random.Random(8), []
    for _ in range(2):
        path = run_dir / "metrics.jsonl"
        lines_before = path.read_text().count("\n") if path.exists() else 0  # a torn last line has no newline
        proc = _spawn(overrides, "none")
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:  # wait for one new step, then a random delay
            if path.exists() and path.read_text().count("\n") > lines_before:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        kills.append(proc.returncode)
    assert -signal.SIGKILL in kills, f"no kill landed before the run finished: {kills}"
    for _ in range(3):  # each start resumes; a clean run needs one
        if _run_child(overrides, "none") == 0:
            break
    _assert_same_as_reference(run_dir, reference)


# -------------------------------------------------------------------- checkpoint integrity
def _flip(path: Path, n: int = 4096) -> None:
    """Invert ``n`` bytes in the middle of ``path`` (the size stays the same)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    path.write_bytes(bytes(data))


def _damage(path: Path, fault: str) -> None:
    if fault == "flip":
        _flip(path)
    elif fault == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:  # emptied
        path.write_bytes(b"")


@pytest.mark.slow
@pytest.mark.parametrize("fault, file", [("flip", "worker_solver_model.pt"), ("truncate", "worker_verifier_model.pt"),
                                         ("empty", "trainer.json")])
def test_a_damaged_checkpoint_is_refused_with_one_line_naming_the_file(warm, reference, capsys, fault, file):
    """4 KiB of flipped bytes in a worker state (same size), a truncated one, an emptied trainer.json: resume
    and ``drmas eval`` stop with one line naming the file, and no record is rewritten (not: load
    the flipped weights and train on, raise a raw torch traceback, or silently restart from step 0)."""
    from drmas.checkpoints import CheckpointDamaged
    from drmas.cli import main

    run_dir = warm / "runs" / f"damaged_{fault}"
    shutil.copytree(warm / "runs" / "reference", run_dir)
    target = run_dir / "checkpoints" / "latest" / file
    _damage(target, fault)
    records = (run_dir / "metrics.jsonl").read_text(), (run_dir / "eval.jsonl").read_text()
    with pytest.raises(CheckpointDamaged, match=str(target)):
        _train(_overrides(warm, f"damaged_{fault}"))
    assert ((run_dir / "metrics.jsonl").read_text(), (run_dir / "eval.jsonl").read_text()) == records
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err  # (above it: the model-loading progress bars of transformers)
    assert err.strip().splitlines()[-1].startswith(f"drmas: {target}: ") and "no previous checkpoint is kept" in err


@pytest.mark.slow
def test_a_damaged_checkpoint_falls_back_to_the_kept_previous_one(warm, caplog):
    """With ``train.keep_previous_checkpoint``, a damaged ``latest`` is set aside and the run resumes from the
    previous checkpoint, saying so; the records it rewrites equal the undamaged run's."""
    overrides = _overrides(warm, "kept", "train.steps=2", "train.keep_previous_checkpoint=true")
    run_dir = _train(overrides)
    metrics, evals = _records(run_dir / "metrics.jsonl"), _records(run_dir / "eval.jsonl")
    ckpt = run_dir / "checkpoints"
    assert [json.loads((ckpt / d / "trainer.json").read_text())["step"] for d in ("latest", "latest.old")] == [2, 1]
    _flip(ckpt / "latest" / "worker_solver_model.pt")
    _train(overrides)
    assert "falling back to the previous checkpoint (step 1)" in caplog.text
    assert f"{ckpt / 'latest' / 'worker_solver_model.pt'}: sha256 differs" in caplog.text
    assert _stable(_records(run_dir / "metrics.jsonl")) == _stable(metrics) and _records(run_dir / "eval.jsonl") == evals
    assert (ckpt / "latest.damaged-1").is_dir()


def test_a_base_checkpoint_is_checked_against_the_sft_block_and_its_files(warm, tmp_path):
    """A base checkpoint records the sha256 of the ``sft`` block and of the trace settings that built it: a
    changed block or trace setting is refused, naming the changed key (never used silently); a flipped byte in its weights is refused, naming
    the file; the unchanged block uses it as it is."""
    from drmas.checkpoints import CheckpointDamaged, CheckpointMismatch
    from drmas.trainer.warmup import warmup

    assert warmup(_load(_overrides(warm, "base")), progress=False) == {}
    with pytest.raises(CheckpointMismatch, match=r"models\.solver_model\.path=.* was built from another `sft` block "
                                                 r"or other SFT traces \(sft\.lr \(0\.003 -> 0\.01\)\)"):
        warmup(_load(_overrides(warm, "base", "sft.lr=0.01")), progress=False)
    # the settings that shape the task source's traces are part of the record too
    with pytest.raises(CheckpointMismatch, match=r"\(env\.args\.error_rate \(0\.2 -> 0\.5\)\)"):
        warmup(_load(_overrides(warm, "base", "env.args.error_rate=0.5")), progress=False)
    copy = tmp_path / "verifier"
    shutil.copytree(warm / "sft" / "verifier", copy)
    _flip(copy / "model.safetensors", n=64)
    with pytest.raises(CheckpointDamaged, match=f"{copy / 'model.safetensors'}: sha256 differs"):
        warmup(_load(_overrides(warm, "base", f"models.verifier_model.path={copy}")), progress=False)


@pytest.mark.slow
def test_sigterm_to_drmas_train_ends_its_children_and_releases_the_run_folder(warm):
    """SIGTERM during RL: the grader's worker subprocess ends with the run, which exits 143 and leaves its
    folder unlocked."""
    import psutil

    config = warm / "terminated.yaml"
    config.write_text("{}\n")
    run_dir = warm / "runs" / "terminated"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DRMAS_PROGRESS": ""}
    proc = subprocess.Popen([sys.executable, "-m", "drmas.cli", "train", str(config),
                             *_overrides(warm, "terminated", "train.steps=200"), "--no-progress"],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: list = []
    try:
        deadline = time.monotonic() + 300
        while not kids or not (run_dir / "metrics.jsonl").exists():  # training, with its grader worker
            assert proc.poll() is None and time.monotonic() < deadline, f"no RL step with a child ({proc.returncode})"
            time.sleep(0.5)
            kids = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(kids, timeout=30)
        assert not alive, f"orphans: {[p.pid for p in alive]}"
        assert (run_dir / "metrics.jsonl").exists() and not (run_dir / ".lock").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in kids:
            try:
                p.kill()
            except psutil.Error:
                pass


# -------------------------------------------------------------------------------------------- numerics
def test_nan_reward_is_rejected_before_any_update(warm, monkeypatch):
    """The environment returns NaN for one episode: the step stops at the advantage boundary with an error
    that says what is wrong and where to look; no step is recorded and no weight moves."""
    import numpy as np
    import torch

    from drmas.models.factory import load_policy
    from drmas.trainer.trainer import Trainer

    trainer = Trainer(_load(_overrides(warm, "nan_reward", "train.steps=2")))
    real_make_env = trainer.source.make_env

    def make_env():
        env = real_make_env()
        real_step = env.step

        def step(actions, idx=None):
            out = real_step(actions, idx)
            out.rewards[:1] = np.nan
            return out

        env.step = step
        return env

    monkeypatch.setattr(trainer.source, "make_env", make_env)
    try:
        with pytest.raises(ValueError, match=r"non-finite value\(s\) \(NaN/inf\).*check the reward function"):
            trainer.train_step(0)
        with pytest.raises(ValueError, match=r"evaluation rewards contain .* non-finite"):
            trainer.evaluate(0)  # not counted as a silent failure either
        initial, _ = load_policy(f"{warm}/sft/solver")
        for (name, p), q in zip(trainer.backend.workers["solver_model"].model.named_parameters(), initial.parameters()):
            assert torch.equal(p, q), name
    finally:
        trainer.close()
    assert not (trainer.run_dir / "eval.jsonl").exists()


# ---------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def _kill_actor_during_update(trainer, ray, key: str, step: int, times: int) -> dict:
    """Wrap the backend's update: at ``step`` (the first ``times`` attempts), SIGKILL the process of
    worker group ``key``'s actor after the update was submitted, then wait for it like the trainer."""
    backend, real_update, state = trainer.backend, trainer.backend.update, {"kills": 0}

    def update(batches, step_seed):
        if step_seed == step and state["kills"] < times:
            pid = ray.get(backend.actors[key].__ray_call__.remote(lambda worker: os.getpid()))
            refs = {k: a.update.remote(batches[k], step_seed) for k, a in backend.actors.items()}
            os.kill(pid, signal.SIGKILL)
            state["kills"] += 1
            from drmas.workers.base import ray_get

            return {k: ray_get(k, ref) for k, ref in refs.items()}
        return real_update(batches, step_seed)

    backend.update = update
    return state


def _assert_close(a: list[dict], b: list[dict]) -> None:
    """Ray and local runs agree to float32 round-off (tests/test_training.py::test_ray_backend_matches_local)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(_stable(a), _stable(b)):
        assert x.keys() == y.keys()
        for key, value in x.items():
            if isinstance(value, float):
                assert y[key] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), key
            else:
                assert y[key] == value, key


@pytest.mark.slow
def test_ray_actor_killed_mid_update_is_replaced_and_the_run_goes_on(warm, reference, ray_session):
    from drmas.trainer.trainer import Trainer

    trainer = Trainer(_load(_overrides(warm, "ray_retry", "train.backend=ray")))
    try:
        state = _kill_actor_during_update(trainer, ray_session, "verifier_model", step=2, times=1)
        trainer.train(progress=False)
    finally:
        trainer.close()
    assert state["kills"] == 1
    _assert_close(reference[0], _records(trainer.run_dir / "metrics.jsonl"))
    assert _records(trainer.run_dir / "eval.jsonl") == reference[1]


@pytest.mark.slow
def test_ray_actor_death_past_the_restart_budget_stops_with_its_checkpoint(warm, reference, ray_session):
    from drmas.trainer.trainer import Trainer, WorkerGroupLost

    overrides = _overrides(warm, "ray_lost", "train.backend=ray")
    trainer = Trainer(_load(overrides))
    trainer.max_worker_restarts = 0
    try:
        _kill_actor_during_update(trainer, ray_session, "verifier_model", step=2, times=1)
        with pytest.raises(WorkerGroupLost, match=r"'verifier_model' died.*during step 2.*last checkpoint \(step 2\)"
                                                  r".*start the same command again"):
            trainer.train(progress=False)
    finally:
        trainer.close()
    run_dir = trainer.run_dir
    assert [r["step"] for r in _records(run_dir / "metrics.jsonl")] == [0, 1]
    assert json.loads((run_dir / "checkpoints" / "latest" / "trainer.json").read_text())["step"] == 2
    # the same command resumes from it (here on the local backend: checkpoints do not depend on it)
    _train(overrides[:-1])
    _assert_close(reference[0], _records(run_dir / "metrics.jsonl"))


@pytest.mark.slow
def test_grader_timeout_holds_inside_a_ray_actor(ray_session):
    from envs.math.grader import MathGrader

    grader = ray_session.remote(MathGrader).remote(timeout_s=1.0, num_workers=1)
    try:
        warmup = ray_session.get(grader.grade_answers_with_outcomes.remote(["\\{2,1\\}"], ["\\{1,2\\}"]), timeout=120)
        assert warmup[1] == ["verify"]
        t0 = time.perf_counter()
        scores, outcomes = ray_session.get(grader.grade_answers_with_outcomes.remote(["10^{10^{10}}"], ["5"]),
                                           timeout=120)
        seconds = time.perf_counter() - t0
    finally:
        ray_session.get(grader.close.remote())
        ray_session.kill(grader)
    assert outcomes == ["timeout"] and scores.tolist() == [0.0]
    assert seconds < 1.0 + 5.0, f"a 1 s timeout took {seconds:.1f}s inside a Ray actor"


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    _child_main(sys.argv[2:])


def test_kill_9_during_the_sft_warm_up_leaves_no_worker_alive(tmp_path):
    """`drmas sft` trains two checkpoints in two spawn workers; SIGKILL to the command (no handler can run) ends
    both workers too (they would otherwise train on as orphans until their job ended)."""
    import psutil

    overrides = [f"out_dir={tmp_path}/runs", "name=sft_kill",
                 f"models.solver_model.path={tmp_path}/sft/a", f"models.verifier_model.path={tmp_path}/sft/b",
                 "models.solver_model.preset=nano", "models.verifier_model.preset=nano",
                 "sft.traces=300", "sft.steps=100000", f"sft.tokenizer_dir={tmp_path}/sft/tok"]
    proc = subprocess.Popen([sys.executable, "-m", "drmas.cli", "sft", "experiments/configs/cpu/math_base.yaml",
                             *overrides, "--no-progress"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        deadline, workers = time.monotonic() + 600, []
        while time.monotonic() < deadline and proc.poll() is None:
            workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                       if "spawn_main" in " ".join(c.cmdline())]
            if len(workers) >= 2:
                break
            time.sleep(0.5)
        assert len(workers) >= 2, f"the warm-up's two workers did not start (exit {proc.poll()})"
        proc.kill()
        proc.wait(30)
        _, alive = psutil.wait_procs(workers, timeout=30)
        alive = [p for p in alive if _running(p)]  # a zombie has ended (it waits to be reaped by its new parent)
        assert not alive, f"SFT workers alive after the warm-up was killed: {[p.pid for p in alive]}"
    finally:
        for p in [psutil.Process(proc.pid) if proc.poll() is None else None, *workers]:
            if p is not None and _running(p):
                p.kill()


def _running(process) -> bool:
    """Whether ``process`` still runs (not ended, not a zombie)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
