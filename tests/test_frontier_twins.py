"""Every twin pair of the frontier round (and its pilot) shares its step-0 rollout (docs/frontier.md, "Twins").

Twins are the GRPO and Dr. MAS runs of one (arm, level, seed); each run logs ``rollout/digest`` at every step.
A pair whose step-0 digests differ was drawn on different machines and is re-run before the analysis."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND_DIRS = ("results/runs/frontier_pilot", "results/runs/frontier")


def _step0_digest(run: Path) -> int | None:
    with (run / "metrics.jsonl").open() as fh:
        first = json.loads(fh.readline() or "{}")
    return first.get("rollout/digest") if first.get("step") == 0 else None


def _twin_pairs(grid_dir: Path) -> dict[tuple, dict[str, Path]]:
    index = json.loads((grid_dir / "index.json").read_text())
    pairs: dict[tuple, dict[str, Path]] = defaultdict(dict)
    for run in index["runs"]:
        folder = grid_dir / run["run"]
        if run.get("status") == "done" and (folder / "metrics.jsonl").is_file():
            pairs[(run.get("arm"), float(run["level"]), int(run["seed"]))][run["estimator"]] = folder
    return {k: v for k, v in pairs.items() if len(v) == 2}


@pytest.mark.parametrize("grid_dir", ROUND_DIRS)
def test_every_finished_twin_pair_shares_its_step0_rollout(grid_dir):
    folder = ROOT / grid_dir
    if not (folder / "index.json").is_file():
        pytest.skip(f"{grid_dir} holds no runs yet (docs/frontier.md)")
    pairs = _twin_pairs(folder)
    if not pairs:
        pytest.skip(f"{grid_dir}: no finished twin pair yet")
    differ = {key: {est: _step0_digest(run) for est, run in twins.items()} for key, twins in pairs.items()}
    differ = {key: d for key, d in differ.items() if len(set(d.values())) != 1 or None in d.values()}
    assert not differ, f"twin pairs whose step-0 rollouts differ (re-run both twins on one machine): {differ}"
