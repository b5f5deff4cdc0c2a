"""REPORT.md's claim table (label, claim, design, paper, ours, verdict) and its stored copy
``tests/data/report_claims.md``, which ``tests/test_report_claims.py`` keeps equal to it: a change that moves a verdict
(or any number of the table) fails there until the copy is rewritten on purpose.

    python -m analysis.report_claims            # compare results/REPORT.md's table with the stored copy (exit 1: differ)
    python -m analysis.report_claims --write    # rewrite the stored copy from results/REPORT.md (the diff shows the change)
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from drmas.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "results" / "REPORT.md"
STORED = ROOT / "tests" / "data" / "report_claims.md"
HEADER = "| label | claim | design | paper | ours | verdict |"


def claim_table(report_text: str) -> str:
    """The claim table of a REPORT.md's text: its header line and every row up to the first blank line."""
    lines = report_text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"no claim table (a line {HEADER!r}) in the report")
    start = lines.index(HEADER)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m analysis.report_claims", description=__doc__.split("\n\n")[0])
    p.add_argument("--report", type=Path, default=REPORT, help=f"the report (default: {REPORT.relative_to(ROOT)})")
    p.add_argument("--stored", type=Path, default=STORED, help=f"the stored copy (default: {STORED.relative_to(ROOT)})")
    p.add_argument("--write", action="store_true", help="rewrite the stored copy from the report")
    args = p.parse_args(argv)
    if not args.report.is_file():
        print(f"analysis.report_claims: {args.report} does not exist; run `bash experiments/run_all.sh --only analysis` "
              "first", file=sys.stderr)
        return 2
    table = claim_table(args.report.read_text())
    if args.write:
        args.stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.stored, table)
        print(f"wrote {args.stored} ({len(table.splitlines()) - 2} claims)")
        return 0
    stored = args.stored.read_text() if args.stored.is_file() else ""
    if stored == table:
        print(f"{args.report}'s claim table equals {args.stored}")
        return 0
    sys.stdout.writelines(difflib.unified_diff(stored.splitlines(True), table.splitlines(True), str(args.stored),
                                               str(args.report)))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
