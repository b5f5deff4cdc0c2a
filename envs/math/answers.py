"""Math answers as text: extract the last ``\\boxed{}`` answer, normalize an answer, and compare two answers
exactly where that is decidable without a CAS (the grader's fast path, :mod:`envs.math.grader`).

Pure string work (standard library only): agents, data loaders and task generators import this module; the
math-verify worker pool lives in :mod:`envs.math.grader`.
"""
from __future__ import annotations

import re
from fractions import Fraction

# ----------------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------------

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped char (\{ \} \\ ...) or a brace
MAX_BOX_CHARS = 10_000  # a longer box is treated as unclosed (keeps extraction linear and cheap)


def extract_boxed(text: str, max_chars: int = MAX_BOX_CHARS) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (outer whitespace stripped).

    Braces are matched with nesting (escaped ``\\{`` ``\\}`` do not count). ``\\boxed 5`` (no braces) gives the
    text up to the next whitespace or ``$``. Returns None when there is no box, or when the last one is
    unclosed or longer than ``max_chars``. Never raises (non-strings give None).
    """
    if not isinstance(text, str):
        return None
    last = None
    for last in _BOX_COMMAND.finditer(text):
        pass
    if last is None:
        return None
    start = last.end()
    after = text[start:start + max_chars + 2]
    stripped = after.lstrip()
    if stripped.startswith("{"):
        open_at = start + len(after) - len(stripped)
        depth = 0
        for token in _BRACE_TOKEN.finditer(text, open_at, open_at + max_chars + 2):
            if token.group() == "{":
                depth += 1
            elif token.group() == "}":
                depth -= 1
                if depth == 0:
                    return text[open_at + 1:token.start()].strip()
        return None
    token = re.match(r"[^\s$]+", stripped)  # "\boxed 5": up to the next space or "$"
    return None if token is None else token.group()


# ----------------------------------------------------------------------------------------------------------
# Fast path: string normalization and exact rational comparison
# ----------------------------------------------------------------------------------------------------------

_TEXT_COMMANDS = r"\\(?:text|textrm|textbf|textit|mbox|mathrm|mathbf|mathit|operatorname)"
# a unit after a number: "5\text{ cm}", "15\mbox{ cm}^2"; not "3+4\mathrm{i}" or "2\mathrm{e}"
_TRAILING_UNIT = re.compile(r"(?<=[0-9})])\s*" + _TEXT_COMMANDS
                            + r"\{(?![ ~]*[eij][ ~]*\})[A-Za-z~ .]*[A-Za-z][A-Za-z~ .]*\}(?:\^\{?[0-9]\}?)?$")
_UNWRAP_TEXT = re.compile(_TEXT_COMMANDS + r"\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_THOUSANDS = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_ASSIGNMENT = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?=([^=]+)")
_CHOICE = re.compile(r"\(([A-Ea-e])\)")
_INTEGER = re.compile(r"[-+]?[0-9]+")
_DECIMAL = re.compile(r"[-+]?[0-9]*\.[0-9]+")
_SCIENTIFIC = re.compile(r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([-+]?[0-9]{1,3})|"
                         r"\\(?:times|cdot)10\^(?:\{([-+]?[0-9]{1,3})\}|([0-9])))")
_FRACTION = re.compile(r"([-+]?)(?:\\frac\{([-+]?[0-9]+)\}\{([-+]?[0-9]+)\}|([-+]?[0-9]+)/([-+]?[0-9]+))")
MAX_NUMBER_DIGITS = 1000  # longer digit strings are left to math-verify's length cap (never parsed here)


def normalize_answer(answer: str) -> str:
    """Canonical string form of a final answer, for the exact-match fast path.

    Removes what never changes the value: whitespace, ``$``, ``\\left``/``\\right``, spacing commands
    (``\\!`` ``\\,`` ``~`` ``\\quad``), ``^\\circ``, ``\\%``, a trailing unit in ``\\text{}``/``\\mathrm{}``,
    thousands separators, trailing periods, a leading ``x=``; rewrites ``\\dfrac``/``\\tfrac`` to ``\\frac``,
    ``\\frac12`` to ``\\frac{1}{2}``, ``\\sqrt2`` to ``\\sqrt{2}``, ``.5`` to ``0.5``, ``(C)`` to ``C``; unwraps
    the remaining ``\\text{...}``. Two answers with the same normal form are equal; different normal forms
    decide nothing.
    """
    s = answer.strip().replace("\u2212", "-")
    s = s.replace("\\$", "").replace("$", "")
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING.sub(" ", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![A-Za-z])", r"\\binom", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    s = _TRAILING_UNIT.sub("", s)
    s = _UNWRAP_TEXT.sub(r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = s.replace("{,}", "")
    s = re.sub(r"\\frac([0-9])([0-9])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([0-9])\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}([0-9])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt([0-9])", r"\\sqrt{\1}", s)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"(?<![0-9])\.([0-9])", r"0.\1", s)
    s = s.rstrip(".")
    assignment = _ASSIGNMENT.fullmatch(s)
    if assignment is not None:
        s = assignment.group(1)
    choice = _CHOICE.fullmatch(s)
    if choice is not None:
        s = choice.group(1).upper()
    return s


def parse_rational(normalized: str) -> tuple[Fraction, bool] | None:
    """``(value, is_integer_literal)`` when a normalized answer is a plain number (``-12``, ``0.25``,
    ``\\frac{3}{4}``, ``3/4``, ``3.8e5``, ``3.8\\times10^{5}``), else None."""
    if len(normalized) > MAX_NUMBER_DIGITS:
        return None
    try:
        if _INTEGER.fullmatch(normalized):
            return Fraction(int(normalized)), True
        if _DECIMAL.fullmatch(normalized):
            return Fraction(normalized), False
        scientific = _SCIENTIFIC.fullmatch(normalized)  # 3.83e35, 3.83\times10^{35}
        if scientific is not None:
            mantissa, exponent = scientific.group(1), next(e for e in scientific.groups()[1:] if e is not None)
            return Fraction(mantissa) * Fraction(10) ** int(exponent), False
        fraction = _FRACTION.fullmatch(normalized)
        if fraction is not None:
            sign = fraction.group(1)
            num, den = fraction.group(2) or fraction.group(4), fraction.group(3) or fraction.group(5)
            if int(den) == 0:
                return None
            value = Fraction(int(num), int(den))
            return (-value if sign == "-" else value), False
    except (ValueError, ZeroDivisionError):
        return None
    return None


def fast_match(pred: str, gold: str) -> bool | None:
    """Decide ``pred == gold`` without math-verify: True / False when certain, None when undecided.

    True: equal normal forms, or equal plain rational numbers. False: an empty answer, or two different
    integers. Everything else (e.g. ``0.333`` vs ``\\frac13``, whose tolerance math-verify decides) is None.
    """
    pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
    if not pred_norm or not gold_norm:
        return False
    if pred_norm == gold_norm:
        return True
    pred_num, gold_num = parse_rational(pred_norm), parse_rational(gold_norm)
    if pred_num is None or gold_num is None:
        return None
    if pred_num[0] == gold_num[0]:
        return True
    if pred_num[1] and gold_num[1]:
        return False
    return None
