"""Device plumbing (``train.device`` / ``train.precision``, drmas/devices.py) on the CPU.

The hot-path tests run under ``torch.device("meta")`` as the *default* device while the models live on the
CPU: a tensor created without an explicit device (e.g. ``torch.tensor(ids)`` in batch packing) lands on
``meta`` and the first op mixing it with the model's CPU tensors raises. A pass therefore means every
tensor of the rollout, the advantages and the update is created on the device of the model that uses it,
which is what makes ``train.device=cuda`` work without global default-device tricks.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from drmas.algos import compute_advantages
from drmas.config import AlgoConfig, ConfigError, ModelConfig, OptimConfig, load_config
from drmas.devices import autocast, resolve_device
from drmas.models import build_policy, save_policy, train_bytelevel_bpe
from drmas.rollout.base import SamplingParams
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker

ROOT = Path(__file__).resolve().parent.parent
CPU_CONFIGS = sorted((ROOT / "experiments/configs/cpu").glob("*.yaml"))


@pytest.fixture(scope="module")
def tokenizer():
    return train_bytelevel_bpe([f"question {i} answer {i * 7} done <search> city </search>" for i in range(300)],
                               vocab_size=320)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("device") / "nano"
    save_policy(build_policy("nano", tokenizer, seed=0), tokenizer, folder)
    return str(folder)


def _worker(checkpoint: str, kl_coef: float = 0.0, precision: str = "fp32") -> PolicyWorker:
    return PolicyWorker(WorkerSpec("wg", ModelConfig(preset="nano", path=checkpoint), OptimConfig(lr=1e-3, mini_batches=2),
                                   AlgoConfig(kl_coef=kl_coef), seed=0, device="cpu", precision=precision))


def _batch(n: int = 12) -> UpdateBatch:
    rng = np.random.default_rng(0)
    return UpdateBatch([rng.integers(3, 250, size=int(rng.integers(2, 20))).tolist() for _ in range(n)],
                       [rng.integers(3, 250, size=int(rng.integers(1, 8))).tolist() for _ in range(n)],
                       rng.normal(size=n).astype(np.float32), np.array(["a" if i % 3 else "b" for i in range(n)]),
                       np.full(n, 0.8))


# ----------------------------------------------------------------------------------- resolution
def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("gpu", "cuda:x", "CPU", ""):
        with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:<index>"):
            resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
def test_a_missing_gpu_is_one_clear_error_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        resolve_device("cuda:0")
    from drmas.cli import main

    out = tmp_path / "runs"
    assert main(["train", str(ROOT / "experiments/configs/cpu/math_base.yaml"), "train.device=cuda",
                 f"out_dir={out}", f"sft.tokenizer_dir={tmp_path}/tok"]) == 2  # a config error: exit 2
    assert not out.exists() and not (tmp_path / "tok").exists()  # nothing was started


def test_config_validates_device_and_precision():
    cfg = load_config(None, ["train.device=cuda:1", "train.precision=bf16"])
    assert (cfg.train.device, cfg.train.precision) == ("cuda:1", "bf16")
    assert load_config(None, []).train.device == "auto" and load_config(None, []).train.precision == "fp32"
    with pytest.raises(ConfigError, match="train.device"):
        load_config(None, ["train.device=gpu"])
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(None, ["train.precision=fp16"])


def test_autocast_is_a_no_op_in_fp32_and_bf16_otherwise():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(torch.device("cpu"), "fp32"):
        assert (a @ b).dtype == torch.float32
    with autocast(torch.device("cpu"), "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="registered"):
        autocast(torch.device("cpu"), "fp8")


# ------------------------------------------------------------------------------------ hot paths
def test_rollout_and_update_create_no_tensor_off_the_model_device(checkpoint):
    worker = _worker(checkpoint, kl_coef=0.1)  # with a reference model, two mini-batches (old log-probs)
    before = {k: p.detach().clone() for k, p in worker.model.named_parameters()}
    with torch.device("meta"):
        gen = worker.generate(["question 3 answer", "question 12"], SamplingParams(temperature=1.0, max_new_tokens=6),
                              seed=1)
        metrics = worker.update(_batch(), step_seed=3)
    assert len(gen.response_ids) == 2 and all(len(r) >= 1 for r in gen.response_ids)
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0 and not metrics["skipped"]
    assert {"agent_grad_norm/a", "agent_grad_norm/b"} <= set(metrics)
    assert all(p.device.type == "cpu" for p in worker.model.parameters())
    assert any(not torch.equal(before[k], p) for k, p in worker.model.named_parameters())  # the step happened


def test_advantages_keep_the_device_of_their_input():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 1.0])
    ids = dict(task_ids=[0, 0, 0, 1, 1, 1], agent_ids=["a", "b", "a", "a", "b", "b"], traj_ids=[0, 0, 1, 0, 1, 2])
    with torch.device("meta"):  # numpy in: CPU out, nothing created on the default device
        res = compute_advantages(scores.numpy(), **ids)
        assert res.advantages.device.type == "cpu" and res.group_index.device.type == "cpu"
        assert len(res.stats) == 4
    ref = compute_advantages(scores, **ids)
    assert torch.equal(res.advantages, ref.advantages) and ref.advantages.device == scores.device


def test_bf16_update_runs_and_keeps_float32_weights(checkpoint):
    worker = _worker(checkpoint, precision="bf16")
    metrics = worker.update(_batch(), step_seed=3)
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    state = worker.get_state()
    assert all(v.device.type == "cpu" for v in state["model"].values())


@pytest.mark.slow
@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda p: p.stem)
def test_every_cpu_setting_runs_a_step_with_train_device_cpu(config, tmp_path, tokenizer):
    """Each CPU setting: its models (untrained, built here), one RL step with ``train.device=cpu`` under a
    ``meta`` default device: the orchestra, the step table, the advantages and every worker group's update
    create their tensors on the models' device."""
    from drmas.trainer.trainer import Trainer

    base = load_config(config, [])
    overrides = [f"name={config.stem}", f"out_dir={tmp_path}/runs", "train.device=cpu", "train.batch_tasks=2",
                 "train.group_size=2", "train.eval_tasks=1", "train.eval_samples=1"]
    for key, model in base.models.items():
        path = tmp_path / f"base_{model.preset}"
        if not path.exists():
            save_policy(build_policy(model.preset, tokenizer, seed=0), tokenizer, path)
        overrides.append(f"models.{key}.path={path}")
    overrides += [f"agents.{a.name}.sampling.max_new_tokens=6" for a in base.agents]
    trainer = Trainer(load_config(config, overrides))
    try:
        with torch.device("meta"):
            metrics = trainer.train_step(0)
    finally:
        trainer.close()
    assert math.isfinite(metrics["reward/mean"])
    norms = {k: v for k, v in metrics.items() if k.startswith("wg/") and k.endswith("/grad_norm")}
    assert norms and all(math.isfinite(v) for v in norms.values())  # (a model whose agents never acted has none)
