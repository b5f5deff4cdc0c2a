"""A run folder, readable: its state (finished, in progress, stopped at step k of N), the final and best
evaluation per benchmark and their average, the mean step time, where its files are and the commands that come
next (:func:`read_summary` -> :class:`RunSummary` -> :func:`summary_text`). ``drmas train`` prints it at the end
of a run; ``drmas summary RUN`` prints it for any run folder and writes ``summary.md`` with the curves
(``summary.png``: training reward and evaluation average over the steps; :func:`write_summary`).

Read from the folder's ``config.yaml``, ``DONE``, ``metrics.jsonl``, ``eval.jsonl`` and ``checkpoints/latest``;
nothing here imports torch, and matplotlib only when the curves are drawn. The records are read by the rules the
analysis applies (:mod:`drmas.io`'s JSONL rule, then :mod:`drmas.records`: the record schema and the records rule),
so a record the report would refuse is an error here too, one line naming the file and line
(:class:`~drmas.records.RecordsRefused`), and so is a file that cannot be read; a config or ``DONE`` value that is
not what a run writes is one line naming the file and the key, never a traceback.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from drmas.checkpoints import read_manifest
from drmas.config import ConfigError
from drmas.io import atomic_output, atomic_write_text, read_json_object, read_jsonl_lines
from drmas.locks import describe_holder, live_holder
from drmas.loggers import eval_average
from drmas.records import RecordsRefused, record_problems, records_rule

logger = logging.getLogger(__name__)

SUMMARY_MD = "summary.md"
CURVES_PNG = "summary.png"


@dataclass(frozen=True)
class BenchmarkEval:
    """One benchmark's avg@k: at the last evaluation, and the best one with its step."""

    name: str
    final: float
    final_step: int
    best: float
    best_step: int


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    name: str
    state: str
    """``finished`` (DONE), ``in progress`` (a live process holds the folder) or ``stopped``."""
    holder: str
    """Who holds the folder, for ``in progress`` (else empty)."""
    steps_done: int
    steps_total: int
    eval_k: int | None
    benchmarks: tuple[BenchmarkEval, ...]
    eval_curve: tuple[tuple[int, float], ...]
    """(step, mean avg@k over the benchmarks) of every evaluation."""
    reward_curve: tuple[tuple[int, float], ...]
    """(step, ``reward/mean``) of every step record."""
    mean_step_seconds: float | None
    """Mean ``timing/step`` (rollout, rewards, advantages, update) over the step records."""
    checkpoint_step: int | None
    files: tuple[tuple[str, Path], ...]
    """(what, path) of the folder's files that exist."""
    tensorboard: bool

    @property
    def final_average(self) -> tuple[int, float] | None:
        return self.eval_curve[-1] if self.eval_curve else None

    @property
    def best_average(self) -> tuple[int, float] | None:
        return max(self.eval_curve, key=lambda sv: sv[1]) if self.eval_curve else None

    @property
    def progress(self) -> str:
        """``finished: 3 of 3 steps``, ``in progress: step 2 of 3 (pid …)``, ``stopped at step 2 of 3``."""
        if self.state == "finished":
            return f"finished: {self.steps_done} of {self.steps_total} steps"
        if self.state == "in progress":
            return f"in progress: step {self.steps_done} of {self.steps_total} ({self.holder})"
        return f"stopped at step {self.steps_done} of {self.steps_total}"

    def next_commands(self) -> list[str]:
        run = str(self.run_dir)
        out = [f"tensorboard --logdir {run}/tb"] if self.tensorboard else []
        if self.checkpoint_step:
            out += [f"drmas eval {run}", f"drmas export {run}"]
        return [*out, f"drmas summary {run}"]


def _read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.yaml); pass the folder `drmas train` wrote")
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: unreadable ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a run config (a YAML mapping)")
    return cfg


def _read_done(path: Path) -> dict[str, Any] | None:
    """``DONE``'s record; None without one, {} when it is there but unreadable or its ``steps`` is not a number of
    steps (the run finished all the same; a warning names the file)."""
    if not path.exists():
        return None
    done = read_json_object(path)
    if done is None or not _is_count(done.get("steps", 0)):
        why = "unreadable" if done is None else f"steps = {done['steps']!r}"
        logger.warning("%s: not the record `drmas train` writes (%s); the run counts as finished, its step count "
                       "is taken from metrics.jsonl", path, why)
        return {}
    return done


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _steps_total(path: Path, train: Any, steps_done: int) -> int:
    """``train.steps`` of the run's config (``steps_done`` when it has none); a value that is not a number of steps
    is a ConfigError naming the file and the key."""
    if not isinstance(train, dict):
        raise ConfigError(f"{path}: train = {train!r} is not a mapping; fix: restore the config.yaml `drmas train` "
                          "wrote")
    steps = train.get("steps", steps_done)
    if not _is_count(steps):
        raise ConfigError(f"{path}: train.steps = {steps!r} is not a number of steps; fix: restore the config.yaml "
                          "`drmas train` wrote")
    return steps


def read_run_records(path: Path, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The records of a run's JSONL file (``keys``: ``("step",)`` for ``metrics.jsonl``, ``("step", "benchmark")``
    for ``eval.jsonl``) by the analysis's rules: :mod:`drmas.io`'s JSONL rule, the record schema and the records
    rule (:mod:`drmas.records`). Identical repeats collapse into one (a warning); a record that breaks the schema,
    records of one key that conflict, or a file that cannot be read raise :class:`RecordsRefused`, one line naming
    the file and the lines. A missing file has no records."""
    if not path.exists():
        return []
    if not path.is_file():
        raise RecordsRefused(f"{path} is not a file (a folder?); a run writes its records there: move it away")
    try:
        got = read_jsonl_lines(path)
        problems = record_problems(path)
    except OSError as exc:
        raise RecordsRefused(f"{path}: unreadable ({exc.strerror or exc})") from None
    if problems:
        more = f" (and {len(problems) - 1} more record(s))" if len(problems) > 1 else ""
        raise RecordsRefused(f"{problems[0]}{more}: not a record `drmas train` writes; restore the file (or remove "
                             "the record)")
    ruling = records_rule(path, got.records, keys, got.line_nos)
    if ruling.conflict:
        raise RecordsRefused(f"{ruling.conflict}: which record is right cannot be told (the analysis leaves the run "
                             "out); remove the wrong record, or rerun the run")
    if ruling.note:
        logger.warning("%s", ruling.note)
    return [r for r, kept in zip(got.records, ruling.kept) if kept]


def benchmark_evals(records: list[dict[str, Any]]) -> tuple[tuple[BenchmarkEval, ...], tuple[tuple[int, float], ...]]:
    """Per benchmark, its final and best avg@k; and (step, mean avg@k over the benchmarks) of every evaluation,
    from the records of ``eval.jsonl`` (a later record of the same step and benchmark replaces an earlier one)."""
    by_step: dict[int, dict[str, dict[str, Any]]] = {}
    for rec in records:
        by_step.setdefault(int(rec["step"]), {})[str(rec["benchmark"])] = rec
    curve = tuple((step, eval_average(by_step[step].values())) for step in sorted(by_step))
    names = list(dict.fromkeys(name for step in sorted(by_step) for name in by_step[step]))
    out = []
    for name in names:
        points = [(step, float(by_step[step][name]["avg"])) for step in sorted(by_step) if name in by_step[step]]
        best_step, best = max(points, key=lambda sv: sv[1])  # the earliest of equal bests
        out.append(BenchmarkEval(name, points[-1][1], points[-1][0], best, best_step))
    return tuple(out), curve


def read_summary(run_dir: str | Path) -> RunSummary:
    """The summary of the run folder ``run_dir`` (finished or not). Raises :class:`~drmas.config.ConfigError`
    for a folder that is not a run folder (no ``config.yaml``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a run folder (no such folder); pass the folder `drmas train` wrote")
    cfg = _read_config(run_dir)
    train = cfg.get("train") or {}
    steps = read_run_records(run_dir / "metrics.jsonl", ("step",))
    evals = read_run_records(run_dir / "eval.jsonl", ("step", "benchmark"))
    benchmarks, eval_curve = benchmark_evals(evals)
    done = _read_done(run_dir / "DONE")
    steps_done = max((int(r["step"]) for r in steps), default=-1) + 1
    steps_total = _steps_total(run_dir / "config.yaml", train, steps_done)
    holder = live_holder(run_dir) if done is None else None
    state = "finished" if done is not None else "in progress" if holder is not None else "stopped"
    if done is not None:
        steps_done = int(done.get("steps", steps_done))
    timings = [float(r["timing/step"]) for r in steps if isinstance(r.get("timing/step"), (int, float))]
    manifest = read_manifest(run_dir / "checkpoints" / "latest")
    return RunSummary(
        run_dir=run_dir, name=str(cfg.get("name", run_dir.name)), state=state,
        holder=describe_holder(holder) if holder is not None else "", steps_done=steps_done, steps_total=steps_total,
        eval_k=int(evals[-1]["k"]) if evals and "k" in evals[-1] else train.get("eval_samples"),
        benchmarks=benchmarks, eval_curve=eval_curve,
        reward_curve=tuple((int(r["step"]), float(r["reward/mean"])) for r in steps
                           if isinstance(r.get("reward/mean"), (int, float))),
        mean_step_seconds=sum(timings) / len(timings) if timings else None,
        checkpoint_step=manifest["step"] if manifest and _is_count(manifest.get("step")) else None,
        files=run_files(run_dir), tensorboard=(run_dir / "tb").is_dir())


def run_files(run_dir: Path) -> tuple[tuple[str, Path], ...]:
    """(what, path) of the run folder's files that exist now (:attr:`RunSummary.files`)."""
    candidates = [("run folder", run_dir), ("config", run_dir / "config.yaml"), ("metrics", run_dir / "metrics.jsonl"),
                  ("evaluations", run_dir / "eval.jsonl"), ("checkpoint", run_dir / "checkpoints" / "latest"),
                  ("tensorboard", run_dir / "tb"), ("wandb", run_dir / "wandb"), ("summary", run_dir / SUMMARY_MD),
                  ("curves", run_dir / CURVES_PNG)]
    return tuple((what, path) for what, path in candidates if path.exists())


def _num(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.3f}"


def _eval_rows(s: RunSummary) -> list[tuple[str, str, str]]:
    """(benchmark, final, best) cells of the evaluation table, the average last."""
    rows = [(b.name, f"{_num(b.final)} (step {b.final_step})", f"{_num(b.best)} (step {b.best_step})")
            for b in s.benchmarks]
    if s.final_average and s.best_average:
        (fs, fv), (bs, bv) = s.final_average, s.best_average
        rows.append(("average", f"{_num(fv)} (step {fs})", f"{_num(bv)} (step {bs})"))
    return rows


def _timing(s: RunSummary) -> str:
    if s.mean_step_seconds is None:
        return "no step recorded yet"
    total = s.mean_step_seconds * len(s.reward_curve)
    last = f", last reward/mean {_num(s.reward_curve[-1][1])}" if s.reward_curve else ""
    return f"mean {s.mean_step_seconds:.2f} s/step over {len(s.reward_curve)} steps ({total:.1f} s in steps){last}"


def summary_text(s: RunSummary) -> str:
    """The summary as the terminal shows it."""
    lines = [f"run {s.name}: {s.progress}"]
    rows = _eval_rows(s)
    if rows:
        rows = [("benchmark", "final", "best"), *rows]
        width, cell = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        lines.append(f"evaluation avg@{s.eval_k} (the final and the best):")
        lines += [f"  {name:{width}}  {final:{cell}}  {best}" for name, final, best in rows]
    else:
        lines.append("evaluation: none recorded yet")
    lines.append(f"training: {_timing(s)}")
    lines.append("files:")
    width = max(len(what) for what, _ in s.files)
    lines += [f"  {what:{width}}  {path}" + (f" (step {s.checkpoint_step})" if what == "checkpoint" else "")
              for what, path in s.files]
    lines.append("next:")
    lines += [f"  {cmd}" for cmd in s.next_commands()]
    if s.state == "stopped":
        lines.append("  (to resume: run the same `drmas train` command again)")
    return "\n".join(lines)


def summary_markdown(s: RunSummary, curves: str | None) -> str:
    """``summary.md``: the summary as Markdown; ``curves`` is the name of the curves' PNG beside it (or None)."""
    lines = [f"# Run `{s.name}`", "", f"{s.progress[0].upper()}{s.progress[1:]}.", ""]
    rows = _eval_rows(s)
    if rows:
        lines += [f"| benchmark | final avg@{s.eval_k} | best avg@{s.eval_k} |", "|---|---|---|"]
        lines += [f"| {name} | {final} | {best} |" for name, final, best in rows]
    else:
        lines.append("No evaluation recorded yet.")
    lines += ["", f"Training: {_timing(s)}.", ""]
    if curves:
        lines += [f"![training reward and evaluation average over the steps]({curves})", ""]
    lines += ["| file | path |", "|---|---|"]
    lines += [f"| {what} | `{path}` |" for what, path in s.files]
    lines += ["", "Next:", "", "```bash", *s.next_commands(), "```", ""]
    return "\n".join(lines)


def plot_curves(s: RunSummary, path: Path) -> bool:
    """Draw the training reward and the evaluation average over the steps into the PNG ``path`` (atomically);
    False, drawing nothing, when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    reward, evaluation = fig.subplots(1, 2)
    if s.reward_curve:
        steps, values = zip(*s.reward_curve)
        reward.plot(steps, values, color="tab:blue", lw=1.2)
    reward.set(title="training reward (reward/mean)", xlabel="step")
    if s.eval_curve:
        steps, values = zip(*s.eval_curve)
        evaluation.plot(steps, values, color="black", lw=2, marker="o", ms=3, label="average")
    evaluation.set(title=f"evaluation avg@{s.eval_k}", xlabel="step")
    if s.eval_curve:
        evaluation.legend(loc="best", fontsize="small")
    for ax in (reward, evaluation):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return True


def write_summary(s: RunSummary) -> Path:
    """Write ``summary.md`` and its curves (``summary.png``) into the run folder; returns the Markdown's path."""
    curves = CURVES_PNG if plot_curves(s, s.run_dir / CURVES_PNG) else None
    path = s.run_dir / SUMMARY_MD
    files = [(what, p) for what, p in s.files if what not in ("summary", "curves")]
    files += [("summary", path)] + ([("curves", s.run_dir / CURVES_PNG)] if curves else [])
    atomic_write_text(path, summary_markdown(replace(s, files=tuple(files)), curves))
    return path
