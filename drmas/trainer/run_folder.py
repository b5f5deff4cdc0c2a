"""A run folder's side effects, apart from the RL step: claiming it (:func:`claim_run_folder`: its lock and its
identity check, taken once per process however many callers ask) and its checkpoints
(:class:`RunCheckpoints`: write, rotate, recover, load).

Layout of ``<run>/checkpoints/``::

    latest/        worker_<key>.pt (one per worker group), trainer.json, the sha256 manifest (written last)
    latest.tmp/    a checkpoint being written (complete once its manifest parses)
    latest.old/    the previous one during rotation; kept when ``train.keep_previous_checkpoint``
    latest.damaged-<k>/  a ``latest`` that failed verification, set aside when ``latest.old`` could replace it

A worker state holds tensors and plain containers only (model, optimizer and scheduler states, counters; the
openrlhf backend's: where its DeepSpeed checkpoint is). It is read with ``torch.load(weights_only=True)``, which
rebuilds exactly those and refuses any other pickled object unread (:func:`load_worker_state`): the manifest
proves that a file is the one written, not that it is safe to unpickle, so a planted payload in a run folder
shared by someone else never runs. Every checkpoint drmas writes has always held only such values, so older
checkpoints load unchanged.
"""
from __future__ import annotations

import json
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path
from pickle import UnpicklingError
from typing import Any, Iterator

import torch

from drmas.algos import first_nonfinite
from drmas.checkpoints import (MANIFEST_NAME, CheckpointDamaged, read_manifest, refused_pickle, verify_checkpoint,
                               write_manifest)
from drmas.config import RunConfig
from drmas.config.identity import check_run_folder
from drmas.io import WriteFailed, atomic_write_text
from drmas.locks import folder_lock

logger = logging.getLogger(__name__)

_CLAIMED: dict[Path, list[str]] = {}
"""Run folders this process holds, with the config changes accepted when each was claimed."""


@contextmanager
def claim_run_folder(cfg: RunConfig, stale: str = "error") -> Iterator[list[str]]:
    """Hold ``cfg.run_dir``'s lock and check, once, that its records were made with this config
    (:func:`drmas.config.identity.check_run_folder`: ``stale`` = error, rerun or keep); yields the changes
    accepted under ``keep``. Re-entrant: a nested claim of a folder this process holds (``drmas train`` claims
    it before the SFT warm-up, :meth:`Trainer.train` again) yields the same changes and checks nothing again."""
    key = Path(cfg.run_dir).resolve()
    if key in _CLAIMED:
        yield _CLAIMED[key]
        return
    with folder_lock(cfg.run_dir, "run folder"):  # a second writer of this run stops at once
        _CLAIMED[key] = check_run_folder(cfg, stale)
        try:
            yield _CLAIMED[key]
        finally:
            del _CLAIMED[key]


class RunCheckpoints:
    """The checkpoints of one run folder: ``checkpoints/latest`` and its rotation (module docstring)."""

    def __init__(self, run_dir: Path, verify: bool = True, keep_previous: bool = False):
        """``verify``: ``train.verify_artifacts`` (a checkpoint without a manifest is refused);
        ``keep_previous``: ``train.keep_previous_checkpoint``."""
        self.run_dir = Path(run_dir)
        self.latest = self.run_dir / "checkpoints" / "latest"
        self.verify = verify
        self.keep_previous = keep_previous

    def _sibling(self, suffix: str) -> Path:
        return self.latest.with_name(f"latest.{suffix}")

    def write(self, step: int, worker_states: dict[str, Any], trainer_state: dict[str, Any]) -> None:
        """Write ``latest.tmp/`` (worker states, ``trainer.json``, then the sha256 manifest, last), then rotate:
        ``latest`` -> ``latest.old``, ``latest.tmp`` -> ``latest``; ``latest.old`` is removed unless
        ``keep_previous``. A failed write (a full disk) removes ``latest.tmp`` and raises :class:`WriteFailed`
        saying what is kept."""
        tmp = self._sibling("tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            for key, state in worker_states.items():
                torch.save(state, tmp / f"worker_{key}.pt")
            atomic_write_text(tmp / "trainer.json", json.dumps(trainer_state))
            write_manifest(tmp, step=step)  # last: a folder with a manifest is complete
        except (OSError, RuntimeError) as exc:  # a full disk: torch.save raises RuntimeError ("file write failed")
            shutil.rmtree(tmp, ignore_errors=True)
            raise WriteFailed(f"{tmp}: the checkpoint of step {step} could not be written ({_write_cause(exc, tmp)}); "
                              f"{self.kept()}; free space and run the same command again to resume",
                              getattr(exc, "errno", None)) from exc
        old = self._sibling("old")
        shutil.rmtree(old, ignore_errors=True)
        if self.latest.exists():
            self.latest.rename(old)
        tmp.rename(self.latest)
        if not self.keep_previous:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint at step %d -> %s", step, self.latest)

    def kept(self) -> str:
        """What a failed checkpoint write left: the previous checkpoint and the records, as they were."""
        manifest = read_manifest(self.latest)
        where = (f"the previous checkpoint {self.latest} (step {manifest.get('step')}) is intact" if manifest
                 else "there is no previous checkpoint")
        return f"{where}, and every complete record in {self.run_dir} is kept"

    def last_step(self) -> int | None:
        """The step of ``latest`` by its manifest, unverified (``None``: no complete checkpoint), for messages."""
        manifest = read_manifest(self.latest)
        return manifest.get("step") if manifest else None

    def recover(self) -> int:
        """Step of the checkpoint the run resumes from (0: none), after verifying it.

        A folder is complete once its manifest (written last) parses. A run killed inside :meth:`write` leaves
        ``latest.tmp`` and/or ``latest.old``; with no ``latest``, the newest complete one of them is moved back.
        A ``latest`` that fails verification raises :class:`CheckpointDamaged` naming the file, unless a verified
        ``latest.old`` is kept: then the damaged one is moved to ``latest.damaged-<k>`` and the run resumes from
        the previous one, with a warning."""
        latest, tmp, old = self.latest, self._sibling("tmp"), self._sibling("old")
        if latest.exists() and not (latest / MANIFEST_NAME).exists() and (latest / "trainer.json").is_file():
            return self._unverified_step()
        if latest.exists():
            try:
                return int(verify_checkpoint(latest)["step"])
            except CheckpointDamaged as exc:
                return self._fall_back(exc)
        complete = {p: int(m["step"]) for p in (tmp, old) if (m := read_manifest(p)) is not None}
        if not complete:
            return 0
        newest = max(complete, key=complete.get)
        verify_checkpoint(newest)
        newest.rename(latest)
        logger.warning("recovered the checkpoint of step %d from %s (a run was killed while checkpointing)",
                       complete[newest], newest)
        return complete[newest]

    def _unverified_step(self) -> int:
        """The step of a ``latest`` without a manifest: refused unless verification is off."""
        latest = self.latest
        if self.verify:
            raise CheckpointDamaged(f"{latest} has no {MANIFEST_NAME}, so it cannot be verified; delete it to "
                                    "start from step 0, or set train.verify_artifacts=false to load it unverified")
        logger.warning("%s has no %s: loaded unverified (train.verify_artifacts=false)", latest, MANIFEST_NAME)
        try:
            return int(json.loads((latest / "trainer.json").read_text())["step"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointDamaged(f"{latest / 'trainer.json'}: unreadable ({exc})") from None

    def _fall_back(self, exc: CheckpointDamaged) -> int:
        """A damaged ``latest``: set it aside and resume from a verified ``latest.old``, or raise."""
        latest, old = self.latest, self._sibling("old")
        if read_manifest(old) is None:
            raise CheckpointDamaged(f"{exc}; no previous checkpoint is kept (train.keep_previous_checkpoint="
                                    f"false): restore the file, or delete {latest} to start from step 0") from None
        verify_checkpoint(old)  # raises if the previous one is damaged too
        k = next(i for i in range(1, 10_000) if not self._sibling(f"damaged-{i}").exists())
        latest.rename(self._sibling(f"damaged-{k}"))
        old.rename(latest)
        step = int(read_manifest(latest)["step"])
        logger.warning("%s; falling back to the previous checkpoint (step %d); the damaged one is kept as "
                       "latest.damaged-%d", exc, step, k)
        return step

    def load(self, keys: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(trainer_state, worker_states)`` of ``latest`` (call :meth:`recover` first): ``trainer.json`` and
        each worker group's ``worker_<key>.pt``."""
        trainer_state = json.loads((self.latest / "trainer.json").read_text())
        worker_states = {}
        for key in keys:
            path = self.latest / f"worker_{key}.pt"
            worker_states[key] = load_worker_state(path, self.latest)
            bad = first_nonfinite(worker_states[key])
            if bad is not None:  # weights or optimizer moments: the next update would spread it to every weight
                raise CheckpointDamaged(f"{path}: {bad} holds non-finite values (NaN/inf); the run cannot resume from "
                                        f"it: delete {self.latest} to start from step 0 (or restore latest.old, kept "
                                        "with train.keep_previous_checkpoint)")
        return trainer_state, worker_states


def load_worker_state(path: Path, latest: Path) -> dict[str, Any]:
    """One worker state, read with ``torch.load(weights_only=True)`` (module docstring); a file holding any
    other pickled object is refused unread, as :class:`CheckpointDamaged` naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except UnpicklingError as exc:
        raise CheckpointDamaged(f"{path}: refused unread: it holds a pickled Python object that is not a tensor or a "
                                f"plain container ({refused_pickle(exc)}), which drmas never writes and which could run "
                                f"code when loaded; delete {latest} to start from step 0, or restore the file drmas "
                                "wrote") from None


def _write_cause(exc: BaseException, path: Path) -> str:
    """Why a write under ``path`` failed, in words: the errno's text, or (torch.save names neither path nor
    cause) its first line and the space left on that filesystem."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else path.parent.parent).free
    except OSError:
        return first
    return f"no space left on device: {free} bytes free ({first})" if free < 1 << 20 else first
