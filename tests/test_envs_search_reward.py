"""EM / F1 answer scoring (SQuAD normalization, as Search-R1 and FlashRAG)."""
from __future__ import annotations

import pytest

from envs.search.reward import contains_answer, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize("raw, expected", [
    ("The Eiffel Tower!", "eiffel tower"),            # lower, punctuation, leading article
    ("  a  B,c ", "bc"),                               # punctuation removed *before* splitting: "b,c" -> "bc"
    ("An apple a day", "apple day"),                   # every article, anywhere
    ("theater Anna", "theater anna"),                  # articles only as whole words
    ("New\tYork\n City", "new york city"),            # whitespace collapsed
    ("U.S.A.", "usa"),
    ("", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_against_any_gold():
    assert exact_match("the eiffel tower", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower", "Paris"]) == 0.0
    assert exact_match("paris.", ["Eiffel Tower", "Paris"]) == 1.0
    assert exact_match("anything", []) == 0.0
    assert exact_match("", ["x"]) == 0.0


def test_f1_token_overlap_and_max_over_golds():
    # pred tokens {eiffel, tower, paris}, gold {eiffel, tower}: P = 2/3, R = 1 -> F1 = 2PR/(P+R) = 0.8
    assert f1_score("Eiffel Tower Paris", ["the Eiffel Tower"]) == pytest.approx(0.8)
    # max over golds: second gold matches exactly
    assert f1_score("Paris", ["Eiffel Tower", "paris"]) == 1.0
    assert f1_score("London", ["Paris"]) == 0.0
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("x", []) == 0.0


def test_f1_yes_no_only_scores_on_equality():
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0  # token overlap with "yes" does not count (FlashRAG)
    assert f1_score("Yes.", ["yes"]) == 1.0


def test_contains_answer_on_word_boundaries():
    assert contains_answer("It opened in 1935 in Paris.", ["paris"])
    assert not contains_answer("It opened in 1935.", ["35"])
    assert not contains_answer("anything", [""])
