"""A grid's runs and where they stand: the spec read into runs (:func:`load_grid`, :func:`sweep_grid`), each run's
status from its folder (:func:`status_of`), the checkpoints the runs start from, and ``index.json``. The runner that
computes them is :mod:`experiments.grid`.

A grid spec (YAML) names the checkpoints to warm up first (``sft``: configs whose missing model paths are
SFT'd) and the runs: each entry is a config, overrides, seeds and the tags the analysis groups by (task,
setting, estimator, assignment, table). Before any work the spec is validated (:mod:`experiments.grid_spec`:
types, seeds distinct integers >= 0, run names that stay inside ``out_dir``; one line per problem naming the
key, the value and the fix, as for a run config), then the config of every run as ``drmas train`` will get it
(:func:`check_run_configs`), and the checkpoints the runs to compute start from must exist or be built by an
``sft`` config (:func:`refuse_unbuilt`). A run directory is ``out_dir/<name>_s<seed>``; a run whose directory
holds ``DONE`` of at least the run's ``train.steps`` is complete, a run with a checkpoint resumes from it
(:func:`run_status`). Whether a run folder holds this run is decided by ``drmas train``'s rule
(:mod:`drmas.config.identity`, :func:`stale_changes`; :func:`set_aside_stale` applies ``--stale``).
``index.json`` in ``out_dir`` lists every run with its config, overrides, tags, status and wall time; it is
rewritten atomically after each run finishes, from the run folders, and only grows (:func:`write_index`).
The analysis checks each run's settings against the config, overrides and seed it is listed under
(:func:`analysis.integrity.settings_problems`).

A sweep is a grid generated from one config and the cartesian product of ``--set key=v1,v2,...``:
any config key can be swept (normalization variants, group size, learning rate, sharing via ``models``).
"""
from __future__ import annotations

import fnmatch
import functools
import itertools
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from drmas.config.errors import format_validation_error
from drmas.config.identity import (GRID_KEYS, STALE_POLICIES, grid_overrides, in_repository, listed_config, move_aside,
                                   saved_config_changes)
from drmas.config.schema import check_run_name
from drmas.io import atomic_write_json
from drmas.locks import folder_lock
from experiments.grid_spec import ROOT, GridSpec

logger = logging.getLogger("experiments.grid")


@dataclass
class Run:
    """One training run of the grid."""

    name: str
    """run directory name: ``<entry name>_s<seed>``"""
    config: str
    """config file (relative to the repository root)"""
    overrides: list[str]
    """``key.sub=value`` overrides (seed, name and out_dir are added by the runner)"""
    seed: int
    tags: dict[str, Any] = field(default_factory=dict)
    """what the analysis groups by: task, setting, estimator, assignment, table, ..."""
    _configs: dict[Path, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """:meth:`effective_config` by ``out_dir``"""

    def train_overrides(self, out_dir: Path) -> list[str]:
        """The overrides ``drmas train`` gets: the run's name, folder and seed, then the entry's own."""
        return grid_overrides(self.name, out_dir, self.seed, self.overrides)

    def effective_config(self, out_dir: Path) -> Any:
        """The validated config ``drmas train`` gets for this run in ``out_dir``, without ``--device`` (not part
        of a run's identity); read once per ``Run``."""
        if out_dir not in self._configs:
            self._configs[out_dir] = listed_config(self.config, self.overrides, self.name, out_dir, self.seed)
        return self._configs[out_dir]

    def command(self, out_dir: Path, device: str = "auto") -> list[str]:
        """``drmas train`` of the run. ``--stale keep``: the runner has applied its own ``--stale`` with the same
        rule (:func:`set_aside_stale`) before it starts a run, so what reaches ``drmas train`` is accepted."""
        return [sys.executable, "-m", "drmas.cli", "train", self.config, *self.train_overrides(out_dir),
                *device_overrides(device), "--no-progress", "--stale", "keep"]


@dataclass
class Grid:
    name: str
    out_dir: Path
    sft: list[str]
    runs: list[Run]
    requires_gpu: bool = False
    twins_together: bool = False
    """start twins side by side (:func:`unstarted_twins`)"""


class GridError(ValueError):
    """A malformed grid spec or sweep request (the message names the entry and the fix)."""


def device_overrides(device: str) -> list[str]:
    """The ``train.device`` override a run gets from ``--device`` (none for ``auto``: the config decides)."""
    return [] if device == "auto" else [f"train.device={device}"]


def load_grid(path: str | Path, seeds: int | None = None) -> Grid:
    """Read and validate a grid spec (:mod:`experiments.grid_spec`), then the config of every run it gives
    (:func:`check_run_configs`), before any work; ``seeds`` (if given, >= 1) replaces every entry's seed list by
    ``range(seeds)``. Raises :class:`GridError` naming the file, the key, the value and the fix."""
    path = Path(path)
    if not path.is_file():
        raise GridError(f"grid spec {path} does not exist; pass a spec file, e.g. experiments/grids/cpu.yaml")
    if seeds is not None and seeds < 1:
        raise GridError(f"--seeds {seeds}: give the number of seeds per entry, >= 1 (the runs take seeds 0 .. N-1); "
                        "leave it out to use the spec's seeds")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise GridError(f"grid spec {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise GridError(f"grid spec {path} must hold a mapping at the top level (name, out_dir, sft, defaults, runs), "
                        f"not {type(data).__name__}: {_short(data)}")
    try:
        spec = GridSpec.model_validate(data)
    except ValidationError as err:
        raise GridError(format_validation_error(err, str(path), GridSpec, "grid spec")) from None
    runs = []
    for entry in spec.runs:
        given = spec.settings(entry)
        for seed in (list(range(seeds)) if seeds else given["seeds"]):
            runs.append(Run(name=f"{entry.name}_s{seed}", config=given["config"], overrides=list(given["overrides"]),
                            seed=seed, tags={**given["tags"], "entry": entry.name, "seed": seed}))
    runs.sort(key=lambda r: r.seed)  # stable: every entry's first seed before any second seed (a full table early)
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise GridError(f"{path}: duplicate run names {dupes}; give each entry a unique name")
    grid = Grid(name=spec.name or path.stem, out_dir=Path(spec.out_dir or f"results/runs/{path.stem}"),
                sft=list(spec.sft), runs=runs, requires_gpu=spec.requires_gpu, twins_together=spec.twins_together)
    check_run_configs(grid, str(path))
    return grid


def _short(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


SHOWN_PROBLEMS = 8
"""Runs whose config problems :func:`check_run_configs` names before it says how many more."""


def check_run_configs(grid: Grid, source: str) -> None:
    """Validate the config of every run of ``grid`` as ``drmas train`` will get it (the entry's config and overrides,
    the run's name, folder and seed: a ``train.steps=abc`` or a learning rate of 0 is found before any run starts),
    and every ``sft`` config; a :class:`GridError` lists each run whose config does not validate, with the config's
    own error lines."""
    from drmas.config import ConfigError, load_config

    problems = []
    for run in grid.runs:
        try:
            run.effective_config(grid.out_dir)
        except ConfigError as exc:
            problems.append(f"run {run.name} (config {run.config}, overrides {run.overrides}): {_one_line(exc)}")
    for config in grid.sft:
        try:
            load_config(in_repository(config), [])
        except ConfigError as exc:
            problems.append(f"sft config {config}: {_one_line(exc)}")
    if problems:
        more = len(problems) - SHOWN_PROBLEMS
        raise GridError(f"{source}: {len(problems)} run config(s) do not validate, nothing was run: "
                        + " | ".join(problems[:SHOWN_PROBLEMS]) + (f" | ... ({more} more)" if more > 0 else ""))


def _one_line(exc: Exception) -> str:
    """A config error's lines as one (its first line names the source; the others one problem each)."""
    first, *rest = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return f"{first.rstrip(':')}: {'; '.join(rest)}" if rest else first


def sweep_grid(config: str, sets: list[str], seeds: int, name: str, out: str) -> Grid:
    """The cartesian product of ``--set key=v1,v2`` values over one config (one run per combination and seed), every
    run's config validated before any work (:func:`check_run_configs`)."""
    if seeds < 1:
        raise GridError(f"--seeds {seeds}: give the number of seeds per combination, >= 1 (seeds 0 .. N-1)")
    try:
        check_run_name(name, "--name")
    except ValueError as exc:
        raise GridError(str(exc)) from None
    if not in_repository(config).is_file():
        raise GridError(f"sweep config {config} does not exist (relative paths start at the repository root, {ROOT})")
    axes: list[tuple[str, list[str]]] = []
    for item in sets:
        if "=" not in item:
            raise GridError(f"--set {item!r} must look like key.sub=value1,value2")
        key, values = item.split("=", 1)
        if key.strip() in GRID_KEYS:
            raise GridError(f"--set {item!r}: {key.strip()} is set by the grid for each run (its folder and seed); "
                            "use --seeds / --name / --out instead")
        axes.append((key, _split_values(values)))
    runs = []
    for combo in itertools.product(*[[(k, v) for v in vs] for k, vs in axes]) if axes else [()]:
        label = "-".join(f"{k.split('.')[-1]}={v}" for k, v in combo) or "base"
        label = "".join(c if c.isalnum() or c in "-_=.," else "_" for c in label)
        for seed in range(seeds):
            runs.append(Run(name=f"{label}_s{seed}", config=config, overrides=[f"{k}={v}" for k, v in combo], seed=seed,
                            tags={"entry": label, "seed": seed, **{k: v for k, v in combo}}))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise GridError(f"--set keys {[k for k, _ in axes]} give clashing run names (same last key part); "
                        "sweep them in separate sweeps or rename through a config")
    grid = Grid(name=name, out_dir=Path(out) / name, sft=[config], runs=runs)
    check_run_configs(grid, f"sweep of {config}")
    return grid


def _split_values(text: str) -> list[str]:
    """``a,b,[1, 2],c`` -> ["a", "b", "[1, 2]", "c"] (commas inside brackets/braces stay)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += 1 if ch in "[{" else -1 if ch in "]}" else 0
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v.strip() for v in out if v.strip()]


def _recorded(path: Path, parse: Callable[[str], Any], *keys: str) -> int | None:
    """The integer at ``keys`` in the file ``path`` read with ``parse`` (None when the file, a key or the
    number is missing)."""
    try:
        node = parse(path.read_text())
        for key in keys:
            node = node[key]
        return int(node)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def finished_steps(run_dir: Path) -> int | None:
    """The steps the finished run in ``run_dir`` trained: ``steps`` of its ``DONE`` record, else ``train.steps``
    of its ``config.yaml``; None when the folder holds no ``DONE`` or neither file says."""
    if not (run_dir / "DONE").exists():
        return None
    done = _recorded(run_dir / "DONE", json.loads, "steps")
    return done if done is not None else _recorded(run_dir / "config.yaml", yaml.safe_load, "train", "steps")


def run_status(run_dir: Path, steps: int | None = None) -> str:
    """``done``: ``run_dir`` holds ``DONE`` of a run that trained at least ``steps`` steps (any number when
    ``steps`` is None or ``DONE`` does not say); ``partial``: a checkpoint to resume from (a finished run asked
    for more steps has its last one); ``todo``: nothing to resume."""
    if (run_dir / "DONE").exists():
        trained = finished_steps(run_dir)
        if steps is None or trained is None or trained >= steps:
            return "done"
    if (run_dir / "checkpoints" / "latest").exists():
        return "partial"
    return "todo"


def status_of(grid: Grid, run: Run) -> str:
    """:func:`run_status` of ``run``'s folder against the ``train.steps`` the grid gives it now."""
    folder = grid.out_dir / run.name
    if not (folder / "DONE").exists():
        return run_status(folder)
    return run_status(folder, run.effective_config(grid.out_dir).train.steps)


def stale_changes(grid: Grid, run: Run) -> list[str]:
    """``key (old -> new)`` of every identity key in which the run folder's ``config.yaml`` differs from the config
    the grid gives now (:func:`drmas.config.identity.saved_config_changes`, the rule of ``drmas train``; empty
    when they agree or the folder has no config yet). Such a folder is not a result of this grid: it is
    neither skipped as complete nor resumed."""
    if not (grid.out_dir / run.name / "config.yaml").exists():
        return []
    return saved_config_changes(run.effective_config(grid.out_dir))


def set_aside_stale(grid: Grid, runs: list[Run], stale: str) -> dict[str, list[str]]:
    """Runs of ``runs`` whose folder holds another config (:func:`stale_changes`): ``error`` (default) stops
    with the list, ``rerun`` moves each folder's files to ``<name>.stale-<k>`` (:func:`move_aside`, holding the
    folder's lock; nothing is deleted) so the run starts afresh, ``keep`` leaves them as they are: a partial one
    is continued under the grid's config (``drmas train --stale keep`` records the changes in its manifest), and a
    finished one stays a result of the settings it was made with only (:func:`index_row` lists it ``stale``, with
    its changes; it is not counted as reused). Returns run name -> changes of the folders kept."""
    if stale not in STALE_POLICIES:
        raise GridError(f"stale={stale!r}; use one of {STALE_POLICIES}")
    changed = {r.name: changes for r in runs if (changes := stale_changes(grid, r))}
    if not changed or stale == "keep":
        for name, changes in changed.items():
            logger.warning("[grid] %s was made with another config (%s); kept (--stale keep): listed in index.json as "
                           "stale, a result of the settings it was made with only", name, "; ".join(changes[:5]))
        return changed
    if stale == "error":
        listing = "; ".join(f"{name}: {', '.join(changes[:4])}{' ...' if len(changes) > 4 else ''}"
                            for name, changes in changed.items())
        raise GridError(f"{len(changed)} run folder(s) in {grid.out_dir} were made with another config than the grid "
                        f"gives now ({listing}); pass --stale rerun to move them aside (<name>.stale-<k>) and run "
                        "them again, --stale keep to use them as they are, or delete them")
    for name, changes in changed.items():
        with folder_lock(grid.out_dir / name, "run folder"):
            aside = move_aside(grid.out_dir / name)
        logger.info("[grid] %s: config changed (%s); old files moved to %s", name, "; ".join(changes[:5]), aside)
    return {}


STALE = "stale"
"""The index status of a finished run folder made with another config than the grid gives now (``--stale keep``)."""


def read_index(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The rows of ``out_dir/index.json`` by run name, in file order (none without the file); an index that cannot
    be read is a :class:`GridError` (rewriting it would lose its runs and their wall times)."""
    path = out_dir / "index.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        rows = data["runs"]
        return {str(row["run"]): row for row in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GridError(f"{path} cannot be read as a grid index ({type(exc).__name__}: {exc}); it lists the runs and "
                        "their wall times, so the runner does not overwrite it: restore it, or move it aside to have "
                        "it written afresh from the run folders") from None


def index_row(grid: Grid, run: Run, seconds: float | None, error: str | None) -> dict[str, Any]:
    """The run's row of index.json, from its folder: ``failed`` (with ``error``), ``stale`` (a finished folder made
    with another config, kept: ``stale`` lists the changes, old -> the grid's), or :func:`status_of`."""
    changes = stale_changes(grid, run) if error is None and (grid.out_dir / run.name / "DONE").exists() else []
    status = "failed" if error is not None else STALE if changes else status_of(grid, run)
    return {"run": run.name, "config": run.config, "overrides": run.overrides, **run.tags, "status": status,
            "seconds": seconds, **({"error": error} if error is not None else {}), **({"stale": changes} if changes else {})}


def write_index(grid: Grid, timings: dict[str, float], failed: dict[str, str]) -> Path:
    """``out_dir/index.json``: every run with its tags, status and wall time (atomic rewrite). ``seconds`` is the
    wall time of the command that finished the run; for a run resumed after a stop, that is its last sitting only
    (the ``timing/step`` records of its metrics.jsonl cover every sitting). The index only grows: a run it lists
    that ``grid`` does not give (another ``--seeds``, an entry renamed) keeps its row as it is (this call does not
    touch its folder); every run keeps its recorded wall time until a new one is measured."""
    out = grid.out_dir
    out.mkdir(parents=True, exist_ok=True)
    previous = read_index(out)
    rows = dict(previous)  # runs this call does not give: their folders are not touched, their rows stay as they are
    for run in grid.runs:
        rows[run.name] = index_row(grid, run, timings.get(run.name, previous.get(run.name, {}).get("seconds")),
                                   failed.get(run.name))
    atomic_write_json(out / "index.json", {"grid": grid.name, "runs": list(rows.values())}, indent=1)
    return out / "index.json"


def warm_ups_needed(grid: Grid, runs: list[Run]) -> list[str]:
    """The grid's ``sft`` configs that build a missing checkpoint one of ``runs`` starts from."""
    needed = {path for r in runs for path in _start_checkpoints(r.config, tuple(r.overrides)) if not path.exists()}
    return [config for config in grid.sft if needed & set(_start_checkpoints(config, ()))]


@functools.lru_cache(maxsize=None)
def _start_checkpoints(config: str, overrides: tuple[str, ...]) -> tuple[Path, ...]:
    """The ``config.json`` files of the checkpoints a run builds its models from (the warm-up writes them);
    cached: the runner asks every second while warm-ups run."""
    from drmas.config import load_config

    cfg = load_config(in_repository(config), list(overrides))
    return tuple(in_repository(m.path) / "config.json"
                 for m in cfg.models.values() if m.path is not None and m.preset is not None)


def checkpoints_ready(run: Run) -> bool:
    """Whether every model checkpoint the run starts from exists (else it waits for the warm-up)."""
    return all(path.exists() for path in _start_checkpoints(run.config, tuple(run.overrides)))


def refuse_unbuilt(grid: Grid, todo: list[Run]) -> None:
    """A :class:`GridError` where a run of ``todo`` starts from a checkpoint that does not exist and that no ``sft``
    config of the grid builds (:func:`unbuilt_checkpoints`)."""
    if unbuilt := unbuilt_checkpoints(grid, todo):
        listing = "; ".join(f"{name}: {', '.join(map(str, paths))}" for name, paths in list(unbuilt.items())[:4])
        raise GridError(f"{len(unbuilt)} run(s) start from checkpoints that do not exist and that no config of the grid's "
                        f"`sft` list builds ({listing}); add the config that builds them (a config naming that "
                        "models.*.path with a preset) to `sft`, or fix the model paths; nothing was run")


def summary_line(grid: Grid, computed: int, reused: int, failed: int, kept: int = 0) -> str:
    """One line saying what a call did: runs computed now, runs reused (complete before it), finished runs kept
    under the settings they were made with (``--stale keep``), runs failed."""
    return (f"{grid.name}: {computed + reused + failed + kept} run(s) in {grid.out_dir}: {computed} computed now, "
            f"{reused} reused (complete before)" + (f", {kept} kept under other settings (--stale keep; index.json "
                                                    "status stale)" if kept else "")
            + (f", {failed} FAILED" if failed else ""))


def select_runs(grid: Grid, only: str | None) -> list[Run]:
    """The runs of ``grid`` whose name matches one of the comma-separated fnmatch patterns ``only`` (all when
    there are none); patterns that select no run are a :class:`GridError` (never a call that does nothing)."""
    patterns = [p for p in (only or "").split(",") if p.strip()]
    selected = [r for r in grid.runs if not patterns or any(fnmatch.fnmatch(r.name, p.strip()) for p in patterns)]
    if not selected:
        shown = ", ".join(r.name for r in grid.runs[:6]) + (", ..." if len(grid.runs) > 6 else "")
        raise GridError(f"--only {only!r} selects none of the {len(grid.runs)} run(s) of grid {grid.name!r} ({shown}); "
                        "give fnmatch patterns on run names, comma-separated, e.g. 'math_*'")
    return selected


def unbuilt_checkpoints(grid: Grid, runs: list[Run]) -> dict[str, list[Path]]:
    """Run name -> the checkpoints it starts from that do not exist and that no ``sft`` config of the grid builds
    (a run that would wait for a warm-up that never comes)."""
    built = {path for config in grid.sft for path in _start_checkpoints(config, ())}
    out = {}
    for run in runs:
        if missing := [p for p in _start_checkpoints(run.config, tuple(run.overrides)) if not p.exists() and p not in built]:
            out[run.name] = [p.parent for p in missing]
    return out
