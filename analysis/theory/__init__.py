"""Checks of the paper's gradient-norm theory (Lemma 4.2, Prop. 4.3) built on ``drmas.algos``.

- :mod:`analysis.theory.lemma`: both sides of Lemma 4.2 on a sample, from ``compute_advantages``;
- :mod:`analysis.theory.softmax`: controlled study and inflation sweep with softmax agents;
- :mod:`analysis.theory.tiny_lm`: the same on per-sample gradients of tiny Qwen2 models;
- :mod:`analysis.theory.report`: JSON, tables, figures; :mod:`analysis.theory.run`: configs and runner.

CLI: ``python -m analysis.theory [--quick] [--out results/theory]``. Details: docs/theory.md.
"""
from analysis.theory.lemma import NORMALIZATION, LemmaTerms, SampleTable, fit_line, lemma_terms
from analysis.theory.records import REQUIRED_KEYS, Record
from analysis.theory.run import STUDIES, TheoryConfig, run_studies, theory_config, write_all

__all__ = ["NORMALIZATION", "LemmaTerms", "SampleTable", "fit_line", "lemma_terms", "REQUIRED_KEYS", "Record",
           "STUDIES", "TheoryConfig", "run_studies", "theory_config", "write_all"]
