"""The stability frontier round's verdicts (C6; docs/frontier.md, the round's pre-registration: its rules were
committed before the pilot's first run, and this module applies them as written).

    python -m analysis.frontier --runs results/runs/frontier --out results/frontier
    python -m analysis.frontier --runs results/runs/frontier_pilot --out results/frontier_pilot --pilot

- **Primary event**: the confirmatory collapse (:func:`analysis.events.collapse_event`) with its onset no later than
  H − 20, by H = 100, 150, 200 (the verdict at 200).
- **C6-n** (non-sharing): per estimator LR50 of the Firth logistic fit of collapse on log2(lr), Δ = log2 LR50(Dr.
  MAS) − log2 LR50(GRPO) with its 95 % parametric-bootstrap interval (:func:`analysis.frontier_design.frontier`),
  read against the ±0.5-octave margin (:func:`analysis.frontier_design.verdict`).
- **C6-s** (shared model): the same for the shared arm, and the arm x estimator interaction (two-sided); Holm over
  C6-n's one-sided test and the interaction.
- Secondary: the log-normal AFT time ratio GRPO / Dr. MAS, "learned, then broke", the rule's false-alarm rate and
  "where both learn" (C6-acc: Dr. MAS − GRPO of the time-averaged avg@4 at 5e-5), the agents' shares of a shared
  update.

``--pilot`` reads the pilot (seeds 2000-2001, labelled pilot: never a verdict) and prints the levels rule's result
per arm, or the extension step the pre-registration names.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from drmas.algos.catalog import DRMAS, GRPO, estimator_label
from drmas.io import atomic_write_text

from analysis.claims import (CONFIRMATORY, INCONCLUSIVE, NOT_RUN, ClaimSpec, Judged, Option, incomplete,
                             incomplete_so_far)
from analysis.cli import one_grid_study
from analysis.events import grid_status
from analysis.formatting import fmt_interval, fmt_lr, fmt_octaves, fmt_step_cost, fmt_value, markdown
from analysis.frontier_design import BOOTSTRAP_DRAWS, X50_SPAN, Frontier, ladder_level, levels_rule, verdict
from analysis.frontier_rules import (ARMS, HORIZONS, PRIMARY, SHARE_WINDOW, aft_time_ratio, arm_frontiers, differs,
                                     event_table, false_alarms, interaction, learned_counts, primary_tests, shares,
                                     time_averaged_accuracy)
from analysis.integrity import problem_lines
from analysis.plotting import figure, finish, save
from analysis.runs import GridData, load_grid
from analysis.stats import bootstrap_streams
from analysis.twins import accuracy_over_time

logger = logging.getLogger(__name__)

ARM_LABELS = {"nonsharing": "non-sharing", "sharing": "shared model"}
ESTIMATE = "estimate (secondary)"
DIFFERS, NO_DIFFERENCE_SHOWN = "differs", "no difference shown"
PILOT_SEEDS = (2000, 2001)
PILOT_TOP, PILOT_BOTTOM = 2e-4, 7.07e-5
"""The pilot's highest and lowest levels (docs/frontier.md, "The pilot")."""
EXTEND_UP, EXTEND_DOWN = (6, 8, 10, 12), (-4, -6, -8)
"""Ladder steps of the pilot's extension by half-octaves: up to the cap 8e-4, down to the floor 2.5e-5."""


@dataclass
class Round:
    """Every number of the round's verdicts, from one grid folder."""

    data: GridData
    finished: int
    total: int
    events: pd.DataFrame
    fronts: dict[tuple[str, int], Frontier]
    interactions: dict[int, dict[str, float]]
    tests: dict[str, float]
    aft: dict[str, dict]
    shares: dict[str, pd.DataFrame]
    false_alarm: dict
    learned: pd.DataFrame
    learn_accuracy: pd.DataFrame
    accuracy: pd.DataFrame
    verdicts: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.finished == self.total


def analyze(data: GridData, seed: int = 0, n_boot: int = 2000, draws: int = BOOTSTRAP_DRAWS,
            pilot: bool = False) -> Round:
    """Every estimate of the round from one grid; each (arm, horizon) frontier and the "where both learn" interval
    draw from their own stream of ``seed``. ``pilot``: the pilot's seeds stand in for the round's (labelled pilot)."""
    events = event_table(data)
    if pilot:
        events["part"] = np.where(events["seed"].isin(PILOT_SEEDS), "round", events["part"])
    streams = bootstrap_streams(seed, len(ARMS) * len(HORIZONS) + 1)
    fronts = arm_frontiers(events, dict(zip([(a, h) for a in ARMS for h in HORIZONS], streams)), draws)
    inter = {h: interaction(fronts[("sharing", h)], fronts[("nonsharing", h)]) for h in HORIZONS
             if ("sharing", h) in fronts and ("nonsharing", h) in fronts}
    learn = events[events["part"] == "learn"].rename(columns={f"collapsed_{PRIMARY}": "collapsed"})
    acc = accuracy_over_time(data, learn, streams[-1], n_boot) if len(learn) else pd.DataFrame()
    finished, total = grid_status(data)
    rnd = Round(data, finished, total, events, fronts, inter, primary_tests(fronts),
                {arm: aft_time_ratio(events, arm) for arm in ARMS}, shares(data, events), false_alarms(events),
                learned_counts(events), acc, time_averaged_accuracy(data, events))
    rnd.verdicts = {} if pilot else verdicts(rnd)
    return rnd


def _incomplete(rnd: Round, v: str) -> str:
    return v if rnd.complete else incomplete_so_far(rnd.finished, rnd.total, v)


def verdicts(rnd: Round) -> dict[str, str]:
    """The pre-registered verdict words per claim (docs/frontier.md, "Hypotheses, tests and verdicts")."""
    out = {}
    if (n := rnd.fronts.get(("nonsharing", PRIMARY))) is not None:
        out["C6-n"] = _incomplete(rnd, verdict(n.ci))
    if (s := rnd.fronts.get(("sharing", PRIMARY))) is not None:
        word = (DIFFERS if differs(rnd.tests["p_holm_C6-s"]) else NO_DIFFERENCE_SHOWN) if PRIMARY in rnd.interactions \
            else INCONCLUSIVE
        out["C6-s"] = _incomplete(rnd, f"{word}; shared arm {verdict(s.ci)}")
    if len(rnd.learn_accuracy):
        out["C6-acc"] = _incomplete(rnd, ESTIMATE)
    return out


# ------------------------------------------------------------------------------------------ words
def lr50_words(f: Frontier, levels: np.ndarray) -> str:
    """Each estimator's LR50 with its own draws' interval, and Δ in octaves with its interval. An LR50 held at the
    edge of its span (X50_SPAN octaves beyond the levels: a curve without a transition there) is said so."""
    parts = []
    lo_edge, hi_edge = np.log2(levels.min()) - X50_SPAN, np.log2(levels.max()) + X50_SPAN
    for i, (est, x50) in enumerate(((GRPO, f.x50_grpo), (DRMAS, f.x50_drmas))):
        lo, hi = f.x50_interval(i)
        where = (f"above the levels (no collapse up to {levels.max():.3g})" if x50 >= hi_edge - 1e-9 else
                 f"below the levels (collapse down to {levels.min():.3g})" if x50 <= lo_edge + 1e-9 else
                 f"{fmt_lr(2 ** x50)} [{fmt_lr(2 ** lo)}, {fmt_lr(2 ** hi)}]")
        parts.append(f"LR50 {estimator_label(est)} {where}")
    return (", ".join(parts) + f"; Δ {fmt_octaves(f.delta, *f.ci)} "
            f"(ratio {fmt_value(f.ratio)} {fmt_interval(2 ** f.ci[0], 2 ** f.ci[1])})")


def _aft_words(a: dict) -> str:
    if "ratio" not in a:
        return f"AFT: {a.get('note', 'not run')}"
    return (f"AFT time ratio GRPO / Dr. MAS {fmt_value(a['ratio'])} {fmt_interval(a['low'], a['high'])} "
            f"({a['events']} collapses in {a['runs']} runs{'; ' + a['note'] if a['note'] else ''})")


def arm_words(rnd: Round, arm: str) -> list[str]:
    """The arm's clauses: the frontier at each horizon (the primary first), the AFT ratio, learned-then-broke."""
    out = []
    for h in (PRIMARY, *(h for h in HORIZONS if h != PRIMARY)):
        if (f := rnd.fronts.get((arm, h))) is not None:
            levels = rnd.events.loc[(rnd.events["part"] == "round") & (rnd.events["arm"] == arm), "lr"].to_numpy()
            out.append(f"H = {h}: {lr50_words(f, levels)}, reads \"{verdict(f.ci)}\"")
    out.append(_aft_words(rnd.aft[arm]))
    lc = rnd.learned[rnd.learned["arm"] == arm]
    if len(lc):
        out.append(f"learned, then broke: {int(lc['learned_then_broke'].sum())} of {int(lc['collapsed'].sum())} "
                   f"collapses ({int(lc['learned'].sum())} of {int(lc['runs'].sum())} runs learned)")
    return out


def share_words(pooled: pd.DataFrame) -> str | None:
    """Each agent's share of the shared update (steps 0-39, every level), per estimator, with the twin pairs' median
    Dr. MAS − GRPO; None without shares."""
    sh = pooled[pooled["measure"] == "share"]
    if sh.empty:
        return None
    parts = []
    for agent, g in sh.groupby("agent"):
        med = g.set_index("estimator")["median"]
        part = f"{agent} " + " / ".join(f"{estimator_label(e)} {med[e]:.2f}" for e in (GRPO, DRMAS) if e in med)
        if g["pairs"].notna().any() and g["pairs"].max() > 0:
            part += f" (Dr. MAS − GRPO {g['median_diff'].iloc[0]:+.2f}, median of {int(g['pairs'].max())} twin pairs)"
        parts.append(part)
    return f"shares of the shared update, steps 0-{SHARE_WINDOW - 1}, every level (median per run): " + "; ".join(parts)


# ------------------------------------------------------------------------------------------ summary
def summary_markdown(rnd: Round, runs_dir: Path, pilot: bool = False) -> str:
    """results/frontier/summary.md (or the pilot's): verdicts, each arm's frontier, tests, secondary estimates."""
    title = "Frontier round PILOT (labelled pilot: no verdict)" if pilot else "Frontier round (C6)"
    commits = ", ".join(sorted(set(rnd.events["git_commit"].dropna().astype(str)))) or "none recorded"
    lines = [f"# {title} ({runs_dir})", "", f"Finished runs: {rnd.finished} of {rnd.total}"
             + ("" if rnd.complete else " (estimates incomplete)") + ".",
             f"Rules: docs/frontier.md. Code commits: {commits}.", ""]
    if rnd.verdicts:
        lines += ["| claim | verdict |", "|---|---|", *[f"| {k} | {v} |" for k, v in rnd.verdicts.items()], ""]
    if pilot:
        lines += ["## Levels rule (docs/frontier.md, \"The pilot\")", ""]
        lines += [f"- {ARM_LABELS[arm]}: {pilot_next(rnd.events, arm, _listed(rnd, arm))}" for arm in ARMS] + [""]
    for arm in ARMS:
        lines += [f"## {ARM_LABELS[arm]} arm", "", *(f"- {c}" for c in arm_words(rnd, arm)), ""]
    if rnd.tests:
        lines += ["## Primary tests (H = 200, Holm over the two)", "",
                  *(f"- {k}: p {fmt_value(rnd.tests[f'p_{k}'], 3)}, Holm p {fmt_value(rnd.tests[f'p_holm_{k}'], 3)}"
                    for k in ("C6-n", "C6-s") if f"p_{k}" in rnd.tests), ""]
    if rnd.interactions:
        lines += ["## Arm x estimator interaction (Δ shared − Δ non-sharing, octaves)", "",
                  *(f"- H = {h}: {fmt_octaves(i['estimate'], i['low'], i['high'])}, two-sided p "
                    f"{fmt_value(i['p'], 3)}" for h, i in rnd.interactions.items()), ""]
    if len(rnd.learned):
        lines += ["## Learned, then broke (per cell, by 200)", "", markdown(rnd.learned, index=False), ""]
    if fa := rnd.false_alarm:
        lines += ["## The rule's false-alarm rate (where both learn, 5e-5)", "",
                  f"Fired by 200 in {fa['fired']} of {fa['runs']} runs, exact 95 % interval "
                  f"{fmt_interval(fa['low'], fa['high'])}; longest reward-clause streak per run (20 needed): "
                  f"{', '.join(map(str, fa['streaks']))}.", ""]
    if len(rnd.learn_accuracy):
        lines += ["## Where both learn (Dr. MAS − GRPO, time-averaged avg@4)", "",
                  markdown(rnd.learn_accuracy, index=False), ""]
    if len(rnd.shares["by_estimator"]):
        lines += [f"## Shares of the shared update (steps 0-{SHARE_WINDOW - 1})", "",
                  markdown(rnd.shares["by_estimator"], index=False), "",
                  "Dr. MAS − GRPO per twin pair:", "", markdown(rnd.shares["paired"], index=False), "",
                  "Over every level:", "", markdown(rnd.shares["pooled"], index=False), ""]
    shown = pilot_labelled(rnd.events) if pilot else rnd.events
    if len(cost := rnd.data.step_seconds(shown["run"])):
        lines += ["## Cost", "", fmt_step_cost(cost), "", markdown(cost_table(shown, rnd.data.runs, cost), index=False),
                  ""]
    lines += ["## Runs", "", markdown(shown.drop(columns=["git_commit"]), index=False), ""]
    if problems := problem_lines(rnd.data):
        lines += ["## Data problems", "", *(f"- {p}" for p in problems), ""]
    return "\n".join(lines)


def pilot_labelled(events: pd.DataFrame) -> pd.DataFrame:
    """The pilot's events as its summary shows them: part "pilot" for the pilot's seeds (:func:`analyze` lets them
    stand in for the round's, so that the levels rule reads them)."""
    return events.assign(part=events["part"].where(~events["seed"].isin(PILOT_SEEDS), "pilot"))


def cost_table(events: pd.DataFrame, runs: pd.DataFrame, step: pd.Series) -> pd.DataFrame:
    """The finished runs' cost per part and arm of ``events``: runs, step time (``step``: seconds per run) and the
    wall time of the command that finished each run (``runs``: index.json's rows, their ``seconds``; a run resumed
    after a stop: its last sitting), in hours, and the median of each per run in seconds. ``wall_runs`` counts the
    runs with a recorded wall time (one that finished after its runner was stopped has none), which ``wall_h``
    sums."""
    wall = runs.set_index("run")["seconds"].astype(float)
    costs = events[["run", "part", "arm"]].assign(step_s=lambda e: e["run"].map(step),
                                                  wall_s=lambda e: e["run"].map(wall))
    return (costs.groupby(["part", "arm"], sort=False)
            .agg(runs=("run", "size"), step_h=("step_s", lambda x: x.sum() / 3600), step_median_s=("step_s", "median"),
                 wall_runs=("wall_s", "count"), wall_h=("wall_s", lambda x: x.sum() / 3600),
                 wall_median_s=("wall_s", "median"))
            .round({"step_h": 2, "wall_h": 2, "step_median_s": 0, "wall_median_s": 0}).reset_index())


def pilot_next(events: pd.DataFrame, arm: str, listed: int) -> str:
    """The pilot's next step for one arm (docs/frontier.md, "The pilot") once its ``listed`` runs have finished: the
    extension level the rule names, "no collapse below 8e-4" at the cap, or the round's levels from
    :func:`analysis.frontier_design.levels_rule`."""
    runs = events[(events["part"] == "round") & (events["arm"] == arm)]
    if len(runs) < listed or runs.empty:
        return f"pilot incomplete ({len(runs)} of {listed} runs finished): no step decided"
    y = runs[f"collapsed_{PRIMARY}"]
    share = runs.assign(y=y).groupby("lr")["y"].mean()
    top, bottom = share.index.max(), share.index.min()
    if (top <= PILOT_TOP and share[top] == 0) or (top > PILOT_TOP and share[top] < 0.5):
        nxt = [ladder_level(j) for j in EXTEND_UP if ladder_level(j) > top * 1.001]
        return f"extend upwards to {nxt[0]:.3g}" if nxt else "no collapse below 8e-4 (the cap): the arm's round is not run"
    if bottom >= PILOT_BOTTOM * 0.999 and share[bottom] == 1.0:
        nxt = [ladder_level(j) for j in EXTEND_DOWN if ladder_level(j) < bottom * 0.999]
        return f"extend downwards to {nxt[0]:.3g}" if nxt else "every run collapses at the floor 2.5e-5"
    try:
        levels = levels_rule(np.log2(runs["lr"].to_numpy()), y.to_numpy())
    except ValueError as exc:
        return str(exc)
    return "levels " + ", ".join(f"{v:.3g}" for v in levels)


def _listed(rnd: Round, arm: str) -> int:
    """The runs of one arm the grid's index lists (finished or not)."""
    return int((rnd.data.runs["assignment"] == arm).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("results/runs/frontier"))
    parser.add_argument("--out", type=Path, default=Path("results/frontier"))
    parser.add_argument("--pilot", action="store_true", help="read the pilot (no verdicts; the levels rule)")
    parser.add_argument("--draws", type=int, default=BOOTSTRAP_DRAWS, help="bootstrap draws of each frontier")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.runs.is_dir():
        logger.error("drmas: %s is not a grid folder (run experiments/grids/frontier%s.yaml first)", args.runs,
                     "_pilot" if args.pilot else "")
        return 2
    try:
        rnd = analyze(load_grid(args.runs), draws=args.draws, pilot=args.pilot)
    except (FileNotFoundError, ValueError) as exc:
        logger.error("drmas: %s; nothing was written", exc)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "summary.md", summary_markdown(rnd, args.runs, args.pilot))
    rnd.events.to_csv(args.out / "events.csv", index=False)
    for key, v in rnd.verdicts.items():
        logger.info("%s: %s", key, v)
    if args.pilot:
        for arm in ARMS:
            logger.info("pilot, %s: %s", ARM_LABELS[arm], pilot_next(rnd.events, arm, _listed(rnd, arm)))
    return 0


# ------------------------------------------------------------------------------------------ figures
FIGURE, ACC_FIGURE = "frontier_collapse", "frontier_accuracy"
COLORS = {GRPO: "tab:red", DRMAS: "tab:blue"}


def _title_state(rnd: Round) -> str:
    """What a figure's titles add while the round is incomplete (empty once every run has finished)."""
    return "" if rnd.complete else f" (incomplete: {rnd.finished} of {rnd.total} runs)"


def _lr_axis(ax, lrs) -> None:
    """A log lr axis ticked at the levels that have runs (labels like 0.000141), half an octave of room each side."""
    lrs = np.unique(np.asarray(lrs, dtype=float))
    ax.set_xscale("log")
    ax.set_xlim(lrs.min() / 2 ** 0.5, lrs.max() * 2 ** 0.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(lrs, [f"{v:.3g}" for v in lrs], fontsize=7, rotation=30)


def fig_frontier(rnd: Round):
    """P(collapse by 200) against the lr per arm: each cell's share with its k/n written beside it, the fitted Firth
    curve of each estimator and its 95 % band (pointwise over the bootstrap refits), drawn where the estimator's runs
    stand at two levels or more (at one level the curve's slope is not identified). An arm without finished runs
    says so; the titles say "incomplete" until every run of the round has finished."""
    fig = figure(5.0 * len(ARMS), 3.6)
    state = _title_state(rnd)
    for ax, arm in zip(fig.subplots(1, len(ARMS)), ARMS):
        f = rnd.fronts.get((arm, PRIMARY))
        runs = rnd.events[(rnd.events["part"] == "round") & (rnd.events["arm"] == arm)]
        ax.set_title(f"{ARM_LABELS[arm]}: collapse by step {PRIMARY}{state}", **({"fontsize": 9} if state else {}))
        ax.set_xlabel("learning rate")
        ax.set_ylabel("runs collapsed (share)")
        ax.set_ylim(-0.05, 1.1)
        if runs.empty:
            ax.text(0.5, 0.5, "no finished runs", transform=ax.transAxes, ha="center", va="center", color="0.4")
            ax.set_xticks([])
            continue
        for i, est in enumerate((GRPO, DRMAS)):
            cell = runs[runs["estimator"] == est].groupby("lr")[f"collapsed_{PRIMARY}"].agg(["sum", "count"])
            if cell.empty:
                continue
            shift = 1 + 0.015 * (2 * i - 1)  # the two estimators side by side at one level
            ax.plot(cell.index * shift, cell["sum"] / cell["count"], "o", color=COLORS[est], label=estimator_label(est))
            for lr, r in cell.iterrows():
                ax.annotate(f"{int(r['sum'])}/{int(r['count'])}", (lr * shift, r["sum"] / r["count"]), fontsize=7,
                            xytext=(4, 6 - 14 * i), textcoords="offset points", color=COLORS[est])
            if f is not None and len(cell) >= 2:
                x = np.linspace(np.log2(cell.index.min()) - 0.25, np.log2(cell.index.max()) + 0.25, 100)
                curve = lambda b: 1 / (1 + np.exp(-(b[..., :1] + b[..., 1:] * x)))  # noqa: E731
                ax.plot(2 ** x, curve(np.array(f.fits[i])), color=COLORS[est])
                band = curve(f.draw_fits[:, i, :])
                ax.fill_between(2 ** x, *np.quantile(band, [0.025, 0.975], axis=0), color=COLORS[est], alpha=0.15)
        _lr_axis(ax, runs["lr"])
        ax.legend(fontsize=7, loc="upper left")
    finish(fig)
    fig.tight_layout()
    return fig


def fig_accuracy(rnd: Round):
    """Each run's time-averaged avg@4 against the lr, per arm and estimator (the round's levels and "where both
    learn"), with the median per cell."""
    fig = figure(5.0 * len(ARMS), 3.6)
    state = _title_state(rnd)
    for ax, arm in zip(fig.subplots(1, len(ARMS)), ARMS):
        pts = rnd.accuracy[rnd.accuracy["arm"] == arm] if len(rnd.accuracy) else rnd.accuracy
        ax.set_title(f"{ARM_LABELS[arm]}: time-averaged avg@4{state}", **({"fontsize": 9} if state else {}))
        ax.set_xlabel("learning rate")
        ax.set_ylabel("avg@4 (%)")
        if pts.empty:
            ax.text(0.5, 0.5, "no finished runs", transform=ax.transAxes, ha="center", va="center", color="0.4")
            ax.set_xticks([])
            continue
        for i, est in enumerate((GRPO, DRMAS)):
            p = pts[pts["estimator"] == est]
            if p.empty:
                continue
            ax.plot(p["lr"] * (1 + 0.03 * (2 * i - 1)), 100 * p["auc"], ".", alpha=0.5, color=COLORS[est])
            med = p.groupby("lr")["auc"].median()
            ax.plot(med.index, 100 * med, "-o", color=COLORS[est], label=f"{estimator_label(est)} (median)")
        _lr_axis(ax, pts["lr"])
        ax.legend(fontsize=7)
    finish(fig)
    fig.tight_layout()
    return fig


def _figures(rnd: Round | None, out: Path) -> list[Path]:
    if rnd is None or rnd.events.empty:
        return []
    return [*save(fig_frontier(rnd), out, FIGURE), *save(fig_accuracy(rnd), out, ACC_FIGURE)]


# ------------------------------------------------------------------------------------------ REPORT.md
PAPER = "Dr. MAS trains stably where GRPO collapses (Sec. 5, Figs. 4, 6, 8)"
HEADLINES = {"C6-n": "GRPO unstable, Dr. MAS stable", "C6-s": "(not in the paper)", "C6-acc": "Dr. MAS higher"}
"""The paper's side of each claim in a few words (REPORT.md's verdict table)."""
CLAIMS = {
    "C6-n": ("stability frontier, non-sharing: Dr. MAS moves the lr at which half the runs collapse up",
             "per estimator LR50 of a Firth logistic fit of collapse by 200 steps on log2(lr); Δ = log2 LR50(Dr. MAS) "
             "− log2 LR50(GRPO) with a 2,000-draw parametric-bootstrap 95 % interval; \"moves up\" / \"no shift "
             "(equivalent)\" / \"moves down\" when it lies above / inside / below ±0.5 octave, else inconclusive "
             "(docs/frontier.md C6-n); power (planned, 6 seeds a cell, transition slope 4-8 per octave): \"moves up\" "
             "at a one-octave shift 0.92-0.99, \"no shift\" at none 0.63-0.98 (docs/frontier.md, Precision and "
             "power)", PAPER),
    "C6-s": ("stability frontier, shared model: the estimator's effect on LR50 differs with a shared model",
             "the arm x estimator interaction Δ(shared) − Δ(non-sharing), 95 % bootstrap interval, two-sided p; Holm "
             "over C6-n's one-sided test and this one, α = 0.05; the shared arm's Δ read against the margin "
             "(docs/frontier.md C6-s); power (planned) 0.97-1.00 at a one-octave interaction, false-positive rate "
             "0.058-0.067 at none (docs/frontier.md, Precision and power); the agents' shares are descriptive",
             "(not in the paper: the suite's hypothesis)"),
    "C6-acc": ("where both learn (5e-5): Dr. MAS − GRPO of the time-averaged avg@4",
               "paired by seed and question, 95 % bootstrap interval over questions, 6 seeds per estimator "
               "(docs/frontier.md, secondary estimate)", "Dr. MAS higher"),
}
GLOSS = {"C6-n": "LR50 = the lr at which an estimator's fitted collapse probability (by 200 steps) is 1/2; Δ in "
                 "octaves (ratio 2^Δ); margin ±0.5 octave",
         "C6-s": "interaction = Δ(shared) − Δ(non-sharing) in octaves; Holm p over the two arms' primary tests",
         "C6-acc": "auc = the time-averaged avg@4 (area under the eval curve / its span), Dr. MAS − GRPO in pts"}


def _ours(rnd: Round, key: str) -> tuple[str, str]:
    if key == "C6-n":
        f = rnd.fronts[("nonsharing", PRIMARY)]
        p = f"one-sided p {fmt_value(rnd.tests['p_C6-n'], 3)}, Holm {fmt_value(rnd.tests['p_holm_C6-n'], 3)}"
        return "; ".join([*arm_words(rnd, "nonsharing"), p]), f"Δ {fmt_octaves(f.delta, *f.ci)}"
    if key == "C6-s":
        f = rnd.fronts[("sharing", PRIMARY)]
        words = arm_words(rnd, "sharing")
        if (i := rnd.interactions.get(PRIMARY)) is not None:
            words.append(f"interaction {fmt_octaves(i['estimate'], i['low'], i['high'])}, p "
                         f"{fmt_value(i['p'], 3)}, Holm {fmt_value(rnd.tests['p_holm_C6-s'], 3)}")
        if (sw := share_words(rnd.shares["pooled"])) is not None:
            words.append(sw)
        return "; ".join(words), f"shared Δ {fmt_octaves(f.delta, *f.ci)}"
    auc = rnd.learn_accuracy[rnd.learn_accuracy["measure"] == "auc"].iloc[0]
    head = f"{100 * auc['diff']:+.1f} pts [{100 * auc['low']:+.1f}, {100 * auc['high']:+.1f}]"
    fa = rnd.false_alarm
    return (f"{head} over {auc['seeds']} seed pairs; the rule fired in {fa['fired']} of {fa['runs']} of these runs "
            f"(false-alarm rate, exact 95 % interval {fmt_interval(fa['low'], fa['high'])})", head)


def judge(rnd: Round | None, key: str) -> Judged:
    """One C6 claim judged (``rnd`` None: the round not run)."""
    claim, _, paper = CLAIMS[key]
    if rnd is None or key not in rnd.verdicts:
        state = ("the frontier round has not run" if rnd is None else
                 f"{rnd.finished} of {rnd.total} runs finished, none that this claim reads")
        v = NOT_RUN if rnd is None else f"{incomplete(rnd.finished, rnd.total)}: no data yet"
        return Judged(claim, paper, state, v, headline=state, paper_headline=HEADLINES[key], design=CONFIRMATORY)
    ours, head = _ours(rnd, key)
    return Judged(claim, paper, ours, rnd.verdicts[key], headline=head, paper_headline=HEADLINES[key],
                  figures=(FIGURE, ACC_FIGURE), design=CONFIRMATORY)


STUDY = one_grid_study(
    "frontier round",
    Option("frontier", "the frontier round's grid directory, results/runs/frontier (claims C6-n, C6-s, C6-acc; "
                       "docs/frontier.md)", "pass the out_dir of a grid, e.g. results/runs/frontier"),
    analyze,
    claims=tuple(ClaimSpec(key, judge=lambda rnd, key=key: judge(rnd, key), rule=rule, gloss=GLOSS[key])
                 for key, (_, rule, _) in CLAIMS.items()),
    figures=_figures)
"""The frontier round as a study of the report (:mod:`analysis.report`)."""


if __name__ == "__main__":
    raise SystemExit(main())
