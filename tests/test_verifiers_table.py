"""A table of verifier cases across answer formats, and adversarial answers that must finish in time and run nothing."""
from __future__ import annotations

import os
import time

import pytest

from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rewards.verifiers import choice, gsm8k_flexible, gsm8k_strict, math_boxed

TABLE = [
    # (verifier, response, reference answer, expected score)
    (math_boxed, r"\boxed{\frac{1}{2}}", "0.5", 1.0),                        # fraction vs decimal
    (math_boxed, r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (math_boxed, r"\boxed{\dfrac{3}{4}}", r"\frac34", 1.0),                   # LaTeX variants
    (math_boxed, r"\boxed{\tfrac{3}{4}}", "3/4", 1.0),
    (math_boxed, r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (math_boxed, r"\boxed{\pi}", r"\pi", 1.0),
    (math_boxed, r"\boxed{3.0}", "3", 1.0),
    (math_boxed, r"\boxed{1,000}", "1000", 1.0),
    (math_boxed, r"\boxed{10\%}", "10", 1.0),
    (math_boxed, r"\boxed{90^\circ}", "90", 1.0),                             # units
    (math_boxed, r"\boxed{5 \text{ cm}}", "5", 1.0),
    (math_boxed, r"\boxed{[1, 3)}", "[1,3)", 1.0),                            # intervals
    (math_boxed, r"\boxed{(1, 3]}", "[1,3)", 0.0),
    (math_boxed, r"\boxed{(-\infty, 2]}", r"(-\infty,2]", 1.0),
    (math_boxed, r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),   # tuples
    (math_boxed, r"\boxed{(2, 3)}", "(3, 2)", 0.0),
    (math_boxed, r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),                         # expressions
    (math_boxed, r"\boxed{x = 5}", "5", 1.0),
    (math_boxed, r"\boxed{-7}", "-7", 1.0),
    (math_boxed, r"\boxed{7}", "-7", 0.0),
    (math_boxed, r"\boxed{12}", "012", 1.0),
    (math_boxed, r"so \boxed{1} wait, \boxed{2}", "2", 1.0),                  # last box counts
    (math_boxed, r"so \boxed{1} wait, \boxed{2}", "1", 0.0),
    (math_boxed, r"$\boxed 2$", "2", 1.0),
    (math_boxed, "the answer is 2", "2", 0.0),                                 # no box
    (math_boxed, "", "2", 0.0),                                                # empty
    (math_boxed, r"\boxed{}", "2", 0.0),
    (math_boxed, r"\boxed{", "2", 0.0),                                        # garbage
    (math_boxed, r"\boxed{%$#@!}", "2", 0.0),
    (choice, r"\boxed{B}", "B", 1.0),                                          # letters
    (choice, r"\boxed{(C)}", "C", 1.0),
    (choice, r"\boxed{\text{D}}", "D", 1.0),
    (choice, "The answer is (A).", "A", 1.0),
    (choice, "Answer: c", "C", 1.0),
    (choice, r"\boxed{B}", "A", 0.0),
    (choice, r"\boxed{AB}", "A", 0.0),
    (choice, "I think A or B", "A", 0.0),
    (choice, "", "A", 0.0),
    (gsm8k_strict, "#### 72", "72", 1.0),                                      # #### formats
    (gsm8k_strict, "####72", "72", 1.0),
    (gsm8k_strict, "#### 1,234", "1234", 1.0),
    (gsm8k_strict, "#### $5", "5", 1.0),
    (gsm8k_strict, "#### 5.00", "5", 1.0),
    (gsm8k_strict, "#### five", "5", 0.0),
    (gsm8k_strict, "72", "72", 0.0),
    (gsm8k_flexible, "so she has 72 apples", "72", 1.0),
    (gsm8k_flexible, "-3 degrees", "-3", 1.0),
    (gsm8k_flexible, "garbage ~~~", "3", 0.0),
]


@pytest.mark.parametrize("verifier,response,answer,expected", TABLE,
                         ids=[f"{v.__name__}-{i}" for i, (v, *_rest) in enumerate(TABLE)])
def test_verifier_table(verifier, response, answer, expected):
    assert verifier(response, answer) == expected


def test_table_is_large_enough():
    assert len(TABLE) >= 40


ADVERSARIAL = [
    r"\boxed{10^{10^{10^{10^{10}}}}}",                                        # huge exponents
    r"\boxed{9^{9^{9^{9^{9^{9}}}}}!}",
    r"\boxed{" + r"\frac{1}{" * 400 + "2" + "}" * 400 + "}",                  # deeply nested LaTeX
    r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
    r"\boxed{__import__('os').system('touch PWNED_PY')}",                      # Python code
    r"\boxed{eval(\"open('PWNED_EVAL','w')\")}",
    r"\boxed{$(touch PWNED_SH)}",                                              # shell commands
    "#### `touch PWNED_TICK`; rm -rf / ",
    r"\boxed{x" + "+x" * 5000 + "}",
]


def test_adversarial_answers_finish_in_time_and_run_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scorer = SafeScorer(timeout_s=3.0)
    try:
        items = [(name, text, "2") for text in ADVERSARIAL for name in ("math", "gsm8k_strict", "choice")]
        start = time.perf_counter()
        scores = scorer.score(items)
        elapsed = time.perf_counter() - start
    finally:
        scorer.close()
    assert scores == [0.0] * len(items)
    assert elapsed < 3.0 * len(items) + 30          # each check bounded by its limit (plus worker restarts)
    assert not [name for name in os.listdir(tmp_path) if name.startswith("PWNED")]
