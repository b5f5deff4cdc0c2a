"""A run's models leave the suite, and its checkpoints cannot run code.

``drmas export RUN`` (drmas/trainer/export.py) on three short runs trained here from the shipped bases (math
non-sharing: two tiny models; search sharing: one nano model for three agents; search heterogeneous: a tiny
Verifier beside two nano models): transformers' ``AutoModelForCausalLM`` / ``AutoTokenizer`` load each exported
folder with the run's token ids (non-NFC text included) and the logits of the run's own policy (the trainer's
worker after resuming the checkpoint) in fp32; the model card names run, step, agents, estimator, config hash and
the evaluation at that step. Refused with one line: a run in progress, an unverified or damaged checkpoint, an
``--out`` that is not an earlier export (an earlier export survives a refused one).

Checkpoints (drmas/trainer/run_folder.py): a pickle payload planted in a worker file, with its manifest rewritten
to match, is refused by ``drmas eval``, ``drmas export`` and a resume without running (its marker file is never
written). Third-party progress bars: a default ``drmas train`` prints none (``--log-level debug`` keeps them).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import held_by_another_process

from drmas.checkpoints import MANIFEST_NAME, write_manifest
from drmas.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs" / "cpu"
SHORT = ["train.steps=1", "train.batch_tasks=2", "train.group_size=2", "train.eval_tasks=2", "train.eval_samples=1",
         "train.eval_every=0", "train.save_every=0", "--no-progress"]
KINDS = {"math_nonsharing": "math_base.yaml", "search_sharing": "search_sharing.yaml",
         "search_hetero": "search_hetero.yaml"}
TEXT = "Cafe\u0301 or caf\u00e9? \u212b vs \u00c5: 12 + 30 = 42 <|im_start|>user\nfind it<|im_end|>"
"""Not in NFC form (a combining accent, the Angstrom sign) next to its NFC forms, digits and special tokens."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One finished 1-step run of each kind (a checkpoint at step 1, evaluations at steps 0 and 1)."""
    tmp = tmp_path_factory.mktemp("export")
    out = {}
    for kind, config in KINDS.items():
        assert main(["train", str(CONFIGS / config), f"name={kind}", f"out_dir={tmp}", *SHORT]) == 0, kind
        out[kind] = tmp / kind
    return out


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("drmas:")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_export_loads_in_transformers_with_the_runs_token_ids_and_logits(runs, kind, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas.trainer.export import run_config
    from drmas.trainer.trainer import Trainer

    run, out = runs[kind], tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    cfg = run_config(run)
    printed = capsys.readouterr().out
    assert all(f"{key}: {out / key}" in printed for key in cfg.models)
    trainer = Trainer(cfg)  # the run's own policies: its workers, resumed from the checkpoint
    try:
        assert trainer.load_checkpoint() == 1
        workers = trainer.backend.generators()
        assert sorted(workers) == sorted(cfg.models) == sorted(p.name for p in out.iterdir() if p.is_dir())
        sizes = set()
        for key, worker in workers.items():
            folder = out / key
            assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                    "README.md"} <= {p.name for p in folder.iterdir()}
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            ids = worker.tokenizer.encode(TEXT)
            assert tokenizer.encode(TEXT) == ids and tokenizer.decode(ids) == TEXT
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
            policy = worker.model.eval()
            with torch.no_grad():
                x = torch.tensor([ids])
                diff = (model(x).logits - policy(x).logits).abs().max().item()
            assert diff <= 1e-6, (key, diff)
            sizes.add(model.config.hidden_size)
            card = (folder / "README.md").read_text()
            agents = [a for a in cfg.agents if a.model == key]
            assert "| step | 1 of 1 |" in card and f"| estimator | {cfg.algo.estimator} |" in card
            assert all(f"{a.name} ({a.role})" in card for a in agents)
            manifest = json.loads((run / "manifest.json").read_text())
            assert f"`{manifest['config_hash']}`" in card
            evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
            for e in (e for e in evals if e["step"] == 1):
                assert f"| {e['benchmark']} | {e['avg']:.3f} | {e['pass']:.3f} | {e['k']} | {e['n_tasks']} |" in card
            assert (folder / MANIFEST_NAME).is_file()
        assert len(sizes) == (2 if kind == "search_hetero" else 1)  # each model at its own size
    finally:
        trainer.close()
    record = json.loads((out / "drmas_export.json").read_text())
    assert record["step"] == 1 and sorted(record["models"]) == sorted(cfg.models)


def test_an_export_of_a_damaged_unverified_or_held_checkpoint_is_refused(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["search_sharing"], run)
    shutil.rmtree(run / "export", ignore_errors=True)
    assert main(["export", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in (run / "export" / "shared").iterdir()}
    capsys.readouterr()
    latest = run / "checkpoints" / "latest"
    worker = latest / "worker_shared.pt"
    data = bytearray(worker.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte
    worker.write_bytes(bytes(data))
    assert main(["export", str(run)]) == 1
    assert "worker_shared.pt: sha256 differs" in _one_error_line(capsys)
    after = {p.name: p.read_bytes() for p in (run / "export" / "shared").iterdir()}
    assert after == before  # the earlier export is kept whole
    (latest / MANIFEST_NAME).unlink()
    assert main(["export", str(run)]) == 1
    assert f"{latest} has no {MANIFEST_NAME}, so it cannot be verified" in _one_error_line(capsys)
    (run / "elsewhere").mkdir()
    (run / "elsewhere" / "notes.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(run / "elsewhere")]) == 2
    assert "is not a drmas export" in _one_error_line(capsys)
    assert (run / "elsewhere" / "notes.txt").read_text() == "mine"
    with held_by_another_process(run) as holder:
        assert main(["export", str(run)]) == 1
        assert f"run folder {run} is in use by pid {holder.pid}" in _one_error_line(capsys)


class _Payload:
    """Unpickling this runs ``exec``: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def test_a_planted_pickle_payload_is_refused_without_running(runs, tmp_path, capsys):
    """The payload sits in a worker state whose manifest was rewritten to match it: the sha256 check passes, and
    loading must still refuse it unread (``drmas eval``, ``drmas export``, a resume of ``drmas train``)."""
    run, marker = tmp_path / "run", tmp_path / "MARKER"
    shutil.copytree(runs["math_nonsharing"], run)
    latest = run / "checkpoints" / "latest"
    worker = latest / "worker_verifier_model.pt"
    state = torch.load(worker, weights_only=True)
    state["scheduler"]["note"] = _Payload(marker)
    torch.save(state, worker)
    write_manifest(latest, step=json.loads((latest / MANIFEST_NAME).read_text())["step"])
    (run / "DONE").unlink()
    for argv in (["eval", str(run)], ["export", str(run)],
                 ["train", str(run / "config.yaml"), f"out_dir={tmp_path}", "name=run", "train.steps=2",
                  "--no-progress"]):
        assert main(argv) == 1, argv
        line = _one_error_line(capsys)
        assert f"{worker}: refused unread: it holds a pickled Python object" in line and "exec" in line, line
        assert not marker.exists(), argv
    assert not (run / "export").exists()


class _SystemPayload:
    """Unpickling this calls ``os.system``, a global of a module that torch's weights-only loader blocks outright."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_payload_of_a_blocked_module_is_refused_naming_the_global(tmp_path):
    """torch words the refusal of a blocked module's global (``os.system``) differently from that of a global not
    allowed: the line named only "Weights only load failed"; it names the global, and the payload never runs."""
    from drmas.checkpoints import CheckpointDamaged
    from drmas.trainer.run_folder import load_worker_state

    marker, worker = tmp_path / "MARKER", tmp_path / "worker_solver_model.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "note": _SystemPayload(marker)}, worker)
    with pytest.raises(CheckpointDamaged) as refused:
        load_worker_state(worker, tmp_path)
    module = os.system.__module__
    assert f"refused unread: it holds a pickled Python object that is not a tensor or a plain container (Trying to load " \
           f"unsupported GLOBAL {module}.system whose module {module} is blocked)" in str(refused.value), refused.value
    assert not marker.exists()


def test_a_checkpoint_written_as_drmas_always_wrote_it_loads_with_weights_only(runs):
    """A worker file holds tensors and plain containers only (the format is unchanged), so the restricted loader
    reads every value the unrestricted one reads."""
    from drmas.trainer.run_folder import load_worker_state

    latest = runs["search_hetero"] / "checkpoints" / "latest"
    for worker in sorted(latest.glob("worker_*.pt")):
        safe, full = load_worker_state(worker, latest), torch.load(worker, weights_only=False)
        flat_safe, flat_full = _flat(safe), _flat(full)
        assert flat_safe.keys() == flat_full.keys()
        assert all(torch.equal(v, flat_full[k]) if isinstance(v, torch.Tensor) else v == flat_full[k]
                   for k, v in flat_safe.items())


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}{i}.").items()}
    return {prefix: value}


def test_a_default_drmas_train_prints_no_third_party_progress_bar(tmp_path):
    """transformers' "Loading weights" bar (one per model) is off by default and back with --log-level debug."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env["PYTHONPATH"] = str(ROOT)

    def train(name: str, *extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "drmas.cli", *extra, "train", str(CONFIGS / "search_hetero.yaml"),
                               f"name={name}", f"out_dir={tmp_path}", "train.evaluate=false", *SHORT[:-1]],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    quiet = train("quiet")
    assert "Loading weights" not in quiet and "it/s]" not in quiet, quiet[-3000:]
    loud = train("loud", "--log-level", "debug")
    assert loud.count("Loading weights") >= 3  # one per model: the check above can fail


def test_the_openrlhf_backends_deepspeed_load_reads_weights_only(tmp_path):
    """DeepSpeed's checkpoint engine calls ``torch.load(weights_only=False)``; inside drmas's load every file is
    read weights-only: a plain state loads, a planted payload is refused with one line and does not run."""
    from drmas.workers.openrlhf import backend

    marker = tmp_path / "MARKER"

    class Strategy:  # OpenRLHF's strategy.load_ckpt, reading the files as DeepSpeed's TorchCheckpointEngine does
        args = type("Args", (), {"ckpt": type("Ckpt", (), {"path": str(tmp_path)})})

        def load_ckpt(self, model, path, tag):
            return torch.load(Path(path) / tag / "states.pt", weights_only=False), {}

    actor = type("Actor", (backend.DrmasActorMixin,), {"strategy": Strategy(), "actor": type("A", (), {"model": None})})()
    (tmp_path / "_actor" / "plain").mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "ds_version": "0.19.6", "global_steps": 3},
               tmp_path / "_actor" / "plain" / "states.pt")
    assert actor.drmas_load_checkpoint("plain") is True
    (tmp_path / "_actor" / "planted").mkdir()
    torch.save({"module": {"w": torch.ones(2)}, "note": _Payload(marker)}, tmp_path / "_actor" / "planted" / "states.pt")
    refused = actor.drmas_load_checkpoint("planted")
    assert isinstance(refused, str) and refused.startswith(f"{tmp_path / '_actor'}/planted: refused unread")
    assert "exec" in refused and "\n" not in refused and not marker.exists()
    assert torch.load.__module__ == "torch.serialization"  # the real loader is back after the block


def test_no_checkpoint_code_runs_unless_the_config_names_trust_remote_code(monkeypatch):
    """``models.<key>.trust_remote_code`` (default false) is what transformers is given, on every path that loads
    a hub checkpoint's tokenizer or model (the openrlhf backend passed True on its own)."""
    from drmas.config import load_config
    from drmas.config.identity import config_hash
    from drmas.models import factory
    from drmas.workers.openrlhf import backend

    cfg = load_config(None, [])
    assert cfg.models and all(m.trust_remote_code is False for m in cfg.models.values())
    key = next(iter(cfg.models))
    assert config_hash(load_config(None, [f"models.{key}.trust_remote_code=true"])) == config_hash(cfg)
    seen = []
    monkeypatch.setattr(factory.AutoTokenizer, "from_pretrained",  # the class backend._load_tokenizer imports too
                        lambda path, **kw: seen.append(("tokenizer", kw.get("trust_remote_code"))))
    monkeypatch.setattr(factory.AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: seen.append(("model", kw.get("trust_remote_code"))) or torch.nn.Linear(1, 1))
    for trust in (False, True):
        backend._load_tokenizer("org/model", trust)
        factory.load_policy("org/model", trust_remote_code=trust)
    assert seen == [("tokenizer", False), ("model", False), ("tokenizer", False),
                    ("tokenizer", True), ("model", True), ("tokenizer", True)]


def test_the_openrlhf_backend_refuses_a_checkpoint_that_ships_code_unless_the_config_trusts_it(tmp_path):
    """OpenRLHF's own loaders pass trust_remote_code=True: a checkpoint declaring classes of its own (auto_map) is
    refused before any actor starts, unless ``models.<key>.trust_remote_code`` asks for it."""
    from drmas.config import ConfigError
    from drmas.workers.openrlhf.backend import refuse_checkpoint_code

    shipped = ROOT / "results" / "sft" / "math" / "base_tiny"
    refuse_checkpoint_code("m", str(shipped), False)  # no code of its own
    coded = tmp_path / "coded"
    shutil.copytree(shipped, coded)
    config = json.loads((coded / "config.json").read_text())
    (coded / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "mine.Model"}}))
    with pytest.raises(ConfigError, match=r"models\.m\.path=.*config\.json declares its own code .*"
                                          r"models\.m\.trust_remote_code=true"):
        refuse_checkpoint_code("m", str(coded), False)
    refuse_checkpoint_code("m", str(coded), True)
