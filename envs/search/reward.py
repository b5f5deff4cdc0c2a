"""Answer scoring for QA: SQuAD-style normalization, exact match and token F1.

``normalize_answer`` is the normalization of the SQuAD v1.1 evaluation script, which Search-R1 and
FlashRAG use: lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace.
The reward of the search task is ``exact_match`` against *any* gold answer (docs/paper.md §4).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# FlashRAG's F1 scores these special answers by exact match only (token overlap with "yes" is meaningless).
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower -> remove punctuation -> remove articles -> collapse whitespace."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _f1_single(pred: str, gold: str) -> float:
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Max over gold answers of the token-level F1 of the normalized strings (FlashRAG convention:
    yes/no/noanswer only score when equal)."""
    pred = normalize_answer(prediction)
    return max((_f1_single(pred, normalize_answer(g)) for g in golds), default=0.0)


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """True if any non-empty normalized gold answer occurs in the normalized text, on word boundaries
    (DPR's "answer-bearing passage" test)."""
    padded = f" {normalize_answer(text)} "
    return any(g and f" {g} " in padded for g in map(normalize_answer, golds))
