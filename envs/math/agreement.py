"""How often does the grader accept a MATH500 reference answer written in another, equivalent form?

    python -m envs.math.agreement [--timeout 5] [--workers 2] [--limit N]

Each reference answer is re-rendered (``rerender_variants``: ``\\frac{a}{b}`` -> ``a/b`` or a decimal,
``\\dfrac``, ``$...$``, spaces, ``\\left(``...``\\right)`` ...), wrapped in a solution ``... \\boxed{variant}``
and graded against the original. Agreement = share of variants judged correct (all are equivalent by
construction). A negative control grades a wrong answer per problem (should be rejected). Prints per-variant
agreement, the false-positive rate, grader counters (timeouts, errors) and the time taken.
"""
from __future__ import annotations

import argparse
import re
import time
from fractions import Fraction
from typing import Callable

from envs.math.data import load_benchmark
from envs.math.grader import MathGrader

_SIMPLE_FRAC = re.compile(r"\\frac\{([^{}]+)\}\{([^{}]+)\}")
_ATOM = re.compile(r"-?[0-9]+|[A-Za-z]|\\[A-Za-z]+")
_INT = re.compile(r"-?[0-9]+")


def _slash_fractions(answer: str) -> str | None:
    """``\\frac{a}{b}`` -> ``a/b`` (parenthesized where needed); None when there is no plain ``\\frac``."""
    if not _SIMPLE_FRAC.search(answer):
        return None

    def one(match: re.Match) -> str:
        num, den = (part if _ATOM.fullmatch(part) else f"({part})" for part in match.groups())
        before, after = answer[:match.start()].rstrip(), answer[match.end():].lstrip()
        alone = (not before or before[-1] in "(,[=+-") and (not after or after[0] in "),]+-=")
        return f"{num}/{den}" if alone else f"({num}/{den})"

    return _SIMPLE_FRAC.sub(one, answer)


def _decimal(answer: str) -> str | None:
    """A terminating decimal for a plain numeric fraction (``-\\frac{3}{4}`` -> ``-0.75``), else None."""
    match = re.fullmatch(r"(-?)\\frac\{([0-9]+)\}\{([0-9]+)\}", answer.strip())
    if match is None:
        return None
    value = Fraction(int(match.group(2)), int(match.group(3)))
    if value.denominator == 0 or any(p not in (2, 5) for p in _prime_factors(value.denominator)):
        return None
    digits = 0
    while (value * 10 ** digits).denominator != 1:
        digits += 1
    return f"{match.group(1)}{float(value):.{digits}f}"


def _prime_factors(n: int) -> set[int]:
    factors, p = set(), 2
    while p * p <= n:
        while n % p == 0:
            factors.add(p)
            n //= p
        p += 1
    if n > 1:
        factors.add(n)
    return factors


def _left_right(answer: str) -> str | None:
    if "\\left" in answer or not re.search(r"[()\[\]]", answer):
        return None
    out = re.sub(r"(?<!\\)([(\[])", r"\\left\1", answer)
    return re.sub(r"(?<!\\)([)\]])", r"\\right\1", out)


_TEXT_GROUP = re.compile(r"(\\(?:text|mbox|mathrm)\{[^{}]*\})")
_SPACED_OPERATOR = re.compile(r"\s*(,(?!\\?!?\s*[0-9]{3}(?![0-9]))|[=+<>]|(?<![\\{^_])-)\s*")


def _spaces(answer: str) -> str:
    """Spaces around operators and commas (not thousands separators, not inside ``\\text{}``), padded ends."""
    parts = _TEXT_GROUP.split(answer)  # odd items are text groups, kept as they are
    spaced = "".join(p if i % 2 else _SPACED_OPERATOR.sub(r" \1 ", p) for i, p in enumerate(parts))
    return f"  {spaced.strip()} "


def _reorder_sum(answer: str) -> str | None:
    """``a+b`` -> ``b+a`` for a two-term sum without other top-level operators (e.g. ``6+9i`` -> ``9i+6``)."""
    match = re.fullmatch(r"([^+\-,=<>()\[\]{}]+)\+([^+\-,=<>()\[\]{}]+)", answer.strip())
    return None if match is None else f"{match.group(2).strip()}+{match.group(1).strip()}"


def _combined(answer: str) -> str:
    """Several renderings at once: ``$``, ``\\dfrac``, ``\\left``/``\\right`` and spaces."""
    out = _left_right(answer) or answer
    return "$ " + _spaces(out.replace("\\frac", "\\dfrac")) + " $"


VARIANTS: dict[str, Callable[[str], str | None]] = {
    "identity": lambda a: a,
    "dollars": lambda a: f"${a}$",
    "spaces": _spaces,
    "dfrac": lambda a: a.replace("\\frac", "\\dfrac") if "\\frac" in a else None,
    "slash_fraction": _slash_fractions,
    "decimal": _decimal,
    "left_right": _left_right,
    "no_left_right": lambda a: re.sub(r"\\(left|right)(?![A-Za-z])", "", a) if "\\left" in a else None,
    "integer_leading_zero": lambda a: f"0{a}" if _INT.fullmatch(a) and not a.startswith("-") else None,
    "integer_as_decimal": lambda a: f"{a}.0" if _INT.fullmatch(a) else None,
    "sqrt_short": lambda a: re.sub(r"\\sqrt\{([0-9])\}", r"\\sqrt\1", a) if re.search(r"\\sqrt\{[0-9]\}", a) else None,
    "degrees_dropped": lambda a: re.sub(r"\^\{?\\circ\}?", "", a) if "\\circ" in a else None,
    "thousands_separator": lambda a: f"{int(a):,}" if _INT.fullmatch(a) and abs(int(a)) >= 1000 else None,
    "reorder_sum": _reorder_sum,
    "combined": _combined,
}


def rerender_variants(answer: str) -> dict[str, str]:
    """Equivalent renderings of a reference answer, by variant name (only the ones that apply)."""
    out = {}
    for name, render in VARIANTS.items():
        variant = render(answer)
        if variant is not None:
            out[name] = variant
    return out


def wrong_answer(answer: str) -> str:
    """A different answer for the negative control: integers + 1, anything else ``+ 1`` appended."""
    stripped = answer.strip()
    return str(int(stripped) + 1) if _INT.fullmatch(stripped) else f"{stripped}+1"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m envs.math.agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per math-verify comparison")
    parser.add_argument("--workers", type=int, default=None, help="math-verify worker processes")
    parser.add_argument("--limit", type=int, default=None, help="use the first N MATH500 problems")
    parser.add_argument("--no-fast-path", action="store_true", help="let math-verify judge every answer")
    args = parser.parse_args(argv)

    tasks = load_benchmark("math500")[:args.limit]
    names, solutions, golds = [], [], []
    for task in tasks:
        for name, variant in rerender_variants(task.answers[0]).items():
            names.append(name)
            solutions.append(f"So the final answer is \\boxed{{{variant}}}.")
            golds.append(task.answers)
    grader = MathGrader(timeout_s=args.timeout, num_workers=args.workers, fast_path=not args.no_fast_path)
    start = time.perf_counter()
    scores = grader.grade_batch(solutions, golds)
    positive_stats = grader.reset_stats()
    wrong = grader.grade_batch([f"\\boxed{{{wrong_answer(t.answers[0])}}}" for t in tasks], [t.answers for t in tasks])
    negative_stats = grader.reset_stats()
    seconds = time.perf_counter() - start
    grader.close()

    mode = "math-verify only" if args.no_fast_path else "fast path + math-verify"
    print(f"MATH500 reference answers re-rendered ({mode}): {len(tasks)} problems, {len(solutions)} variants")
    print(f"{'variant':24s} {'n':>5s} {'agree %':>8s}")
    per_variant = {}
    for name in VARIANTS:
        picked = [s for n, s in zip(names, scores) if n == name]
        if picked:
            per_variant[name] = (len(picked), 100.0 * sum(picked) / len(picked))
            print(f"{name:24s} {len(picked):5d} {per_variant[name][1]:8.1f}")
    non_identity = [s for n, s in zip(names, scores) if n != "identity"]
    agreement = 100.0 * sum(non_identity) / max(1, len(non_identity))
    false_positive = 100.0 * float(wrong.mean()) if len(wrong) else 0.0
    print(f"agreement on non-identity variants: {agreement:.1f}% of {len(non_identity)}")
    print(f"negative control (one wrong answer per problem): {false_positive:.1f}% wrongly accepted")
    print(f"grader (variants): {positive_stats.as_dict()}")
    print(f"grader (negative control): {negative_stats.as_dict()}")
    print(f"timeouts: {positive_stats.timeouts + negative_stats.timeouts}; time: {seconds:.1f}s")
    disagreements = [(n, s, g[0]) for n, s, g, ok in zip(names, solutions, golds, scores) if not ok]
    for name, solution, gold in disagreements[:25]:
        print(f"  rejected {name}: {solution}  (gold {gold})")
    return {"agreement": agreement, "false_positive": false_positive, "per_variant": per_variant,
            "timeouts": positive_stats.timeouts + negative_stats.timeouts}


if __name__ == "__main__":
    main()
