"""Copy a grid's finished runs out of the folder where it runs, records only, with an index that agrees with them:

    python -m experiments.publish ../round/results/runs/frontier results/runs/frontier

A long grid runs over several sittings in a worktree at its own commit (docs/frontier.md); its finished runs are
committed from another checkout as they come in. Copying the folder by hand copies an index that also lists the runs
still in flight ("partial"), whose folders are not copied: the analysis then reads a run the index promises and no
folder holds. This command copies each finished run's records (:data:`RECORDS`: manifest, config, metrics,
evaluations, ``DONE``; not its checkpoints, TensorBoard files, logs or summaries) and writes the destination's
``index.json`` from the source's, listing every run the destination does not hold as not started (``todo``, no wall
time) and every finished run as done (one that finished after its runner was stopped, before the runner wrote its
row, keeps the rest of the source's row: no wall time where the runner recorded none). It refuses, before copying
anything, where a run the destination holds differs from the source's (a finished run's records do not change: one
of the two folders is not what it seems) or where the destination holds a folder the source has not finished. It
reads the grid the destination would be with :func:`analysis.runs.load_grid` before it changes the destination, and
stops, leaving it as it was, where a finished run there cannot be used, naming why; notes on usable runs (training
its ``DONE`` marker calls degenerate, as a collapsed run's often is) are outcomes the report lists, and are logged.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from analysis.run_records import NOT_STARTED, GridLoadError
from analysis.runs import load_grid
from drmas.io import atomic_write_json
from experiments.grid_runs import GridError, read_index

logger = logging.getLogger("experiments.publish")


RECORDS = ("manifest.json", "config.yaml", "metrics.jsonl", "eval.jsonl", "DONE")
"""A run's records, the files `drmas train` writes at the top of its folder for the analysis (``eval.jsonl`` is absent
where ``train.evaluate`` is off): what is copied and compared. Checkpoints, TensorBoard files, logs and the outputs of
``drmas summary`` stay behind."""


def record_files(run_dir: Path) -> list[Path]:
    """The :data:`RECORDS` that ``run_dir`` holds."""
    return [run_dir / name for name in RECORDS if (run_dir / name).is_file()]


def plan(src: Path, dst: Path) -> tuple[dict[str, dict], list[str], list[str]]:
    """(``src``'s index rows by run, runs to copy, runs already in ``dst`` with the same records); a
    :class:`GridError` naming every conflict where ``dst`` holds a run whose records differ, or a folder of a run
    ``src`` has not finished."""
    rows = read_index(src)
    if not rows:
        raise GridError(f"{src} has no index.json: not a grid's out_dir (python -m experiments.grid run writes one)")
    new, same, conflicts = [], [], []
    for name in rows:
        source, target = src / name, dst / name
        finished = (source / "DONE").is_file()
        if not target.exists():
            if finished:
                new.append(name)
            continue
        if not finished:
            conflicts.append(f"{name}: {target} exists but the run is not finished in {src}")
            continue
        files = record_files(source)
        _, differ, missing = filecmp.cmpfiles(source, target, [p.name for p in files], shallow=False)
        extra = sorted({p.name for p in record_files(target)} - {p.name for p in files})
        if differ or missing or extra:
            conflicts.append(f"{name}: its records in {dst} differ from {src}'s "
                             f"(differ: {differ}, absent: {missing}, only in {dst}: {extra})")
        else:
            same.append(name)
    unlisted = sorted(p.name for p in dst.iterdir() if p.is_dir() and p.name not in rows) if dst.is_dir() else []
    conflicts += [f"{name}: a folder of {dst} that {src}'s index does not list" for name in unlisted
                  if (dst / name / "manifest.json").exists()]
    if conflicts:
        raise GridError(f"nothing copied: {len(conflicts)} run(s) of {dst} do not match {src}: " + "; ".join(conflicts))
    return rows, new, same


def publish(src: Path, dst: Path) -> dict[str, int]:
    """Copy the finished runs of ``src`` that ``dst`` lacks (records only) and write ``dst/index.json`` from
    ``src``'s with every run ``dst`` does not hold listed as not started; returns the counts. The new runs and the
    index are first put together in a staging folder beside ``dst`` (the runs ``dst`` holds linked in) and read
    there: ``dst`` changes only where the whole grid reads and every finished run can be used."""
    rows, new, same = plan(src, dst)
    finished = set(new) | set(same)
    for name, row in rows.items():
        if name not in finished:
            rows[name] = {**row, "status": NOT_STARTED, "seconds": None}
        elif row.get("status") != "done":  # it finished after the runner last wrote its index (a runner stopped)
            rows[name] = {**row, "status": "done"}
    index = {"grid": json.loads((src / "index.json").read_text()).get("grid", src.name), "runs": list(rows.values())}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dst.name}.publish-", dir=dst.parent) as tmp:
        staged = Path(tmp)
        for name in same:
            (staged / name).symlink_to((dst / name).resolve(), target_is_directory=True)
        for name in new:
            (staged / name).mkdir()
            for path in record_files(src / name):
                shutil.copy2(path, staged / name / path.name)
        atomic_write_json(staged / "index.json", index, indent=1)
        problems = _check_readable(staged, shown_as=dst)
        dst.mkdir(exist_ok=True)
        for name in new:
            os.replace(staged / name, dst / name)
    atomic_write_json(dst / "index.json", index, indent=1)
    if problems:  # notes on usable runs (e.g. degenerate training after a collapse): outcomes, not copy faults
        logger.info("%s: %d note(s) REPORT.md lists under \"Data problems\": %s", dst, len(problems),
                    "; ".join(problems))
    return {"copied": len(new), "already": len(same), "finished": len(finished), "listed": len(rows)}


def _check_readable(grid_dir: Path, shown_as: Path) -> list[str]:
    """The notes :func:`analysis.runs.load_grid` has on ``grid_dir``'s usable runs; a :class:`GridError` naming why
    the grid does not read or which finished runs cannot be used. Messages name ``shown_as`` (the destination) where
    they would name ``grid_dir`` (its staging folder)."""
    def shown(text: str) -> str:
        return text.replace(str(grid_dir), str(shown_as))

    try:
        data = load_grid(grid_dir)
    except GridLoadError as exc:
        raise GridError(shown(f"nothing copied: the grid would not read: {exc}")) from None
    unusable = data.runs[~data.runs["usable"] & (data.runs["status"] != NOT_STARTED)]
    if len(unusable):
        raise GridError(shown(f"nothing copied: {len(unusable)} of the finished run(s) cannot be used: "
                              + "; ".join(f"{r.run}: {r.problem}" for r in unusable.itertuples())))
    return [shown(note) for note in data.problems]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.publish", description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the grid's out_dir where it runs (e.g. in its worktree)")
    parser.add_argument("dst", type=Path, help="the out_dir to commit from")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.src.resolve() == args.dst.resolve():
        print(f"experiments.publish: {args.src} and {args.dst} are the same folder", file=sys.stderr)
        return 2
    try:
        counts = publish(args.src, args.dst)
    except GridError as exc:
        print(f"experiments.publish: {exc}", file=sys.stderr)
        return 2
    logger.info("%s: %d run(s) copied, %d already there; %d of %d listed runs finished, the rest listed as not "
                "started", args.dst, counts["copied"], counts["already"], counts["finished"], counts["listed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
