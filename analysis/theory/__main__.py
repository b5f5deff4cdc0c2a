"""CLI: ``python -m analysis.theory [--quick] [--out results/theory] [--figures paper_figures]``.

Runs the controlled study, the inflation sweep and the tiny-LM study (docs/theory.md), writes
``lemma42.json``, ``summary.csv``, ``summary.md`` and the ``theory_*`` figures, and prints the summary.
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


@dataclass
class Args:
    quick: bool = field(default=False, metadata={"help": "small sizes (under a minute on 2 cores)"})
    out: Path = field(default=Path("results/theory"),
                      metadata={"help": "folder of lemma42.json and the summary tables"})
    figures: Path = field(default=Path("paper_figures"), metadata={"help": "folder of the theory_* figures"})
    no_figures: bool = field(default=False, metadata={"help": "skip the figures"})
    studies: str = field(default=",".join(STUDIES), metadata={"help": "comma-separated subset of " + ",".join(STUDIES)})
    seed: int = field(default=0, metadata={"help": "seed of every numpy Generator and torch generator"})
    threads: int = field(default=1, metadata={"help": "torch threads (1: the segment reductions are faster "
                                                      "single-threaded on a shared 2-core machine)"})


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
    records, fits = run_studies(cfg)
    title = f"Lemma 4.2 / Prop. 4.3 checks ({'quick' if args.quick else 'full'} run, seed {args.seed})"
    paths = write_all(records, fits, args.out, None if args.no_figures else args.figures, title)
    print(title)
    print(summary_text(records, fits))
    print(f"wrote {len(paths)} files ({', '.join(str(p) for p in paths[:3])}, ...) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
