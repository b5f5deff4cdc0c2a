"""Reports of the device checks (experiments/gpu_local_smoke.sh, experiments/gpu_device_check.sh), read from
run folders' ``metrics.jsonl``: per-step phase timings, generation tokens/s and per-agent gradient norms; the
comparison of an interrupted-and-resumed run with an uninterrupted twin; s/step per setting and the
throughput of N concurrent runs.

    python -m experiments.device_report smoke RUN_A RUN_B [--out summary.json]
    python -m experiments.device_report timing RUN_DIR... [--out timing.json] [--cpu-grid-minutes 47.4]

Only the standard library, numpy and the run folders are needed (no torch), so it runs anywhere.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from drmas.io import read_jsonl

logger = logging.getLogger("experiments.device_report")
VOLATILE = ("timing/",)
"""Metric key prefixes that measure wall time, not the computation (left out of run comparisons)."""


def load_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The step records of a run folder (``metrics.jsonl``); a clear error when there are none."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the run wrote no step (see its log)")
    return read_jsonl(path)  # the project's one JSONL rule (drmas/io.py)


def agents_of(records: list[dict[str, Any]]) -> list[str]:
    """Agent names of a run (from its ``agent/{k}/steps`` keys)."""
    return sorted({k.split("/")[1] for r in records for k in r if k.startswith("agent/") and k.endswith("/steps")})


def step_rows(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step: step / rollout / update seconds, generated tokens per rollout second, reward and each agent's
    gradient norm (generated tokens = sum over agents of steps x mean response length)."""
    agents = agents_of(records)
    rows = []
    for r in records:
        generated = sum(r.get(f"agent/{a}/steps", 0) * r.get(f"agent/{a}/response_len", 0.0) for a in agents)
        rollout = r.get("timing/rollout", float("nan"))
        rows.append({"step": r["step"], "step_s": r.get("timing/step", float("nan")), "rollout_s": rollout,
                     "update_s": r.get("timing/update", float("nan")), "generated_tokens": generated,
                     "gen_tokens_per_s": generated / rollout if rollout and rollout > 0 else float("nan"),
                     "reward": r.get("reward/mean", float("nan")),
                     **{f"grad_norm/{a}": r.get(f"agent/{a}/grad_norm", float("nan")) for a in agents}})
    return rows


def compare_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """How far two runs' step records differ, wall-time keys left out: ``identical`` (same steps, same keys,
    equal values), ``max_abs_diff`` and the key where it is largest."""
    steps_a, steps_b = [r["step"] for r in a], [r["step"] for r in b]
    out: dict[str, Any] = {"steps_a": steps_a, "steps_b": steps_b, "same_steps": steps_a == steps_b,
                           "keys_only_in_one": [], "max_abs_diff": 0.0, "worst_key": None}
    for ra, rb in zip(a, b):
        ka = {k for k in ra if not k.startswith(VOLATILE)}
        kb = {k for k in rb if not k.startswith(VOLATILE)}
        out["keys_only_in_one"] += sorted(ka ^ kb)
        for k in ka & kb:
            va, vb = ra[k], rb[k]
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                both_nan = isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
                diff = 0.0 if both_nan or va == vb else abs(float(va) - float(vb))
            else:
                diff = 0.0 if va == vb else float("inf")
            if diff > out["max_abs_diff"] or (math.isnan(diff) and out["worst_key"] is None):
                out["max_abs_diff"], out["worst_key"] = diff, f"step {ra['step']}: {k}"
    out["keys_only_in_one"] = sorted(set(out["keys_only_in_one"]))
    out["identical"] = out["same_steps"] and not out["keys_only_in_one"] and out["max_abs_diff"] == 0.0
    return out


def run_timing(records: list[dict[str, Any]], skip_first: int = 1) -> dict[str, float]:
    """Median s/step (rollout, update) and generated tokens/s of a run, its first ``skip_first`` steps left out
    (CUDA warm-up) when it has more."""
    rows = step_rows(records)
    rows = rows[skip_first:] if len(rows) > skip_first else rows
    med = lambda key: float(np.median([r[key] for r in rows])) if rows else float("nan")  # noqa: E731
    return {"steps": len(rows), "s_per_step": med("step_s"), "rollout_s": med("rollout_s"),
            "update_s": med("update_s"), "gen_tokens_per_s": med("gen_tokens_per_s")}


def concurrency_table(per_level: dict[int, list[float]]) -> list[dict[str, float]]:
    """For N concurrent runs with s/step values ``per_level[N]``: mean s/step and throughput (run-steps per
    second = sum of 1 / s_per_step) and the speed-up over one run."""
    base = None
    table = []
    for n in sorted(per_level):
        values = [v for v in per_level[n] if v > 0 and math.isfinite(v)]
        throughput = float(sum(1.0 / v for v in values))
        base = base or throughput
        table.append({"runs": n, "measured": len(values), "s_per_step": float(np.mean(values)) if values else float("nan"),
                      "steps_per_s": throughput, "speedup": throughput / base if base else float("nan")})
    return table


def best_lanes(table: list[dict[str, float]], gain: float = 1.1) -> int:
    """The most concurrent runs that still pay off: each doubling kept only if it adds >= ``gain``x throughput."""
    best = table[0]["runs"] if table else 1
    last = table[0]["steps_per_s"] if table else 0.0
    for row in table[1:]:
        if row["steps_per_s"] >= gain * last:
            best, last = row["runs"], row["steps_per_s"]
    return int(best)


def _fmt(rows: list[dict[str, float]]) -> str:
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    lines = ["  ".join(f"{k:>14s}" for k in keys)]
    for r in rows:
        lines.append("  ".join(f"{r[k]:>14.4g}" if isinstance(r[k], (int, float)) else f"{str(r[k]):>14s}" for k in keys))
    return "\n".join(lines)


def smoke_report(run_a: Path, run_b: Path) -> dict[str, Any]:
    """Summary of the smoke test: both runs' step tables and the comparison of B (killed, resumed) with A."""
    a, b = load_metrics(run_a), load_metrics(run_b)
    return {"run_a": str(run_a), "run_b": str(run_b), "steps_a": step_rows(a), "steps_b": step_rows(b),
            "timing_a": run_timing(a), "timing_b": run_timing(b), "resume_vs_uninterrupted": compare_runs(a, b)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.device_report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("smoke", help="step tables of two twin runs and their comparison")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = smoke_report(Path(args.run_a), Path(args.run_b))
    except FileNotFoundError as exc:
        print(f"device_report: {exc}", file=sys.stderr)
        return 2
    for name in ("a", "b"):
        logger.info("run %s (%s):\n%s", name.upper(), report[f"run_{name}"], _fmt(report[f"steps_{name}"]))
        logger.info("median after step 0: %s", json.dumps(report[f"timing_{name}"]))
    cmp = report["resume_vs_uninterrupted"]
    logger.info("resumed run B vs uninterrupted run A: %s (same steps %s, max |diff| %.3g at %s, keys in one only %s)",
                "IDENTICAL" if cmp["identical"] else "DIFFERENT", cmp["same_steps"], cmp["max_abs_diff"],
                cmp["worst_key"], cmp["keys_only_in_one"][:5])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    return 0 if cmp["same_steps"] and not cmp["keys_only_in_one"] else 1


if __name__ == "__main__":
    sys.exit(main())
