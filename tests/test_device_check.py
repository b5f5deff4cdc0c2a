"""The reports of the device checks (experiments/device_report.py, experiments/device_check.py): run
comparison, throughput of concurrent runs, and the scaled-down copies of a grid (their configs are the grid's
settings with only paths, steps and evaluation changed)."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from drmas.config import load_config
from experiments.device_check import prepare
from experiments.device_report import best_lanes, compare_runs, concurrency_table, run_timing, step_rows
from experiments.grid_runs import ROOT, load_grid


def _rec(step, **kw):
    return {"step": step, "timing/step": 1.0 + step, "timing/rollout": 0.5, "timing/update": 0.25, "reward/mean": 0.5,
            "agent/s/steps": 10, "agent/s/response_len": 4.0, "agent/s/grad_norm": 0.3, **kw}


def test_step_rows_and_timing():
    rows = step_rows([_rec(0), _rec(1), _rec(2)])
    # 10 calls x 4 tokens = 40 generated tokens in 0.5 s of rollout
    assert rows[1]["generated_tokens"] == 40 and rows[1]["gen_tokens_per_s"] == 80.0
    assert rows[0]["grad_norm/s"] == 0.3
    timing = run_timing([_rec(0), _rec(1), _rec(2)])  # step 0 (warm-up) left out: median of 2.0, 3.0
    assert timing["steps"] == 2 and timing["s_per_step"] == 2.5


def test_compare_runs_ignores_wall_time_only():
    a = [_rec(0), _rec(1)]
    same = [_rec(0, **{"timing/step": 9.0}), _rec(1)]
    assert compare_runs(a, same)["identical"]
    nan = [_rec(0, **{"reward/mean": float("nan")})]
    assert compare_runs(nan, nan)["identical"]  # NaN == NaN for this purpose
    off = [_rec(0), _rec(1, **{"agent/s/grad_norm": 0.31})]
    cmp = compare_runs(a, off)
    assert not cmp["identical"] and cmp["max_abs_diff"] == pytest.approx(0.01) and "grad_norm" in cmp["worst_key"]
    short = compare_runs(a, a[:1])
    assert not short["identical"] and not short["same_steps"]
    extra = compare_runs(a, [_rec(0, new=1), _rec(1)])
    assert extra["keys_only_in_one"] == ["new"] and not extra["identical"]


def test_concurrency_table_and_best_lanes():
    # 1 run at 1 s/step = 1 step/s; 2 runs at 1.25 s = 1.6; 4 at 2.0 = 2.0; 8 at 4.2 = 1.9
    table = concurrency_table({1: [1.0], 2: [1.25, 1.25], 4: [2.0] * 4, 8: [4.2] * 8})
    assert [round(r["steps_per_s"], 3) for r in table] == [1.0, 1.6, 2.0, 1.905]
    assert table[2]["speedup"] == pytest.approx(2.0)
    assert best_lanes(table) == 4  # 8 lanes do not add 10 %
    assert best_lanes(concurrency_table({1: [1.0], 2: [1.9, 1.9]})) == 1  # 2 runs add only 5 %
    assert math.isnan(concurrency_table({1: [float("nan")]})[0]["s_per_step"])


def test_prepare_copies_the_grid_settings(tmp_path):
    spec_path = prepare("experiments/grids/cpu.yaml", tmp_path, "cpu-settings", steps=3, sft_steps=20,
                        only="math_*,search_sharing_drmas", extra=["train.batch_tasks=2"])
    spec = yaml.safe_load(spec_path.read_text())
    entries = sorted(r["name"] for r in spec["runs"])
    cpu = load_grid(ROOT / "experiments/grids/cpu.yaml", seeds=1)
    assert entries == sorted({r.tags["entry"] for r in cpu.runs if r.tags["entry"].startswith("math_")}
                             | {"search_sharing_drmas"})
    grid = load_grid(spec_path)
    original = {r.tags["entry"]: r for r in cpu.runs}
    for run in grid.runs:
        cfg = load_config(run.config, run.overrides)
        ref = load_config(ROOT / original[run.tags["entry"]].config, original[run.tags["entry"]].overrides)
        # the setting is the grid's: orchestra, agents, algorithm, models' presets and optimizers
        assert cfg.env == ref.env and cfg.agents == ref.agents and cfg.algo == ref.algo
        assert {k: (m.preset, m.optim) for k, m in cfg.models.items()} == {k: (m.preset, m.optim) for k, m in ref.models.items()}
        # ... with its files under the work folder, a few steps, a short SFT
        assert all(str(tmp_path.resolve()) in m.path for m in cfg.models.values())
        assert (cfg.train.steps, cfg.sft.steps, cfg.train.batch_tasks, cfg.train.save_every) == (3, 20, 2, 0)
    lanes = yaml.safe_load(prepare("experiments/grids/cpu.yaml", tmp_path, "lanes4", steps=3, sft_steps=20,
                                   only="math_nonsharing_drmas", copies=4).read_text())
    assert [r["name"] for r in lanes["runs"]] == [f"math_nonsharing_drmas_c{i}" for i in range(4)]
    assert json.loads((tmp_path / "lanes4" / "prepared.json").read_text())["copies"] == 4
    with pytest.raises(ValueError, match="no entry matches"):
        prepare("experiments/grids/cpu.yaml", tmp_path, "none", steps=3, sft_steps=20, only="nothing")


def test_report_estimates_the_full_grid_from_the_measured_steps(tmp_path):
    """Fake measurements: every CPU-grid entry at 2 s/step (steps 1.. after a slow step 0), SFT 10 s for
    100 steps; 1 and 2 concurrent runs. The estimate is sum(steps x 2 s) / lanes, plus the SFT scaled to the
    grid's step counts."""
    from drmas.config import load_config
    from experiments.device_check import report
    from experiments.grid import auto_jobs, hardware

    cpu = load_grid(ROOT / "experiments/grids/cpu.yaml")
    settings = tmp_path / "cpu-settings"
    (settings / "runs" / "logs").mkdir(parents=True)
    (settings / "prepared.json").write_text(json.dumps({"grid": "experiments/grids/cpu.yaml", "steps": 3,
                                                         "sft_steps": 100, "copies": 1, "only": None}))
    for entry in {r.tags["entry"] for r in cpu.runs}:
        (settings / "runs" / f"{entry}_s0").mkdir()
        (settings / "runs" / f"{entry}_s0" / "metrics.jsonl").write_text(
            "\n".join(json.dumps(_rec(i, **{"timing/step": 9.0 if i == 0 else 2.0})) for i in range(3)))
    (settings / "runs" / "logs" / "sft_math_base.log").write_text(
        'x\n{"sft": {"solver_model+verifier_model": {"seconds": 10.0, "steps": 100}}}\n')
    for n, s_per_step in ((1, 1.0), (2, 1.2)):
        folder = tmp_path / f"lanes{n}"
        (folder / "runs").mkdir(parents=True)
        (folder / "prepared.json").write_text(json.dumps({"grid": "experiments/grids/cpu.yaml", "steps": 3,
                                                           "sft_steps": 100, "copies": n, "only": "x"}))
        for c in range(n):
            (folder / "runs" / f"x_c{c}_s0").mkdir()
            (folder / "runs" / f"x_c{c}_s0" / "metrics.jsonl").write_text(
                "\n".join(json.dumps(_rec(i, **{"timing/step": s_per_step})) for i in range(3)))
    rep = report(tmp_path, cpu_minutes=60.0)
    assert rep["concurrency"]["best_lanes"] == 2  # 1/1.0 -> 2/1.2 = 1.67 steps/s
    lanes = auto_jobs(*hardware("auto")[:2])
    steps = sum(load_config(ROOT / r.config, r.overrides).train.steps for r in cpu.runs)
    est = rep["cpu-settings"]["estimate"]
    assert est["rl_minutes"] == pytest.approx(steps * 2.0 / lanes / 60) and est["unmeasured_runs"] == 0
    full_sft = load_config(ROOT / "experiments/configs/cpu/math_base.yaml").sft.steps
    assert est["sft_minutes"] == pytest.approx(10.0 * full_sft / 100 / 60)
    assert est["speedup_vs_2_cores"] == pytest.approx(60.0 / (est["rl_minutes"] + est["sft_minutes"]))
