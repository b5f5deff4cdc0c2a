"""The timing parts of experiments/gpu_device_check.sh: scaled-down copies of a grid, their run, and the report.

    python -m experiments.device_check prepare GRID --work DIR --name NAME [--steps N] [--sft-steps N]
                                       [--copies N] [--only ENTRY]
    python -m experiments.device_check report --work DIR [--cpu-minutes 47.4] [--lanes-grid cpu.yaml]

``prepare`` writes ``DIR/NAME/grid.yaml`` and one derived config per entry (``base:`` the grid's config, so
the setting is exactly the grid's) with every model checkpoint, tokenizer and run folder under ``DIR``, a
short SFT (``--sft-steps``) and ``--steps`` RL steps without intermediate evaluation or checkpoints.
``--copies N`` makes N copies of each entry (N runs at once measure how many concurrent runs pay off).
``experiments.grid run DIR/NAME/grid.yaml --jobs auto`` then runs it. Grids named ``*settings`` give the
s/step of each entry (measured with ``--jobs auto`` runs at once, as the full grid would run), grids named
``lanes<N>`` the s/step of N copies of one entry run at once. ``report`` reads every prepared grid
under ``DIR``: s/step per setting (median after the first step), generation tokens/s, the throughput of 1, 2,
4, 8 concurrent runs, and estimates the time of the full grids on this device from those numbers.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from experiments.device_report import best_lanes, concurrency_table, load_metrics, run_timing
from experiments.grid import auto_jobs, hardware
from experiments.grid_runs import ROOT, load_grid
from experiments.grid_spec import RESERVED_TAGS

logger = logging.getLogger("experiments.device_check")


def derived_config(config: str, work: Path, steps: int, sft_steps: int) -> dict[str, Any]:
    """A config that is ``config`` (a grid's) with its checkpoints and tokenizer under ``work`` (same file
    names, so configs sharing a base still share it), ``steps`` RL steps, a short evaluation at the start and
    the end only, and ``sft_steps`` SFT steps."""
    from drmas.config import load_config

    cfg = load_config(ROOT / config)
    task = Path(cfg.sft.tokenizer_dir).parent.name or "task"
    return {"base": str((ROOT / config).resolve()),
            "models": {key: {"path": str(work / "sft" / task / Path(m.path).name)} for key, m in cfg.models.items()
                       if m.preset is not None and m.path is not None},
            "train": {"steps": steps, "eval_every": 0, "save_every": 0, "eval_tasks": 4, "eval_samples": 1},
            "sft": {"steps": sft_steps, "tokenizer_dir": str(work / "sft" / task / "tokenizer")}}


def prepare(grid_spec: str, work: Path, name: str, steps: int, sft_steps: int, copies: int = 1,
            only: str | None = None, extra: list[str] | None = None) -> Path:
    """Write the scaled-down grid ``work/name/grid.yaml`` (see the module docstring); returns its path.
    ``only``: fnmatch pattern(s) on entry names, comma-separated; ``extra``: overrides added to every run."""
    if steps < 2 or sft_steps < 1 or copies < 1:
        raise ValueError(f"need steps >= 2, sft_steps >= 1, copies >= 1 (got {steps}, {sft_steps}, {copies})")
    grid = load_grid(ROOT / grid_spec, seeds=1)
    folder = work / name
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}

    def derived(config: str) -> str:
        if config not in written:
            path = folder / "configs" / f"{Path(config).stem}.yaml"
            path.write_text(yaml.safe_dump(derived_config(config, work.resolve(), steps, sft_steps), sort_keys=False))
            written[config] = str(path.resolve())
        return written[config]

    runs = []
    for run in grid.runs:
        entry = run.tags["entry"]
        if only and not any(fnmatch.fnmatch(entry, pattern) for pattern in only.split(",")):
            continue
        for copy in range(copies):
            runs.append({"name": entry if copies == 1 else f"{entry}_c{copy}", "config": derived(run.config),
                         "overrides": [*run.overrides, *(extra or [])], "seeds": [0],
                         "tags": {k: v for k, v in run.tags.items() if k not in RESERVED_TAGS}})  # entry, seed: the runner's
    if not runs:
        raise ValueError(f"{grid_spec}: no entry matches {only!r}")
    spec = {"name": f"{grid.name}-{name}", "out_dir": str((folder / "runs").resolve()),
            "sft": [derived(c) for c in grid.sft], "runs": runs}
    (folder / "grid.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    meta = {"grid": grid_spec, "steps": steps, "sft_steps": sft_steps, "copies": copies, "only": only}
    (folder / "prepared.json").write_text(json.dumps(meta))
    return folder / "grid.yaml"


def _sft_seconds(folder: Path) -> dict[str, float]:
    """Seconds and steps of each SFT'd checkpoint, from the warm-up logs of a prepared grid."""
    out = {}
    for log in sorted((folder / "runs" / "logs").glob("sft_*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"sft"'):
                for key, m in json.loads(line)["sft"].items():
                    out[f"{log.stem}:{key}"] = {"seconds": m["seconds"], "steps": m["steps"]}
    return out


def _timings(folder: Path) -> dict[str, dict[str, float]]:
    """Run name -> :func:`run_timing` of every run of a prepared grid that wrote steps."""
    out = {}
    for run_dir in sorted(p for p in (folder / "runs").iterdir() if (p / "metrics.jsonl").exists()):
        out[run_dir.name] = run_timing(load_metrics(run_dir))
    return out


def full_grid_minutes(grid_spec: str, s_per_step: dict[str, float], lanes: int) -> dict[str, Any]:
    """RL minutes of the full ``grid_spec`` (its own seeds and steps) on this device: the sum over its runs of
    steps x the measured s/step of the run's entry, spread over ``lanes`` concurrent runs."""
    from drmas.config import load_config

    total, missing = 0.0, []
    for run in load_grid(ROOT / grid_spec).runs:
        value = s_per_step.get(run.tags["entry"])
        if value is None or not math.isfinite(value):
            missing.append(run.name)
            continue
        total += load_config(ROOT / run.config, run.overrides).train.steps * value
    return {"rl_minutes": total / max(lanes, 1) / 60, "lanes": lanes, "unmeasured_runs": len(missing),
            "unmeasured_examples": missing[:3]}


def report(work: Path, cpu_minutes: float | None) -> dict[str, Any]:
    """Everything measured under ``work`` (the prepared grids that ran), with the full-grid estimates."""
    out: dict[str, Any] = {}
    for meta_file in sorted(work.glob("*/prepared.json")):
        folder, meta = meta_file.parent, json.loads(meta_file.read_text())
        if not (folder / "runs").is_dir():
            continue
        timings = _timings(folder)
        out[folder.name] = {"meta": meta, "runs": timings, "sft": _sft_seconds(folder)}
    levels = {int(m.group(1)): [t["s_per_step"] for t in v["runs"].values()]
              for k, v in out.items() if (m := re.fullmatch(r"lanes(\d+)", k))}
    table = concurrency_table(levels) if levels else []
    lanes = best_lanes(table) if table else None
    out["concurrency"] = {"table": table, "best_lanes": lanes}
    cores, gpus, _ = hardware("auto")
    auto_lanes = auto_jobs(cores, gpus)
    for key in [k for k in out if k.endswith("settings")]:
        block, grid_spec = out[key], out[key]["meta"]["grid"]
        per_entry = {re.sub(r"_s\d+$", "", name): t["s_per_step"] for name, t in block["runs"].items()}
        estimate = full_grid_minutes(grid_spec, per_entry, auto_lanes)  # the lanes the settings ran with
        full_sft = _full_sft_minutes(grid_spec, block["sft"])
        estimate.update(sft_minutes=full_sft, total_minutes=estimate["rl_minutes"] + full_sft)
        if cpu_minutes and key.startswith("cpu"):
            estimate.update(cpu_2core_minutes=cpu_minutes, speedup_vs_2_cores=cpu_minutes / estimate["total_minutes"])
        block["estimate"] = estimate
    return out


def _full_sft_minutes(grid_spec: str, measured: dict[str, dict[str, float]]) -> float:
    """Minutes of the grid's SFT warm-ups at their full step counts, from the short ones measured (warm-ups of
    one task source run one after the other, different sources at once: the longest source counts)."""
    from drmas.config import load_config

    per_source: dict[str, float] = {}
    for config in load_grid(ROOT / grid_spec).sft:
        full_steps = load_config(ROOT / config).sft.steps
        for key, m in measured.items():
            if key.startswith(f"sft_{Path(config).stem}:"):
                source = Path(load_config(ROOT / config).sft.tokenizer_dir).parent.name
                per_source[source] = max(per_source.get(source, 0.0), m["seconds"] * full_steps / m["steps"])
    return max(per_source.values(), default=0.0) / 60


def _text(rep: dict[str, Any]) -> str:
    lines = []
    for key, block in rep.items():
        if key == "concurrency":
            continue
        lines.append(f"== {key} ({block['meta']['grid']}, {block['meta']['steps']} steps, SFT {block['meta']['sft_steps']} steps)")
        for name, t in block["runs"].items():
            lines.append(f"   {name:36s} {t['s_per_step']:7.2f} s/step  rollout {t['rollout_s']:6.2f}  update "
                         f"{t['update_s']:6.2f}  gen {t['gen_tokens_per_s']:9.0f} tok/s  ({t['steps']} steps)")
        for name, m in block["sft"].items():
            lines.append(f"   SFT {name}: {m['seconds']:.1f} s for {m['steps']} steps")
        if "estimate" in block:
            lines.append(f"   estimate of the full grid on this device: {json.dumps(block['estimate'], default=float)}")
    conc = rep.get("concurrency", {})
    for row in conc.get("table", []):
        lines.append(f"   {row['runs']} run(s) at once: {row['s_per_step']:.2f} s/step each, {row['steps_per_s']:.2f} "
                     f"run-steps/s ({row['speedup']:.2f}x one run)")
    if conc.get("best_lanes"):
        lines.append(f"   concurrent runs that pay off (>= 1.1x per doubling): {conc['best_lanes']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.device_check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("grid")
    p.add_argument("--work", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--only", default=None, help="fnmatch pattern(s) on the grid's entry names, comma-separated")
    p.add_argument("--set", dest="extra", action="append", default=[], help="key.sub=value added to every run")
    p = sub.add_parser("report")
    p.add_argument("--work", required=True)
    p.add_argument("--cpu-minutes", type=float, default=None, help="the measured 2-core time of the CPU grid")
    p.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "prepare":
            print(prepare(args.grid, Path(args.work), args.name, args.steps, args.sft_steps, args.copies, args.only,
                          args.extra))
            return 0
        rep = report(Path(args.work), args.cpu_minutes)
    except ValueError as exc:
        print(f"device_check: {exc}", file=sys.stderr)
        return 2
    print(_text(rep))
    if args.out:
        Path(args.out).write_text(json.dumps(rep, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
