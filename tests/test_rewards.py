"""Verifiers score what they should, and a broken or hanging check costs one sample, not the run."""
from __future__ import annotations

import logging
import time

import pytest

from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rewards.verifiers import gsm8k_flexible, gsm8k_strict, last_boxed, math_boxed, resolve


@pytest.mark.parametrize("response,answer,expected", [
    ("so the total is #### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("#### $18", "18", 1.0),
    ("#### -5", "-5", 1.0),
    ("#### 3.50", "3.5", 1.0),
    ("#### 72.", "72", 1.0),
    ("#### 7 then #### 8", "8", 1.0),
    ("#### 7 then #### 8", "7", 0.0),
    ("the answer is 72", "72", 0.0),
    ("####", "72", 0.0),
    ("", "72", 0.0),
])
def test_gsm8k_strict(response, answer, expected):
    assert gsm8k_strict(response, answer) == expected


@pytest.mark.parametrize("response,answer,expected", [
    ("7 + 8 = 15", "15", 1.0),
    ("15.", "15", 1.0),
    ("The answer is 1,000", "1000", 1.0),
    ("15 apples, no 16", "15", 0.0),
    ("no numbers here", "15", 0.0),
])
def test_gsm8k_flexible(response, answer, expected):
    assert gsm8k_flexible(response, answer) == expected


@pytest.mark.parametrize("response,answer,expected", [
    (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{3}", "4", 0.0),
    ("no box 3", "3", 0.0),
])
def test_math_boxed(response, answer, expected):
    assert math_boxed(response, answer) == expected


def test_last_boxed_balances_braces():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}") == r"\frac{a}{b}"
    assert last_boxed(r"\boxed{unclosed") is None


def test_unknown_verifier_lists_valid_ones():
    with pytest.raises(KeyError, match="gsm8k_strict"):
        resolve("nope")


def test_raising_and_hanging_verifiers_score_zero_and_scoring_goes_on(caplog):
    scorer = SafeScorer(timeout_s=1.0)
    try:
        with caplog.at_level(logging.WARNING):
            start = time.perf_counter()
            scores = scorer.score([
                ("tests.helpers.rewards:hanging", "fine", "x"),
                ("tests.helpers.rewards:hanging", "please hang", "x"),
                ("tests.helpers.rewards:raising", "anything", "x"),
                ("gsm8k_strict", "#### 4", "4"),
            ])
            elapsed = time.perf_counter() - start
        assert scores == [1.0, 0.0, 0.0, 1.0]
        assert elapsed < 30
        assert "exceeded 1.0s" in caplog.text and "RuntimeError: this verifier always fails" in caplog.text
    finally:
        scorer.close()
