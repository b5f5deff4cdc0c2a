"""The three studies in one call: configurations (full and quick) and the runner the CLI and the
notebook share."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.theory.records import Record
from analysis.theory.repetition import RepetitionConfig, run_repetition, write_repetition
from analysis.theory.report import save_figures, write_results
from analysis.theory.softmax import ControlledConfig, SweepConfig, SweepFit, run_controlled, run_sweep
from analysis.theory.tiny_lm import TinyLMConfig, run_tiny_lm

log = logging.getLogger(__name__)

STUDIES = ("controlled", "sweep", "tiny_lm", "repetition")


@dataclass(frozen=True)
class TheoryConfig:
    """Configurations of the three studies."""

    controlled: ControlledConfig = field(default_factory=ControlledConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    tiny_lm: tuple[TinyLMConfig, ...] = (TinyLMConfig(), TinyLMConfig(sharing=True))
    repetition: RepetitionConfig = field(default_factory=RepetitionConfig)
    studies: tuple[str, ...] = STUDIES

    def __post_init__(self) -> None:
        unknown = sorted(set(self.studies) - set(STUDIES))
        if unknown:
            raise ValueError(f"unknown studies {unknown}; choose among {list(STUDIES)}")


def theory_config(quick: bool = False, seed: int = 0, studies: tuple[str, ...] = STUDIES) -> TheoryConfig:
    """The full configuration (under a minute of compute on 2 cores) or the quick one (about 15 s)."""
    if not quick:
        return TheoryConfig(ControlledConfig(seed=seed), SweepConfig(seed=seed),
                            (TinyLMConfig(seed=seed), TinyLMConfig(seed=seed, sharing=True)), RepetitionConfig(seed=seed),
                            studies)
    return TheoryConfig(
        ControlledConfig(n_groups=1000, seed=seed),  # Monte Carlo error about 0.7 % instead of 0.35 %
        SweepConfig(offsets=(0.0, 1.0, 2.0, 2.5), spreads=(0.25, 1.0, 2.0),  # 11 points, factors up to ~8
                    fresh_batches=32, seed=seed),  # half the fresh batches: grad_sq noisier
        (TinyLMConfig(n_groups=16, batch_groups=4, seed=seed),),  # ~300 per-sample gradients, no sharing run
        RepetitionConfig(n_actions=(64, 16, 4), n_groups=200, seed=seed),  # 3 levels, a fifth of the groups
        studies)


def run_studies(cfg: TheoryConfig) -> tuple[list[Record], list[SweepFit], pd.DataFrame]:
    """Run the selected studies; returns all records, the sweep's line fits and the repetition table."""
    records: list[Record] = []
    fits: list[SweepFit] = []
    repetition = pd.DataFrame()
    for study in cfg.studies:
        t0 = time.perf_counter()
        log.info("study %s ...", study)
        if study == "controlled":
            records += run_controlled(cfg.controlled)
        elif study == "sweep":
            recs, fits = run_sweep(cfg.sweep)
            records += recs
        elif study == "repetition":
            repetition = run_repetition(cfg.repetition)
        else:
            for lm in cfg.tiny_lm:
                records += run_tiny_lm(lm)
        log.info("study %s done in %.1f s", study, time.perf_counter() - t0)
    return records, fits, repetition


def write_all(records: list[Record], fits: list[SweepFit], out_dir: Path, fig_dir: Path | None,
              title: str = "Lemma 4.2 / Prop. 4.3 checks", repetition: pd.DataFrame | None = None) -> list[Path]:
    """JSON, tables and (unless ``fig_dir`` is None) figures; the repetition table and figure when given."""
    paths = write_results(records, fits, out_dir, title)
    if fig_dir is not None:
        paths += save_figures(records, fits, fig_dir)
    if repetition is not None and len(repetition):
        paths += write_repetition(repetition, out_dir, fig_dir)
    return paths


__all__ = ["STUDIES", "TheoryConfig", "run_studies", "theory_config", "write_all"]
