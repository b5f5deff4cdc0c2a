"""The confirmatory stability round's verdicts (docs/stability.md, "The confirmatory round": the rules were committed
there before the round's first run; the constants below are its numbers).

    python -m analysis.confirm --runs results/runs/stability_confirm --out results/stability_confirm

- **The event**: rule (g)'s clauses (non-finite, reward collapse) plus the abandonment of *every* agent the run's
  orchestra declares (``Orchestra.slots`` of its ``env.orchestra``, read from the registry); a run without a collapse
  is censored at its last step.
- **C1** time to collapse: stratified log-rank test (statsmodels ``survdiff``), Cox hazard ratio stratified by
  learning rate (``PHReg``), Kaplan-Meier medians with CIs (``SurvfuncRight``).
- **C2** abandonment of an agent: Cochran-Mantel-Haenszel over the levels (``StratifiedTable``).
- **C3** persistent elevation: per twin pair and agent the GRPO / Dr. MAS ratio of the p95 (and max) pre-clip norm over
  steps 0-39; sign test, Holm over the agents.
- **C4** stability frontier: logistic fit of collapse-by-the-horizon on log2(lr), LR50 with a parametric bootstrap CI.
- **C5** the clip dial: update-norm ratios with and without the clip, time to collapse in the clip-off arm.
- accuracy over time: the exploratory rule (:func:`analysis.twins.accuracy_over_time`) with Holm over the levels.

The main arm is the runs tagged ``arm: main``, the clip dial ``arm: clip_dial``. Only finished runs enter a verdict;
a verdict computed on fewer runs than the grid holds is marked incomplete.
"""
from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from drmas.algos.catalog import DRMAS, GRPO, estimator_label
from drmas.io import atomic_write_text

from analysis.claims import (CONFIRMATORY, DESCRIPTIVE, INCONCLUSIVE, NO_DIFFERENCE, NOT_RUN, REFUTED, REPRODUCED,
                             UNDERPOWERED, ClaimSpec, Judged, Option, incomplete, incomplete_so_far)
from analysis.cli import one_grid_study
from analysis.confirm_rules import WINDOW, abandonment, clip_dial, elevation, frontier, record, time_to_collapse
from analysis.events import collapse_event, declared_agents, finished, steps_of
from analysis.formatting import fmt_interval, fmt_step_cost, fmt_value, markdown
from analysis.integrity import problem_lines
from analysis.plotting import save
from analysis.run_records import run_manifest
from analysis.runs import GridData, load_grid
from analysis.stats import ALPHA, N_BOOT, bootstrap_streams, holm
from analysis.twins import accuracy_over_time, fig_gradnorm_over_steps

logger = logging.getLogger(__name__)

POWER_EVENTS = 0.5           # C1 assumed Dr. MAS collapsing by the horizon in 30-70 % of runs: at least half of all runs
"""C1's power statement assumed collapse probabilities of 0.3-0.7 (Dr. MAS) and more under GRPO; a round that ends
with fewer than this share of its runs collapsed had less information than the statement assumed."""


# ------------------------------------------------------------------------------------------ the event
def event_table(data: GridData) -> pd.DataFrame:
    """One row per finished run: estimator, lr, seed, arm, clip, the time (collapse step, or last step when
    censored), the event flag, its reason, abandoned agents, and the code commit it ran with."""
    rows = []
    for r, done in zip(data.runs.itertuples(), finished(data)):
        if not done:
            continue
        path = Path(r.path)
        agents = declared_agents(path)
        ev = collapse_event(steps_of(data, r.run), agents)
        manifest = run_manifest(path)
        clip = clip_setting(manifest["config"])
        rows.append({"run": r.run, "estimator": r.estimator, "lr": float(r.level), "seed": int(r.seed),
                     "arm": "clip_dial" if clip == "off" else "main", "clip": clip,
                     "time": ev.step if ev.step is not None else ev.last_step, "event": int(ev.step is not None),
                     "reason": ev.reason, "abandoned": ",".join(ev.abandoned), "agents": ",".join(agents),
                     "git_commit": manifest.get("git_commit")})
    return pd.DataFrame(rows, columns=["run", "estimator", "lr", "seed", "arm", "clip", "time", "event", "reason",
                                       "abandoned", "agents", "git_commit"])


CLIP_OFF = 1.0e6
"""A run whose every model clips at ``optim.max_grad_norm`` >= this does not clip (the dial sets 1e9; the largest
pre-clip norm any committed run logged is 5.5e5)."""


def clip_setting(config: dict) -> str:
    """"off" when no model of the run's config clips (:data:`CLIP_OFF`), else "on" (read from the run's own config,
    so that the arm is right without the grid's index too)."""
    norms = [float((m.get("optim") or {}).get("max_grad_norm", 1.0)) for m in (config.get("models") or {}).values()]
    return "off" if norms and min(norms) >= CLIP_OFF else "on"


# ------------------------------------------------------------------------------------------ the whole
@dataclass
class Confirmation:
    """Every number of the confirmatory verdicts, from one grid folder."""

    data: GridData
    finished: int
    total: int
    events: pd.DataFrame
    c1: dict
    c2: pd.DataFrame
    c3: pd.DataFrame
    c4: pd.DataFrame
    c5: dict
    accuracy: pd.DataFrame
    verdicts: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.finished == self.total


def analyze(data: GridData, seed: int = 0, n_boot: int = N_BOOT) -> Confirmation:
    """Every claim of the round from one grid. Each bootstrap draws from its own stream of ``seed`` (C3, C4, accuracy),
    so a change to one claim's resampling leaves the others' intervals as they are."""
    rng_c3, rng_c4, rng_acc = bootstrap_streams(seed, 3)
    events = event_table(data)
    total = len(data.runs)
    main = events[events["arm"] == "main"]
    c1 = time_to_collapse(main) if len(main) else {}
    c2 = abandonment(main) if len(main) else pd.DataFrame()
    c3 = elevation(data, main, rng_c3, n_boot) if len(main) else pd.DataFrame()
    c4 = frontier(main, rng_c4) if len(main) else pd.DataFrame()
    c5 = clip_dial(data, events) if len(events) else {}
    runs = main.rename(columns={"event": "collapsed"})
    acc = accuracy_over_time(data, runs, rng_acc, n_boot) if len(runs) else pd.DataFrame()
    if len(acc):
        auc = acc["measure"] == "auc"
        acc.loc[auc, "p_holm"] = holm(acc.loc[auc, "p_wilcoxon"].to_numpy())
    an = Confirmation(data, len(events), total, events, c1, c2, c3, c4, c5, acc)
    an.verdicts = verdicts(an)
    return an


def _incomplete(an: Confirmation, verdict: str) -> str:
    """``verdict``, marked incomplete (with the verdict so far) while the round has runs that do not count (not
    started, unfinished, their folder gone, their records in conflict: :func:`analysis.events.grid_status`)."""
    return verdict if an.complete else incomplete_so_far(an.finished, an.total, verdict)


def verdicts(an: Confirmation) -> dict[str, str]:
    """The verdict words of docs/stability.md per confirmatory claim."""
    out = {}
    c1 = an.c1
    if c1 and np.isfinite(c1.get("p", math.nan)):
        if c1["p"] < ALPHA:
            v = REPRODUCED
        elif c1["hr"] < 1 and 1 - c1["p"] < ALPHA:
            v = REFUTED
        elif c1["events"] < POWER_EVENTS * c1["runs"]:
            v = UNDERPOWERED
        else:
            v = INCONCLUSIVE
        out["C1"] = _incomplete(an, v)
    c2 = an.c2
    if len(c2):
        p = float(c2.loc[c2["agent"] == "any", "p"].iloc[0])
        row = c2[c2["agent"] == "any"].iloc[0]
        drmas_more = row["drmas_n"] > 0 and row["grpo_n"] > 0 and \
            row["drmas"] / row["drmas_n"] > row["grpo"] / row["grpo_n"]  # a cell without runs says nothing
        v = REPRODUCED if p < ALPHA else REFUTED if drmas_more and 1 - p < ALPHA else INCONCLUSIVE
        out["C2"] = _incomplete(an, v)
    c3 = an.c3
    if len(c3):
        p95 = c3[c3["stat"] == "p95"]
        up, down = (p95["p_holm"] < ALPHA).any(), (p95["p_below_holm"] < ALPHA).any()
        out["C3"] = _incomplete(an, REPRODUCED if up and not down else REFUTED if down and not up else INCONCLUSIVE)
    ratio = an.c4.attrs.get("ratio") if len(an.c4) else None
    if ratio:
        out["C4"] = _incomplete(an, REPRODUCED if ratio[1] > 1 else REFUTED if ratio[2] < 1 else INCONCLUSIVE)
    if an.c5:
        out["C5"] = _incomplete(an, DESCRIPTIVE)
    acc = an.accuracy
    if len(acc):
        auc = acc[acc["measure"] == "auc"]
        above = ((auc["p_holm"] < ALPHA) & (auc["low"] > 0)).any()
        below = ((auc["p_holm"] < ALPHA) & (auc["high"] < 0)).any()
        out["accuracy-confirm"] = _incomplete(an, REPRODUCED if above and not below else REFUTED if below and
                                              not above else NO_DIFFERENCE)
    return out


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """Infinite medians and bounds (not reached) as words, not empty cells."""
    return frame.map(lambda v: "not reached" if isinstance(v, float) and v == math.inf else v)


def _label(key: str) -> str:
    """A claim as REPORT.md names it, with its key where the two differ (``C-acc (accuracy-confirm)``)."""
    label = LABELS.get(key, (key, ""))[0]
    return label if label == key else f"{label} ({key})"


def summary_markdown(an: Confirmation, runs_dir: Path) -> str:
    """results/stability_confirm/summary.md: each claim's verdict, test, effect with CI and data."""
    lines = [f"# Confirmatory stability round ({runs_dir})", "",
             f"Finished runs: {an.finished} of {an.total}" + ("" if an.complete else " (verdicts incomplete)") + ".",
             f"Rules: docs/stability.md, \"The confirmatory round\". Code commits: "
             f"{', '.join(sorted(set(an.events['git_commit'].dropna().astype(str)))) or 'none recorded'}.", ""]
    lines += ["| claim | verdict |", "|---|---|", *[f"| {_label(k)} | {v} |" for k, v in an.verdicts.items()], ""]
    if an.c1:
        c = an.c1
        lines += ["## C1 time to collapse", "",
                  f"Stratified log-rank, one-sided p = {fmt_value(c.get('p', math.nan), 3)}; Cox hazard ratio GRPO / Dr. MAS "
                  f"{fmt_value(c.get('hr', math.nan))} [{fmt_value(c.get('hr_low', math.nan))}, {fmt_value(c.get('hr_high', math.nan))}]"
                  + (f" ({c['hr_note']})" if c.get("hr_note") else "") + "; "
                  f"{c['events']} collapses in {c['runs']} runs. Power (planned): 0.82 at HR = 3.", "",
                  markdown(_shown(c["medians"]), index=False), ""]
    for title, frame in (("C2 abandonment of an agent (by the horizon)", an.c2),
                         ("C3 persistent elevation (steps 0-39, GRPO / Dr. MAS per twin pair)", an.c3),
                         ("C4 stability frontier (LR50)", an.c4), ("Accuracy over time (Dr. MAS − GRPO, avg@4)", an.accuracy)):
        if len(frame):
            lines += [f"## {title}", "", markdown(frame, index=False), ""]
    if len(an.c4) and an.c4.attrs.get("ratio"):
        r = an.c4.attrs["ratio"]
        lines += [f"LR50 ratio Dr. MAS / GRPO: {fmt_value(r[0])} {fmt_interval(r[1], r[2])}"
                  + (" (not identified: both frontiers lie outside the grid on the same side)"
                     if r[1] == 0 and r[2] == math.inf else "") + ".", ""]
    if an.c5:
        lines += ["## C5 the clip dial", ""]
        if len(an.c5.get("updates", [])):
            lines += [markdown(an.c5["updates"], index=False), ""]
        off = an.c5.get("off", {})
        if off:
            lines += [f"Clip off: log-rank one-sided p = {fmt_value(off.get('p', math.nan), 3)}, HR {fmt_value(off.get('hr', math.nan))} "
                      f"[{fmt_value(off.get('hr_low', math.nan))}, {fmt_value(off.get('hr_high', math.nan))}]", ""]
        if "interaction" in an.c5:
            inter = an.c5["interaction"]
            lines += ["Estimator x clip interaction (Cox): " + (inter["note"] if "note" in inter else
                      f"HR {fmt_value(inter['hr'])} [{fmt_value(inter['low'])}, {fmt_value(inter['high'])}], p = {fmt_value(inter['p'], 3)}"), ""]
    if len(an.events):
        lines += record(an.data, an.events)
    if len(cost := an.data.step_seconds(an.events["run"])):
        lines += ["## Cost", "", fmt_step_cost(cost), ""]
    lines += ["## Runs", "", markdown(an.events.drop(columns=["agents", "git_commit"]), index=False), ""]
    if problems := problem_lines(an.data):
        lines += ["## Data problems", "", *(f"- {item}" for item in problems), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("results/runs/stability_confirm"))
    parser.add_argument("--out", type=Path, default=Path("results/stability_confirm"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.runs.is_dir():
        logger.error("drmas: %s is not a grid folder (run experiments/grids/stability_confirm.yaml first)", args.runs)
        return 2
    try:
        an = analyze(load_grid(args.runs))
    except (FileNotFoundError, ValueError) as exc:
        logger.error("drmas: %s; nothing was written", exc)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "summary.md", summary_markdown(an, args.runs))
    an.events.to_csv(args.out / "events.csv", index=False)
    for claim, verdict in an.verdicts.items():
        logger.info("%s: %s", claim, verdict)
    return 0


# ------------------------------------------------------------------------------------------ REPORT.md
PAPER_STABLE = "GRPO's per-agent gradient norms spike and the run can collapse; Dr. MAS trains stably (Sec. 5, Figs. 4, 6, 8)"
PAPER_STABLE_HEADLINE = "GRPO unstable, Dr. MAS stable"
CLAIMS = {
    "C1": ("time to collapse: GRPO collapses sooner than Dr. MAS",
           "stratified log-rank test over the 3 levels, one-sided, α = 0.05; Cox hazard ratio GRPO / Dr. MAS with 95 % CI; "
           "Kaplan-Meier medians; power 0.82 at HR = 3 with 6 seeds per cell (docs/stability.md C1)"),
    "C2": ("abandonment of an agent: GRPO stops calling some agent more often",
           "per run, any declared agent's calls per trajectory (10-step mean) below 1/4 of its early level for 20 "
           "steps; Cochran-Mantel-Haenszel over the levels, one-sided, α = 0.05 (docs/stability.md C2)"),
    "C3": ("persistent elevation: GRPO's per-agent pre-clip norm above its Dr. MAS twin's",
           "per twin pair and agent, GRPO / Dr. MAS of the p95 norm over steps 0-39; sign test over pairs, Holm over "
           "agents, α = 0.05 (docs/stability.md C3)"),
    "C4": ("stability frontier: Dr. MAS tolerates a higher learning rate",
           "per estimator LR50 of a logistic fit of collapse on log2(lr), parametric bootstrap CI; reproduced when the "
           "CI of LR50(Dr. MAS) / LR50(GRPO) lies above 1 (docs/stability.md C4)"),
    "C5": ("the clip dial: without clipping, GRPO's larger norm becomes a larger update and an earlier collapse "
           "(descriptive)", "update-norm ratio per twin pair with the clip on and off, log-rank in the "
           "clip-off arm, Cox interaction estimator x clip; underpowered by design (docs/stability.md C5)"),
    "accuracy-confirm": ("accuracy over time: Dr. MAS above GRPO",
                         "Dr. MAS − GRPO of the time-averaged avg@4 per main-arm level, paired bootstrap CI over tasks, "
                         "Wilcoxon over tasks, Holm over the 3 levels (docs/stability.md)"),
}

LABELS = {
    "C1": ("C1", "HR = Cox hazard ratio of collapse (Terms), GRPO / Dr. MAS, stratified by lr (> 1: GRPO collapses "
                 "sooner) with its 95 % CI; p = one-sided stratified log-rank test"),
    "C2": ("C2", "abandonment (Terms); k/n = runs that abandoned an agent out of the finished runs; p = one-sided "
                 "Cochran-Mantel-Haenszel test over the lrs"),
    "C3": ("C3", "ratio = GRPO / Dr. MAS of the p95 pre-clip norm over steps 0-39 of a twin pair (the Dr. MAS run of the "
                 "same lr and seed), median over pairs; k/n above = pairs whose ratio is > 1"),
    "C4": ("C4", "LR50 = the lr at which an estimator's fitted collapse probability crosses 1/2 (the C4 frontier); "
                 "ratio = LR50(Dr. MAS) / LR50(GRPO) with its bootstrap CI; \"below the grid\": more than half of the "
                 "estimator's runs collapsed at the lowest lr tried and every run above it, so the fit separates and "
                 "its LR50 lies below that lr (no point estimate: —; the ratio's CI is then open on that side)"),
    "C5": ("C5", "update ratio = GRPO / Dr. MAS of the norm of the applied parameter update per twin pair, with the "
                 "clip on and off; HR as in C1, in the clip-off arm"),
    "accuracy-confirm": ("C-acc", "auc as in S-acc (Dr. MAS − GRPO of the time-averaged avg@4, pts) per main-arm lr, "
                                  "Holm over the 3 lrs (a secondary measure, not one of C1-C5)"),
}
"""REPORT.md label and gloss of each claim of :data:`CLAIMS` (same keys, same order)."""

def _ours(an: Confirmation, key: str) -> tuple[str, str]:
    """(ours in words, ours in one number) of one claim."""
    if key == "C1":
        c = an.c1
        head = f"HR {fmt_value(c['hr'])} [{fmt_value(c['hr_low'])}, {fmt_value(c['hr_high'])}], p {fmt_value(c['p'], 3)}"
        med = c["medians"][c["medians"]["lr"].isna()].set_index("estimator")["median"]
        return (f"{head}; {c['events']} collapses in {c['runs']} runs; median time to collapse GRPO "
                f"{fmt_value(med.get(GRPO, math.nan))}, Dr. MAS {fmt_value(med.get(DRMAS, math.nan))} steps", head)
    if key == "C2":
        r = an.c2[an.c2["agent"] == "any"].iloc[0]
        per = "; ".join(f"{a.agent} {a.grpo} vs {a.drmas}" for a in an.c2.itertuples() if a.agent != "any")
        head = f"GRPO {r['grpo']}/{r['grpo_n']} vs Dr. MAS {r['drmas']}/{r['drmas_n']} runs, p {fmt_value(r['p'], 3)}"
        return f"{head}; per agent (GRPO vs Dr. MAS): {per}", head
    if key == "C3":
        p95 = an.c3[an.c3["stat"] == "p95"]
        per = "; ".join(f"{a.agent} {a.above}/{a.pairs} pairs above, median ratio {fmt_value(a.median_ratio)} "
                        f"[{fmt_value(a.low)}, {fmt_value(a.high)}], Holm p {fmt_value(a.p_holm, 3)} (above), "
                        f"{fmt_value(a.p_below_holm, 3)} (below)" for a in p95.itertuples())
        best = p95.sort_values("p_holm").iloc[0]
        return per, f"{best['agent']}: {best['above']}/{best['pairs']} above, ratio {fmt_value(best['median_ratio'])}"
    if key == "C4":
        rows = "; ".join(f"{estimator_label(r.estimator)} "
                         + (f"{fmt_value(r.lr50)} [{fmt_value(r.low)}, {fmt_value(r.high)}]" if not r.note else r.note)
                         for r in an.c4.itertuples())
        ratio = an.c4.attrs.get("ratio", (math.nan,) * 3)
        head = f"ratio {fmt_value(ratio[0])} {fmt_interval(ratio[1], ratio[2])}"
        return f"LR50: {rows}; Dr. MAS / GRPO {head}", head
    if key == "C5":
        up = an.c5.get("updates", pd.DataFrame())
        parts = [f"clip {r.clip}, {r.model}: update ratio {fmt_value(r.median_ratio)} ({r.above}/{r.pairs} pairs above)"
                 for r in up.itertuples()] if len(up) else []
        off = an.c5.get("off", {})
        if off:
            parts.append(f"clip off: HR {fmt_value(off.get('hr', math.nan))}, p {fmt_value(off.get('p', math.nan), 3)}")
        return "; ".join(parts) or "no clip-off runs finished", (parts[-1] if parts else "no data")
    auc = an.accuracy[an.accuracy["measure"] == "auc"]
    per = "; ".join(f"lr {r.lr:g}: {100 * r.diff:+.1f} pts [{100 * r.low:+.1f}, {100 * r.high:+.1f}], Holm p "
                    f"{fmt_value(r.p_holm, 3)}" for r in auc.itertuples())
    return per, f"{100 * auc['diff'].min():+.1f} to {100 * auc['diff'].max():+.1f} pts"


def judge(an: Confirmation | None, key: str) -> Judged:
    """One confirmatory claim judged (``an`` None: the round not run)."""
    claim, _ = CLAIMS[key]
    if an is None or key not in an.verdicts:
        state = ("the confirmatory grid has not run" if an is None else
                 f"{an.finished} of {an.total} runs finished, none that this claim reads")
        verdict = NOT_RUN if an is None else f"{incomplete(an.finished, an.total)}: no data yet"
        return Judged(claim, PAPER_STABLE, state, verdict, headline=state, paper_headline=PAPER_STABLE_HEADLINE,
                      design=CONFIRMATORY)
    ours, head = _ours(an, key)
    return Judged(claim, PAPER_STABLE, ours, an.verdicts[key], headline=head, paper_headline=PAPER_STABLE_HEADLINE,
                  figures=(FIGURE,), design=CONFIRMATORY)


FIGURE = "stability_gradnorm_search_confirm"
"""The round's Figure-4 analogue (main arm) in paper_figures/."""


def _figures(an: Confirmation | None, out: Path) -> list[Path]:
    if an is None:
        return []
    main_arm = an.events[an.events["arm"] == "main"]
    return save(fig_gradnorm_over_steps(an.data, main_arm, collapses=main_arm, window=WINDOW), out, FIGURE)


STUDY = one_grid_study(
    "confirmatory round",
    Option("confirm", "the confirmatory stability round's grid directory, results/runs/stability_confirm "
                      "(claims C1-C5, accuracy-confirm)", "pass the out_dir of a grid, e.g. results/runs/cpu"),
    analyze,
    claims=tuple(ClaimSpec(key, judge=lambda an, key=key: judge(an, key), rule=rule,
                           label=LABELS.get(key, (key, ""))[0], gloss=LABELS.get(key, (key, ""))[1])
                 for key, (_, rule) in CLAIMS.items()),
    figures=_figures)
"""The confirmatory round as a study of the report (:mod:`analysis.report`)."""


if __name__ == "__main__":
    raise SystemExit(main())
