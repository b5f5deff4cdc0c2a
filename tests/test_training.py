"""End to end with real (nano) models: SFT warm-up -> RL steps -> metrics, evaluation, manifest;
resume equality; sharing; the Ray backend gives the same metrics as the local one."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from drmas.config import load_config
from drmas.trainer.trainer import Trainer
from drmas.trainer.warmup import warmup

VOLATILE = ("timing/",)


def _config(tmp, name, *extra):
    return load_config(None, [
        f"name={name}", f"out_dir={tmp}/runs",
        "env.name=math_generated", "env.orchestra=math", "env.args={difficulty: 1}",
        f"models={{solver_model: {{preset: nano, path: {tmp}/sft/solver}}, verifier_model: {{preset: nano, path: {tmp}/sft/verifier}}}}",
        "agents=[{name: solver, role: math_solver, model: solver_model, sampling: {max_new_tokens: 24}},"
        " {name: verifier, role: math_verifier, model: verifier_model, sampling: {max_new_tokens: 16}}]",
        "train.batch_tasks=4", "train.group_size=4", "train.eval_tasks=8", "train.eval_samples=2", "train.eval_every=0",
        f"sft.traces=400", "sft.steps=60", f"sft.tokenizer_dir={tmp}/sft/tok", *extra])


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    sft = warmup(_config(tmp, "warm"), progress=False)
    assert set(sft) == {"solver_model", "verifier_model"}
    assert all(m["loss"] < m["first_loss"] for m in sft.values())  # SFT learns
    return tmp


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _stable(records):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def test_training_run_writes_metrics_eval_manifest(warm):
    cfg = _config(warm, "basic", "train.steps=2", "train.save_every=0")
    trainer = Trainer(cfg)
    trainer.train(progress=False)
    trainer.close()
    recs = _metrics(cfg.run_dir)
    assert [r["step"] for r in recs] == [0, 1]
    m = recs[-1]
    for key in ("reward/mean", "task/mu", "agent/solver/reward_mean", "agent/verifier/adv_m2",
                "agent/solver/grad_norm", "agent/verifier/grad_norm", "wg/solver_model/grad_norm",
                "wg/verifier_model/clip_frac", "agent/solver/invalid_rate", "timing/rollout", "timing/update",
                "tokens/solver", "agent/solver/spike", "agent/solver/distinct_share",
                "agent/verifier/class_factor_trajectory_grpo", "agent/solver/class_factor_pooled_grpo"):
        assert key in m, key
    assert all(0 < r[f"agent/{k}/distinct_share"] <= 1 for r in recs for k in ("solver", "verifier"))
    # non-sharing: each model's gradient is its single agent's contribution
    assert m["agent/solver/grad_norm"] == pytest.approx(m["wg/solver_model/grad_norm"], rel=1e-4)  # float32 sums
    evals = [json.loads(line) for line in (cfg.run_dir / "eval.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in evals}) == [0, 2] and all(0 <= e["avg"] <= e["pass"] <= 1 for e in evals)
    for step in (0, 2):  # one record per benchmark (problem kind); together they cover the eval tasks
        at = [e for e in evals if e["step"] == step]
        assert sum(e["n_tasks"] for e in at) == 8 and all(e["benchmark"].startswith("d1-") for e in at)
        assert all(len(e["successes"]) == e["n_tasks"] for e in at)
    manifest = json.loads((cfg.run_dir / "manifest.json").read_text())
    assert manifest["effective_agents"]["verifier"]["model"] == "verifier_model"
    assert manifest["versions"]["torch"] and "git_commit" in manifest
    assert [set(m) for m in manifest["machines"]] == [{"model", "capability"}]  # the CPU that drew step 0
    assert (cfg.run_dir / "DONE").exists()
    from drmas.cli import main  # `drmas eval RUN_DIR` re-evaluates the latest checkpoint

    assert main(["eval", str(cfg.run_dir)]) == 0
    # `drmas eval DIR` evaluates DIR: a run folder moved elsewhere is evaluated from its own checkpoint
    moved = cfg.run_dir.parent / "moved" / "run_copy"
    shutil.copytree(cfg.run_dir, moved)
    shutil.rmtree(cfg.run_dir / "checkpoints")  # the recorded out_dir/name no longer holds one
    assert main(["eval", str(moved)]) == 0
    result = json.loads((moved / "eval_cli_step2.json").read_text())
    assert result["step"] == 2 and not result["initial_models"] and result["run_dir"] == str(moved.resolve())
    assert main(["eval", str(cfg.run_dir)]) == 2  # a finished run without its checkpoint: an error, not step 0


def test_resume_gives_the_same_metrics_as_an_uninterrupted_run(warm):
    full = _config(warm, "full", "train.steps=4", "train.save_every=2")
    t = Trainer(full)
    t.train(progress=False)
    t.close()
    # interrupted: the first attempt stops after 2 steps (with its checkpoint), the second resumes
    first = _config(warm, "resumed", "train.steps=2", "train.save_every=2")
    t = Trainer(first)
    t.train(progress=False)
    t.close()
    second = _config(warm, "resumed", "train.steps=4", "train.save_every=2")
    t = Trainer(second)
    t.train(progress=False)
    t.close()
    assert _stable(_metrics(second.run_dir)) == _stable(_metrics(full.run_dir))


def test_sharing_one_model_two_agents_has_per_agent_grad_norms(warm):
    cfg = _config(warm, "sharing", "train.steps=1", "train.save_every=0",
                  f"models={{shared: {{preset: nano, path: {warm}/sft/solver}}}}",
                  "agents.solver.model=shared", "agents.verifier.model=shared")
    t = Trainer(cfg)
    t.train(progress=False)
    t.close()
    m = _metrics(cfg.run_dir)[-1]
    total = m["wg/shared/grad_norm"]
    a, b = m["agent/solver/grad_norm"], m["agent/verifier/grad_norm"]
    assert a > 0 and b >= 0 and math.isfinite(total)  # b is 0 when every verifier step had advantage 0
    # the model's gradient is the sum of the agents' contributions: triangle inequality both ways
    assert abs(a - b) - 1e-5 <= total <= a + b + 1e-5
    # the agents' shares of the update and the cosine between them (one mini-batch: one optimizer step)
    share_a, share_b, cos = m["agent/solver/grad_share"], m["agent/verifier/grad_share"], m["wg/shared/grad_cos/solver~verifier"]
    assert share_a + share_b == pytest.approx(1.0, abs=1e-6)
    if b > 0:  # law of cosines: ||g_a + g_b||² = a² + b² + 2ab cos, and share_a = (a² + ab cos) / ||g||²
        assert total ** 2 == pytest.approx(a * a + b * b + 2 * a * b * cos, rel=1e-3)
        assert share_a == pytest.approx((a * a + a * b * cos) / total ** 2, rel=1e-3, abs=1e-6)


def test_twins_draw_the_same_step0_rollout_and_a_seed_changes_it(warm):
    """Twins (same seed; estimator and learning rate differ) sample the same step-0 rollout on one machine:
    the frontier round's paired analysis rests on it (docs/frontier.md, "Twins")."""
    digests = {}
    for name, extra in {"twin_grpo": ("algo.estimator=trajectory_grpo", "train.seed=7"),
                        "twin_drmas": ("algo.estimator=drmas", "train.seed=7", "models.solver_model.optim.lr=3e-4",
                                       "models.verifier_model.optim.lr=3e-4"),
                        "other_seed": ("algo.estimator=drmas", "train.seed=8")}.items():
        cfg = _config(warm, name, "train.steps=1", "train.save_every=0", *extra)
        t = Trainer(cfg)
        t.train(progress=False)
        t.close()
        digests[name] = _metrics(cfg.run_dir)[0]["rollout/digest"]
    assert isinstance(digests["twin_grpo"], int) and 0 <= digests["twin_grpo"] < 2 ** 52
    assert digests["twin_grpo"] == digests["twin_drmas"]
    assert digests["other_seed"] != digests["twin_grpo"]


@pytest.mark.slow
def test_ray_backend_matches_local(warm):
    pytest.importorskip("ray")
    local = _config(warm, "local", "train.steps=1", "train.save_every=0")
    t = Trainer(local)
    t.train(progress=False)
    t.close()
    remote = _config(warm, "ray", "train.steps=1", "train.save_every=0", "train.backend=ray")
    t = Trainer(remote)
    try:
        t.train(progress=False)
    finally:
        t.close()
        import ray

        ray.shutdown()
    a, b = _stable(_metrics(local.run_dir)), _stable(_metrics(remote.run_dir))
    assert a[0].keys() == b[0].keys()
    for key in a[0]:
        if isinstance(a[0][key], float) and math.isfinite(a[0][key]):
            assert b[0][key] == pytest.approx(a[0][key], rel=1e-5, abs=1e-7), key


def test_nonfinite_gradients_skip_the_step_then_stop_with_a_checkpoint(warm, monkeypatch):
    """Fault injection: every advantage becomes inf, so every gradient is non-finite. Each step's optimizer
    step is skipped and counted; after `max_nonfinite_skips` consecutive ones the run stops with a clear
    message and a checkpoint, and the weights are untouched."""
    import torch

    import drmas.trainer.trainer as trainer_module
    from drmas.models.factory import load_policy

    real = trainer_module.compute_advantages

    def poisoned(*args, **kwargs):
        res = real(*args, **kwargs)
        res.advantages = torch.full_like(res.advantages, float("inf"))
        return res

    monkeypatch.setattr(trainer_module, "compute_advantages", poisoned)
    cfg = _config(warm, "nonfinite", "train.steps=5", "train.max_nonfinite_skips=2", "train.save_every=0")
    t = Trainer(cfg)
    with pytest.raises(trainer_module.NonFiniteStop, match="2 consecutive steps with a non-finite gradient"):
        t.train(progress=False)
    recs = _metrics(cfg.run_dir)
    assert [r["wg/solver_model/skipped"] for r in recs] == [1.0, 1.0]
    assert json.loads((t.ckpt_dir / "trainer.json").read_text())["step"] == 2
    initial, _ = load_policy(f"{warm}/sft/solver")
    for (name, p), q in zip(t.backend.workers["solver_model"].model.named_parameters(), initial.parameters()):
        assert torch.equal(p, q), name
    t.close()


def test_a_checkpoint_does_not_depend_on_the_config_that_builds_it(tmp_path):
    """The same (preset, roles, sft block) gives the same weights whichever config warms it up and at
    whichever position of its `models` it stands (a grid warms a base once, from any of its configs)."""
    import torch

    from drmas.models.factory import load_policy

    def cfg(order, tag):
        paths = {"solver_model": f"{{preset: nano, path: {tmp_path}/{tag}_solver}}",
                 "verifier_model": f"{{preset: nano, path: {tmp_path}/{tag}_verifier}}"}
        return _config(tmp_path, tag, "models={" + ", ".join(f"{k}: {paths[k]}" for k in order) + "}",
                       "sft.traces=60", "sft.steps=2")

    warmup(cfg(["solver_model", "verifier_model"], "a"), progress=False)
    warmup(cfg(["verifier_model", "solver_model"], "b"), progress=False)  # the solver is built second here
    a, _ = load_policy(str(tmp_path / "a_solver"))
    b, _ = load_policy(str(tmp_path / "b_solver"))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


# ----------------------------------------------------------------------------- degenerate and non-finite training
def test_weights_made_non_finite_by_an_update_stop_before_the_step_is_recorded(warm):
    """A NaN in Adam's state makes the next update's weights NaN: the step stops with one message naming the
    model and the step, and the step is not recorded (not left to surface later as a raw sampling error)."""
    from drmas.trainer.health import NonFiniteWeights

    cfg = _config(warm, "nan_adam", "train.steps=3", "train.save_every=0", "train.evaluate=false")
    trainer = Trainer(cfg)
    try:
        trainer.sink.write_step(0, trainer.train_step(0))
        state = next(iter(trainer.backend.workers["solver_model"].optimizer.state.values()))
        state["exp_avg"].fill_(float("nan"))
        with pytest.raises(NonFiniteWeights, match=r"model solver_model: the weights are non-finite \(NaN/inf\) after "
                                                   r"the update of step 1 \(solver_model lr=.*records in .*metrics"
                                                   r"\.jsonl end at step 0"):
            trainer.train_step(1)
    finally:
        trainer.close()
    assert [r["step"] for r in _metrics(cfg.run_dir)] == [0]


def test_a_checkpoint_holding_non_finite_values_is_refused_before_use(warm, capsys):
    """A checkpoint whose optimizer moments hold a NaN (hashes intact: written so) is refused at resume, naming
    the file and the tensor; `drmas train` says it in one line, exit 1."""
    import torch

    from drmas.checkpoints import write_manifest
    from drmas.cli import main

    cfg = _config(warm, "nan_ckpt", "train.steps=1", "train.evaluate=false")
    trainer = Trainer(cfg)
    trainer.train(progress=False)
    trainer.close()
    latest = cfg.run_dir / "checkpoints" / "latest"
    state = torch.load(latest / "worker_verifier_model.pt", weights_only=False)
    first = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][first]["exp_avg_sq"].view(-1)[0] = float("inf")
    torch.save(state, latest / "worker_verifier_model.pt")
    write_manifest(latest, step=1)
    (cfg.run_dir / "DONE").unlink()
    assert main(["train", str(cfg.run_dir / "config.yaml"), "train.steps=2", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("drmas:")]) == 1, err
    line = next(line for line in err if line.startswith("drmas:"))
    assert f"{latest / 'worker_verifier_model.pt'}: optimizer.state.{first}.exp_avg_sq holds non-finite values" in line


def test_an_initial_model_with_non_finite_weights_is_refused_naming_its_folder(warm, tmp_path):
    from drmas.checkpoints import CheckpointDamaged
    from drmas.models.factory import load_policy, save_policy

    model, tokenizer = load_policy(str(warm / "sft" / "solver"))
    next(iter(model.parameters())).data.view(-1)[3] = float("nan")
    bad = tmp_path / "nan_solver"
    save_policy(model, tokenizer, str(bad))
    cfg = _config(warm, "nan_init", "train.steps=1",
                  f"models.solver_model.path={bad}")
    with pytest.raises(CheckpointDamaged, match=rf"{bad}: parameter .* of model 'solver_model' holds non-finite"):
        Trainer(cfg)


def test_greedy_sampling_is_flagged_degenerate_in_the_log_and_in_done(warm, caplog):
    """Temperature 0: every trajectory of a task group is the same, every advantage 0, every gradient norm
    exactly 0. The run finishes, warns once per cause, and its DONE marker lists the causes."""
    import logging

    from drmas.trainer.health import DEGENERATE_STEPS

    cfg = _config(warm, "greedy", f"train.steps={DEGENERATE_STEPS + 1}", "train.save_every=0", "train.evaluate=false",
                  "agents.solver.sampling.temperature=0", "agents.verifier.sampling.temperature=0")
    with caplog.at_level(logging.WARNING, logger="drmas.trainer.health"):
        trainer = Trainer(cfg)
        trainer.train(progress=False)
        trainer.close()
    done = json.loads((cfg.run_dir / "DONE").read_text())
    causes = done["degenerate"]
    assert any(c.startswith("identical samples in every task group (every advantage 0) for "
                            f"{DEGENERATE_STEPS} steps in a row (from step 0)") for c in causes), causes
    assert any(c.startswith("agent solver: gradient norm exactly 0") for c in causes), causes
    warned = [r.getMessage() for r in caplog.records if "degenerate training" in r.getMessage()]
    assert len(warned) == len(causes)
    normal = _config(warm, "basic_done", "train.steps=1", "train.save_every=0", "train.evaluate=false")
    trainer = Trainer(normal)
    trainer.train(progress=False)
    trainer.close()
    assert "degenerate" not in json.loads((normal.run_dir / "DONE").read_text())
