"""Checks of a researcher's own plug-ins against the properties the built-ins are tested for.

:func:`check_estimator` runs a registered advantage estimator (``@register_estimator``) through
:func:`drmas.algos.compute_advantages`, the entry the trainer uses, and checks

- ``returns``: the estimator returns ``(advantages, grouping)``: a floating tensor of one value per row and a
  :class:`~drmas.algos.advantages.Grouping` whose segments cover every row (its statistics frame builds);
- ``finite``: every advantage is finite;
- ``row permutation``: permuting the rows of the step table permutes the advantages the same way;
- ``zero on constant groups``: a task group whose scores are all equal gets advantage 0;
- ``shift invariance``, if the estimator declares it (``my_estimator.shift_invariant = True``): adding a
  constant to every score of a task group leaves its advantages unchanged;

under each of several statistical conventions (:data:`CHECKED_CONVENTIONS`). The last two hold for the groups
without a group of one at any level (every built-in treats a singleton by ``algo.singleton``): task groups
with at least two trajectories in which every agent acts in at least two of them (:func:`covered_tasks`).

    from drmas.testing import check_estimator
    report = check_estimator("my_estimator")      # raises EstimatorCheckFailed naming the property and the rows
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from drmas.algos.advantages import (
    ESTIMATORS,
    Conventions,
    EstimatorFn,
    Grouping,
    StepBatch,
    compute_advantages,
)

StepColumns = tuple[Sequence[float], Sequence[Any], Sequence[Any], Sequence[Any]]
"""(scores, task ids, agent ids, trajectory ids): one entry per agent step, as :func:`compute_advantages` takes."""

CHECKED_CONVENTIONS: tuple[Conventions, ...] = (Conventions(), Conventions(ddof=0, singleton="zero"),
                                                Conventions(scale_by_std=False))
"""The conventions :func:`check_estimator` checks under: the reference's defaults, population std with the
``zero`` singleton rule, mean-only (no division by the std)."""


class EstimatorCheckFailed(AssertionError):
    """An estimator broke a property; the message names the estimator, the property, the conventions and rows."""


@dataclass(frozen=True)
class EstimatorReport:
    """What :func:`check_estimator` checked."""

    estimator: str
    """the registered name"""
    rows: int
    """agent steps of the checked table"""
    passed: tuple[str, ...]
    """the properties that held under every checked convention"""
    skipped: dict[str, str] = field(default_factory=dict)
    """property -> why it was not checked"""


def example_table() -> StepColumns:
    """A step table shaped like the math system's: 3 tasks x 4 trajectories, a solver acting once or twice per
    trajectory and a verifier once; team rewards in {0, 1} minus a 0.1 penalty on some steps, plus a small
    per-step spread (no ties within a group)."""
    scores, tasks, agents, trajs = [], [], [], []
    for t in range(3):
        for j in range(4):
            reward = float((t + j) % 2)
            for k, agent in enumerate(["solver"] * (1 + (j + t) % 2) + ["verifier"]):
                penalty = 0.1 if (t + j + k) % 3 == 0 else 0.0
                scores.append(reward - penalty + 0.01 * (3 * t + 2 * j + k))
                tasks.append(f"task{t}")
                agents.append(agent)
                trajs.append(j)
    return scores, tasks, agents, trajs


def covered_tasks(table: StepColumns) -> list[Any]:
    """The task ids whose group has at least two trajectories and in which every agent acts in at least two of
    them: no estimator level (task, agent, trajectory within either) has a group of one there."""
    _, tasks, agents, trajs = table
    seen: dict[Any, dict[str, set]] = {}
    for task, agent, traj in zip(tasks, agents, trajs):
        entry = seen.setdefault(task, {"trajs": set()})
        entry["trajs"].add(traj)
        entry.setdefault(("agent", agent), set()).add(traj)
    return [task for task, entry in seen.items()
            if len(entry["trajs"]) >= 2 and all(len(v) >= 2 for k, v in entry.items() if k != "trajs")]


def check_estimator(estimator: str | EstimatorFn, *, table: StepColumns | None = None, seed: int = 0,
                    conventions: Sequence[Conventions] = CHECKED_CONVENTIONS, atol: float = 1e-5,
                    rtol: float = 1e-5) -> EstimatorReport:
    """Check a registered estimator (its name, or the function ``@register_estimator`` returned) on ``table``
    (default: :func:`example_table`); ``seed`` draws the row permutation. Raises :class:`EstimatorCheckFailed`
    at the first property that does not hold; returns an :class:`EstimatorReport`."""
    name = _registered_name(estimator)
    fn = ESTIMATORS.get(name)
    table = example_table() if table is None else table
    scores = np.asarray(table[0], dtype=np.float64)
    tasks, agents, trajs = (np.asarray(column) for column in table[1:])
    n = scores.shape[0]
    covered = np.isin(tasks, covered_tasks(table)) if n else np.zeros(0, bool)
    shift = bool(getattr(fn, "shift_invariant", False))
    skipped = {}
    if not covered.any():
        skipped["zero on constant groups"] = skipped["shift invariance"] = (
            "no task group with two trajectories in which every agent acts in two of them")
    elif not shift:
        skipped["shift invariance"] = f"not declared (set {name}.shift_invariant = True where it holds)"
    perm = np.random.default_rng(seed).permutation(n)
    # a different constant per task group: equal scores within each, and a shift that differs between groups
    per_task = {task: 0.37 * (i + 1) for i, task in enumerate(dict.fromkeys(tasks.tolist()))}
    offsets = np.array([per_task[task] for task in tasks.tolist()], dtype=np.float64)

    for conv in conventions:
        def run(x: np.ndarray, order: np.ndarray | None = None) -> torch.Tensor:
            idx = np.arange(n) if order is None else order
            return compute_advantages(torch.from_numpy(x[idx]), tasks[idx], agents[idx], trajs[idx], estimator=name,
                                      ddof=conv.ddof, eps=conv.eps, singleton=conv.singleton,
                                      scale_by_std=conv.scale_by_std).advantages.double()

        def fail(prop: str, detail: str) -> EstimatorCheckFailed:
            return EstimatorCheckFailed(f"estimator {name!r} breaks `{prop}` under {conv}: {detail}")

        _check_returns(fn, name, scores, tasks, agents, trajs, conv, fail)
        base = run(scores)
        bad = np.flatnonzero(~torch.isfinite(base).numpy())
        if bad.size:
            raise fail("finite", f"rows {bad[:5].tolist()} are {base[bad[:5]].tolist()}; guard divisions by a std or "
                                 "a count that can be 0")
        _close(run(scores, perm), base[perm], "row permutation", "the advantages of the permuted table are not the "
               "permuted advantages (rows {rows}: {got} vs {want}); compute from the id columns, not row positions",
               fail, atol, rtol)
        if "zero on constant groups" in skipped:
            continue
        rows = np.flatnonzero(covered)
        constant = np.where(covered, offsets, scores)
        _close(run(constant)[rows], torch.zeros(rows.size, dtype=torch.float64), "zero on constant groups",
               "rows {rows} of task groups whose scores are all equal got {got}, not 0", fail, atol, rtol, rows)
        if shift:
            _close(run(scores + np.where(covered, offsets, 0.0))[rows], base[rows], "shift invariance",
                   "adding a constant to the scores of each task group changed rows {rows}: {got} vs {want}", fail,
                   atol, rtol, rows)
    passed = tuple(p for p in ("returns", "finite", "row permutation", "zero on constant groups", "shift invariance")
                   if p not in skipped)
    return EstimatorReport(name, n, passed, skipped)


def _registered_name(estimator: str | EstimatorFn) -> str:
    if isinstance(estimator, str):
        ESTIMATORS.get(estimator)  # an unknown name lists the registered ones
        return estimator
    names = [n for n in ESTIMATORS.names() if ESTIMATORS.get(n) is estimator]
    if not names:
        raise EstimatorCheckFailed(f"{estimator!r} is not a registered estimator; decorate it with "
                                   "@register_estimator('my_estimator') (and import its module) first")
    return names[0]


def _check_returns(fn: EstimatorFn, name: str, scores: np.ndarray, tasks: np.ndarray, agents: np.ndarray,
                   trajs: np.ndarray, conv: Conventions, fail: Any) -> None:
    """The estimator's own return value: ``(float tensor [n], Grouping covering the n rows)``; the statistics
    frame of :func:`compute_advantages` builds from it."""
    n = scores.shape[0]
    out = fn(StepBatch(torch.from_numpy(scores), tasks, agents, trajs, conv))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise fail("returns", f"it returned {type(out).__name__}; return (advantages, grouping): a tensor of one "
                              "value per row and the Grouping of the groups it normalized in")
    adv, grouping = out
    if not isinstance(adv, torch.Tensor) or adv.shape != (n,) or not adv.is_floating_point():
        got = (f"a {adv.dtype} tensor of shape {tuple(adv.shape)}" if isinstance(adv, torch.Tensor)
               else f"{type(adv).__module__}.{type(adv).__qualname__}")
        raise fail("returns", f"advantages must be a floating tensor of shape ({n},), got {got}")
    if not isinstance(grouping, Grouping):
        raise fail("returns", f"the second value must be a drmas.algos.advantages.Grouping, got "
                              f"{type(grouping).__name__}; e.g. Grouping(batch.task_agent, batch.agent_steps, by_agent=True)")
    code, count = grouping.segments.code, grouping.segments.count
    if code.shape != (n,) or (n and not (0 <= int(code.min()) and int(code.max()) < count)) \
            or grouping.stats.n.shape != (count,):
        raise fail("returns", f"its Grouping does not cover the {n} rows (segments.code of shape {tuple(code.shape)} "
                              f"for {count} groups, stats for {tuple(grouping.stats.n.shape)}); pass the Segments and "
                              "SegmentStats of one grouping of the batch")
    if n:
        frame = compute_advantages(torch.from_numpy(scores), tasks, agents, trajs, estimator=name, ddof=conv.ddof,
                                   eps=conv.eps, singleton=conv.singleton, scale_by_std=conv.scale_by_std).stats
        if len(frame) != count:
            raise fail("returns", f"its statistics frame has {len(frame)} rows for {count} groups")


def _close(got: torch.Tensor, want: torch.Tensor, prop: str, message: str, fail: Any, atol: float, rtol: float,
           rows: np.ndarray | None = None) -> None:
    bad = np.flatnonzero(~np.isclose(got.numpy(), want.numpy(), atol=atol, rtol=rtol))
    if bad.size:
        where = bad[:5] if rows is None else rows[bad[:5]]
        raise fail(prop, message.format(rows=where.tolist(), got=[round(float(v), 6) for v in got[bad[:5]]],
                                        want=[round(float(v), 6) for v in want[bad[:5]]]))
