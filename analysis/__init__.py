"""Analysis: theory checks, tables, figures, statistics (reads run directories; calls drmas.algos).

- :mod:`analysis.runs` -- a grid directory as tidy DataFrames;
- :mod:`analysis.claims` -- the verdict words and the claim types every claim module shares;
- :mod:`analysis.stats` -- bootstrap CIs, unbiased pass@k, spike counts, the paired Dr. MAS vs GRPO test;
- :mod:`analysis.tables` -- Tables 1-3, headline gains, gradient-norm and heterogeneous-cost tables;
- :mod:`analysis.figures` -- the paper's figures (Agg canvas);
- :mod:`analysis.report` -- ``python -m analysis.report --runs DIR``: tables, figures and REPORT.md;
- :mod:`analysis.theory` -- Lemma 4.2 / Prop. 4.3 checks (``python -m analysis.theory``).
"""
