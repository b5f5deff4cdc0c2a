"""Config identity: which config a run folder's records were made with, and whether another one may write there.

A run folder keeps the effective config it was made with (``config.yaml``) and its sha256 (``config_hash`` in
``manifest.json``, :func:`config_hash`). :func:`check_run_folder` compares the config about to run with the
folder's before any work and refuses a different one (:class:`ConfigDrift`, naming every differing key with
the old and new value): its records would otherwise be relabelled (``config.yaml`` and ``manifest.json``
rewritten) or continued under other settings.

Not part of the identity (:data:`IGNORED`), because they do not change what a step computes:

- ``name``, ``out_dir``: where the folder is (another name is another run);
- ``train.device``: CPU or GPU run the same steps (the grid runner's ``--device`` sets it per launch: a run begun
  on one resumes on the other); ``train.backend``: local, Ray or OpenRLHF execute the same steps (their checkpoints
  are interchangeable: a run begun on one resumes on another);
- ``train.threads``: how fast; ``train.save_every``, ``train.keep_previous_checkpoint``: how often and how many
  checkpoints are written (a resumed step is a pure function of seed, step and checkpointed state);
- ``train.allow_unusual_lr``: lets a config through validation; the learning rates themselves are identity;
- ``train.loggers``: where the metrics are also sent (TensorBoard, W&B); ``metrics.jsonl`` is always written;
- ``models.*.resources.checkpoint_dir``: derived from the run folder;
- ``models.*.trust_remote_code``: a permission to run a checkpoint's own code, not a setting of what it computes;
- ``models.*.rollout.engine``: which loop draws the samples from the same policy. ``fast`` and ``hf`` draw the same
  tokens from the same generator state (``tests/test_fast_rollout.py``), so a run made with one is the same run with
  the other, and the grids committed with ``hf`` stay valid under the ``fast`` default (as a run is the same run on a
  CPU or a GPU, whose float rounding differs as vLLM's does). ``config.yaml`` keeps the engine a run was made with.

``train.steps`` may grow: a finished or partial run continued to more steps keeps its records, which are the
first steps of the longer run (:func:`config_changes` lists it only when it shrinks); the trainer resumes it
from its last checkpoint. Everything else that differs (estimator, learning rate, seed, batch sizes,
evaluation settings, models, agents, ...) is a change, and so is the source of a plug-in (``plugins``): the
manifest records each plug-in's sha256 (:func:`plugin_sources`: its file and the files of the modules it loads from
outside the installed packages, :func:`drmas.plugins.source_digest`), so a run is not resumed, nor evaluated, with
other plug-in code.

The explicit ways past a change are ``drmas train --stale rerun`` (:func:`move_aside`: the old files move to
``<name>.stale-<k>/``, nothing is deleted, and the run starts afresh) and ``--stale keep`` (continue under the
new config; the manifest lists the changes it was continued with); or another ``name``.

This is the one rule for ``drmas train`` and the grid runner (``experiments/grid.py``): the grid applies its
``--stale`` with :func:`saved_config_changes` and :func:`move_aside` before it starts a run, so a finished run
whose config differs only in :data:`IGNORED` keys is reused, and one asked for more ``train.steps`` is
started again and resumes.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any

from drmas.config.errors import ConfigError
from drmas.io import read_json_object
from drmas.config.schema import RunConfig

logger = logging.getLogger(__name__)

IGNORED = ("name", "out_dir", "train.device", "train.backend", "train.threads", "train.save_every", "train.keep_previous_checkpoint",
           "train.allow_unusual_lr", "train.loggers", "train.max_tool_failure_rate", "train.verify_artifacts",
           "models.*.resources.checkpoint_dir", "models.*.rollout.engine", "models.*.trust_remote_code")
"""Dotted keys (``*``: any model key) that are not part of a run's identity (see the module docstring)."""
GROWABLE = ("train.steps",)
"""Keys that may grow on an existing run folder (a run continued to more steps)."""
STALE_POLICIES = ("error", "rerun", "keep")
GRID_KEYS = ("name", "out_dir", "train.seed")
"""Keys the grid runner sets for each of its runs (:func:`grid_overrides`); a grid entry's overrides may not set them."""


REPOSITORY = Path(__file__).resolve().parents[2]
"""The repository root: the config paths of grid specs and of ``index.json`` are relative to it."""


def in_repository(path: str | Path) -> Path:
    """A config path of a grid spec or ``index.json``: a relative one is relative to the repository root."""
    return Path(path) if Path(path).is_absolute() else REPOSITORY / path


def grid_overrides(name: str, out_dir: str | Path, seed: int, overrides: list[str]) -> list[str]:
    """The overrides of a grid run's config: its folder (``name``, ``out_dir``) and ``seed``, then the entry's own
    ``overrides`` (which may not set those, :data:`GRID_KEYS`)."""
    return [f"name={name}", f"out_dir={out_dir}", f"train.seed={seed}", *overrides]


def listed_config(config: str | Path, overrides: list[str], name: str, out_dir: str | Path, seed: int) -> RunConfig:
    """The config a grid lists a run under: ``config`` (:func:`in_repository`) with :func:`grid_overrides`. The grid
    runner starts the run with it, and the analysis resolves a run's ``index.json`` entry (config, overrides, seed)
    with it, so both read one listing the same way. Raises ConfigError."""
    from drmas.config.loader import load_config

    return load_config(in_repository(config), grid_overrides(name, out_dir, seed, list(overrides)))


class ConfigDrift(RuntimeError):
    """A run folder holds records made with another config (the message lists the keys)."""


def _drop(node: Any, parts: list[str]) -> None:
    if not isinstance(node, dict) or not parts:
        return
    head, rest = parts[0], parts[1:]
    for key in (list(node) if head == "*" else [head]):
        if not rest:
            node.pop(key, None)
        else:
            _drop(node.get(key), rest)


def comparable(cfg: RunConfig) -> dict[str, Any]:
    """The config as JSON data without the :data:`IGNORED` keys."""
    data = json.loads(cfg.model_dump_json())
    for key in IGNORED:
        _drop(data, key.split("."))
    return data


def config_hash(cfg: RunConfig) -> str:
    """sha256 of :func:`comparable` without the :data:`GROWABLE` keys (canonical JSON, sorted keys)."""
    data = comparable(cfg)
    for key in GROWABLE:
        _drop(data, key.split("."))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def changed_keys(saved: Any, current: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, current value) of every leaf that differs (lists of one length leaf-wise)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [c for key in sorted(set(saved) | set(current), key=str)
                for c in changed_keys(saved.get(key), current.get(key), f"{prefix}{key}.")]
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [c for i, (a, b) in enumerate(zip(saved, current)) for c in changed_keys(a, b, f"{prefix}{i}.")]
    return [] if saved == current else [(prefix.rstrip("."), saved, current)]


def config_changes(saved: RunConfig, current: RunConfig, growable: tuple[str, ...] = GROWABLE) -> list[str]:
    """``key (old -> new)`` for every identity key that differs (a grown ``train.steps`` is not one: a run folder
    may be continued to more steps; ``growable=()`` where the records must be the ones ``current`` asks for, as
    when the analysis takes a finished run for a result of the settings it is listed under)."""
    out = []
    for key, old, new in changed_keys(comparable(saved), comparable(current)):
        if key in growable and isinstance(old, (int, float)) and isinstance(new, (int, float)) and new >= old:
            continue
        out.append(f"{key} ({old!r} -> {new!r})")
    return out


def plugin_sources(cfg: RunConfig) -> dict[str, str | None]:
    """Each plug-in entry of the config -> the sha256 of its source (:func:`drmas.plugins.source_digest`)."""
    from drmas.plugins import PluginError, resolve_entry, source_digest

    out: dict[str, str | None] = {}
    for entry in cfg.plugins:
        try:
            out[entry] = source_digest(resolve_entry(entry))
        except PluginError:
            out[entry] = None
    return out


def plugin_changes(saved: dict[str, Any], current: dict[str, str | None]) -> list[str]:
    """``plugin ./x.py (source sha256 1a2b3c4d5e6f -> ...)`` for every plug-in whose source differs from the one
    the run folder recorded (a plug-in added or removed is a change of ``plugins``, listed by the config)."""
    return [f"plugin {entry} (source sha256 {str(saved[entry])[:12]} -> {str(digest)[:12]})"
            for entry, digest in current.items() if entry in saved and saved[entry] != digest]


def saved_config_changes(cfg: RunConfig) -> list[str]:
    """:func:`config_changes` against the run folder's ``config.yaml`` (none when it has none), and the plug-ins
    whose source differs from the one its ``manifest.json`` recorded (:func:`plugin_changes`)."""
    from drmas.config.loader import load_config

    saved_file = cfg.run_dir / "config.yaml"
    if not saved_file.exists():
        return []
    try:
        saved = load_config(saved_file, [])
    except ConfigError as exc:
        return [f"(its config.yaml no longer loads: {str(exc).splitlines()[-1].strip()})"]
    return config_changes(saved, cfg) + saved_plugin_changes(cfg)


def saved_plugin_changes(cfg: RunConfig) -> list[str]:
    """:func:`plugin_changes` against the plug-in sources the run folder's ``manifest.json`` recorded (none when it
    recorded none): what ``drmas eval`` checks before it loads a checkpoint, as a resume does."""
    recorded = (read_json_object(cfg.run_dir / "manifest.json") or {}).get("plugin_sources") or {}
    return plugin_changes(recorded, plugin_sources(cfg)) if isinstance(recorded, dict) else []


def check_run_folder(cfg: RunConfig, stale: str = "error") -> list[str]:
    """Refuse (``error``), set aside (``rerun``) or accept (``keep``) a run folder made with another config;
    returns the changes accepted under ``keep``. Call it holding the folder's lock, before any work."""
    if stale not in STALE_POLICIES:
        raise ValueError(f"stale={stale!r}; use one of {STALE_POLICIES}")
    changes = saved_config_changes(cfg)
    if not changes:
        return []
    run_dir = cfg.run_dir
    listing = "; ".join(changes[:8]) + (f"; ... ({len(changes)} keys)" if len(changes) > 8 else "")
    if stale == "error":
        raise ConfigDrift(f"run folder {run_dir} was made with another config ({listing}); its records would be "
                          "relabelled or continued under other settings. Give the run another name=..., pass "
                          f"--stale rerun to move its files aside ({run_dir.name}.stale-<k>) and start afresh, or "
                          "--stale keep to continue it under the new config")
    if stale == "keep":
        logger.warning("run folder %s was made with another config (%s); continued under the new one (--stale keep)",
                       run_dir, listing)
        return changes
    aside = move_aside(run_dir)
    logger.warning("run folder %s was made with another config (%s); its files moved to %s (--stale rerun)",
                   run_dir, listing, aside)
    return []


def stale_folder(run_dir: Path) -> Path:
    """The first ``<name>.stale-<k>`` (k = 1, 2, ...) beside ``run_dir`` that does not exist yet."""
    return next(aside for k in itertools.count(1)
                if not (aside := run_dir.with_name(f"{run_dir.name}.stale-{k}")).exists())


def move_aside(run_dir: Path) -> Path:
    """Move every file of ``run_dir`` into a new :func:`stale_folder` beside it and return that folder
    (``--stale rerun`` of ``drmas train`` and of the grid runner): nothing is deleted, and the run starts
    afresh in ``run_dir``. The folder's lock stays: call it holding that lock."""
    from drmas.locks import HOLDER_NAME, LOCK_NAME

    aside = stale_folder(run_dir)
    aside.mkdir()
    for entry in run_dir.iterdir():
        if entry.name not in (LOCK_NAME, HOLDER_NAME):
            os.replace(entry, aside / entry.name)
    return aside


def identity_record(cfg: RunConfig, kept: list[str]) -> dict[str, Any]:
    """What ``manifest.json`` records of the run's identity."""
    return {"config_hash": config_hash(cfg), "config_ignored_keys": list(IGNORED),
            **({"plugin_sources": plugin_sources(cfg)} if cfg.plugins else {}),
            **({"config_changes_kept": kept} if kept else {})}

