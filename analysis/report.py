"""``python -m analysis.report --runs results/runs/cpu [--out results] [--figures paper_figures] [--mechanism DIR]
[--stability DIR...] [--confirm DIR] [--frontier DIR]``

Assembles what the studies return into the paper's tables (``<out>/tables/``), figures (``<figures>/``) and a one-page
``<out>/REPORT.md``: each claim of the paper with our measurement, the paper's value, a verdict and the rule that gave
it. Each study (:data:`STUDIES`: the main grid, the mechanism sweep, the exploratory stability grids, the confirmatory
round, the frontier round) is one :class:`analysis.claims.Study`: the report loads the grids named on its command line, hands them to every
study (:class:`analysis.claims.Inputs`), and writes the studies' tables, figures and judged claims in the list's order.
A claim whose runs are missing says "not run", one computed on fewer runs than its design says "incomplete (n of N
runs)", and "Data problems" lists every run not used and every record dropped, of every grid read
(docs/reliability.md, "The records rule"). Adding a study: docs/analysis.md, "Adding a study".
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import pandas as pd
import yaml

from drmas.io import atomic_write_text

from analysis import confirm, frontier, main_grid, stability, sweep
from analysis.claims import Claim, Inputs, Study
from analysis.cli import missing_paths, parse_dataclass_args
from analysis.integrity import data_problems_section
from analysis.run_records import GridLoadError
from analysis.runs import GridData, load_grid
from analysis.stats import N_BOOT
from analysis.tables import PRICES_YAML
from analysis.views import describe_scale

logger = logging.getLogger("analysis.report")
ROOT = Path(__file__).resolve().parent.parent

STUDIES: tuple[Study, ...] = (main_grid.STUDY, sweep.STUDY, stability.STUDY, confirm.STUDY, frontier.STUDY)
"""The report's studies, in REPORT.md's order (their claims, tables and figures come out in this order)."""


@dataclass
class Assembled:
    """What the studies returned: each study with its analysis, from the report's :class:`analysis.claims.Inputs`."""

    inputs: Inputs
    analyses: list[tuple[Study, Any]]
    given: list[tuple[str, list[Path]]] = field(default_factory=list)
    """per study option (flag), the folders given whose grids were read (REPORT.md's command line)"""

    def claims(self) -> list[Claim]:
        return [spec.evaluate(an) for study, an in self.analyses for spec in study.claims]

    def other_grids(self) -> list[GridData]:
        """Every grid the studies read besides the main one, in the studies' order."""
        return [g for study, an in self.analyses for g in study.grids(an)]


def assemble(inputs: Inputs, studies: Sequence[Study] = STUDIES,
             given: Sequence[tuple[str, list[Path]]] = ()) -> Assembled:
    """Every study's analysis of ``inputs``, in the list's order (``given``: :func:`load_inputs`'s second value)."""
    return Assembled(inputs, [(study, study.analyze(inputs)) for study in studies], list(given))


# ------------------------------------------------------------------------------------------ writing
def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(Path(path).resolve(), Path(start).resolve())


def _scale_text(scale: dict[str, Any]) -> str:
    params = (yaml.safe_load(PRICES_YAML.read_text()) or {}).get("parameters_millions", {})
    parts = []
    for task, t in scale["tasks"].items():
        presets = ", ".join(f"{p} ({params[p]:g}M parameters)" if p in params else p for p in t["presets"]) or "?"
        parts.append(f"{task}: {t['runs']} finished runs, presets {presets}, "
                     f"{'/'.join(str(s) for s in t['steps'])} RL steps, seeds {t['seeds']}, benchmarks "
                     f"{', '.join(t['benchmarks'])} ({'/'.join(str(n) for n in t['n_tasks'])} tasks each, "
                     f"k = {'/'.join(str(k) for k in t['k'])} samples)"
                     + (f", {t['hours']:.1f} run-hours" if t["hours"] > 0 else ""))
    status = ", ".join(f"{n} {s}" for s, n in scale["status"].items())
    return (f"Grid `{scale['grid']}`: {scale['n_runs']} runs ({status}). " + "; ".join(parts) + ". "
            "The paper trains 3B-8B Qwen models on DAPO-Math / NQ+HotpotQA for hundreds of steps on 4-8 H100 and "
            "evaluates avg@16 / pass@16 on public benchmarks; here the policies are tiny Qwen2-architecture models "
            "SFT'd from scratch on generated tasks, with k samples per eval task. Verdicts at this scale are "
            "about the mechanism (gradient statistics, the direction of effects), not the paper's absolute numbers.")


TERMS = (
    ("pts", "absolute percentage points of avg@k / pass@k (a difference of two accuracies, e.g. Dr. MAS − GRPO); the "
            "report's one convention for gains, the paper's gains recomputed the same way from paper_tables.csv"),
    ("avg@k / pass@k", "mean success over k samples per eval task / success of any of the k (k = 16 in the paper)"),
    ("±, [low, high]", "95 % bootstrap interval over eval tasks (± its half-width); p = the named test's p-value"),
    ("×", "a ratio of two times or costs (hetero / homogeneous); below 1 is faster or cheaper"),
    ("Lemma factor", "F_k = (σk² + (μk − μ)²)/σ², μ, σ the group's statistics and μk, σk agent k's (the paper's "
                     "Lemma 4.2): how much the global baseline inflates agent k's gradient second moment E‖A·z‖² "
                     "over agent-wise normalization (F_k = 1 under Dr. MAS); logged per agent and step"),
    ("class-aware factor", "Σ_g Σ_c S_c(b)² / Σ_g Σ_c S_c(Dr. MAS)², S_c the sum of the advantages of a class c of "
                           "identical (prompt, response) samples, which share one gradient: the squared grad-norm "
                           "ratio of baseline b over Dr. MAS when class gradients are orthogonal and of equal norm "
                           "(analysis/class_aware.py); its square root is the predicted ratio"),
    ("grad-norm ratio", "an agent's mean pre-clip norm under a global baseline (GRPO) / under Dr. MAS, same seed and "
                        "setting"),
    ("rho", "Spearman rank correlation (a1, a2: over the sweep's (miss rate, seed, agent) points)"),
    ("pre-clip norm", "L2 norm of one agent's policy-gradient before gradient clipping (agent/{k}/grad_norm, the "
                      "norm the clip then caps)"),
    ("spike", "a step whose pre-clip norm is > 3x the median of the agent's previous 20 steps (at least 5 of them), "
              "or non-finite (drmas/algos/diagnostics.py)"),
    ("twin", "the Dr. MAS run of the same lr and seed as a GRPO run (S-b, C3, C5 compare them step by step)"),
    ("collapse", "S-g: a run's first non-finite norm or skipped step, or its 10-step mean reward <= half its running "
                 "peak for 20 steps, or (search) its 10-step mean Search calls per trajectory < 1/4 of steps 0-9 for "
                 "20 steps; C1-C5: the non-finite and reward clauses plus the abandonment of any agent"),
    ("abandonment", "an agent's 10-step mean calls per trajectory below 1/4 of its early level for 20 steps"),
    ("frontier", "S-g: the largest lr at which no seed of an estimator collapsed (and no lower lr did); C4 (LR50): "
                 "the lr at which its collapse probability crosses 1/2, from a logistic fit of collapse on log2(lr) "
                 "(analysis/confirm.py)"),
    ("HR", "Cox hazard ratio of collapse, GRPO / Dr. MAS, stratified by lr (> 1: GRPO collapses sooner)"),
    ("auc", "time-averaged avg@k: the area under the eval curve / its step span"),
    ("Kendall tau", "rank agreement of our order of the four Table 3 variants with the paper's (1 = the same order)"),
    ("exploratory / confirmatory", "the stability grids (3 seeds, rules that could only say \"not reproduced\") / "
                                   "the confirmatory round (fresh seeds, rules and power written before its runs)"),
    ("incomplete (n of N runs)", "a verdict computed on fewer finished runs than its design holds"),
)
"""The report's Terms section: (term, one line)."""


def terms_section() -> list[str]:
    """REPORT.md's glossary: one line per term of :data:`TERMS`."""
    return ["", "## Terms", "", *(f"- **{term}**: {text}." for term, text in TERMS)]


def report_markdown(an: Assembled, claims: list[Claim], out: Path, tables_dir: Path, figures: list[Path],
                    runs_dir: Path) -> str:
    """REPORT.md: the verdict table (claim, the paper's number, ours in one number, verdict), the scale, then one
    section per claim (:func:`claim_section`), where the numbers are, and the data problems."""
    theory = next((p for p in (out / "theory" / "summary.md", ROOT / "results" / "theory" / "summary.md") if p.exists()), None)
    pngs = {p.stem: p for p in figures if p.suffix == ".png"}
    lines = ["# Dr. MAS reproduction: claims and verdicts", "",
             f"Generated by `python -m analysis.report --runs {runs_dir}"
             + "".join(f" --{flag} {' '.join(map(str, paths))}" for flag, paths in an.given if paths)
             + "`; every number below is computed from the run "
             "directories (the paper's from `analysis/data/`). Gains are absolute percentage points (pts), Dr. MAS − "
             "GRPO unless named, the paper's recomputed the same way; ± is the half-width of a 95 % bootstrap interval "
             "over eval tasks; the terms are defined under [Terms](#terms).", "",
             "The *design* column says which test judged a claim: the main grid's pre-registered rules, the stability "
             "grids (**exploratory**: 3 seeds, a test that could only say \"not reproduced\"), or the confirmatory "
             "round (**confirmatory**: fresh seeds, rules and power statements committed before its runs, "
             "docs/stability.md). Labels: a1-f the main grid (the paper's claims a-f), S-... the exploratory "
             "stability grids (S-b revisits b, S-g is claim g, collapse; -math: the math system), C1-C5 and C-acc "
             "the confirmatory round, C6-n, C6-s and C6-acc the frontier round (confirmatory too, docs/frontier.md).", "",
             "| label | claim | design | paper | ours | verdict |", "|---|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.label} | [{c.claim}](#{_anchor(c)}) | {c.design} | {c.paper_headline} | {c.headline} | "
                     f"**{c.verdict}** |".replace("\n", " "))
    lines += terms_section()
    lines += ["", "**Scale.** " + _scale_text(describe_scale(an.inputs.main))]
    for c in claims:
        lines += claim_section(c, pngs, out)
    lines += ["", "## Where the numbers are", "", "Tables (Markdown, LaTeX, CSV) in "
              f"[`{_rel(tables_dir, out)}/`]({_rel(tables_dir, out)}/): "
              + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in sorted(tables_dir.glob('*.md'))) + "."]
    if pngs:
        lines += ["", "Figures: " + ", ".join(f"[{stem}]({_rel(p, out)})" for stem, p in pngs.items()) + "."]
    if theory is not None:
        lines += ["", f"Controlled checks of Lemma 4.2 / Prop. 4.3 (softmax policies and a tiny LM): "
                      f"[{_rel(theory, out)}]({_rel(theory, out)})."]
    else:
        lines += ["", "Controlled checks of Lemma 4.2 / Prop. 4.3: run `python -m analysis.theory` (results/theory/summary.md)."]
    lines += ["", "Verdict rules in full, table and figure definitions: docs/analysis.md."]
    lines += data_problems_section(an.inputs.main, an.other_grids())
    return "\n".join(lines) + "\n"


SECTION_FIGURES = 2
"""Figures drawn inline in a claim's section; the rest of its figures are linked."""


def _anchor(c: Claim) -> str:
    """GitHub's anchor of the claim's section heading."""
    heading = f"{c.label or c.key} {c.claim}".lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def claim_section(c: Claim, pngs: dict[str, Path], out: Path) -> list[str]:
    """One claim's REPORT.md section: verdict, rule, the paper's statement, our statistics, its figures."""
    lines = ["", f"## {c.label or c.key} {c.claim}", "", *([f"*Terms:* {c.gloss}.", ""] if c.gloss else []),
             f"**{c.verdict}**: ours {c.headline}; paper {c.paper_headline}.", "",
             f"- **Rule.** {c.rule}", f"- **Paper.** {c.paper}", "- **Ours.**",
             *(f"  - {d}" for d in c.details)]
    shown = [pngs[s] for s in c.figures if s in pngs]
    if shown:
        lines += ["", *(f"![{p.stem}]({_rel(p, out)})" for p in shown[:SECTION_FIGURES])]
        if shown[SECTION_FIGURES:]:
            lines += ["", "More: " + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in shown[SECTION_FIGURES:]) + "."]
    return lines


def summary_text(claims: list[Claim], report: Path) -> str:
    """What the terminal shows after the analysis: one line per claim (key, verdict, ours in one number)."""
    width = max(len(c.verdict) for c in claims) if claims else 0
    key_width = max(len(c.label or c.key) for c in claims) if claims else 0
    rows = [f"  {c.label or c.key:<{key_width}}  {c.verdict:<{width}}  {c.short}: {c.headline}" for c in claims]
    return "\n".join(["claims (verdict, ours in one number):", *rows, f"full report: {report}"])


def make_report(runs: Path, out: Path = Path("results"), figures_dir: Path = Path("paper_figures"), seed: int = 0,
                n_boot: int = N_BOOT, with_figures: bool = True, **grids: Any) -> Path:
    """Load ``runs`` and the studies' grid folders (``grids``: by option, e.g. ``mechanism=``, ``stability=[...]``,
    ``confirm=``), write tables, figures and ``out/REPORT.md``; return the report's path."""
    return write_report(runs, out, figures_dir, seed, n_boot, with_figures, **grids)[0]


def load_inputs(runs: Path, seed: int, n_boot: int, studies: Sequence[Study] = STUDIES,
                **grids: Any) -> tuple[Inputs, list[tuple[str, list[Path]]]]:
    """The report's :class:`analysis.claims.Inputs` and, per option, the given folders whose grids were read. A given
    folder that does not exist is refused (:class:`analysis.run_records.GridLoadError`, one line) before anything is
    read."""
    options = [s for s in studies if s.option is not None]
    unknown = sorted(set(grids) - {s.option.flag for s in options})
    if unknown:
        raise TypeError(f"no study reads {', '.join(unknown)}; the studies' options: {[s.option.flag for s in options]}")
    single = {s.option.flag: grids.get(s.option.flag) for s in options if not s.option.many}
    if missing := missing_paths(runs=runs, **single):
        raise GridLoadError("; ".join(missing) + "; pass the out_dir of a grid, e.g. results/runs/cpu; nothing was written")
    for s in options:
        if s.option.many and (missing := [f"--{s.option.flag} {p} does not exist" for p in grids.get(s.option.flag) or ()
                                          if not Path(p).exists()]):
            raise GridLoadError("; ".join(missing) + f"; {s.option.example}; nothing was written")
    main = load_grid(runs)
    loaded: dict[str, Any] = {}
    given: list[tuple[str, list[Path]]] = []
    for s in options:
        value = grids.get(s.option.flag)
        if s.option.many:
            each = {Path(p): s.load(p) for p in value or ()}  # None: nothing has run there ("not run")
            loaded[s.option.flag] = [g for g in each.values() if g is not None]
            given.append((s.option.flag, [p for p, g in each.items() if g is not None]))
        else:
            loaded[s.option.flag] = s.load(value) if value else None
            given.append((s.option.flag, [value] if loaded[s.option.flag] is not None else []))
    return Inputs(main, seed, n_boot, loaded), given


def write_report(runs: Path, out: Path = Path("results"), figures_dir: Path = Path("paper_figures"), seed: int = 0,
                 n_boot: int = N_BOOT, with_figures: bool = True, **grids: Any) -> tuple[Path, list[Claim]]:
    """:func:`make_report`, returning the judged claims too."""
    inputs, given = load_inputs(runs, seed, n_boot, **grids)
    an = assemble(inputs, given=given)
    tables_dir = Path(out) / "tables"
    for study, analysis in an.analyses:
        study.tables(analysis, tables_dir)
    fig_paths = [p for study, analysis in an.analyses for p in study.figures(analysis, figures_dir)] if with_figures else []
    claims = an.claims()
    pd.DataFrame([{"label": c.label or c.key, "key": c.key, "claim": c.claim, "paper": c.paper, "ours": c.ours,
                   "verdict": c.verdict,
                   "headline": c.headline, "rule": c.rule} for c in claims]).to_csv(tables_dir / "claims.csv", index=False)
    path = Path(out) / "REPORT.md"
    atomic_write_text(path, report_markdown(an, claims, Path(out), tables_dir, fig_paths, Path(runs)))
    logger.info("wrote %s, %d tables in %s, %d figure files in %s", path, len(list(tables_dir.glob("*.md"))),
                tables_dir, len(fig_paths), figures_dir)
    return path, claims


# ------------------------------------------------------------------------------------------ CLI
@dataclass
class Args:
    runs: Path = field(metadata={"help": "grid output directory (holds index.json), e.g. results/runs/cpu"})
    out: Path = field(default=Path("results"), metadata={"help": "folder of REPORT.md and tables/"})
    figures: Path = field(default=Path("paper_figures"), metadata={"help": "folder of the PNG/PDF figures"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap Generator"})
    n_boot: int = field(default=N_BOOT, metadata={"help": "bootstrap replicates per interval"})
    no_figures: bool = field(default=False, metadata={"help": "skip the figures"})


def study_args(studies: Sequence[Study] = STUDIES) -> type:
    """:class:`Args` with one field per study option (``--mechanism``, ``--stability``, ``--confirm``, ...)."""
    extra = [(s.option.flag, list[Path], field(default_factory=list, metadata={"help": s.option.help}))
             if s.option.many else (s.option.flag, Optional[Path], field(default=None, metadata={"help": s.option.help}))
             for s in studies if s.option is not None]
    return make_dataclass("Args", extra, bases=(Args,))


def parse_args(argv: list[str] | None = None) -> Any:
    return parse_dataclass_args(study_args(), "python -m analysis.report",
                                "Tables, figures and REPORT.md from a grid directory (docs/analysis.md).", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    grids = {s.option.flag: getattr(args, s.option.flag) for s in STUDIES if s.option is not None}
    try:
        path, claims = write_report(args.runs, args.out, args.figures, args.seed, args.n_boot, not args.no_figures,
                                    **grids)
    except (FileNotFoundError, ValueError) as exc:
        print(f"analysis.report: {exc}", file=sys.stderr)
        return 2
    print(summary_text(claims, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
