"""Benchmark: the worker-group update with and without shared prompts, on real rollouts.

    python benchmarks/bench_update.py [--configs math_single search_base] [--steps 2] [--rounds 5]

For each CPU config (experiments/configs/cpu/, its shipped SFT'd base under results/sft/), the trainer
runs ``--steps`` real RL steps (rollout, rewards, advantages, update). The update batches of each step
are kept, and the update of that step is then timed on the same rows from the same weights and
optimizer state (restored before every run) with ``algo.shared_prefix`` = off (plain) and the config's
own setting (auto, the default), alternating for ``--rounds`` rounds; the script prints the medians of
the wall-clock time and of this process's CPU time (``time.process_time``: on a shared, loaded machine
the wall clock also counts the time other processes hold the core), their ratios, and the padded token
positions each path runs through the model (plus the real tokens: prompt + response). It also checks
that both paths give the same loss and gradient norms.

Absolute times depend on the machine and its load; the ratios are the result (docs/training.md quotes
them).
"""
from __future__ import annotations

import argparse
import copy
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drmas.config import load_config
from drmas.io import atomic_write_json
from drmas.models.logprobs import shared_prefix_tokens
from drmas.trainer.trainer import Trainer
from drmas.workers.base import UpdateBatch
from drmas.workers.policy import PolicyWorker

CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "cpu"


def set_mode(worker: PolicyWorker, mode: str) -> None:
    """Switch ``algo.shared_prefix`` of a live worker (its spec is frozen: replaced whole)."""
    worker.spec = replace(worker.spec, algo=worker.spec.algo.model_copy(update={"shared_prefix": mode}))


def tokens(worker: PolicyWorker, batch: UpdateBatch, step_seed: int) -> dict[str, int]:
    """Padded token positions of the update's forward passes under the worker's current mode, and the
    real tokens (prompt + response) of its rows."""
    ran = 0
    for (micro_batches,) in worker.update_plan(batch, worker.spec.optim.mini_batches, step_seed):
        for mb in micro_batches:
            prompts = [batch.prompt_ids[i] for i in mb.rows]
            responses = [batch.response_ids[i] for i in mb.rows]
            groups = worker.prompt_groups(prompts, responses)
            leaders = groups[1] if groups is not None else np.arange(len(prompts))
            plain, shared = shared_prefix_tokens(np.array([len(p) for p in prompts]),
                                                 np.array([len(r) for r in responses]), leaders)
            ran += shared if groups is not None else plain
    real = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    return {"positions": ran, "real": real}


def collect(config: str, steps: int, run_dir: Path) -> tuple[Trainer, list[tuple[dict[str, UpdateBatch], int, dict]]]:
    """A trainer on ``config`` and, for each of ``steps`` real RL steps, its update batches, step seed and
    the worker states before that step's update."""
    cfg = load_config(CONFIGS / f"{config}.yaml", [f"out_dir={run_dir}", f"name={config}", "train.evaluate=false"])
    trainer = Trainer(cfg)
    backend = trainer.backend
    real_update = backend.update
    kept: list[tuple[dict[str, UpdateBatch], int, dict]] = []

    def keep(batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        kept.append((batches, step_seed, copy.deepcopy(backend.get_states())))  # on the CPU, states are live
        return real_update(batches, step_seed)

    backend.update = keep
    for step in range(steps):
        trainer.train_step(step)
    backend.update = real_update
    return trainer, kept


def bench(config: str, steps: int, rounds: int, run_dir: Path) -> dict[str, Any]:
    trainer, kept = collect(config, steps, run_dir)
    workers: dict[str, PolicyWorker] = trainer.backend.workers
    default = {key: w.spec.algo.shared_prefix for key, w in workers.items()}
    times: dict[str, list[float]] = {"off": [], "default": []}
    cpu: dict[str, list[float]] = {"off": [], "default": []}
    counts = {"off": {"positions": 0, "real": 0}, "default": {"positions": 0, "real": 0}}
    worst = 0.0
    for batches, seed, states in kept:
        for mode in ("off", "default"):
            for key, w in workers.items():
                set_mode(w, "off" if mode == "off" else default[key])
                for k, v in tokens(w, batches[key], seed).items():
                    counts[mode][k] += v
        per_round: dict[str, list[float]] = {"off": [], "default": []}
        cpu_round: dict[str, list[float]] = {"off": [], "default": []}
        metrics: dict[str, dict] = {}
        for r in range(rounds):
            for mode in (("off", "default") if r % 2 == 0 else ("default", "off")):  # alternate the order
                trainer.backend.set_states(states)
                for key, w in workers.items():
                    set_mode(w, "off" if mode == "off" else default[key])
                start, start_cpu = time.perf_counter(), time.process_time()
                metrics[mode] = trainer.backend.update(batches, seed)
                per_round[mode].append(time.perf_counter() - start)
                cpu_round[mode].append(time.process_time() - start_cpu)
        for mode in times:
            times[mode].append(statistics.median(per_round[mode]))
            cpu[mode].append(statistics.median(cpu_round[mode]))
        for key in batches:
            a, b = metrics["off"][key].get("grad_norm"), metrics["default"][key].get("grad_norm")
            if a is not None:
                worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    trainer.close()
    plain, fast = sum(times["off"]), sum(times["default"])
    plain_cpu, fast_cpu = sum(cpu["off"]), sum(cpu["default"])
    return {"config": config, "shared_prefix": default, "steps": steps, "rounds": rounds,
            "update_s_plain": plain / steps, "update_s_shared": fast / steps, "ratio": plain / fast,
            "update_cpu_s_plain": plain_cpu / steps, "update_cpu_s_shared": fast_cpu / steps,
            "ratio_cpu": plain_cpu / fast_cpu,
            "positions_plain": counts["off"]["positions"] // steps,
            "positions_shared": counts["default"]["positions"] // steps,
            "real_tokens": counts["off"]["real"] // steps, "max_rel_diff_grad_norm": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["math_single", "math_base", "search_base"])
    parser.add_argument("--steps", type=int, default=2, help="real RL steps whose updates are timed")
    parser.add_argument("--rounds", type=int, default=5, help="alternating plain/shared runs per step")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            r = bench(config, args.steps, args.rounds, Path(tmp))
            results.append(r)
            mode = "/".join(sorted(set(r["shared_prefix"].values())))
            print(f"{config}: update per step, plain vs shared_prefix={mode}: wall {r['update_s_plain']:.3f} s vs "
                  f"{r['update_s_shared']:.3f} s ({r['ratio']:.2f}x), CPU {r['update_cpu_s_plain']:.3f} s vs "
                  f"{r['update_cpu_s_shared']:.3f} s ({r['ratio_cpu']:.2f}x); token positions "
                  f"{r['positions_plain']:,} vs "
                  f"{r['positions_shared']:,} ({r['positions_plain'] / r['positions_shared']:.2f}x fewer; real tokens "
                  f"{r['real_tokens']:,}); grad norm max rel. diff {r['max_rel_diff_grad_norm']:.1e}", flush=True)
    if args.json:
        atomic_write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
