"""A synthetic stability grid folder (the files ``drmas train`` and ``experiments/grid.py`` write), for the tests
of analysis/stability.py and its notebook: never results. Each run's numbers are built so that the rules'
outcomes are known: at the top learning rate GRPO's seeds stop calling the Search agent after step 30 (rule g,
search clause) and its Search agent's norm jumps 10x at steps 25 and 40 (twin spikes); Dr. MAS stays smooth.
``task="math"``: the Solver <-> Verifier system, where the top-lr GRPO seeds' reward falls to 0.02 from step 30
(rule g, reward clause: no agent can be abandoned) and the Solver's norm jumps instead.
``python tests/stability_fixture.py DIR`` writes one."""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

AGENTS = ("verifier", "search", "answer")
MATH_AGENTS = ("solver", "verifier")
LRS = (5.0e-5, 8.0e-4)
STEPS, EVAL_EVERY, N_TASKS, K = 60, 20, 24, 4


def write_run(root: Path, est: str, lr: float, seed: int, done: bool = True, task: str = "search") -> dict:
    name = f"stab_{'grpo' if est == 'trajectory_grpo' else 'drmas'}_lr{lr:g}_s{seed}"
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    run = root / name
    run.mkdir(parents=True)
    agents, spiking = (AGENTS, "search") if task == "search" else (MATH_AGENTS, "solver")
    (run / "manifest.json").write_text(json.dumps({"name": name, "config": {
        "env": {"name": f"{task}_generated"}, "models": {f"{a}_model": {"preset": "nano"} for a in agents},
        "agents": [{"name": a, "model": f"{a}_model"} for a in agents], "algo": {"estimator": est},
        "train": {"seed": seed}}, "seeds": {"train": seed}}))
    collapse = est == "trajectory_grpo" and lr == max(LRS)
    lines = []
    for step in range(STEPS):
        late = collapse and step >= 30
        m = {"step": step, "train/nonfinite": 0}
        if task == "search":
            m.update({"reward/mean": 0.3 + 0.02 * rng.random(),
                      "agent/search/calls_per_traj": 0.05 if late else 1.5 + 0.1 * rng.random(),
                      "search/answered_without_search": 0.9 if late else 0.1})
        else:
            m.update({"reward/mean": 0.02 if late else 0.3 + 0.02 * rng.random(), "math/reject_rate": 0.1,
                      "math/solver_rounds": 1.1})
        for a in agents:
            norm = 1.0 + 0.05 * rng.standard_normal()
            spike = collapse and a == spiking and step in (25, 40)
            m.update({f"agent/{a}/grad_norm": norm * (10 if spike else 1), f"agent/{a}/spike": int(spike),
                      f"agent/{a}/entropy": 0.5, f"agent/{a}/control_prob": 0.99 if late and a == "verifier" else 0.7})
        for a in agents:
            m[f"wg/{a}_model/grad_norm"] = 1.0
            m[f"wg/{a}_model/skipped"] = 0.0
        lines.append(json.dumps(m))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    evals = []
    for step in range(0, STEPS + 1, EVAL_EVERY):
        q = 0.3 if est == "trajectory_grpo" else 0.3 + 0.2 * step / STEPS
        succ = np.random.default_rng(zlib.crc32(f"{name}{step}".encode())).binomial(K, q, size=N_TASKS)
        evals.append(json.dumps({"step": step, "benchmark": "kb", "avg": float(succ.mean() / K),
                                 "pass": float((succ > 0).mean()), "k": K, "n_tasks": N_TASKS, "successes": succ.tolist()}))
    (run / "eval.jsonl").write_text("\n".join(evals) + "\n")
    if done:
        (run / "DONE").write_text("")
    return {"run": name, "config": "x.yaml", "overrides": [], "task": task, "setting": f"stability:lr={lr:g}",
            "estimator": est, "assignment": "nonsharing", "entry": name.rsplit("_s", 1)[0], "seed": seed,
            "level": lr, "status": "done" if done else "partial", "seconds": 60.0}


def make_stability_grid(root: Path, seeds=(0, 1, 2), unfinished: int = 0, task: str = "search") -> Path:
    """The grid of one system: 2 estimators x ``LRS`` x ``seeds``; the last ``unfinished`` runs are left partial."""
    root.mkdir(parents=True, exist_ok=True)
    cells = [(est, lr, seed) for seed in seeds for lr in LRS for est in ("trajectory_grpo", "drmas")]
    entries = [write_run(root, est, lr, seed, done=i < len(cells) - unfinished, task=task)
               for i, (est, lr, seed) in enumerate(cells)]
    (root / "index.json").write_text(json.dumps({"grid": "stability" if task == "search" else f"stability_{task}",
                                                 "runs": entries}))
    return root


if __name__ == "__main__":
    make_stability_grid(Path(sys.argv[1]))
