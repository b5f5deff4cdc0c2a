"""Benchmark: vectorized ``compute_advantages`` against a lean per-row Python loop with the same semantics.

    python benchmarks/bench_advantages.py [--sizes 10000 100000 200000] [--repeats 3]

Both are timed in the same run on the same step tables (ids as integer arrays, 4 agents, group size 8,
agents acting 1-3 times per trajectory); the script prints the ratio loop / vectorized per size and
checks that both give the same advantages. Absolute times depend on the machine; the ratios are the
result.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
import torch

from drmas.algos import compute_advantages


def loop_drmas(scores: list, task_ids: list, agent_ids: list, eps: float = 1e-6) -> np.ndarray:
    """Lean per-row loop (the reference code's structure, without its torch-per-group overhead):
    group by (task, agent), unbiased std, singleton -> mean 0 / std 1."""
    groups: dict = defaultdict(list)
    for i in range(len(scores)):
        groups[(task_ids[i], agent_ids[i])].append(scores[i])
    stats = {}
    for key, vals in groups.items():
        n = len(vals)
        if n == 1:
            stats[key] = (0.0, 1.0)
            continue
        mean = sum(vals) / n
        var = sum((v - mean) ** 2 for v in vals) / (n - 1)
        stats[key] = (mean, var ** 0.5)
    out = np.empty(len(scores))
    for i in range(len(scores)):
        mean, std = stats[(task_ids[i], agent_ids[i])]
        out[i] = (scores[i] - mean) / (std + eps)
    return out


def reference_style_drmas(scores: torch.Tensor, index: list, eps: float = 1e-6) -> torch.Tensor:
    """The reference code's structure (verl ``compute_grpo_outcome_advantage`` with agent grouping):
    per-row dict appends of tensors, ``torch.std`` per group, per-row tensor arithmetic."""
    id2score: dict = defaultdict(list)
    id2mean, id2std = {}, {}
    scores = scores.clone()
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            t = torch.tensor([vals])
            id2mean[idx], id2std[idx] = torch.mean(t), torch.std(t)
    for i in range(len(scores)):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return scores


def make_table(n: int, rng: np.random.Generator, group_size: int = 8, n_agents: int = 4):
    steps_per_traj = 6  # on average: 4 agents acting 1-3 times... truncated to exactly n rows below
    n_traj = n // steps_per_traj + 1
    traj = np.repeat(np.arange(n_traj), steps_per_traj)[:n]
    task = traj // group_size
    agent = rng.integers(0, n_agents, size=n)
    reward = rng.integers(0, 2, size=n_traj).astype(np.float64)[traj]
    scores = reward - 0.1 * (rng.random(n) < 0.1)
    return scores, task, agent, traj


def time_best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 200_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-max", type=int, default=200_000,
                        help="largest size at which the (slow) reference-style loop is timed")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread each: the ratio measures the algorithm, not the thread count
    rng = np.random.default_rng(0)
    print("lean loop: plain-Python per-row loop over lists; reference-style: the reference code's per-row "
          "torch loop (timed once, at sizes <= --reference-max)")
    print(f"{'samples':>8} {'vectorized_s':>13} {'lean_loop_s':>12} {'ratio':>8} {'reference_s':>12} {'ratio':>8}  max|diff|")
    for n in args.sizes:
        scores, task, agent, traj = make_table(n, rng)
        scores_t = torch.from_numpy(scores)
        vec = lambda: compute_advantages(scores_t, task, agent, traj, estimator="drmas")  # noqa: E731
        vec_stats = lambda: compute_advantages(scores_t, task, agent, traj, estimator="drmas").stats  # noqa: E731
        s_list, t_list, a_list = scores.tolist(), task.tolist(), agent.tolist()
        loop = lambda: loop_drmas(s_list, t_list, a_list)  # noqa: E731
        diff = float(np.abs(vec().advantages.numpy() - loop()).max())
        t_vec, t_loop = time_best(vec, args.repeats), time_best(loop, args.repeats)
        t_stats = time_best(vec_stats, args.repeats)
        ref_cell = f"{'-':>12} {'-':>8}"
        if n <= args.reference_max:
            index = list(zip(t_list, a_list))
            t0 = time.perf_counter()
            ref = reference_style_drmas(torch.tensor(s_list, dtype=torch.float32), index)
            t_ref = time.perf_counter() - t0
            diff = max(diff, float(np.abs(vec().advantages.numpy() - ref.numpy()).max()))
            ref_cell = f"{t_ref:>12.3f} {t_ref / t_vec:>7.0f}x"
        print(f"{n:>8} {t_vec:>13.4f} {t_loop:>12.3f} {t_loop / t_vec:>7.1f}x {ref_cell}  {diff:.1e}  "
              f"(with the stats table: {t_stats:.4f}s, {t_loop / t_stats:.1f}x vs lean loop)")


if __name__ == "__main__":
    main()
