"""Experiment grids and ablation sweeps: a resumable runner of ``drmas train`` jobs.

    python -m experiments.grid run experiments/grids/cpu.yaml [--seeds N] [--only PATTERN] [--jobs auto|N]
                                   [--device auto|cpu|cuda] [--ray ADDRESS]
    python -m experiments.grid list experiments/grids/cpu.yaml
    python -m experiments.grid sweep CONFIG --set algo.estimator=drmas,trajectory_grpo --set train.group_size=4,8
                                   [--seeds N] [--name NAME] [--out results/runs/sweeps]

What a grid is and where its runs stand (the spec and its validation before any work, a run's status from its
folder, the "same run" rule, ``index.json``) is :mod:`experiments.grid_runs`; this module computes the runs that are
not complete. ``--seeds`` below 1 and an ``--only`` that selects no run are errors. A complete run is skipped, a run
with a checkpoint resumes from it (``drmas train`` does that; also a finished run asked for more steps), so the
runner can be interrupted and restarted at any point. A folder made with another config than the grid gives now is
neither skipped nor resumed: the runner stops and lists the changed keys (``--stale rerun`` moves such folders
aside; ``--stale keep`` leaves them, and a finished one stays a result of the settings it was made with only:
index.json lists it ``stale``). Runs execute as subprocesses, ``--jobs`` at a time (one torch thread each: on 2
cores, two runs take the time of one). ``--jobs auto`` takes the number from the hardware (:func:`auto_jobs`): one
run per core on the CPU, several runs sharing each GPU on a GPU machine (runs are spread over the GPUs with
``CUDA_VISIBLE_DEVICES``). ``--device`` (default ``auto``: a GPU when torch sees one) is handed to every run as
``train.device``; a run folder made on another device is the same run (``train.device`` is not part of a run's
identity). ``--ray ADDRESS`` runs every command as a Ray task on that cluster instead (:class:`RayLauncher`): same
queue, index and run folders; Ray places each run by its CPU/GPU needs.
``kill -USR1 <runner's pid>`` ends a sitting without losing work (:data:`DRAIN_SIGNAL`): no new run starts, the
running ones finish, the index is written and the runner exits 0 naming the runs left for the next call (SIGTERM
stops at once: a run in flight resumes from its last checkpoint, where its folder is kept).
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from drmas.config.identity import STALE_POLICIES
from drmas.locks import FolderLocked, describe_holder, folder_lock, live_holder
from drmas.progress import reader_left
from drmas.shutdown import children_end_with_me, die_with_parent
from experiments.grid_runs import (STALE, Grid, GridError, Run, checkpoints_ready, device_overrides, load_grid,
                                   read_index, refuse_unbuilt, select_runs, set_aside_stale, stale_changes, status_of,
                                   summary_line, sweep_grid, warm_ups_needed, write_index)
from experiments.grid_spec import ROOT

logger = logging.getLogger("experiments.grid")


DEVICES = ("auto", "cpu", "cuda")


RUNS_PER_GPU = 8
"""Concurrent runs per GPU under ``--jobs auto``. Measured on one H200 with the CPU grid's math setting (issue
15): 2 runs at once 0.76 s/step each, 8 runs 1.1-1.2 s/step each, i.e. 8 lanes give ~2.6x the throughput of 2
(GPU generation is launch-bound at these model sizes, so runs overlap well). experiments/gpu_device_check.sh
measures 1, 2, 4 and 8 lanes again on the machine at hand."""


def auto_jobs(cores: int, gpus: int, runs_per_gpu: int = RUNS_PER_GPU) -> int:
    """How many runs of a grid go at once: one per CPU core on a CPU machine (one torch thread each); with
    ``gpus`` > 0, ``runs_per_gpu`` per GPU, but never more than the cores (every run keeps one core busy
    with Python and kernel launches)."""
    if cores < 1 or gpus < 0 or runs_per_gpu < 1:
        raise GridError(f"auto_jobs: need cores >= 1, gpus >= 0, runs_per_gpu >= 1 (got {cores}, {gpus}, {runs_per_gpu})")
    return cores if gpus == 0 else max(1, min(cores, gpus * runs_per_gpu))


def hardware(device: str) -> tuple[int, int, str]:
    """(usable CPU cores, GPUs the runs will use, a line naming them) for ``--device``."""
    import torch

    from drmas.devices import cpu_cores, resolve_device

    cores = cpu_cores()
    try:
        resolved = resolve_device(device)
    except ValueError as exc:
        raise GridError(f"--device {device}: {exc}") from None
    if resolved.type != "cuda":
        return cores, 0, f"cpu ({cores} cores, one torch thread per run)"
    gpus = 1 if resolved.index is not None else torch.cuda.device_count()  # (no CUDA context in this process)
    return cores, gpus, f"{resolved} ({gpus} GPU(s) in use; {cores} CPU cores)"


def least_busy_gpu(gpus: int, busy: list[int]) -> int:
    """The GPU (0 .. gpus-1) running the fewest of the runs on ``busy`` GPUs (the lowest index on a tie)."""
    return min(range(gpus), key=lambda g: (busy.count(g), g))


def parse_seeds(text: str) -> int:
    """``--seeds``: the number of seeds per entry, >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give the number of seeds per entry, >= 1 (the runs take "
                                         "seeds 0 .. N-1); leave it out to use the spec's seeds")
    return int(text)


def parse_jobs(text: str) -> int | str:
    """``--jobs``: a positive number or ``auto``."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs {text!r}: give a number >= 1 or 'auto'")
    return int(text)


class LocalLauncher:
    """Runs the grid's commands as subprocesses of this machine (the default)."""

    @staticmethod
    def hardware(device: str) -> tuple[int, int, str]:
        return hardware(device)

    @staticmethod
    def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """``cmd`` in the repository root, its output appended to ``log``, ``env`` added to this environment.
        The child gets SIGTERM when the runner dies, even by SIGKILL (:func:`die_with_parent`), and ends its
        own children in turn (``drmas.shutdown``): no run goes on as an orphan."""
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=log.open("a"), stderr=subprocess.STDOUT,
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))


def _run_logged(cmd: list[str], cwd: str, log: str, env: dict[str, str]) -> int:
    """Body of a grid run's Ray task: the command on the node Ray chose, output appended to ``log``."""
    with open(log, "a") as fh:
        return subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT).returncode


class RayTask:
    """A grid command running as a Ray task, with the two calls of ``subprocess.Popen`` the runner uses."""

    def __init__(self, ref: Any):
        self.ref, self.returncode = ref, None

    def poll(self) -> int | None:
        import ray

        if self.returncode is None and ray.wait([self.ref], timeout=0)[0]:
            try:
                self.returncode = int(ray.get(self.ref))
            except ray.exceptions.RayError as exc:  # the task's worker or node died
                logger.error("[grid] ray task failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                self.returncode = -1
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.5)
        return int(self.returncode)


class RayLauncher:
    """Runs the grid's commands as tasks on a Ray cluster (``ray start --head`` on one node, ``ray start
    --address=...`` on the others; ``local`` starts a head in this process): each ``drmas train`` / ``drmas sft``
    is a task needing 1 CPU and, when the runs train on GPUs, 1 / ``RUNS_PER_GPU`` of a GPU (Ray sets its
    ``CUDA_VISIBLE_DEVICES``). Ray places the tasks; the runner keeps its queue, index and run folders, which
    must be on a filesystem every node sees (same repository path and Python on every node)."""

    def __init__(self, address: str, device: str):
        import ray

        if not ray.is_initialized():
            ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        resources = ray.cluster_resources()
        self.cpus, self.gpus = int(resources.get("CPU", 1)), int(resources.get("GPU", 0))
        self.gpu_share = 1.0 / RUNS_PER_GPU if self.gpus and device != "cpu" else 0.0
        self._remote = ray.remote(_run_logged).options(num_cpus=1, num_gpus=self.gpu_share, max_retries=0)
        logger.info("[grid] ray cluster %s: %d CPUs, %d GPUs", address, self.cpus, self.gpus)

    def hardware(self, device: str) -> tuple[int, int, str]:
        gpus = self.gpus if device != "cpu" else 0
        return self.cpus, gpus, f"ray cluster: {self.cpus} CPUs, {gpus} GPU(s) used (1/{RUNS_PER_GPU} GPU per run)"

    def start(self, cmd: list[str], log: Path, env: dict[str, str]) -> RayTask:
        return RayTask(self._remote.remote(cmd, str(ROOT), str(log.resolve()), env))


def _start_warm_up(grid: Grid, runs: list[Run], device: str,
                   launcher: "LocalLauncher | RayLauncher") -> list[tuple[str, Path, Any]]:
    """Start the SFT warm-up of every ``sft`` config of the grid that builds a missing checkpoint one of
    ``runs`` starts from, all at once, in the background (each ``drmas sft`` runs its own checkpoints in
    parallel processes and returns at once when they exist; two warm-ups of one task source serialize on a
    lock in drmas/trainer/warmup.py). ``--only math_*`` warms up only the math base."""
    procs = []
    for config in warm_ups_needed(grid, runs):
        log = grid.out_dir / "logs" / f"sft_{Path(config).stem}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        logger.info("[grid] SFT warm-up: %s (log: %s)", config, log)
        cmd = [sys.executable, "-m", "drmas.cli", "sft", config, *device_overrides(device), "--no-progress"]
        procs.append((config, log, launcher.start(cmd, log, {})))
    return procs


@dataclass(frozen=True)
class GridOptions:
    """How :func:`run_grid` runs a grid: the flags of ``python -m experiments.grid run`` (and ``sweep``)."""

    jobs: int | str = 2
    """runs at a time, or ``auto`` (:func:`auto_jobs`)"""
    only: str | None = None
    """fnmatch pattern(s) on run names, comma-separated (None: every run)"""
    dry_run: bool = False
    """print the commands of the runs to compute and run nothing"""
    stale: str = "error"
    """what to do with run folders made with another config (:func:`set_aside_stale`)"""
    device: str = "auto"
    """every run's ``train.device`` (``auto``: the configs' own)"""
    ray_address: str | None = None
    """run every command as a task on this Ray cluster (:class:`RayLauncher`; ``local`` starts a local head)
    instead of as a subprocess of this machine"""
    summary: Path | None = None
    """a file that gets one line appended: what the call computed and what it reused (:func:`summary_line`)"""

    def __post_init__(self) -> None:
        if self.stale not in STALE_POLICIES:
            raise GridError(f"stale={self.stale!r}; use one of {STALE_POLICIES}")
        if self.device not in DEVICES:
            raise GridError(f"device={self.device!r}; use one of {DEVICES}")


@dataclass(frozen=True)
class Lanes:
    """Where the runs of a grid go and how many at once."""

    jobs: int
    """runs (and warm-ups) at a time"""
    gpus: int
    """GPUs the runs use (0: CPU)"""
    device: str
    """every run's ``train.device`` (``auto``: the configs' own)"""
    launcher: Any
    """:class:`LocalLauncher` or :class:`RayLauncher`"""


def options_from(args: argparse.Namespace) -> GridOptions:
    """The :class:`GridOptions` of parsed ``run`` / ``sweep`` arguments."""
    return GridOptions(jobs=args.jobs, only=args.only, dry_run=args.dry_run, stale=args.stale, device=args.device,
                       ray_address=args.ray_address, summary=args.summary)


def run_grid(grid: Grid, options: GridOptions = GridOptions()) -> dict[str, str]:
    """:func:`_run_grid` holding the lock of ``grid.out_dir`` (a second runner on it stops at once with
    ``FolderLocked`` naming the first), and ending every child process on SIGTERM/SIGINT."""
    if options.dry_run:
        return _run_grid(grid, options)
    if not grid.out_dir.exists():  # nothing holds it yet: a grid that cannot start is refused before the lock makes it
        refuse_unbuilt(grid, select_runs(grid, options.only))
    with folder_lock(grid.out_dir, "grid out_dir"), children_end_with_me(), drain_on_signal() as drain:
        return _run_grid(grid, options, drain)


DRAIN_SIGNAL = signal.SIGUSR1
"""Sent to the runner (``kill -USR1 <pid>``, not to its process group: a run's default action on SIGUSR1 is to end):
it starts no new run and stops once the running ones (and warm-ups) have finished."""


@contextmanager
def drain_on_signal() -> Iterator[threading.Event]:
    """While inside, :data:`DRAIN_SIGNAL` sets the event it yields (must be entered in the main thread)."""
    drain = threading.Event()

    def handler(_signum: int, _frame: object) -> None:
        if not drain.is_set():
            logger.warning("[grid] SIGUSR1: no new run starts; the grid stops once the running ones have finished")
        drain.set()

    previous = signal.signal(DRAIN_SIGNAL, handler)
    try:
        yield drain
    finally:
        signal.signal(DRAIN_SIGNAL, previous)


def grid_lanes(grid: Grid, options: GridOptions) -> Lanes:
    """The launcher, GPUs and lanes ``options`` give on this machine or Ray cluster (a local launcher for a dry
    run); a grid that needs GPUs where none is in use is an error, except for a dry run."""
    launcher = RayLauncher(options.ray_address, options.device) if options.ray_address and not options.dry_run \
        else LocalLauncher()
    cores, gpus, where = launcher.hardware(options.device)
    if grid.requires_gpu and not options.dry_run and not gpus:
        raise GridError(f"grid {grid.name!r} needs GPUs and none is in use ({where}); run it on a GPU machine "
                        "(docs/gpu.md) or pass --dry-run to list its commands")
    jobs = auto_jobs(cores, gpus) if options.jobs == "auto" else int(options.jobs)
    logger.info("[grid] device: %s; %d run(s) at a time", where, jobs)
    return Lanes(jobs=jobs, gpus=gpus, device=options.device, launcher=launcher)


def _run_grid(grid: Grid, options: GridOptions, drain: threading.Event | None = None) -> dict[str, str]:
    """Run every incomplete run of ``grid`` that ``options.only`` selects, after applying ``options.stale`` to
    the folders made with another config (:func:`set_aside_stale`); a dry run prints their commands instead.
    Returns run name -> error for the runs that failed; the others are complete. With ``options.summary``,
    appends :func:`summary_line` to that file.

    Scheduling: the warm-ups start first, each holding one of the lanes while it runs; a run starts on a
    free lane as soon as its checkpoints exist (queue order otherwise), so search runs go while the math
    base is still being trained. With the spec's `twins_together`, twins start side by side (a free lane waits for
    its twin's: :func:`unstarted_twins`). Once ``drain`` is set (:func:`drain_on_signal`) no new run starts."""
    selected = select_runs(grid, options.only)
    lanes = grid_lanes(grid, options)
    kept: dict[str, list[str]] = {}
    if not options.dry_run:
        read_index(grid.out_dir)  # an index that cannot be read stops the runner before any work
        kept = set_aside_stale(grid, selected, options.stale)
    todo = [r for r in selected if status_of(grid, r) != "done"]
    refuse_unbuilt(grid, todo)
    if options.dry_run:
        for r in todo:
            print(" ".join(r.command(grid.out_dir, options.device)))
        return {}
    kept_done = [r for r in selected if r.name in kept and r not in todo]
    reused = len(selected) - len(todo) - len(kept_done)
    logger.info("[grid] %s: %d run(s) already complete (reused), %d to compute", grid.name, reused, len(todo))
    failed = _run_todo(grid, todo, lanes, drain) if todo else {}
    if not todo:
        write_index(grid, {}, {})
    left = not_computed(grid, todo, failed)
    if left:
        logger.warning("[grid] %s: stopped with %d run(s) not computed (%s%s); the same command computes them",
                       grid.name, len(left), ", ".join(left[:3]), " ..." if len(left) > 3 else "")
    line = summary_line(grid, len(todo) - len(failed) - len(left), reused, len(failed), len(kept_done))
    logger.info("[grid] %s", line)
    if options.summary is not None:
        with open(options.summary, "a") as fh:
            fh.write(line + "\n")
    return failed


def not_computed(grid: Grid, runs: list[Run], failed: dict[str, str]) -> list[str]:
    """The runs of ``runs`` neither complete nor failed: those a drained call (:data:`DRAIN_SIGNAL`) left for the next."""
    return [r.name for r in runs if r.name not in failed and status_of(grid, r) != "done"]


TWIN_FREE_TAGS = ("estimator", "entry")
"""The tags in which twins differ: the same cell and seed under another estimator."""


def unstarted_twins(grid: Grid, run: Run, queue: list[Run]) -> list[Run]:
    """The twins of ``run`` waiting in ``queue`` when neither it nor any of them has started (no ``metrics.jsonl``):
    they must start together, so that every twin draws its step-0 rollout in the same sitting on the same machine
    (floating-point results depend on the CPU: docs/frontier.md, "Twins"). Empty where the grid does not ask for
    it, or where one of them started in an earlier sitting (then nothing is gained by waiting)."""
    if not grid.twins_together:
        return []
    key = lambda r: sorted((k, str(v)) for k, v in r.tags.items() if k not in TWIN_FREE_TAGS)  # noqa: E731
    mates = [r for r in queue if r is not run and key(r) == key(run)]
    started = any((grid.out_dir / r.name / "metrics.jsonl").exists() for r in (run, *mates))
    return [] if started else mates


def _run_todo(grid: Grid, todo: list[Run], lanes: Lanes, drain: threading.Event | None = None) -> dict[str, str]:
    """Run ``todo`` on ``lanes`` (warm-ups first) until it is done or ``drain`` is set and the running ones have
    finished; returns run name -> error for the runs that failed."""
    drain = drain or threading.Event()
    jobs, gpus, launcher = lanes.jobs, lanes.gpus, lanes.launcher
    warming = _start_warm_up(grid, todo, lanes.device, launcher)
    timings: dict[str, float] = {}
    failed: dict[str, str] = {}
    running: list[tuple[Run, Any, float, Path]] = []
    gpu_of: dict[str, int] = {}  # run name -> GPU index (machines with several GPUs)
    queue = list(todo)
    held: list[Run] = []  # runs whose folder a live process holds (a runner before this one left it running)
    t_start = time.perf_counter()
    while (queue and not drain.is_set()) or running or held:
        for run in list(held):  # once its holder is gone, the run is complete or goes back to the queue
            if live_holder(grid.out_dir / run.name) is None:
                held.remove(run)
                if status_of(grid, run) == "done":
                    logger.info("[grid] %s was completed by the process that held it", run.name)
                else:
                    queue.insert(0, run)
        for item in list(warming):
            config, log, proc = item
            if proc.poll() is not None:
                warming.remove(item)
                if proc.returncode != 0:
                    raise RuntimeError(f"SFT warm-up of {config} failed (exit {proc.returncode}); see {log}")
                logger.info("[grid] SFT warm-up of %s complete", config)
        while queue and not drain.is_set() and len(running) + len(warming) < jobs:
            ready = next((r for r in queue if checkpoints_ready(r)), None)
            if ready is None:
                if not warming:
                    missing = ", ".join(r.name for r in queue[:3])
                    raise RuntimeError(f"runs {missing} ... start from checkpoints that no warm-up builds; add their "
                                       "config to the grid's `sft` list or fix the model paths")
                break
            mates = unstarted_twins(grid, ready, queue)
            free = jobs - len(running) - len(warming)
            if mates and free < 1 + len(mates) and jobs >= 1 + len(mates):
                break  # a lane waits for its twin's lane: twins start side by side
            queue.remove(ready)
            for mate in reversed(mates):  # the twins go next, on the lanes that are free now
                queue.remove(mate)
                queue.insert(0, mate)
            if (holder := live_holder(grid.out_dir / ready.name)) is not None:
                held.append(ready)
                logger.warning("[grid] %s is being run by %s; waiting for it (not started twice, not failed)",
                               ready.name, describe_holder(holder))
                continue
            log = grid.out_dir / "logs" / f"{ready.name}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            lane_env = {"PYTHONHASHSEED": "0"}
            if gpus > 1 and isinstance(launcher, LocalLauncher):  # the run sees only the least busy GPU, as "cuda"
                gpu_of[ready.name] = least_busy_gpu(gpus, [gpu_of[r.name] for r, *_ in running])
                lane_env["CUDA_VISIBLE_DEVICES"] = str(gpu_of[ready.name])
            proc = launcher.start(ready.command(grid.out_dir, lanes.device), log, lane_env)
            running.append((ready, proc, time.perf_counter(), log))
            logger.info("[grid] start %s (%d/%d; log %s)", ready.name, len(todo) - len(queue), len(todo), log)
        time.sleep(1.0)
        for item in list(running):
            run, proc, t0, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            timings[run.name] = time.perf_counter() - t0
            if proc.returncode != 0:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                failed[run.name] = f"exit {proc.returncode}: {tail[0][:300]}"
                logger.error("[grid] %s FAILED (%s); log: %s", run.name, failed[run.name], log)
            done = len(todo) - len(queue) - len(running)
            elapsed = time.perf_counter() - t_start
            # the runs left times the mean run so far, spread over the lanes (warm-up time excluded)
            eta = sum(timings.values()) / len(timings) * (len(todo) - done) / jobs
            logger.info("[grid] %s finished in %.0fs - %d/%d runs done, %.1f min elapsed, ~%.1f min left",
                        run.name, timings[run.name], done, len(todo), elapsed / 60, eta / 60)
            write_index(grid, timings, failed)
    for config, log, proc in warming:  # warm-ups no remaining run needed
        proc.wait()
    write_index(grid, timings, failed)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.grid", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "list"):
        p = sub.add_parser(name)
        p.add_argument("spec")
        p.add_argument("--seeds", type=parse_seeds, default=None,
                       help="seeds per entry, N >= 1: seeds 0 .. N-1 (default: the spec's)")
        p.add_argument("--only", default=None, help="fnmatch pattern(s) on run names, comma-separated")
        p.add_argument("--jobs", type=parse_jobs, default=2,
                       help="runs at a time, or 'auto': one per CPU core, or several per GPU (auto_jobs)")
        p.add_argument("--device", default="auto", choices=DEVICES,
                       help="every run's train.device (auto: the configs' own, i.e. a GPU when torch sees one)")
        p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                       help="run every command as a task on this Ray cluster (e.g. auto, 10.0.0.1:6379, or local)")
        p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
        p.add_argument("--summary", type=Path, default=None, metavar="FILE",
                       help="append one line to FILE: runs computed now and runs reused (run_all.sh's summary)")
        p.add_argument("--stale", choices=STALE_POLICIES, default="error",
                       help="run folders made with another config: stop and list them (error), move them aside "
                            "and run again (rerun), or use them (keep)")
    p = sub.add_parser("sweep", help="cartesian product of --set values over one config")
    p.add_argument("config")
    p.add_argument("--set", dest="sets", action="append", default=[], help="key.sub=v1,v2,... (repeatable)")
    p.add_argument("--seeds", type=parse_seeds, default=1, help="seeds per combination, N >= 1: seeds 0 .. N-1")
    p.add_argument("--name", default=None, help="sweep name (default: from the config and keys)")
    p.add_argument("--out", default="results/runs/sweeps")
    p.add_argument("--jobs", type=parse_jobs, default=2)
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS")
    p.add_argument("--only", default=None)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--stale", choices=STALE_POLICIES, default="error")
    p.add_argument("--summary", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        if args.command == "sweep":
            name = args.name or Path(args.config).stem + "".join(f"-{s.split('=')[0].split('.')[-1]}" for s in args.sets)
            grid = sweep_grid(args.config, args.sets, args.seeds, name, args.out)
        else:
            grid = load_grid(args.spec, args.seeds)
        if args.command == "list":
            for r in select_runs(grid, args.only):
                status = STALE if stale_changes(grid, r) else status_of(grid, r)
                print(f"{status:8s} {r.name:40s} {r.config} {' '.join(r.overrides)}")
            return 0
        failed = run_grid(grid, options_from(args))
        selected, index = ([], {}) if args.dry_run else (select_runs(grid, args.only), read_index(grid.out_dir))
        left = not_computed(grid, selected, failed)
        kept = [r.name for r in selected if index.get(r.name, {}).get("status") == STALE]
    except GridError as exc:
        print(f"experiments.grid: {exc}", file=sys.stderr)
        return 2
    except FolderLocked as exc:
        print(f"experiments.grid: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `python -m experiments.grid list SPEC | head`
        return reader_left()
    if failed:
        print(f"experiments.grid: {len(failed)} run(s) failed: {sorted(failed)}; rerun to retry them", file=sys.stderr)
        return 1
    if left:  # stopped by DRAIN_SIGNAL
        print(f"[grid] {grid.name}: stopped with {len(left)} run(s) not computed; the same command computes them")
        return 0
    if kept:
        print(f"[grid] {grid.name}: the selected runs are complete in {grid.out_dir}, except {len(kept)} finished run(s) "
              f"made with another config and kept as they are (--stale keep): {kept[:5]}{' ...' if len(kept) > 5 else ''}; "
              "index.json lists them as stale, not as results of the grid's settings")
        return 0
    print(f"[grid] {grid.name}: all runs complete in {grid.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
