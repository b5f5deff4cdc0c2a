"""CLI: ``python -m analysis.theory [--quick] [--out DIR] [--figures DIR]``.

Runs the controlled study, the inflation sweep and the tiny-LM study (docs/theory.md), writes
``lemma42.json``, ``summary.csv``, ``summary.md`` and the ``theory_*`` figures, and prints the summary.
Only a full run with the default ``--out`` writes the committed ``results/theory`` and
``paper_figures/theory_*``; a quick run goes to ``results/theory/quick``, and ``--out DIR`` puts the figures
under ``DIR/figures`` unless ``--figures`` says otherwise.
The options are generated from :class:`Args`.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analysis.cli import parse_dataclass_args
from analysis.theory.report import summary_text
from analysis.theory.run import STUDIES, run_studies, theory_config, write_all


FULL_OUT, COMMITTED_FIGURES = Path("results/theory"), Path("paper_figures")


@dataclass
class Args:
    quick: bool = field(default=False, metadata={"help": "small sizes (under a minute on 2 cores)"})
    out: str = field(default="", metadata={"help": "folder of lemma42.json and the summary tables; empty: "
                                                   f"{FULL_OUT} for a full run, {FULL_OUT}/quick for --quick"})
    figures: str = field(default="", metadata={"help": f"folder of the theory_* figures; empty: {COMMITTED_FIGURES} "
                                                       f"for a full run into {FULL_OUT}, else OUT/figures"})
    no_figures: bool = field(default=False, metadata={"help": "skip the figures"})
    studies: str = field(default=",".join(STUDIES), metadata={"help": "comma-separated subset of " + ",".join(STUDIES)})
    seed: int = field(default=0, metadata={"help": "seed of every numpy Generator and torch generator"})
    threads: int = field(default=1, metadata={"help": "torch threads (1: the segment reductions are faster "
                                                      "single-threaded on a shared 2-core machine)"})


    def __post_init__(self) -> None:
        """Computed here, in one place: ``out_dir`` and ``figures_dir``. A quick run, or one with another
        ``--out``, never writes over the committed full-run files (``results/theory``, ``paper_figures/theory_*``)
        unless ``--out``/``--figures`` name them."""
        self.out_dir = Path(self.out) if self.out else FULL_OUT / "quick" if self.quick else FULL_OUT
        full_default = not self.quick and self.out_dir == FULL_OUT
        self.figures_dir = Path(self.figures) if self.figures else COMMITTED_FIGURES if full_default \
            else self.out_dir / "figures"


def parse_args(argv: list[str] | None = None) -> Args:
    return parse_dataclass_args(Args, "python -m analysis.theory", "Checks of Lemma 4.2 and Prop. 4.3 (docs/theory.md).", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    if not args.no_figures:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
    t0 = time.perf_counter()
    cfg = theory_config(args.quick, args.seed, tuple(s for s in args.studies.split(",") if s))
    records, fits, repetition = run_studies(cfg)
    title = f"Lemma 4.2 / Prop. 4.3 checks ({'quick' if args.quick else 'full'} run, seed {args.seed})"
    paths = write_all(records, fits, args.out_dir, None if args.no_figures else args.figures_dir, title, repetition)
    print(title)
    print(summary_text(records, fits))
    print(f"wrote {len(paths)} files ({', '.join(str(p) for p in paths[:3])}, ...) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
