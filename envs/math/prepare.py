"""Prepare the math data a run needs: ``<out>/<set>.jsonl`` in the Task schema, plus ``prepare_report.json``.

    python -m envs.math.prepare                         # local shared files -> data_cache/math/
    python -m envs.math.prepare --source hf             # the reference's Hugging Face hub sets

Steps: load the test sets, then for each train set drop problems that also occur in any test set (exact
match after ``normalize_problem_text``) and repeated problems (first copy kept; copies that disagree on the
answer are all dropped unless ``--keep-conflicting``). With the local files, DAPO-17k (17,917 rows) loses 10
test problems (5 AMC23, 4 MATH-500, 1 OlympiadBench), 719 extra copies of repeated problems and the 24 copies
of 12 problems whose copies disagree on the answer: 17,164 rows remain.

``--source hf`` downloads with the ``datasets`` package (imported only there; install it with
``pip install datasets``). That path needs internet and is not covered by the test suite.
"""
from __future__ import annotations

import argparse
import json
import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Sequence

from drmas.io import atomic_write_json
from envs.base import Task
from envs.math.data import (MATH_SETS, PAPER_TEST_SETS, load_benchmark, load_hub, prepared_dir,
                            write_tasks_jsonl)
from envs.math.answers import normalize_answer

logger = logging.getLogger(__name__)


def normalize_problem_text(text: str) -> str:
    """Problem text key for overlap and duplicate checks: whitespace runs collapsed, lower-cased."""
    return " ".join(text.split()).lower()


def remove_test_overlaps(train: Sequence[Task],
                         test_sets: dict[str, Sequence[Task]]) -> tuple[list[Task], dict[str, int]]:
    """Drop train tasks whose normalized problem text occurs in a test set.

    Returns the kept tasks and, per test set, how many of its problems were found in ``train``.
    """
    train_keys = {normalize_problem_text(t.question) for t in train}
    test_keys: set[str] = set()
    overlaps: dict[str, int] = {}
    for name, tasks in test_sets.items():
        keys = {normalize_problem_text(t.question) for t in tasks}
        overlaps[name] = len(keys & train_keys)
        test_keys |= keys
    kept = [t for t in train if normalize_problem_text(t.question) not in test_keys]
    return kept, overlaps


def dedupe_tasks(tasks: Sequence[Task], drop_conflicting: bool = True) -> tuple[list[Task], dict[str, int]]:
    """Keep the first task of each normalized problem text.

    A problem whose copies have different answers (compared after ``normalize_answer``) is ambiguous; with
    ``drop_conflicting`` all its copies are dropped. Returns the kept tasks and counts
    ``{"duplicates_removed", "conflicting_problems", "conflicting_rows_removed"}``.
    """
    keys = [normalize_problem_text(t.question) for t in tasks]
    answers_by_key: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for key, task in zip(keys, tasks):
        answers_by_key[key].add(tuple(normalize_answer(a) for a in task.answers))
    conflicting = {key for key, answers in answers_by_key.items() if len(answers) > 1}
    copies = Counter(keys)
    seen: set[str] = set()
    kept: list[Task] = []
    for key, task in zip(keys, tasks):
        if key in seen or (drop_conflicting and key in conflicting):
            continue
        seen.add(key)
        kept.append(task)
    conflicting_rows = sum(copies[k] for k in conflicting) if drop_conflicting else 0
    counts = {"duplicates_removed": len(tasks) - len(kept) - conflicting_rows,
              "conflicting_problems": len(conflicting), "conflicting_rows_removed": conflicting_rows}
    return kept, counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``drmas data prepare math`` / ``python -m envs.math.prepare``."""
    parser.add_argument("--source", choices=("local", "hf"), default="local",
                        help="local: the shared jsonl files; hf: download from the Hugging Face hub (needs `datasets`)")
    parser.add_argument("--shared-dir", type=Path, default=None,
                        help="folder holding math/<set>/*.jsonl (default: $DRMAS_SHARED_DATA or ../shared/data)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: data_cache/math)")
    parser.add_argument("--train", nargs="*", default=None, choices=sorted(MATH_SETS), metavar="SET",
                        help="train sets (default: dapo17k for local, dapo_filter for hf)")
    parser.add_argument("--test", nargs="*", default=list(PAPER_TEST_SETS), choices=sorted(MATH_SETS),
                        metavar="SET", help=f"test sets (default: the paper's {', '.join(PAPER_TEST_SETS)})")
    parser.add_argument("--sampled-math500", type=int, default=50,
                        help="also write math500_sampled.jsonl with this many first MATH500 rows (0: skip)")
    parser.add_argument("--keep-overlaps", action="store_true", help="do not remove test problems from train sets")
    parser.add_argument("--keep-conflicting", action="store_true",
                        help="keep the first copy of a repeated train problem even when copies disagree on the answer")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the prepared files; return (and log) the report of rows and removals."""
    out_dir = prepared_dir(args.out)
    train_names = args.train if args.train is not None else (["dapo17k"] if args.source == "local" else ["dapo_filter"])

    def load(name: str) -> list[Task]:
        return load_benchmark(name, args.shared_dir) if args.source == "local" else load_hub(name)

    test_sets = {name: load(name) for name in args.test}
    report: dict[str, Any] = {"source": args.source, "out_dir": str(out_dir), "files": {}, "train": {}}
    for name, tasks in test_sets.items():
        path = out_dir / f"{name}.jsonl"
        report["files"][name] = {"path": str(path), "rows": write_tasks_jsonl(tasks, path)}
    if args.sampled_math500 > 0 and "math500" in test_sets:
        path = out_dir / "math500_sampled.jsonl"
        n = write_tasks_jsonl(test_sets["math500"][:args.sampled_math500], path)
        report["files"]["math500_sampled"] = {"path": str(path), "rows": n}
    overlap_sets = {name: tasks for name, tasks in test_sets.items() if name != "math500_sampled"}
    for name in train_names:
        tasks = load(name)
        entry: dict[str, Any] = {"rows_in": len(tasks)}
        if not args.keep_overlaps:
            tasks, overlaps = remove_test_overlaps(tasks, overlap_sets)
            entry["test_overlaps"] = overlaps
            entry["overlap_rows_removed"] = entry["rows_in"] - len(tasks)
        tasks, dedupe_counts = dedupe_tasks(tasks, drop_conflicting=not args.keep_conflicting)
        entry.update(dedupe_counts)
        path = out_dir / f"{name}.jsonl"
        entry["rows_out"] = write_tasks_jsonl(tasks, path)
        report["files"][name] = {"path": str(path), "rows": entry["rows_out"]}
        report["train"][name] = entry
        logger.info("math train set %s: %d rows in, test overlaps %s, %d repeats removed, %d conflicting "
                    "problems (%d rows) dropped, %d rows written to %s", name, entry["rows_in"],
                    entry.get("test_overlaps", "kept"), dedupe_counts["duplicates_removed"],
                    dedupe_counts["conflicting_problems"], dedupe_counts["conflicting_rows_removed"],
                    entry["rows_out"], path)
    atomic_write_json(out_dir / "prepare_report.json", report, indent=2)
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m envs.math.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    report = run(parser.parse_args(argv))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
