"""Analysis: theory checks, tables, figures, statistics (reads run directories; calls drmas.algos)."""
