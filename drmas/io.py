"""The project's one JSONL reader and appender, and its one atomic file write.

**JSONL rule** (every reader of a ``*.jsonl`` file in drmas, envs and analysis goes through
:func:`read_jsonl_lines`): records are JSON objects, one per line, appended by :func:`append_jsonl` with one
``write(2)`` and an ``fsync``, so a process killed while appending leaves at most a torn *last* line.

- a last line that does not parse (or is not a JSON object) is such a torn append: it is dropped with a
  warning and reported to the caller (``JsonlRead.torn``);
- any other damage (a line before the last that does not parse or is not an object) is an error,
  :class:`JsonlDamaged`, naming the file and the line: dropping it would hide a lost record (a step, an
  evaluation, a task) and silently change whatever is computed from the file;
- blank lines carry no record and are skipped.

**Atomic write** (:func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json`): the data
goes to a uniquely named temporary file in the same folder (:func:`atomic_output`, for any writer), is
fsynced, then renamed over the target, so a reader sees the old file or the new one, never a mixture, and
two writers never share a temporary file. A folder (a checkpoint, a tokenizer, an index) is written the
same way: filled in a temporary sibling, then renamed into place (:func:`atomic_folder`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

logger = logging.getLogger(__name__)


class WriteFailed(OSError):
    """A write did not complete (full disk, quota, I/O error); the message names the path and the cause, and
    says what was kept (the file as it was before the write). ``errno`` is the failed call's."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


def _cause(exc: BaseException) -> str:
    """``No space left on device`` (the errno's text) rather than ``[Errno 28] ...: 'path'``."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0] if str(exc) else \
        type(exc).__name__


def write_all(fd: int, data: bytes, path: str | Path) -> None:
    """``os.write`` until every byte of ``data`` is written (a write may write fewer bytes than asked); a
    write that makes no progress, or fails, raises :class:`WriteFailed` naming ``path`` and the cause."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as exc:
            raise WriteFailed(f"{path}: {len(view)} of {len(data)} bytes could not be written "
                              f"({_cause(exc)})", exc.errno) from exc
        if n <= 0:
            raise WriteFailed(f"{path}: write made no progress with {len(view)} of {len(data)} bytes left")
        view = view[n:]


class JsonlDamaged(ValueError):
    """A JSONL file is damaged somewhere other than a torn last line (the message names file and line)."""


@dataclass
class JsonlRead:
    """What :func:`read_jsonl_lines` read: the (line, record) pairs, and the torn last line it dropped."""

    path: Path
    lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    line_nos: list[int] = field(default_factory=list)
    """The file's line number (1-based) of each record of :attr:`lines`."""
    torn: str | None = None
    """The dropped torn last line (None: the file ended with a complete record)."""
    torn_line_no: int | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        return [rec for _, rec in self.lines]

    def __iter__(self):
        return iter(self.lines)


def read_jsonl_lines(path: str | Path) -> JsonlRead:
    """Read a JSONL file by the module's rule (torn last line dropped with a warning, other damage raises
    :class:`JsonlDamaged` naming the file and line). A missing file raises ``FileNotFoundError``."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline, as every complete append does
    out = JsonlRead(path)
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
        except (ValueError, RecursionError) as exc:
            if i == last:
                logger.warning("%s, line %d: dropping a torn last line (%d bytes) left by a killed writer",
                               path, i + 1, len(line))
                out.torn, out.torn_line_no = line, i + 1
                break
            raise JsonlDamaged(f"{path}, line {i + 1}: not a JSON record ({str(exc)[:120]}) and not the last line, "
                               "so not a torn append: the file is damaged. Restore it (or delete the run and run it "
                               "again); dropping the line would silently change every number computed from the file"
                               ) from None
        out.lines.append((line, rec))
        out.line_nos.append(i + 1)
    return out


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL file, by the module's rule (see :func:`read_jsonl_lines`)."""
    return read_jsonl_lines(path).records


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON line with one ``write(2)`` on an ``O_APPEND`` descriptor (more only if the kernel
    writes fewer bytes, :func:`write_all`) and fsync it: a kill leaves at most a torn last line, and
    concurrent appenders never interleave within a line. A write that fails (a full disk) cuts the file back
    to its size before the append, so it holds complete records only, and raises :class:`WriteFailed`
    naming the path and the cause."""
    data = (json.dumps(record, default=float, allow_nan=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise WriteFailed(f"{path}: cannot be opened for appending ({_cause(exc)})", exc.errno) from exc
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data, path)
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)  # no half record stays behind
            if isinstance(exc, WriteFailed):
                raise WriteFailed(f"{exc}; the file keeps its {size} bytes of complete records", exc.errno) from exc
            raise WriteFailed(f"{path}: fsync failed ({_cause(exc)}); the file keeps its {size} "
                              "bytes of complete records", exc.errno) from exc
    finally:
        os.close(fd)


def write_jsonl(path: str | Path, records: list[dict[str, Any]] | list[str]) -> None:
    """Write a whole JSONL file atomically (records, or already-serialized lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a unique temporary path in ``path``'s folder for the caller to write (any writer: text,
    ``savefig``, ``torch.save``); on success it is fsynced, made world-readable (0644) and renamed over
    ``path``; on an exception it is removed and ``path`` is untouched. An ``OSError`` (a full disk) while
    writing, fsyncing or renaming becomes :class:`WriteFailed` naming ``path`` and the cause."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except OSError as exc:
        what = str(exc) if isinstance(exc, WriteFailed) else f"{path}: could not be written ({_cause(exc)})"
        kept = "the previous file is unchanged" if path.exists() else "nothing was written"
        raise WriteFailed(f"{what}; {kept}", exc.errno) from exc
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_folder(path: str | Path, if_exists: Literal["replace", "keep"] = "replace") -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``path`` for the caller to fill (a checkpoint, a tokenizer, an
    index); on success it is renamed onto ``path``, so a reader never sees a half-written folder; on an
    exception it is removed and ``path`` is untouched. An existing ``path``: ``replace`` moves it aside,
    renames the new one in and removes the old one (between the two renames, for an instant, there is no
    ``path``); ``keep`` keeps it and discards ours (a concurrent writer of the same content got there first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if if_exists == "keep":
            try:
                os.rename(tmp, path)
            except OSError:
                if not path.is_dir():
                    raise
        elif path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            write_all(fd, data, path)
        finally:
            os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, **kw: Any) -> None:
    """:func:`atomic_write_bytes` of ``json.dumps(obj, **kw)``."""
    atomic_write_text(path, json.dumps(obj, **kw))


def read_json_object(path: str | Path) -> dict[str, Any] | None:
    """The JSON object (a dict) that ``path`` holds; ``None`` when the file is absent, unreadable, not JSON or not
    an object (a run folder's manifest.json and DONE are read this way)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
