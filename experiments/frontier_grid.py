"""The frontier round's grids written from its pilot by the pre-registered rules (docs/frontier.md), so that no level
is typed by hand:

    python -m experiments.frontier_grid --pilot results/runs/frontier_pilot          # what the rules say, per arm
    python -m experiments.frontier_grid --pilot results/runs/frontier_pilot --write  # and write it

Per arm, :func:`analysis.frontier.pilot_next` names the step: while the pilot is incomplete nothing is written; an
extension level is appended to ``experiments/grids/frontier_pilot.yaml`` (2 seeds x 2 estimators, the pilot's
seeds); once both arms have their levels, ``experiments/grids/frontier.yaml`` is written: each arm's levels x the
round's 6 seeds x both estimators, plus "where both learn" (non-sharing, 5e-5, seeds 3100-3105). An arm with "no
collapse below 8e-4" has no round entries. The round's file is written once: it is committed before the round's
first run and never rewritten (``--write`` refuses while it exists).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from analysis.frontier import ARM_LABELS, analyze, pilot_next
from analysis.frontier_rules import ARMS, LEARN_SEEDS, ROUND_SEEDS
from analysis.runs import load_grid

logger = logging.getLogger("experiments.frontier_grid")
ROOT = Path(__file__).resolve().parent.parent
PILOT_YAML = ROOT / "experiments" / "grids" / "frontier_pilot.yaml"
ROUND_YAML = ROOT / "experiments" / "grids" / "frontier.yaml"
LEARN_LR = 5e-5
CONFIGS = {"nonsharing": "experiments/configs/cpu/search_base.yaml",
           "sharing": "experiments/configs/cpu/search_sharing.yaml"}
MODEL_KEYS = {"nonsharing": ("verifier_model", "search_model", "answer_model"), "sharing": ("shared",)}
SHORT = {"nonsharing": "non", "sharing": "sha"}
ESTIMATORS = (("trajectory_grpo", "grpo"), ("drmas", "drmas"))
COMMON = ("train.batch_tasks=2, train.steps=200, train.eval_every=25, train.eval_tasks=32, train.eval_samples=4, "
          "train.save_every=10")


def entry(prefix: str, arm: str, estimator: str, lr: float, study: str, seeds: tuple[int, ...] | None = None) -> str:
    """One run entry in the pilot's format (flow style): the arm's config, both estimators' names, every model at
    ``lr``; ``seeds`` where they differ from the spec's defaults."""
    short = dict(ESTIMATORS)[estimator]
    lrs = ", ".join(f"models.{m}.optim.lr={lr:.3e}" for m in MODEL_KEYS[arm])
    seed_text = f", seeds: [{', '.join(map(str, seeds))}]" if seeds else ""
    return (f"  - {{name: {prefix}_{SHORT[arm]}_{short}_lr{lr:g}, config: {CONFIGS[arm]}{seed_text},\n"
            f"     overrides: [algo.estimator={estimator}, {COMMON},\n       {lrs}],\n"
            f"     tags: {{task: search, study: {study}, arm: {arm}, assignment: {arm}, estimator: {estimator}, "
            f"level: {lr:.3e}}}}}\n")


def round_yaml(levels: dict[str, list[float]], pilot_commit: str) -> str:
    """experiments/grids/frontier.yaml from each arm's levels (an arm without levels has no entries)."""
    head = (f"# The frontier round (C6; docs/frontier.md), written by `python -m experiments.frontier_grid --write` from the\n"
            f"# pilot's runs (results/runs/frontier_pilot, {pilot_commit}) by the levels rule, and committed before the\n"
            f"# round's first run. Levels per arm: "
            + "; ".join(f"{ARM_LABELS[a]} {', '.join(f'{v:.3g}' for v in lv) or 'none'}" for a, lv in levels.items())
            + ".\n# Seeds 3000-3005 per cell (both arms, both estimators); \"where both learn\": non-sharing, 5e-5, "
            f"seeds 3100-3105.\n# 200 steps, no early stop; every run at the training commit named in docs/frontier.md.\n"
            "name: frontier\nout_dir: results/runs/frontier\ntwins_together: true\nsft:\n  - experiments/configs/cpu/search_base.yaml\n"
            f"defaults:\n  seeds: [{', '.join(map(str, ROUND_SEEDS))}]\nruns:\n")
    body = "".join(entry("round", arm, est, lr, "frontier") for arm, lv in levels.items() for lr in lv
                   for est, _ in ESTIMATORS)
    body += "".join(entry("learn", "nonsharing", est, LEARN_LR, "frontier_learn", LEARN_SEEDS) for est, _ in ESTIMATORS)
    return head + body


def extension_level(step: str) -> float | None:
    """The level of an "extend upwards/downwards to X" step (None for any other step)."""
    m = re.match(r"extend (?:upwards|downwards) to ([0-9.e-]+)$", step)
    return float(m.group(1)) if m else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pilot", type=Path, default=Path("results/runs/frontier_pilot"))
    parser.add_argument("--write", action="store_true", help="append the extension / write frontier.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (args.pilot / "index.json").is_file():
        logger.error("drmas: %s holds no pilot grid (index.json); run experiments/grids/frontier_pilot.yaml first",
                     args.pilot)
        return 2
    rnd = analyze(load_grid(args.pilot), draws=10, pilot=True)
    steps = {arm: pilot_next(rnd.events, arm, int((rnd.data.runs["assignment"] == arm).sum())) for arm in ARMS}
    for arm, step in steps.items():
        logger.info("%s: %s", ARM_LABELS[arm], step)
    if any(s.startswith("pilot incomplete") for s in steps.values()):
        logger.info("nothing to write until every pilot run has finished")
        return 0
    extend = {arm: lv for arm, s in steps.items() if (lv := extension_level(s)) is not None}
    if extend:
        text = "".join(entry("pilot", arm, est, lr, "frontier_pilot") for arm, lr in extend.items()
                       for est, _ in ESTIMATORS)
        logger.info("extension entries for %s:\n%s", PILOT_YAML.relative_to(ROOT), text)
        if args.write:
            PILOT_YAML.write_text(PILOT_YAML.read_text() + text)
        return 0
    levels = {arm: [float(v) for v in s.removeprefix("levels ").split(", ")] if s.startswith("levels ") else []
              for arm, s in steps.items()}
    if ROUND_YAML.exists():
        logger.error("drmas: %s exists: the round's levels are committed once, before its first run",
                     ROUND_YAML.relative_to(ROOT))
        return 2
    commits = ", ".join(sorted(set(rnd.events["git_commit"].dropna().astype(str).str[:7])))
    text = round_yaml(levels, f"commit {commits}")
    logger.info("%s", text)
    if args.write:
        ROUND_YAML.write_text(text)
        logger.info("wrote %s: commit it before the round's first run", ROUND_YAML.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
