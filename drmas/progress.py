"""Progress of a long loop (the RL steps, the SFT warm-up, an evaluation), one way for all of them
(:class:`Progress`): a tqdm bar when stderr is a terminal; off a terminal (a log file, a grid runner, CI) one
log line every ``DRMAS_PROGRESS_EVERY`` seconds (default 30) with ``k/N``, the rate, the elapsed time and the
ETA, e.g. ``rl 12/200 (6%) 2.31 s/step, elapsed 0:27, ETA 7:14, reward=0.312``.

Environment: ``DRMAS_PROGRESS`` set (not empty, not ``0``) draws the bar even off a terminal;
``DRMAS_PROGRESS_EVERY`` is the interval of the log lines, in seconds.

Third-party progress output (transformers' ``Loading weights`` and ``Writing model shards`` bars, huggingface_hub's
downloads) is off in drmas commands below ``--log-level debug`` (:func:`quiet_third_party_progress`), so that the
terminal shows drmas's own progress only.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

BAR_ENV = "DRMAS_PROGRESS"
EVERY_ENV = "DRMAS_PROGRESS_EVERY"
DEFAULT_EVERY = 30.0
"""Seconds between two progress log lines off a terminal."""


QUIET_THIRD_PARTY_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""What turns third-party progress bars off: read by huggingface_hub and transformers at import, in this process
and in every process it starts (SFT workers, Ray actors); a value the user set is kept."""


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def setup_logging(level: int | str) -> None:
    """The log lines of a drmas process (the command's and each worker process's, :func:`drmas.plugins.init_worker`,
    so that a worker logs at its parent's ``--log-level``): ``14:02:11 INFO drmas.trainer: ...`` at ``level`` and
    above (a :mod:`logging` level or its name, e.g. ``"warning"``)."""
    if isinstance(level, str):
        level = getattr(logging, level.upper())
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)


def reader_left() -> int:
    """What a command does when the reader of its output has gone (``... list | head`` raised
    :class:`BrokenPipeError`): stop quietly, as the Python docs advise, with stdout pointed at devnull so that the
    exit's flush finds no pipe either. Returns the exit status, 1."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def quiet_third_party_progress() -> None:
    """Third-party progress bars off (:data:`QUIET_THIRD_PARTY_ENV`), also where transformers is already imported."""
    for key, value in QUIET_THIRD_PARTY_ENV.items():
        os.environ.setdefault(key, value)
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1" and "transformers.utils.logging" in sys.modules:
        sys.modules["transformers.utils.logging"].disable_progress_bar()


def wants_bar(environ: Mapping[str, str] = os.environ, stream: Any = None) -> bool:
    """A tqdm bar (``stream``, default: the current stderr, is a terminal, or ``DRMAS_PROGRESS`` asks for one) rather
    than timed log lines. A closed stream is no terminal."""
    forced = environ.get(BAR_ENV, "").strip()
    stream = sys.stderr if stream is None else stream
    try:
        return bool(forced and forced != "0") or bool(getattr(stream, "isatty", lambda: False)())
    except ValueError:  # "I/O operation on closed file"
        return False


def interval_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """``DRMAS_PROGRESS_EVERY`` in seconds (a positive number), else :data:`DEFAULT_EVERY`."""
    raw = environ.get(EVERY_ENV, "").strip()
    if not raw:
        return DEFAULT_EVERY
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        logger.warning("%s=%r is not a positive number of seconds; using %g", EVERY_ENV, raw, DEFAULT_EVERY)
        return DEFAULT_EVERY
    return value


def format_duration(seconds: float) -> str:
    """``M:SS`` under an hour, else ``H:MM:SS`` (``?`` for an unknown duration)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    hours, rest = divmod(s, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_line(desc: str, done: int, total: int | None, elapsed: float, rate: float, unit: str = "step",
                  postfix: Mapping[str, Any] | None = None) -> str:
    """One progress log line: ``desc k/N (p%) <rate>, elapsed E, ETA T[, key=value ...]``. ``rate`` is units
    per second over the units done in this process (0: none yet); it is written as ``s/unit`` below one unit
    per second, else ``unit/s``."""
    count = f"{done}/{total} ({done / total:.0%})" if total else f"{done}"
    speed = ("? s/" + unit if rate <= 0 else f"{1 / rate:.2f} s/{unit}" if rate < 1 else f"{rate:.2f} {unit}/s")
    parts = [f"{desc} {count} {speed}", f"elapsed {format_duration(elapsed)}"]
    if total:
        parts.append(f"ETA {format_duration((total - done) / rate) if rate > 0 else '?'}")
    parts.extend(f"{k}={v}" for k, v in (postfix or {}).items())
    return ", ".join(parts)


class Progress:
    """Progress of ``total`` units: a tqdm bar (:func:`wants_bar`), or a log line (:func:`progress_line`) once
    ``every`` seconds have passed since the last one (and a last line at the end, when the loop took that long);
    nothing when ``enabled`` is false. ``clock`` and ``log`` are injectable (a test passes a fake clock)."""

    def __init__(self, total: int | None, desc: str, *, unit: str = "step", enabled: bool = True, initial: int = 0,
                 bar: bool | None = None, every: float | None = None, clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None, leave: bool = True):
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.done = self.initial = initial
        self.postfix: dict[str, Any] = {}
        self.every = interval_from_env() if every is None else every
        self._clock, self._log = clock, log or logger
        self._start = self._last = clock()
        self._bar = None
        if enabled and (wants_bar() if bar is None else bar):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave)

    def advance_to(self, done: int, **postfix: Any) -> None:
        """``done`` units are done; ``postfix`` (e.g. ``reward="0.312"``) is shown beside the count."""
        if not self.enabled:
            return
        step, self.done = done - self.done, done
        self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(self.postfix, refresh=False)
            self._bar.update(step)
            return
        now = self._clock()
        finished = self.total is not None and done >= self.total
        if now - self._last >= self.every or (finished and now - self._start >= self.every):
            self._last = now
            self._log.info("%s", self.line(now))

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.advance_to(self.done + n, **postfix)

    def set_postfix(self, **postfix: Any) -> None:
        """Shown from the next update on."""
        self.postfix.update(postfix)

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, one unit done after each one's loop body; closed at the end (or when the loop stops)."""
        try:
            for item in items:
                yield item
                self.update(1)
        finally:
            self.close()

    def line(self, now: float | None = None) -> str:
        elapsed = (self._clock() if now is None else now) - self._start
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        return progress_line(self.desc, self.done, self.total, elapsed, rate, self.unit, self.postfix)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
