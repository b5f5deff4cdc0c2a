"""Where a run's step and evaluation records go: ``metrics.jsonl`` and ``eval.jsonl`` in the run folder, always
(:class:`MetricsSink`), and every logger of ``train.loggers`` (:data:`LOGGERS`: TensorBoard, W&B).

The logger registry is the catalogue config validation reads (``train.loggers``); a logger's own library
(tensorboard, wandb) is imported only when a run builds it. Which keys a step logs is
:mod:`drmas.trainer.metrics`.
"""
from __future__ import annotations

import math
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from drmas.io import WriteFailed, append_jsonl, atomic_write_text, read_jsonl_lines, write_jsonl
from drmas.registry import Registry


REFERENCE_ACTOR_KEYS = {"grad_norm": "grad_norm", "loss": "pg_loss", "clip_frac": "pg_clipfrac", "entropy": "entropy",
                        "approx_kl_old": "ppo_kl", "lr": "lr"}
"""drmas's ``wg/{m}/{key}`` -> the reference code's (verl) ``actor/{m}/{name}``, logged beside drmas's keys to W&B."""


def reference_names(metrics: dict[str, Any]) -> dict[str, Any]:
    """The reference code's per-model names of ``metrics``' worker-group keys: ``wg/{m}/grad_norm`` ->
    ``actor/{m}/grad_norm``, ``wg/{m}/loss`` -> ``actor/{m}/pg_loss``, ... (:data:`REFERENCE_ACTOR_KEYS`)."""
    out = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "wg" and parts[2] in REFERENCE_ACTOR_KEYS:
            out[f"actor/{parts[1]}/{REFERENCE_ACTOR_KEYS[parts[2]]}"] = value
    return out


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (what a scalar logger can plot)."""
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


EVAL_AVERAGE_KEY = "eval/avg"
"""The scalar of an evaluation's mean avg@k over its benchmarks (:func:`eval_average`), sent to the loggers."""


def eval_average(records: Iterable[dict[str, Any]]) -> float:
    """The mean ``avg`` (avg@k) over the benchmark records of one evaluation (the records of ``eval.jsonl``)."""
    values = [float(r["avg"]) for r in records]
    return sum(values) / len(values) if values else math.nan


def _eval_scalars(record: dict[str, Any]) -> dict[str, float]:
    return {f"eval/{record['benchmark']}/avg@{record['k']}": record["avg"],
            f"eval/{record['benchmark']}/pass@{record['k']}": record["pass"]}


def config_markdown(config: dict[str, Any]) -> str:
    """``config`` as YAML in a fenced code block (how TensorBoard's text tab shows it as written)."""
    import yaml

    return "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```"


class LoggerUnavailable(RuntimeError):
    """A logger of ``train.loggers`` could not start (one line: why, and what to do)."""


LOGGERS: Registry[Callable[..., Any]] = Registry("metrics logger")
"""Loggers a run writes to beside metrics.jsonl / eval.jsonl (``train.loggers``). Each is built as
``factory(run_dir=, run_name=, config=)`` and has ``log_step(step, metrics)``, ``log_eval(record)`` and ``close()``."""


_TB_WRITER_MODULE = "tensorboard.summary.writer.event_file_writer"
"""The module of TensorBoard's event writer thread (``_AsyncWriterThread``)."""


def _leave_out_writer_thread_tracebacks() -> None:
    """TensorBoard's event writer thread keeps the exception of a failed write (a full disk) as its ``exception``
    and then ends by raising it; the writer raises the same exception in the thread that writes or flushes next
    (TensorBoardLogger turns it into one WriteFailed line). The traceback Python prints as that thread ends says
    nothing more: ``threading.excepthook`` leaves it out, and passes every other thread's exception on. Installed
    once per process."""
    previous = threading.excepthook
    if getattr(previous, "leaves_out_tb_writer", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if not (type(thread).__module__ == _TB_WRITER_MODULE and getattr(thread, "exception", None) is args.exc_value):
            previous(args)

    hook.leaves_out_tb_writer = True  # type: ignore[attr-defined]
    threading.excepthook = hook


@LOGGERS.register("tensorboard")
class TensorBoardLogger:
    """TensorBoard events in ``<run>/tb`` (nothing when tensorboard is not installed): the step and evaluation
    scalars, and the run's config as text (``config``, the YAML in a code block) each time the logger starts."""

    def __init__(self, run_dir: Path, run_name: str = "", config: dict[str, Any] | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self._tb = None
            return
        folder = Path(run_dir) / "tb"
        _leave_out_writer_thread_tracebacks()
        try:
            self._tb = SummaryWriter(str(folder))
            if config is not None:
                self._tb.add_text("config", config_markdown(config))
        except OSError as exc:  # a full disk: its event file cannot be created
            raise WriteFailed(f"{folder}: the TensorBoard writer could not start ({exc.strerror or exc}); nothing was "
                              "run; free space (or drop tensorboard from train.loggers) and run the same command "
                              "again", exc.errno) from None

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in _scalars(metrics).items() if self._tb else ():
            self._tb.add_scalar(key, value, step)

    def log_eval(self, record: dict[str, Any]) -> None:
        for key, value in _eval_scalars(record).items() if self._tb else ():
            self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self._tb:
            self._tb.close()


@LOGGERS.register("wandb")
class WandbLogger:
    """A Weights & Biases run in ``<run>/wandb`` (``pip install drmas[wandb]``): offline unless ``WANDB_MODE``
    says otherwise (``WANDB_MODE=online`` with ``wandb login``; ``wandb sync <run>/wandb/offline-run-*``
    uploads an offline run later). Project ``WANDB_PROJECT`` (default ``drmas``), run name = the config's
    ``name`` (``run_name``). Logs drmas's keys and the reference code's ``actor/{m}/...`` names (:func:`reference_names`).
    A resumed run continues the same W&B run: its id is kept in ``<run>/wandb/run_id`` (``resume="allow"``)."""

    def __init__(self, run_dir: Path, run_name: str = "", config: dict[str, Any] | None = None):
        import wandb

        folder = Path(run_dir) / "wandb"
        if folder.exists() and not folder.is_dir():
            raise LoggerUnavailable(f"{folder} is a file, in the way of the W&B run folder; move it away, or drop "
                                    "wandb from train.loggers")
        id_file = folder / "run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)  # W&B ids: [a-z0-9]
        id_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(id_file, run_id + "\n")
        mode = os.environ.get("WANDB_MODE", "offline")
        try:
            self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "drmas"), name=run_name or None,
                                   dir=str(run_dir), config=config or {}, mode=mode, id=run_id, resume="allow",
                                   reinit="create_new")
        except Exception as exc:  # wandb raises its own error types, and plain ones, for a failed start
            detail = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
            hint = ("; online mode needs a network and `wandb login`: set WANDB_MODE=offline to write the run into "
                    f"{folder} and upload it later with `wandb sync`" if mode != "offline" else "")
            raise LoggerUnavailable(f"the wandb logger could not start (WANDB_MODE={mode}): {detail}{hint}; or drop "
                                    "wandb from train.loggers") from None

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(_scalars({**metrics, **reference_names(metrics)}), step=step)

    def log_eval(self, record: dict[str, Any]) -> None:
        self._run.log(_eval_scalars(record), step=record["step"])

    def close(self) -> None:
        self._run.finish()


class MetricsSink:
    """``metrics.jsonl`` (one line per step) and ``eval.jsonl`` in the run dir, always; and every logger of
    ``loggers`` (:data:`LOGGERS`: TensorBoard, W&B), built on first use."""

    def __init__(self, run_dir: Path, loggers: Sequence[str] = ("tensorboard",), name: str = "",
                 config: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.eval_path = self.run_dir / "eval.jsonl"
        self._names = [n for n in loggers if n != "jsonl"]  # JSONL is always written
        self._kwargs = {"run_dir": self.run_dir, "run_name": name, "config": config}
        self._loggers: list[Any] | None = None

    def open(self) -> list[Any]:
        """Start every logger (at the latest by the first record; the trainer calls it before step 0, so a logger
        that cannot start stops the run before any work)."""
        if self._loggers is None:
            self._loggers = [LOGGERS.build(n, **self._kwargs) for n in self._names]
        return self._loggers

    def write_step(self, step: int, metrics: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        for lg in self.open():
            lg.log_step(step, metrics)

    def write_eval(self, record: dict[str, Any]) -> None:
        append_jsonl(self.eval_path, record)
        for lg in self.open():
            lg.log_eval(record)

    def write_eval_average(self, step: int, records: Iterable[dict[str, Any]]) -> None:
        """Send one evaluation's mean avg@k over its benchmarks (:data:`EVAL_AVERAGE_KEY`) to every logger as a
        scalar of ``step``; ``eval.jsonl`` holds the per-benchmark records it is computed from."""
        value = eval_average(records)
        for lg in self.open():
            lg.log_step(step, {EVAL_AVERAGE_KEY: value})

    def truncate(self, after_step: int) -> None:
        """Drop records a resumed run rewrites, atomically (write a copy, then rename it over the file):
        step records of steps > ``after_step``, and evaluation records after the checkpoint the run resumes
        from (the checkpoint at step s = after_step + 1 follows the evaluation at s; a run resumed from no
        checkpoint, s = 0, evaluates step 0 again). A torn last line (a killed append) is dropped."""
        limits = ((self.metrics_path, after_step), (self.eval_path, after_step + 1 if after_step >= 0 else -1))
        for path, limit in limits:
            if not path.exists():
                continue
            write_jsonl(path, [line for line, rec in read_jsonl_lines(path) if rec.get("step", -1) <= limit])

    def close(self) -> None:
        for lg in self._loggers or []:
            lg.close()
        self._loggers = None
