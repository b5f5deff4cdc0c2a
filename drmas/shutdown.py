"""Clean shutdown: SIGTERM or SIGINT to a drmas command ends every process it started.

Python's default SIGTERM action ends only the process that gets it: the grid runner's ``drmas train``
and ``drmas sft`` children, the SFT warm-up's spawn workers and the grader's worker subprocess would run
on as orphans. Inside :func:`children_end_with_me`, either signal first ends every descendant (SIGTERM,
then SIGKILL for those still alive after ``grace`` seconds; found with ``psutil``, which also sees
grandchildren; multiprocessing's resource tracker ends by itself once they are gone) and then raises
``SystemExit(128 + signum)``, so ``finally`` blocks and locks are released on the way out. A pool's workers
started inside :func:`ctrl_c_left_to_me` leave a terminal's Ctrl-C to this process.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import psutil

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def end_descendants(grace: float = 5.0) -> int:
    """SIGTERM every descendant of this process, SIGKILL the ones alive after ``grace`` s; returns how many
    there were. multiprocessing's resource tracker is left to end by itself, as it does once the processes it
    serves have closed its pipe (it ignores both signals, and killing it made the exit print a ``KeyError``
    traceback per semaphore, from a relaunched tracker asked to unregister what it never registered)."""
    children = [p for p in psutil.Process().children(recursive=True) if not _is_resource_tracker(p)]
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return len(children)


def _is_resource_tracker(process: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


@contextmanager
def children_end_with_me(grace: float = 5.0, exit_within: float = 20.0) -> Iterator[None]:
    """While inside: SIGTERM/SIGINT end every descendant, then raise ``SystemExit(128 + signum)`` (and end
    the process with that code after ``exit_within`` s if the unwinding hangs). Must be entered in the main
    thread (Python delivers signals there)."""

    def handler(signum: int, _frame: object) -> None:
        n = end_descendants(grace)
        logger.warning("%s: stopped %d child process(es); exiting", signal.Signals(signum).name, n)
        # a pool whose workers were killed can block the way out (a feeder thread writing to a dead pipe):
        # past ``exit_within`` seconds the process ends without further cleanup (a lock it held is then
        # stale and taken over by the next writer)
        watchdog = threading.Timer(exit_within, os._exit, (128 + signum,))
        watchdog.daemon = True  # does not itself keep the process alive
        watchdog.start()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def ctrl_c_left_to_me() -> Iterator[None]:
    """Processes started inside (a pool's workers) start with SIGINT blocked, so that a Ctrl-C to the terminal's
    process group reaches this process alone, whose :func:`children_end_with_me` ends them; each unblocks it in
    :func:`ignore_ctrl_c` (without both, every worker printed its own ``KeyboardInterrupt`` traceback). A Ctrl-C
    that comes while inside is delivered to this process on the way out."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ignore_ctrl_c() -> None:
    """In a worker started inside :func:`ctrl_c_left_to_me`: ignore SIGINT (its parent ends it) and unblock it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a child (between fork and exec, or a pool worker's initializer): have the kernel send ``sig`` when the
    parent dies, even by SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing), and send it now if the
    parent is gone already."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
