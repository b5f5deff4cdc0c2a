"""The openrlhf backend on the real OpenRLHF 0.11.2 + DeepSpeed 0.19.6 + Ray, in CPU mode (fp32), against
drmas's local worker (plain PyTorch PPO-clip + AdamW) from the same weights.

(a) One worker group's UpdateBatch through OpenRLHF's own ``PolicyModelActor`` (in this process, one
    DeepSpeed rank; ZeRO-2 and ZeRO-3; both loss aggregations; two agents with their own advantages;
    2 mini-batches x 2 micro-batches) and through ``PolicyWorker.update``: per optimizer step the loss, the
    pre-clip gradient norm and the parameters after the step agree within :data:`TOL`, and so do the
    per-agent behaviour statistics (entropy, control-token probability under the pre-update policy). Breaking
    the advantage broadcast, the accumulation boundary or the mini-batch normalizer makes the same comparison
    fail.
(b) The backend's own ``update`` on OpenRLHF ``RayActorGroup``s (logical GPUs) with two worker groups in
    its one placement group, one shared by two agents and one serving one agent, equals the local backend.
(c) ``get_states`` -> ``set_states`` gives an identical next update; the exported checkpoint loads in
    transformers with the trained weights.

Tolerances (:data:`TOL`, fp32 on one thread): the two sides run the same math in different orders
(micro-batch order, DeepSpeed's flat gradient buffers and its norm), so values agree to float rounding.
Parameters are compared through the update they received (``theta_after - theta_before``): Adam divides
by ``sqrt(v)``, which turns rounding-level gradient differences of tiny gradients into relative update
differences of order 1e-5..1e-4, far below what a wrong loss, advantage or step boundary gives (>= 1e-1,
shown by the mutation test)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.config.schema import ResourcesConfig, RolloutEngineConfig
from drmas.models.factory import TinyModelConfig, build_policy, save_policy
from drmas.models.tokenizer import train_bytelevel_bpe
from drmas.workers import policy as policy_mod
from drmas.workers.openrlhf import backend as backend_mod
from drmas.workers.openrlhf import api, cpu_compat, seam
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker

pytestmark = pytest.mark.openrlhf

#: Agreement required between OpenRLHF's actor and drmas's local worker, per optimizer step.
TOL = {"loss_abs": 1e-6, "grad_norm_rel": 1e-5, "update_rel_l2": 5e-4}
TEMPERATURE = 0.7  # the rows' sampling temperature: both sides score at it
LR = 1e-3


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny fp32 Qwen2 policy with drmas's tokenizer, saved as the SFT step saves it."""
    tok = train_bytelevel_bpe(["Problem: 2 + 3 = ? Solution: \\boxed{5}", "Verifier: <verify>approve</verify>",
                               "search the answer"] * 20, vocab_size=300)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return str(save_policy(build_policy(cfg, tok, seed=0), tok, tmp_path_factory.mktemp("ckpt") / "policy"))


def worker_spec(key: str, path: str, ckpt_dir: Path, zero: int = 2, aggregation: str = "token_mean",
                mini_batches: int = 2, micro_batch_size: int = 3, seed: int = 0) -> WorkerSpec:
    model = ModelConfig(preset=None, path=path, rollout=RolloutEngineConfig(engine="hf"),
                        resources=ResourcesConfig(num_gpus=1, zero_stage=zero, checkpoint_dir=str(ckpt_dir)))
    optim = OptimConfig(lr=LR, micro_batch_size=micro_batch_size, mini_batches=mini_batches, max_grad_norm=1.0)
    return WorkerSpec(key, model, optim, AlgoConfig(aggregation=aggregation), seed=seed)


def update_batch(agents: list[str], rows_per_agent: int, seed: int) -> UpdateBatch:
    """Rows of several agents with varied prompt and response lengths; each agent's advantages are its
    rewards normalized within the agent (agent-wise, as drmas computes them), so they differ per agent."""
    rng = np.random.default_rng(seed)
    prompts, responses, advantages, names = [], [], [], []
    for a, agent in enumerate(agents):
        rewards = rng.normal(loc=a, scale=1.0 + a, size=rows_per_agent)
        advantages += list((rewards - rewards.mean()) / (rewards.std() + 1e-6))
        for _ in range(rows_per_agent):
            prompts.append(rng.integers(3, 290, rng.integers(3, 7)).tolist())
            responses.append(rng.integers(3, 290, rng.integers(2, 8)).tolist())
            names.append(agent)
    n = len(names)
    return UpdateBatch(prompts, responses, np.asarray(advantages, np.float32), np.array(names, dtype=object),
                       np.full(n, TEMPERATURE))


def named_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float64, copy=True) for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------- the two sides
def local_steps(spec: WorkerSpec, batch: UpdateBatch, step_seed: int, monkeypatch) -> dict:
    """drmas's PolicyWorker.update: per optimizer step its loss, pre-clip norm and weights after the step."""
    worker = PolicyWorker(spec)
    before = named_weights(worker.model)
    after: list[dict[str, torch.Tensor]] = []
    steps: list[dict] = []
    step = worker.optimizer.step

    def recorded_step(*args, **kwargs):
        out = step(*args, **kwargs)
        after.append(named_weights(worker.model))
        return out

    worker.optimizer.step = recorded_step
    reduce = policy_mod.reduce_step_metrics
    monkeypatch.setattr(policy_mod, "reduce_step_metrics", lambda per_step: steps.extend(per_step) or reduce(per_step))
    metrics = worker.update(batch, step_seed)
    monkeypatch.setattr(policy_mod, "reduce_step_metrics", reduce)
    return {"before": before, "after": after, "loss": [d["loss"] for d in steps],
            "grad_norm": [d["grad_norm"] for d in steps],
            "behavior": {k: v for k, v in metrics.items() if k.startswith(("agent_entropy/", "agent_control_prob"))}}


def openrlhf_rank(spec: WorkerSpec):
    """OpenRLHF's own PolicyModelActor with drmas's methods, as one DeepSpeed rank in this process, built as
    the backend builds it (api.build_args with CPU mode's options, OpenRLHF's init_model_from_pretrained)."""
    plain = api.openrlhf_attr("PolicyModelActor").__ray_metadata__.modified_class.__ray_actor_class__
    rank = type("InProcessPolicyActor", (backend_mod.DrmasActorMixin, plain), {})(1, 0, "127.0.0.1", None)
    args = api.build_args({**seam.openrlhf_overrides(spec, 0.5), **cpu_compat.cpu_overrides()}, api.cli_defaults())
    rank.init_model_from_pretrained(api.openrlhf_attr("get_strategy")(args), spec.model.path,
                                    seam.scheduler_steps(spec), None)
    return rank


def openrlhf_steps(spec: WorkerSpec, batch: UpdateBatch, step_seed: int, pad_id: int,
                   positions: np.ndarray | None = None) -> dict:
    """The same rows through OpenRLHF's actor, converted and fitted exactly as the backend's ``update`` does:
    per optimizer step (DeepSpeed's accumulation boundary) its loss, pre-clip norm and weights after it, and
    the per-agent behaviour statistics (control tokens at ``positions``)."""
    rank = openrlhf_rank(spec)
    engine = rank.actor.model
    before = {k: v.to(torch.float64) for k, v in rank.drmas_state_dict().items()}
    after: list[dict[str, torch.Tensor]] = []
    step = engine.step

    def recorded_step(*args, **kwargs):
        boundary = engine.is_gradient_accumulation_boundary()
        out = step(*args, **kwargs)
        if boundary:
            after.append({k: v.to(torch.float64) for k, v in rank.drmas_state_dict().items()})
        return out

    engine.step = recorded_step
    lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    plan = seam.plan_minibatches(lengths, spec.optim.mini_batches, 1, spec.optim.micro_batch_size, step_seed)
    payload = seam.rank_payloads(batch.prompt_ids, batch.response_ids, batch.advantages, plan, pad_id, 1)[0]
    fitted = rank.drmas_fit(payload, TEMPERATURE)
    assert fitted.weights_finite
    held = next(iter(rank.actor.model.module.parameters()))  # its ZeRO-3 partition or the whole tensor
    held = getattr(held, "ds_tensor", held)
    keep = held.data.flatten()[0].item()
    held.data.view(-1)[0] = float("nan")
    assert not rank._weights_finite()  # one non-finite entry on this rank is found
    held.data.view(-1)[0] = keep
    positions = np.full(len(batch.agents), -1) if positions is None else positions
    behavior = seam.behavior_metrics(plan, [fitted.rows], [len(p) for p in batch.prompt_ids], batch.agents, positions)
    return {"before": before, "after": after, "loss": [d["loss"] for d in fitted.steps],
            "grad_norm": [d["grad_norm"] for d in fitted.steps], "behavior": behavior}


def differences(local: dict, other: dict) -> dict[str, float]:
    """Largest difference per optimizer step between two runs (inf where they took different step counts)."""
    n = len(local["after"])
    if not n or len(other["after"]) != n or len(other["loss"]) != n:
        return {"loss_abs": float("inf"), "grad_norm_rel": float("inf"), "update_rel_l2": float("inf")}
    update_rel = []
    for a, b in zip(local["after"], other["after"]):
        du = torch.cat([(a[k] - local["before"][k]).flatten() for k in sorted(a)])
        do = torch.cat([(b[k] - other["before"][k]).flatten() for k in sorted(a)])
        update_rel.append(float((du - do).norm() / du.norm()))
    return {"loss_abs": max(abs(x - y) for x, y in zip(local["loss"], other["loss"])),
            "grad_norm_rel": max(abs(x - y) / abs(x) for x, y in zip(local["grad_norm"], other["grad_norm"])),
            "update_rel_l2": max(update_rel)}


def within_tolerance(diff: dict[str, float]) -> bool:
    return all(diff[k] <= TOL[k] for k in TOL)


# ============================================================================ (a) one worker group
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_openrlhf_actor_update_equals_the_local_worker(checkpoint, tmp_path, monkeypatch, zero, aggregation):
    spec = worker_spec("m", checkpoint, tmp_path, zero=zero, aggregation=aggregation, mini_batches=2,
                       micro_batch_size=3)
    batch = update_batch(["solver", "verifier"], rows_per_agent=6, seed=zero)  # 12 rows: 2 x (3 + 3)
    # control tokens at response positions -1 (none), 0, 1, ... (every response has >= 2 tokens; prompts of 3-6)
    positions = np.arange(len(batch.agents)) % 3 - 1
    monkeypatch.setattr(PolicyWorker, "_control_positions", lambda self, b: positions)
    local = local_steps(spec, batch, step_seed=7, monkeypatch=monkeypatch)
    plan = seam.plan_minibatches([len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)], 2, 1, 3, 7)
    assert [len(mini[0]) for mini in plan] == [2, 2]  # 2 mini-batches x 2 micro-batches on the OpenRLHF side
    other = openrlhf_steps(spec, batch, step_seed=7, pad_id=0, positions=positions)
    diff = differences(local, other)
    print(f"zero={zero} {aggregation}: {diff}; behaviour local {local['behavior']}, openrlhf {other['behavior']}")
    assert within_tolerance(diff), f"OpenRLHF vs local worker: {diff} (tolerance {TOL})"
    # the behaviour statistics: under the pre-update weights on both sides (2 optimizer steps here)
    assert set(local["behavior"]) == set(other["behavior"]) == {
        f"agent_{stat}/{a}" for a in ("solver", "verifier") for stat in ("entropy", "control_prob", "control_prob_min")}
    for k, x in local["behavior"].items():
        assert abs(x - other["behavior"][k]) <= 1e-6 * abs(x), (k, x, other["behavior"][k])


@pytest.mark.parametrize("broken", ["advantage_broadcast", "accumulation_boundary", "minibatch_normalizer"])
def test_the_comparison_catches_a_broken_seam(checkpoint, tmp_path, monkeypatch, broken):
    """The equivalence above is not vacuous: the same comparison fails when the advantage reaches the
    wrong tokens, when DeepSpeed steps at every micro-batch instead of once per mini-batch, or when the
    accumulated loss is normalized by one micro-batch's tokens instead of the mini-batch's."""
    spec = worker_spec("m", checkpoint, tmp_path, zero=2)
    batch = update_batch(["solver", "verifier"], rows_per_agent=6, seed=2)
    local = local_steps(spec, batch, step_seed=7, monkeypatch=monkeypatch)
    if broken == "advantage_broadcast":
        right = seam.sample_fields

        def shifted(prompt_ids, response_ids, advantage):  # the advantage one token early (on the prompt's last)
            fields = right(prompt_ids, response_ids, advantage)
            fields["advantages"] = torch.roll(fields["advantages"], -1)
            return fields

        monkeypatch.setattr(seam, "sample_fields", shifted)
    elif broken == "minibatch_normalizer":
        counts = seam.loss_counts
        monkeypatch.setattr(seam, "loss_counts", lambda masks: counts(masks[:1]))
    else:
        boundary = backend_mod.DrmasActorMixin.drmas_fit

        def fit_with_boundary_everywhere(self, minibatches, temperature):
            engine = self.actor.model
            engine.set_gradient_accumulation_boundary = lambda _: type(engine).set_gradient_accumulation_boundary(
                engine, True)
            return boundary(self, minibatches, temperature)

        monkeypatch.setattr(backend_mod.DrmasActorMixin, "drmas_fit", fit_with_boundary_everywhere)
    diff = differences(local, openrlhf_steps(spec, batch, step_seed=7, pad_id=0))
    print(f"{broken} broken: {diff}")
    assert not within_tolerance(diff), f"a broken {broken} went unnoticed: {diff}"


# ===================================================================== (b), (c) the backend on Ray
#: Worker group -> (agents it serves, ZeRO stage, loss aggregation): one group shared by two agents, one not.
GROUPS = {"pair_model": (["solver", "verifier"], 2, "token_mean"), "solo_model": (["critic"], 3, "seq_mean_token_mean")}


def group_specs(path: str, ckpt_dir: Path) -> dict[str, WorkerSpec]:
    return {key: worker_spec(key, path, ckpt_dir, zero=zero, aggregation=agg, seed=i)
            for i, (key, (_, zero, agg)) in enumerate(GROUPS.items())}


def group_batches(seed: int) -> dict[str, UpdateBatch]:
    return {key: update_batch(agents, rows_per_agent=12 // len(agents), seed=seed + i)
            for i, (key, (agents, _, _)) in enumerate(GROUPS.items())}


@pytest.fixture(scope="module")
def backend_run(ray_session, checkpoint, tmp_path_factory):
    """The openrlhf backend (two OpenRLHF actor groups in one placement group, logical GPUs) after its first
    update, with the local backend's result for the same specs and rows."""
    from drmas.workers.local import LocalBackend

    specs = group_specs(checkpoint, tmp_path_factory.mktemp("deepspeed"))
    batches = group_batches(seed=11)
    backend = backend_mod.OpenRLHFBackend(specs)
    try:
        before = {key: named_weights(engine.model) for key, engine in backend.engines.items()}
        metrics = backend.update(batches, step_seed=3)
        local = LocalBackend(specs)
        local_metrics = local.update(batches, step_seed=3)
        yield {"backend": backend, "specs": specs, "before": before, "metrics": metrics,
               "local": {key: named_weights(w.model) for key, w in local.workers.items()}, "local_metrics": local_metrics}
    finally:
        backend.close()


def test_backend_update_on_ray_equals_the_local_backend(backend_run):
    """Each group's metrics (loss: mean over its optimizer steps; grad norm: the max) and the weights its
    rollout engine received equal the local backend's for the same rows and step seed."""
    backend, before = backend_run["backend"], backend_run["before"]
    assert len(backend.groups) == 2 and backend.pg is not None  # both groups in the one placement group
    for key, m in backend_run["metrics"].items():
        ref = backend_run["local_metrics"][key]
        after, local_after, start = named_weights(backend.engines[key].model), backend_run["local"][key], before[key]
        du = torch.cat([(local_after[k] - start[k]).flatten() for k in sorted(start)])
        do = torch.cat([(after[k] - start[k]).flatten() for k in sorted(start)])
        diff = {"loss_abs": abs(m["loss"] - ref["loss"]), "grad_norm_rel": abs(m["grad_norm"] - ref["grad_norm"]) /
                ref["grad_norm"], "update_rel_l2": float((du - do).norm() / du.norm())}
        print(f"{key} through Ray: {diff}")
        assert within_tolerance(diff), f"{key}: openrlhf backend vs local backend {diff} (tolerance {TOL})"
        assert m["samples"] == ref["samples"] == 12 and m["lr"] == ref["lr"] == LR and m["weights_finite"] == 1.0
        # each agent's entropy under the pre-update policy, also where two agents share a model (and micro-batches)
        entropies = {k for k in ref if k.startswith("agent_entropy/")}
        assert entropies == {f"agent_entropy/{a}" for a in GROUPS[key][0]} and entropies <= set(m), (entropies, m)
        for k in entropies:
            assert abs(m[k] - ref[k]) <= 1e-6 * abs(ref[k]), (key, k, m[k], ref[k])
    solo_agent = GROUPS["solo_model"][0][0]
    assert backend_run["metrics"]["solo_model"][f"agent_grad_norm/{solo_agent}"] == \
        backend_run["metrics"]["solo_model"]["grad_norm"]


def test_checkpoint_round_trip_and_export(backend_run, tmp_path):
    """get_states -> update -> set_states -> the same update: identical metrics and weights, also where a later
    get_states was made in between (the next checkpoint's DeepSpeed save, of a run stopped before its own checkpoint
    rotated: it goes under the other tag); save_models writes checkpoints transformers loads, holding the weights the
    rollout engine has."""
    from transformers import AutoModelForCausalLM

    backend = backend_run["backend"]
    batches = group_batches(seed=23)
    states = backend.get_states()
    first = backend.update(batches, step_seed=5)
    first_weights = {key: named_weights(e.model) for key, e in backend.engines.items()}
    later = backend.get_states()
    assert all(later[key]["tag"] != states[key]["tag"] and later[key]["files"] != states[key]["files"]
               for key in states)
    backend.set_states(states)
    restored = {key: named_weights(e.model) for key, e in backend.engines.items()}
    assert any(not torch.equal(restored[k][n], first_weights[k][n]) for k in restored for n in restored[k])
    again = backend.update(batches, step_seed=5)
    assert again == first
    for key, weights in first_weights.items():
        now = named_weights(backend.engines[key].model)
        assert all(torch.equal(now[n], weights[n]) for n in weights), key
    paths = backend.save_models(str(tmp_path / "hf"))
    for key, path in paths.items():
        loaded = named_weights(AutoModelForCausalLM.from_pretrained(path))
        engine = named_weights(backend.engines[key].model)
        assert set(loaded) == set(engine) and all(torch.equal(loaded[n], engine[n]) for n in engine), key
