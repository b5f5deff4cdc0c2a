"""One source for a run's settings (analysis/integrity.py ``settings_problems``; docs/reliability.md, "Config
identity"): every analysis reads a run's settings from its manifest's ``config``, and a run whose ``config.yaml``,
cell (task, estimator, seed tags) or index listing (config, overrides, seed) says otherwise is left out and named
under "Data problems" with the keys, by the identity rule of ``drmas train`` (drmas/config/identity.py).

The grid folders are the confirmatory round's synthetic fixture (tests/test_confirm.py) built in ``tmp_path``, with
real settings written into the run folders the way ``drmas train`` writes them (config.yaml and the manifest's
``config``); committed results are never touched."""
from __future__ import annotations

import json
from pathlib import Path

from analysis import confirm
from analysis.runs import load_grid
from drmas.config import dump_config, load_config
from test_confirm import STEPS
from test_confirm import make_grid as make_confirm_grid

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "experiments/configs/cpu/search_base.yaml"
MODELS = ("verifier_model", "search_model", "answer_model")
RUN = "conf_grpo_lr0.0004_s0"


def _overrides(estimator: str, lr: float) -> list[str]:
    """A confirmatory run's overrides of the search config, at the fixture's length (evaluations at 0 and STEPS)."""
    return [f"algo.estimator={estimator}", f"train.steps={STEPS}", f"train.eval_every={STEPS // 2}",
            *(f"models.{m}.optim.lr={lr:g}" for m in MODELS)]


def _with_settings(grid: Path, made_lr: dict[str, float] | None = None) -> Path:
    """Every run folder of ``grid`` gets the settings of its index entry, written as ``drmas train`` writes them
    (config.yaml, the manifest's ``config``), and its entry names them (config, overrides); a run of ``made_lr``
    was made at that learning rate instead."""
    index = json.loads((grid / "index.json").read_text())
    for entry in index["runs"]:
        entry.update(config=CONFIG, overrides=_overrides(entry["estimator"], entry["level"]))
        lr = (made_lr or {}).get(entry["run"], entry["level"])
        made = load_config(ROOT / CONFIG, [f"name={entry['run']}", f"out_dir={grid}", f"train.seed={entry['seed']}",
                                           *_overrides(entry["estimator"], lr)])  # as the grid runner starts the run
        folder = grid / entry["run"]
        (folder / "config.yaml").write_text(dump_config(made))
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**manifest, "config": json.loads(made.model_dump_json())}))
    (grid / "index.json").write_text(json.dumps(index))
    return grid


def _problem_of(data, run: str) -> str:
    return data.runs.set_index("run").loc[run, "problem"]


def test_consistent_settings_are_no_problem(tmp_path):
    data = load_grid(_with_settings(make_confirm_grid(tmp_path / "conf", seeds=[0])))
    assert data.runs["usable"].all() and data.problems == []


def test_a_run_made_at_another_learning_rate_than_its_listing_is_left_out_and_named(tmp_path):
    """The --stale keep case: a finished run made at lr 1e-4 listed in index.json at 4e-4. The confirmatory analysis
    leaves it out (5 of 6 runs, every verdict incomplete) and its summary names it under Data problems with the
    keys, rather than giving the output of a run made at 4e-4."""
    grid = _with_settings(make_confirm_grid(tmp_path / "conf", seeds=[0]), made_lr={RUN: 1e-4})
    data = load_grid(grid)
    assert not data.runs.set_index("run").loc[RUN, "usable"]
    said = ("index.json lists it under other settings than it was made with (models.answer_model.optim.lr (0.0001 -> "
            "0.0004); models.search_model.optim.lr (0.0001 -> 0.0004); models.verifier_model.optim.lr (0.0001 -> 0.0004))")
    assert said in _problem_of(data, RUN)
    an = confirm.analyze(data, n_boot=50)
    assert (an.finished, an.total) == (5, 6) and RUN not in set(an.events["run"])
    assert an.verdicts and all(v.startswith("incomplete (5 of 6 runs): ") for v in an.verdicts.values())
    summary = confirm.summary_markdown(an, grid)
    assert f"- {RUN}: {said}; not used" in summary


def test_config_yaml_that_disagrees_with_the_manifest_and_a_run_in_another_cell_are_data_problems(tmp_path):
    """The manifest's ``config`` is the source; a config.yaml that says otherwise, an index entry whose estimator tag
    is not the run's estimator, and a finished run listed at more steps than it made each make the run unusable
    with a line naming the keys."""
    grid = _with_settings(make_confirm_grid(tmp_path / "conf", seeds=[0]))
    other, longer = "conf_drmas_lr0.0004_s0", "conf_drmas_lr0.00028_s0"
    saved = grid / RUN / "config.yaml"
    saved.write_text(saved.read_text().replace("clip_high: 0.28", "clip_high: 0.2"))
    index = json.loads((grid / "index.json").read_text())
    next(e for e in index["runs"] if e["run"] == other)["estimator"] = "trajectory_grpo"
    next(e for e in index["runs"] if e["run"] == longer)["overrides"].append(f"train.steps={STEPS + 20}")
    (grid / "index.json").write_text(json.dumps(index))
    data = load_grid(grid)
    assert "its config.yaml disagrees with its manifest.json config (algo.clip_high (0.28 -> 0.2))" in _problem_of(data, RUN)
    assert ("index.json puts it in another cell than its settings say (estimator ('drmas' -> 'trajectory_grpo'))"
            in _problem_of(data, other))
    assert (f"index.json lists it under other settings than it was made with (train.steps ({STEPS} -> {STEPS + 20}))"
            in _problem_of(data, longer))
    assert sorted(line.split(":")[0] for line in data.problems) == sorted([RUN, other, longer])
    manifest = {**json.loads((grid / RUN / "manifest.json").read_text()), "config_hash": "0" * 64}
    (grid / RUN / "manifest.json").write_text(json.dumps(manifest))
    saved.unlink()  # a folder drmas train wrote (its manifest records a config_hash) without config.yaml
    assert "its config.yaml is missing (drmas train writes it with manifest.json)" in _problem_of(load_grid(grid), RUN)
    del manifest["config"]
    (grid / RUN / "manifest.json").write_text(json.dumps(manifest))
    assert "its manifest.json records no config (the source of its settings)" in _problem_of(load_grid(grid), RUN)
