"""Analysis: theory checks, tables, figures, statistics and the report (reads run directories; calls drmas.algos).

- :mod:`analysis.claims` -- the contract: the verdict words, the claim types, a :class:`~analysis.claims.Study`;
- :mod:`analysis.runs` -- a grid directory as tidy DataFrames (:mod:`analysis.views`: what the studies read off it);
- :mod:`analysis.events` -- the event rules the stability studies share (rolling windows, collapse, abandonment);
- :mod:`analysis.stats` -- bootstrap CIs, unbiased pass@k, spike counts, the paired test, Holm, ``ALPHA``,
  Kaplan-Meier, the logistic and Firth fits;
- :mod:`analysis.tables` -- Tables 1-3, headline gains, gradient-norm and heterogeneous-cost tables;
- :mod:`analysis.figures` -- the paper's figures (Agg canvas);
- the studies, side by side: :mod:`analysis.main_grid`, :mod:`analysis.sweep`, :mod:`analysis.stability`,
  :mod:`analysis.confirm`;
- :mod:`analysis.report` -- ``python -m analysis.report --runs DIR``: assembles the studies into tables, figures and
  REPORT.md;
- :mod:`analysis.theory` -- Lemma 4.2 / Prop. 4.3 checks (``python -m analysis.theory``).
"""
