"""Exclusive locks on folders that one process writes (a run folder, a grid's ``out_dir``).

Built on :class:`filelock.SoftFileLock`: the lock is the marker file ``<folder>/.lock``, created exclusively
and holding the owner's pid, host name and process-start token. A second writer does not wait: it stops at
once with :class:`FolderLocked`, whose message names the holder (pid, host, start time, command line; read
from ``<folder>/.lock.json``, which the holder writes after acquiring). A marker whose pid is no longer
alive on this host (a killed process; the start token also rules out a reused pid) is stale: filelock
removes it and takes the lock over atomically, and :func:`folder_lock` logs which holder it replaced.

A marker that names no holder (empty, or not a holder record: a process killed between creating it and writing
its pid, a copied or hand-made file) and has not changed for :data:`RECORDLESS_AGE_S` is a dead holder's too:
:func:`folder_lock` and :func:`live_holder` remove it (with a warning) and take the lock (filelock itself keeps an
empty marker forever, so such a folder would be refused for good).

A marker written on another host cannot be probed: it is reported as held; remove ``<folder>/.lock`` by
hand once you know that holder is gone.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import filelock

from drmas.io import atomic_write_json

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.json"
_HELD: set[Path] = set()  # folders this process holds
RECORDLESS_AGE_S = 2.0
"""Seconds a marker that names no holder must be old before it counts as dead: a live holder writes its record
right after it creates the marker (filelock waits as long before it takes over a malformed marker)."""


class FolderLocked(RuntimeError):
    """Another live process holds the folder's lock."""


def _holder(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / HOLDER_NAME).read_text())
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def describe_holder(info: dict | None, fallback_pid: int | None = None) -> str:
    """``pid P on host H, started T (command)`` of a holder record."""
    if not info:
        return f"pid {fallback_pid}" if fallback_pid else "a process that has not recorded itself yet"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on host {info.get('host')}, started {started} ({info.get('command', '?')})"


@contextmanager
def folder_lock(folder: str | Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of ``folder`` (created if missing) for the ``with`` body.

    ``what`` names the folder in messages (``"run folder"``, ``"grid out_dir"``). Raises :class:`FolderLocked`
    at once when another live process holds it; takes over (with a warning) a lock whose holder died."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    if key in _HELD:  # re-entrant within this process (``drmas train`` holds it around warm-up and training)
        yield
        return
    lock = filelock.SoftFileLock(str(folder / LOCK_NAME), timeout=0)
    previous = _holder(folder)
    if _remove_recordless(lock, folder):
        logger.warning("%s %s: its lock file %s named no holder (empty or unreadable): the lock of a process that "
                       "died, taken over", what, folder, folder / LOCK_NAME)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise FolderLocked(f"{what} {folder} is in use by {describe_holder(_holder(folder), lock.pid)}; wait for it "
                           f"to finish or stop it (a lock whose process died is taken over automatically)") from None
    try:
        if previous and previous.get("pid") != os.getpid():
            logger.warning("%s %s: took over the lock of %s, which is no longer running (killed?)", what, folder,
                           describe_holder(previous))
        atomic_write_json(folder / HOLDER_NAME, {"pid": os.getpid(), "host": socket.gethostname(),
                                                 "started": time.time(), "command": " ".join(sys.argv)[:300]})
        _HELD.add(key)
        yield
    finally:
        _HELD.discard(key)
        (folder / HOLDER_NAME).unlink(missing_ok=True)
        lock.release()


def live_holder(folder: str | Path) -> dict | None:
    """The holder record of a live process holding ``folder``'s lock (``{"pid": P}`` when it has not recorded
    itself yet), or None when the folder is free (a stale lock of a dead holder counts as free and is taken
    over and released). For a supervisor that must not start a second writer on a folder, nor take a run
    held by a live process for a failed one."""
    folder = Path(folder)
    if not (folder / LOCK_NAME).exists() or folder.resolve() in _HELD:
        return None
    lock = filelock.SoftFileLock(str(folder / LOCK_NAME), timeout=0)
    _remove_recordless(lock, folder)
    try:
        lock.acquire()
    except filelock.Timeout:
        return _holder(folder) or {"pid": lock.pid}
    lock.release()
    return None


def _remove_recordless(lock: filelock.SoftFileLock, folder: Path) -> bool:
    """Remove ``folder``'s marker when it names no holder (``lock.pid`` reads none: empty, or not a holder record)
    and is older than :data:`RECORDLESS_AGE_S`; whether it did."""
    marker = folder / LOCK_NAME
    try:
        seen = marker.stat()
        if lock.pid is not None or time.time() - seen.st_mtime < RECORDLESS_AGE_S:
            return False
        now = marker.stat()
        if (now.st_ino, now.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):  # replaced meanwhile: not the one judged
            return False
        marker.unlink()
    except OSError:  # gone already, or not ours to remove: filelock decides
        return False
    return True
