"""The stability grid's verdicts (docs/stability.md; the rules are written there first, and the constants
below are its numbers): collapse (rule g) with Fisher exact tests and the stability frontier, which signal
moved first in a collapsed run, spikes against the Dr. MAS twin (rule b revisited), accuracy over time
(Dr. MAS − GRPO area under the avg@k curve and at the last evaluation, paired by seed), the stress dial
read off the pilot, and the Figure-4 analogue.

    python -m analysis.stability --runs results/runs/stability [--pilot results/runs/stability_pilot]
    python -m analysis.stability --runs results/runs/stability_math --pilot results/runs/stability_math_pilot \
        --out results/stability_math

Inputs are :func:`analysis.runs.load_grid` frames; the learning rate of a run is its ``level`` tag (the grid's
index), its estimator the ``estimator`` tag, its system (search or math) the ``task`` tag. The search grid's
claims keep their short keys (b-revisited, g, accuracy-over-time); the math grid's are suffixed ``-math``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from drmas.algos.catalog import DRMAS, GRPO
from drmas.io import atomic_write_text

from analysis.claims import (EXPLORATORY, MIXED, NO_DIFFERENCE, NOT_REPRODUCED, NOT_RUN, REPRODUCED, UNDERPOWERED,
                             ClaimSpec, Judged, Option, Study, incomplete)
from analysis.cli import load_optional, missing_paths
from analysis.events import finished, grid_status
from analysis.formatting import markdown
from analysis.integrity import problem_lines
from analysis.plotting import save
from analysis.run_records import GridLoadError
from analysis.runs import GridData, load_grid
from analysis.stability_rules import (POWER_EFFECT, POWER_NEEDED, collapse_counts, finished_runs, first_movers,
                                      fisher_power, frontier, pilot_summary, run_table, spike_verdict, twin_spikes,
                                      zero_reward_signal)
from analysis.stats import ALPHA, N_BOOT
from analysis.twins import TASKS, accuracy_over_time, fig_gradnorm_over_steps, task_of

logger = logging.getLogger(__name__)


def figure_stem(task: str) -> str:
    """The Figure-4 analogue's file stem in paper_figures/."""
    return f"stability_gradnorm_{task}_nonsharing"


# ------------------------------------------------------------------------------------------ the whole
@dataclass
class StabilityAnalysis:
    """Every number of the stability verdicts, from one grid folder (and the pilot's, for the dial)."""

    data: GridData | None
    finished: int
    total: int
    runs: pd.DataFrame
    collapses: pd.DataFrame
    frontier: dict[str, float | None]
    movers: pd.DataFrame
    spikes: pd.DataFrame
    spike_agents: pd.DataFrame
    spike_verdict: str
    accuracy: pd.DataFrame
    pilot: pd.DataFrame
    in_progress: pd.DataFrame
    """runs not finished yet: steps so far and rule (g) on them so far (listed, never in a verdict)"""
    zero_reward: pd.DataFrame = field(default_factory=pd.DataFrame)
    """:func:`zero_reward_signal` of the finished runs"""
    task: str = "search"
    """the system: search or math"""


def analyze_stability(data: GridData | None, pilot: GridData | None = None, seed: int = 0,
                      n_boot: int = N_BOOT, task: str = "search") -> StabilityAnalysis:
    """Every verdict's numbers from one stability grid (None: not run; ``task`` names the system then; with a grid
    it is the grid's own ``task`` tag)."""
    pilot_table = pilot_summary(pilot) if pilot is not None else pd.DataFrame()
    if data is None:
        empty = pd.DataFrame()
        return StabilityAnalysis(None, 0, 0, empty, empty, {}, empty, empty, empty, NOT_RUN, empty, pilot_table, empty,
                                 task=task)
    task = task_of(data)
    _require_levels(data)
    runs = finished_runs(data)
    n_finished, total = grid_status(data)
    everything = run_table(data)
    in_progress = everything[~finished(data).to_numpy() & (everything["n_steps"] > 0)].reset_index(drop=True)
    spikes = twin_spikes(data, runs) if len(runs) else pd.DataFrame(columns=["lr", "seed", "agent", "steps", "grpo", "drmas"])
    verdict, per_agent = spike_verdict(spikes)
    rng = np.random.default_rng(seed)
    return StabilityAnalysis(
        data=data, finished=n_finished, total=total, runs=runs,
        collapses=collapse_counts(runs) if len(runs) else pd.DataFrame(), frontier=frontier(runs) if len(runs) else {},
        movers=first_movers(data, runs) if len(runs) else pd.DataFrame(), spikes=spikes, spike_agents=per_agent,
        spike_verdict=verdict, accuracy=accuracy_over_time(data, runs, rng, n_boot) if len(runs) else pd.DataFrame(),
        pilot=pilot_table, in_progress=in_progress, zero_reward=zero_reward_signal(data, runs), task=task)


def _require_levels(data: GridData) -> None:
    """Refuse (one line) a grid whose runs lack the ``level`` tag (their learning rate): it is only in index.json."""
    lacking = data.runs.loc[pd.to_numeric(data.runs["level"], errors="coerce").isna(), "run"].tolist()
    if lacking:
        raise GridLoadError(f"{data.root}: {len(lacking)} run(s) without a level tag (the learning rate), e.g. "
                            f"{lacking[0]}; a stability grid's levels are in its index.json: regenerate it with "
                            "`python -m experiments.grid run experiments/grids/<the grid>.yaml` (finished runs are "
                            "reused, not rerun)")


# ------------------------------------------------------------------------------------------ claims
RULE_B = ("per agent, GRPO steps that spike in their own history (3x the median of the previous 20) and are >= 2x "
          "the Dr. MAS twin's norm (same lr, seed, step) vs the same count the other way, over seeds and lrs; "
          "binomial test of G vs D, Holm over agents: supported if some agent G > D at p < 0.05, none D > G")
RULE_G = ("a run collapses at the first non-finite norm or skipped step, or when its 10-step mean reward stays <= half "
          "its running peak, or its 10-step mean Search calls per trajectory < 1/4 of steps 0-9, for 20 steps; "
          "one-sided Fisher exact test per lr and pooled; frontier = largest lr with no collapsed seed")
RULE_G_MATH = ("a run collapses at the first non-finite norm or skipped step, or when its 10-step mean reward stays <= "
               "half its running peak for 20 steps (the loop calls both agents every round: no agent can be "
               "abandoned); one-sided Fisher exact test per lr and pooled; frontier = largest lr with no collapsed seed")
RULE_ACC = ("Dr. MAS - GRPO of the time-averaged avg@k (area under the curve / step span) and of the last "
            "evaluation, paired by seed and task, 95 % bootstrap CI over tasks; a difference is called when the "
            "CI excludes 0")


def _status(an: StabilityAnalysis) -> str | None:
    """'not run' / 'incomplete (n of N runs)' when the grid is absent or unfinished, else None."""
    if an.data is None or an.total == 0:
        return NOT_RUN
    if an.finished < an.total:
        return incomplete(an.finished, an.total)
    return None


def _lr(x: float | None) -> str:
    return "none" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:g}"


SHORT = {"b-revisited": "GRPO's spikes against its Dr. MAS twin", "g": "collapse under GRPO, not Dr. MAS",
         "accuracy-over-time": "Dr. MAS - GRPO along the run"}
"""The claims in a few words (the terminal summary)."""

PAPER = {
    "search": {"b-revisited": "GRPO's Search agent spikes to > 80 and NaN; Dr. MAS smooth (Figures 4, 6)",
               "g": "search, Qwen2.5-7B non-sharing: GRPO collapses (28.0 vs 43.8 avg@16)",
               "accuracy-over-time": "search non-sharing: Dr. MAS above GRPO over training (Figure 8)"},
    "math": {"b-revisited": "the paper's spike-and-NaN example is the search system; none is reported for math",
             "g": "no collapse reported for math",
             "accuracy-over-time": "math: Dr. MAS above GRPO at the end of training (Table 1, +3.2 pts avg@16)"},
}
"""The paper's expectation per system and claim."""


def _system(an: StabilityAnalysis, claim: str, key: str) -> tuple[str, str, str]:
    """(claim, paper, short) with the system named where it is not the search grid (whose keys are the short ones)."""
    short = SHORT[key]
    if an.task != "search":
        claim, short = f"{claim} [{an.task} system]", f"{short} ({an.task})"
    return claim, PAPER[an.task][key], short


def _no_data(claim: str, paper: str, short: str, ours: str, status: str | None) -> Judged:
    """A claim with nothing to judge yet: "not run", or the grid's status when it has runs but none that count."""
    return Judged(claim, paper, ours, status or NOT_RUN, short=short, design=EXPLORATORY)


def judge_spikes(an: StabilityAnalysis) -> Judged:
    claim, paper, short = _system(an, "(b) revisited: under GRPO per-agent grad norms spike far above Dr. MAS's at the "
                                      "same step", "b-revisited")
    status = _status(an)
    if an.spike_agents.empty:
        return _no_data(claim, paper, short, "no twin pairs finished", status)
    parts = [f"{r.agent}: GRPO {r.grpo} vs Dr. MAS {r.drmas} (p_Holm {r.p_holm:.2g})" for r in an.spike_agents.itertuples()]
    pairs = an.spikes.groupby(["lr", "seed"]).ngroups
    verdict = an.spike_verdict if status is None else f"{status}; so far {an.spike_verdict}"
    headline = ", ".join(f"{r.agent} GRPO {r.grpo} vs Dr. MAS {r.drmas}" for r in an.spike_agents.itertuples())
    return Judged(claim, paper, f"twin spikes over {pairs} twin pair(s): " + "; ".join(parts), verdict, short=short,
                  headline=headline, figures=(figure_stem(an.task),), design=EXPLORATORY)


def judge_collapse(an: StabilityAnalysis) -> Judged:
    what = "the system stops calling the Search agent, NaN" if an.task == "search" else "reward collapse, NaN"
    claim, paper, short = _system(an, f"(g) collapse: GRPO runs collapse ({what}) where Dr. MAS's do not", "g")
    status = _status(an)
    if an.collapses.empty:
        return _no_data(claim, paper, short, "no run finished", status)
    cells = [f"lr {_lr(r.lr)}: GRPO {r.grpo_collapsed}/{r.grpo_n}, Dr. MAS {r.drmas_collapsed}/{r.drmas_n} "
             f"(Fisher p {r.fisher_p:.2g})" for r in an.collapses.itertuples() if not np.isnan(r.lr)]
    pooled = an.collapses[an.collapses["lr"].isna()].iloc[0]
    collapsed = an.movers[an.movers["collapsed"]] if len(an.movers) else an.movers
    stable = an.movers[~an.movers["collapsed"]] if len(an.movers) else an.movers
    movers = collapsed["moved_first"].value_counts().to_dict() if len(collapsed) else {}
    control = stable["moved_first"].value_counts().to_dict() if len(stable) else {}
    ours = ("; ".join(cells) + f"; pooled p {pooled.fisher_p:.2g}; frontier GRPO {_lr(an.frontier.get(GRPO))}, "
            f"Dr. MAS {_lr(an.frontier.get(DRMAS))}; moved first: "
            + (", ".join(f"{k} {v}" for k, v in movers.items()) or "no collapse")
            + (f" (in the runs that did not collapse, by the same rule: {', '.join(f'{k} {v}' for k, v in control.items())})"
               if movers and control else "") + _zero_reward_clause(an))
    power = fisher_power(int(pooled.grpo_n), int(pooled.drmas_n))
    ours += (f"; power of the pooled test against collapse rates {POWER_EFFECT[0]:g} vs {POWER_EFFECT[1]:g}: "
             f"{power:.2f} (the floor and ceiling levels dilute it further)")
    if status is not None:
        verdict = status
    elif pooled.fisher_p < ALPHA:
        verdict = REPRODUCED
    else:  # a test without the power to find the effect says nothing of its absence
        verdict = NOT_REPRODUCED if power >= POWER_NEEDED else UNDERPOWERED
    return Judged(claim, paper, ours, verdict, short=short, design=EXPLORATORY,
                  headline=f"collapsed GRPO {pooled.grpo_collapsed:.0f}/{pooled.grpo_n:.0f}, Dr. MAS "
                           f"{pooled.drmas_collapsed:.0f}/{pooled.drmas_n:.0f}; frontier GRPO "
                           f"{_lr(an.frontier.get(GRPO))}, Dr. MAS {_lr(an.frontier.get(DRMAS))}")


def _zero_reward_clause(an: StabilityAnalysis) -> str:
    """'; on steps with zero training reward, mean adv_m2 per agent GRPO ... vs Dr. MAS ...' (mean over the learning
    rates with such steps), or '' without them."""
    z = an.zero_reward
    cols = [c for c in z.columns if c.startswith("adv_m2_")] if len(z) else []
    if not cols or z["zero_share"].fillna(0).eq(0).all():
        return ""
    means = z[z["zero_share"] > 0].groupby("estimator")[cols].mean()
    fmt = lambda est: "/".join(f"{means.loc[est, c]:.2f}" for c in cols) if est in means.index else "none"  # noqa: E731
    return (f"; on steps with zero training reward the advantage second moment per agent ({'/'.join(c.removeprefix('adv_m2_') for c in cols)}) "
            f"is GRPO {fmt(GRPO)} vs Dr. MAS {fmt(DRMAS)}: each divides the invalid-action penalty by a std")


def judge_accuracy(an: StabilityAnalysis) -> Judged:
    claim, paper, short = _system(an, "Accuracy over time: Dr. MAS above GRPO along the run (area under avg@k, last "
                                      "evaluation)", "accuracy-over-time")
    status = _status(an)
    if an.accuracy.empty:
        return _no_data(claim, paper, short, "no twin pairs with evaluations", status)
    parts = [f"lr {_lr(r.lr)} {r.measure} {100 * r.diff:+.1f} pts [{100 * r.low:+.1f}, {100 * r.high:+.1f}] "
             f"({r.seeds} seeds)" for r in an.accuracy.itertuples()]
    auc = an.accuracy[an.accuracy["measure"] == "auc"]
    above = (auc["low"] > 0).sum()
    below = (auc["high"] < 0).sum()
    verdict = status or (REPRODUCED if above and not below else NOT_REPRODUCED if below and not above
                         else NO_DIFFERENCE if not above and not below else MIXED)
    decided = (f"decided by the {len(auc)} area cells alone, each on its own 95 % CI with no correction across the "
               "levels (exploratory; the last-evaluation cells are reported, not judged)")
    return Judged(claim, paper, "; ".join(parts) + "; " + decided, verdict, short=short, design=EXPLORATORY)


def judges(task: str) -> tuple[tuple[str, Callable[[StabilityAnalysis], Judged], str], ...]:
    """(key, judge, rule) of one system's stability claims (:data:`STUDY` registers them as
    :class:`analysis.claims.ClaimSpec`). The search grid's keys are b-revisited, g, accuracy-over-time; another
    system's carry its name (g-math, ...)."""
    suffix = "" if task == "search" else f"-{task}"
    return ((f"b-revisited{suffix}", judge_spikes, RULE_B), (f"g{suffix}", judge_collapse, RULE_G if task == "search" else RULE_G_MATH),
            (f"accuracy-over-time{suffix}", judge_accuracy, RULE_ACC))


JUDGES = judges("search")
"""The search grid's claims (the summary of ``python -m analysis.stability`` uses :func:`judges` of its grid)."""


# ------------------------------------------------------------------------------------------ the study
LABELS = {
    "b-revisited": ("S-b", "twin = the Dr. MAS run of the same lr and seed; counts = GRPO steps that spike in their own "
                           "history (> 3x the median of the previous 20 steps) and are >= 2x the twin's pre-clip norm at "
                           "that step, against the same count the other way; p_Holm = binomial test, Holm over agents"),
    "g": ("S-g", "collapsed = runs with a collapse (Terms) out of the estimator's runs; frontier = the largest lr at "
                 "which no seed of the estimator collapsed (and no lower lr did)"),
    "accuracy-over-time": ("S-acc", "auc = Dr. MAS − GRPO of the time-averaged avg@k (area under the eval curve / its "
                                    "step span) in pts, paired by seed and task; last = the same at the last evaluation; "
                                    "[low, high] = 95 % bootstrap interval over tasks"),
}
"""REPORT.md label and gloss of each claim of the search grid; another system's carry its name (S-b-math)."""


def label_of(key: str) -> tuple[str, str]:
    """(label, gloss) of a stability claim key (``g``, ``g-math``, ...)."""
    base = next(k for k in sorted(LABELS, key=len, reverse=True) if key == k or key.startswith(k + "-"))
    label, gloss = LABELS[base]
    return label + key[len(base):], gloss


def by_task(grids: Sequence[GridData], seed: int = 0, n_boot: int = N_BOOT) -> dict[str, StabilityAnalysis]:
    """Each system's stability verdicts: from its grid, or "not run"; two grids of one system are an error."""
    out = {t: analyze_stability(None, task=t) for t in TASKS}
    seen: set[str] = set()
    for grid in grids:
        task = task_of(grid)
        if task in seen:
            raise ValueError(f"two stability grids of the {task} system were given; pass one per system")
        seen.add(task)
        out[task] = analyze_stability(grid, seed=seed, n_boot=n_boot)
    return out


def _figures(analyses: dict[str, StabilityAnalysis], out: Path) -> list[Path]:
    return [path for st in analyses.values() if st.data is not None
            for path in save(fig_gradnorm_over_steps(st.data, st.runs, st.in_progress), out, figure_stem(st.task))]


STUDY = Study(
    name="exploratory stability grids",
    analyze=lambda inputs: by_task(inputs.grids.get("stability", []), inputs.seed, inputs.n_boot),
    claims=tuple(ClaimSpec(key, judge=lambda an, judge=judge, task=task: judge(an[task]), rule=rule,
                           label=label_of(key)[0], gloss=label_of(key)[1])
                 for task in TASKS for key, judge, rule in judges(task)),
    figures=_figures,
    grids=lambda analyses: [st.data for st in analyses.values() if st.data is not None],
    option=Option("stability", "stability grid directories, one per system, e.g. results/runs/stability "
                               "results/runs/stability_math (claims b-revisited, g, accuracy-over-time and their -math "
                               "forms)", "pass the stability grids' out_dirs, e.g. results/runs/stability", many=True),
    load=load_optional)
"""The exploratory stability grids as a study of the report (:mod:`analysis.report`)."""


# ------------------------------------------------------------------------------------------ writing
def summary_markdown(an: StabilityAnalysis, runs_dir: Path) -> str:
    lines = ["# Stability grid: collapse, twin spikes, accuracy over time", "",
             f"Generated by `python -m analysis.stability --runs {runs_dir}`; rules in docs/stability.md.", "",
             f"Runs finished: {an.finished} of {an.total}.", ""]
    for key, judge, rule in judges(an.task):
        j = judge(an)
        lines += [f"**{key}.** {j.claim}. Paper: {j.paper}. Ours: {j.ours}. **{j.verdict}**. Rule: {rule}.", ""]
    for title, frame in (("Pilot (stress dial)", an.pilot), ("Runs", an.runs), ("Collapses", an.collapses),
                         ("First movers (every run; the runs that did not collapse are the control)", an.movers), ("Twin spikes per agent", an.spike_agents),
                         ("Accuracy over time", an.accuracy),
                         ("Steps with zero training reward: share, and there the mean advantage second moment per agent "
                          "and the mean step score (what the invalid-action penalty leaves to train on)", an.zero_reward),
                         ("Runs in progress (steps so far; not in any verdict)", an.in_progress)):
        if frame is not None and len(frame):
            lines += [f"## {title}", "", markdown(frame, index=False), ""]
    if an.data is not None and (problems := problem_lines(an.data)):
        lines += ["## Data problems", "", *(f"- {item}" for item in problems), ""]
    return "\n".join(lines) + "\n"


def write_outputs(an: StabilityAnalysis, out: Path, figures: Path, runs_dir: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.md"]
    atomic_write_text(paths[0], summary_markdown(an, runs_dir))
    for name, frame in (("runs", an.runs), ("collapses", an.collapses), ("movers", an.movers), ("zero_reward", an.zero_reward),
                        ("twin_spikes", an.spikes), ("accuracy", an.accuracy), ("pilot", an.pilot)):
        if frame is not None and len(frame):
            frame.to_csv(out / f"{name}.csv", index=False)
            paths.append(out / f"{name}.csv")
    if an.data is not None:
        paths += save(fig_gradnorm_over_steps(an.data, an.runs, an.in_progress), figures, figure_stem(an.task))
    return paths


DEFAULT_RUNS = Path("results/runs/stability")
DEFAULT_PILOT = Path("results/runs/stability_pilot")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m analysis.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--pilot", type=Path, default=None, help=f"the pilot's grid (default: {DEFAULT_PILOT}, if there)")
    p.add_argument("--out", type=Path, default=Path("results/stability"))
    p.add_argument("--figures", type=Path, default=Path("paper_figures"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if missing := missing_paths(runs=args.runs, pilot=args.pilot):
        print(f"analysis.stability: {'; '.join(missing)}; pass a stability grid's out_dir (e.g. {DEFAULT_RUNS}, "
              "written by experiments/grids/stability.yaml); nothing was written", file=sys.stderr)
        return 2
    try:
        an = analyze_stability(load_grid(args.runs), load_optional(args.pilot or DEFAULT_PILOT), seed=args.seed)
    except (FileNotFoundError, ValueError) as exc:
        print(f"analysis.stability: {exc}; nothing was written", file=sys.stderr)
        return 2
    for path in write_outputs(an, args.out, args.figures, args.runs):
        logger.info("wrote %s", path)
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
