"""Verifier soundness suite: each case is decided as a careful grader would, and every case on which a second,
independent grader disagrees names the written rule (RULES) that decides it.

Second graders: for `math`, a minimal reimplementation of Qwen2.5-Math's `math_equal` (evaluation/grader.py and
the `strip_string` / `extract_answer` of evaluation/parser.py: last box, string, numeric with its percentage and
1e-4 tolerance, list, simple-equation and symbolic checks), whose symbolic step uses a small LaTeX parser written
here (sympy objects built from tokens, nothing evaluated); for `gsm8k_strict` / `gsm8k_flexible`, verl's
`reward_score/gsm8k.py`; for `choice`, Qwen's `choice_answer_clean`.

Kinds: OK = an equivalent form that must score 1; WRONG = a well-formed wrong answer; BAD = a malformed answer
(both must score 0). Size, and false positives / negatives of the verifiers before this suite (verifiers.py as of
ace5a3b) -> now:
  math            142 cases (70 OK, 32 WRONG, 40 BAD): FP 27 (9 WRONG, 18 BAD) -> 0, FN 9 -> 0
  gsm8k_strict     34 cases (17 OK,  9 WRONG,  8 BAD): FP  6 (0 WRONG,  6 BAD) -> 0, FN 2 -> 0
  gsm8k_flexible   28 cases (12 OK,  6 WRONG, 10 BAD): FP 10 (1 WRONG,  9 BAD) -> 0, FN 2 -> 0
  choice           34 cases (16 OK,  8 WRONG, 10 BAD): FP  4 (2 WRONG,  2 BAD) -> 0, FN 5 -> 0
  all             238 cases: FP 47 -> 0, FN 18 -> 0 (the second graders: FP 49, FN 31, each one a RULES case).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from fractions import Fraction
from math import isclose

import pytest
import sympy

from tokenrl.rewards import verifiers
from tokenrl.rewards.normalize import math_forms
from tokenrl.rewards.verifiers import (
    GOLD_FORMS,
    boxed_all,
    extract_choice,
    gsm8k_flexible,
    gsm8k_strict,
    last_boxed,
    resolve,
)

RULES = {
    # math
    "box": "math needs a boxed answer (the prompt asks for one); Qwen falls back to 'the answer is ...' or the "
    "last number.",
    "one-answer": "A response commits to one answer: every non-empty box must hold it, so two boxes with different "
    "answers score 0 (Qwen reads the last box). An empty box (an echoed instruction) is ignored.",
    "unbalanced": "Unbalanced brackets or braces are malformed, an unclosed box included (Qwen deletes brackets "
    "before comparing and reads an unclosed box on to the end of the text).",
    "python": "Python syntax is not an answer: `**`, `//`, `%` between numbers and float literals like `1e0` score 0 "
    "even when their value is right (Qwen's sympy parse_expr fallback reads them as Python).",
    "side-by-side": "Numbers side by side, or apart only by what the parser drops (`3 4`, `5 \\quad 6`, "
    "`3 \\phantom{0} 4`, `5 \\text{ dollars and } 6`), are malformed, except thousands in groups of "
    "three digits (`1 000`); Qwen deletes spaces (`3 4` is 34) and cuts an answer ending in "
    "`\\text{}` from its first `\\text{`.",
    "text-number": "Text holding a number beside other content is part of the answer, not a unit "
    "(`6 \\text{ or 7}`, `331\\text{1}`); Qwen drops a final `\\text{}` as a unit.",
    "equation": "Against a value, an equation counts only as `name = value` (x = 5, f(x) = 2x, AB = 5; likewise "
    "`x \\in [1,3)` and a leading `\\approx`): `2x = 10` states an equation, not the value 10, and "
    "`= 5` has no left side (Qwen drops any left side of at most two characters, `x\\in` only when "
    "written without a space, and never `\\approx`).",
    "brackets": "Brackets carry meaning: the set \\{1,3\\} is not the interval or pair (1,3), and (1,3] is not "
    "[1,3) (a bare list `1, 3` has no brackets to contradict); Qwen strips brackets or compares the "
    "items only.",
    "unordered": "Sets and bare comma lists of solutions are unordered (`2, 1` = `1, 2`); Qwen compares them as "
    "strings.",
    "conjunction": "`\\text{ or }` / `\\text{ and }` between answers separates list items "
    "(`x = 1 \\text{ or } x = 2` is the list 1, 2); Qwen glues the words into the expression.",
    "mixed-number": "A whole number followed by a fraction is a mixed number, as MATH writes them "
    "(2\\frac{1}{2} = 5/2); Qwen's parser multiplies.",
    "thousands": "Thousands may be grouped by `,`, `{,}`, `\\,` or a space, in groups of exactly three digits; "
    "Qwen reads only the plain comma.",
    "comma": "A comma groups thousands only before exactly three digits (1,000); otherwise it separates items "
    "(`1,2` is the list 1, 2), which Qwen and verl read as 12.",
    "percent": "A percent sign has two readings, N (MATH golds drop the sign) and N/100 (its value); a bare number is "
    "never rescaled (Qwen accepts 0.1 and 1000 for 10).",
    "unit": "Units after a number are dropped, in `\\text{}` with a power (`12\\text{ cm}^2`) or as plain words "
    "(`18 dollars`); Qwen drops only a `\\text{}` that ends the answer.",
    "tolerance": "Numbers are equal exactly or when the decimal rounds to the value at about six places "
    "(math-verify); Qwen's relative 1e-4 accepts 99.995 for 100 and 1.000001 for 1.",
    "base": "A base subscript is part of the number: 2516_9 is not 2516_8 and 331_7 is not 331; it may be left out "
    "where the gold has it (the question fixes the base). Qwen's float() reads 2516_9 as 25169, within its "
    "tolerance of 25168, and its parser cannot read subscripts.",
    "unicode-minus": "U+2212 (−) is a minus sign, in a box and in a GSM8K number; verl's and Qwen's number "
    "patterns do not know it and keep the digits without their sign.",
    # GSM8K (both verifiers; `comma` and `unicode-minus` above apply to them too)
    "value": "GSM8K numbers compare by value: `$`, `\\$`, thousands commas, trailing zeros, a trailing period and no "
    "space after #### are allowed; verl compares strings.",
    "one-number": "The #### line holds one number: if anything after it contains a digit or starts with an operator "
    "(`#### 5-3`, `#### 2**3`, `#### 5 or 6`, `#### 3/4`) it scores 0; verl keeps the leading digits.",
    "operand": "The last number must stand on its own: an operand (`2 + 3`, `5-3`, `x**2`, `2^3`, a \\frac "
    "denominator) scores 0, and a minus between two numbers is not a sign; verl takes the digits.",
    "name-digits": "Digits inside a name (H2O, x2) are not numbers; verl's last number would be that 2.",
    # multiple choice (`one-answer` and `unbalanced` above apply to it too)
    "box-decides": "With a box present the box is the commitment and prose letters are ignored (Qwen reads the "
    "first letter after the last 'answer is').",
    "hedge": "Two letters in one commitment (`A or B`, `A/B`, `\\boxed{A and B}`) score 0; Qwen takes one of them.",
    "article": "A lower-case letter in prose counts only on its own (`Answer: c`, `(b)`); 'the answer is a "
    "tricky one' names no option (Qwen upper-cases the text first).",
}

OK, WRONG, BAD = "equivalent", "near-miss", "malformed"

CASES = [
    # (verifier, response, reference answer, kind, rule deciding a disagreement with the second grader)
    # --- math: equivalent forms -------------------------------------------------------------------------------
    ("math", r"\boxed{\frac{1}{2}}", "0.5", OK, None),  # fractions and decimals
    ("math", r"so \boxed{\frac{1}{2}}", "0.5", OK, None),
    ("math", r"\boxed{0.5}", r"\frac{1}{2}", OK, None),
    ("math", r"\boxed{.5}", r"\frac12", OK, None),
    ("math", r"\boxed{\frac{2}{4}}", r"\frac12", OK, None),
    ("math", r"\boxed{-\frac{1}{2}}", r"\frac{-1}{2}", OK, None),
    ("math", r"\boxed{-0.5}", r"-\frac12", OK, None),
    ("math", r"\boxed{0.3333333}", r"\frac13", OK, None),
    ("math", r"\boxed{3.0}", "3", OK, None),
    ("math", r"\boxed{3.00}", "3", OK, None),
    ("math", r"\boxed{12}", "012", OK, None),
    ("math", r"\boxed{\dfrac{3}{4}}", r"\frac34", OK, None),  # LaTeX variants
    ("math", r"\boxed{\tfrac{3}{4}}", "3/4", OK, None),
    ("math", r"\boxed{\frac34}", "0.75", OK, None),
    ("math", r"\boxed{\left(\frac{1}{2}\right)}", "0.5", OK, None),
    ("math", r"\boxed{2\sqrt{2}}", r"\sqrt{8}", OK, None),
    ("math", r"\boxed{\sqrt3}", r"\sqrt{3}", OK, None),
    ("math", r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", OK, None),
    ("math", r"\boxed{\sqrt[3]{8}}", "2", OK, None),
    ("math", r"\boxed{\log_2 8}", "3", OK, None),
    ("math", r"\boxed{\dfrac 3 8}", "0.375", OK, None),
    ("math", r"\boxed{\pi}", r"\pi", OK, None),
    ("math", r"\boxed{2^{10}}", "1024", OK, None),
    ("math", r"\boxed{5!}", "120", OK, None),
    ("math", r"\boxed{3 \cdot 10^{3}}", "3000", OK, None),
    ("math", r"\boxed{10^{-3}}", "0.001", OK, None),
    ("math", r"\boxed{3(4)}", "12", OK, None),
    ("math", r"\boxed{2\frac{1}{2}}", r"\frac{5}{2}", OK, "mixed-number"),
    ("math", r"\boxed{3 \, \frac{1}{2}}", r"\frac72", OK, "mixed-number"),
    ("math", r"\boxed{2 \sqrt 3}", r"2\sqrt{3}", OK, None),
    ("math", r"\boxed{−15}", "-15", OK, "unicode-minus"),
    ("math", r"\boxed{1,000}", "1000", OK, None),  # thousands separators
    ("math", r"\boxed{1{,}000}", "1000", OK, "thousands"),
    ("math", r"\boxed{1\,000}", "1000", OK, "thousands"),
    ("math", r"\boxed{1 000}", "1000", OK, None),
    ("math", r"\boxed{1,234.5}", "1234.5", OK, None),
    ("math", r"\boxed{29,\!322,\!216}", "29322216", OK, None),
    ("math", r"\boxed{1\,000\,000 \text{ dollars}}", "1000000", OK, "thousands"),
    ("math", r"\boxed{10\%}", "10", OK, None),  # percent
    ("math", r"\boxed{10\%}", "0.1", OK, None),
    ("math", r"\boxed{50}", r"50\%", OK, None),
    ("math", r"\boxed{0.5}", r"50\%", OK, None),
    ("math", r"\boxed{12.5\%}", r"\frac18", OK, "percent"),
    ("math", r"\boxed{90^\circ}", "90", OK, None),  # units
    ("math", r"\boxed{5 \text{ cm}}", "5", OK, None),
    ("math", r"\boxed{12\text{ cm}^2}", "12", OK, "unit"),
    ("math", r"\boxed{\$18.00}", "18", OK, None),
    ("math", r"\boxed{18 dollars}", "18", OK, "unit"),
    ("math", r"\boxed{\text{(C)}}", r"\text{(C)}", OK, None),  # \text{}
    ("math", r"\boxed{\text{Monday}}", r"\text{Monday}", OK, None),
    ("math", r"\boxed{[1, 3)}", "[1,3)", OK, None),  # intervals
    ("math", r"\boxed{\left[1,3\right)}", "[1,3)", OK, None),
    ("math", r"\boxed{(-\infty, 2]}", r"(-\infty,2]", OK, None),
    ("math", r"\boxed{x \in [1,3)}", "[1,3)", OK, "equation"),
    ("math", r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", OK, None),  # tuples, sets
    ("math", r"\boxed{(1, 4.5)}", r"(1,\frac{9}{2})", OK, None),
    ("math", r"\boxed{2, 1}", "1, 2", OK, "unordered"),
    ("math", r"\boxed{\{1, 2\}}", r"\{2, 1\}", OK, "unordered"),
    ("math", r"\boxed{x = 1 \text{ or } x = 2}", "1, 2", OK, "conjunction"),
    ("math", r"\boxed{x^2+2x+1}", "(x+1)^2", OK, None),  # expressions, equations
    ("math", r"\boxed{x = 5}", "5", OK, None),
    ("math", r"\boxed{\approx 8.24}", "8.24", OK, "equation"),
    ("math", r"\boxed{2516}", "2516_8", OK, "base"),
    ("math", r"\boxed{f(x) = 2x}", "2x", OK, "equation"),
    ("math", r"\boxed{\emptyset}", r"\varnothing", OK, None),
    ("math", r"\boxed{-7}", "-7", OK, None),
    ("math", r"$\boxed 2$", "2", OK, None),  # box forms
    ("math", r"\fbox{7}", "7", OK, None),
    ("math", r"first \boxed{\frac12}, checked: \boxed{0.5}", "0.5", OK, None),
    ("math", r"I will put it in \boxed{}. ... \boxed{7}", "7", OK, None),
    # --- math: near-misses ------------------------------------------------------------------------------------
    ("math", r"\boxed{3}", "4", WRONG, None),
    ("math", r"\boxed{7}", "-7", WRONG, None),
    ("math", r"\boxed{(1, 3]}", "[1,3)", WRONG, "brackets"),
    ("math", r"\boxed{[1,3]}", "(1,3)", WRONG, "brackets"),
    ("math", r"\boxed{(2, 3)}", "(3, 2)", WRONG, None),
    ("math", r"\boxed{-\infty}", r"\infty", WRONG, None),
    ("math", r"\boxed{\pm\sqrt{2}}", r"\sqrt{2}", WRONG, None),
    ("math", r"\boxed{0.333}", r"\frac13", WRONG, None),
    ("math", r"\boxed{99.995}", "100", WRONG, "tolerance"),
    ("math", r"\boxed{1.000001}", "1", WRONG, "tolerance"),
    ("math", r"\boxed{0.1}", "10", WRONG, "percent"),
    ("math", r"\boxed{1000}", "10", WRONG, "percent"),
    ("math", r"\boxed{(1,3)}", r"\{1,3\}", WRONG, "brackets"),
    ("math", r"\boxed{x^2 = 25}", "25", WRONG, None),
    ("math", r"\boxed{2x = 10}", "10", WRONG, "equation"),
    ("math", r"\boxed{1+1=6}", "6", WRONG, None),
    ("math", r"\boxed{6 \approx 7}", "6", WRONG, None),
    ("math", r"\boxed{2516_9}", "2516_8", WRONG, "base"),  # bases
    ("math", r"\boxed{331_7}", "331", WRONG, None),
    ("math", r"\boxed{1, 2}", "1", WRONG, None),  # a list hedges
    ("math", r"\boxed{1 \text{ or } 2}", "1", WRONG, None),
    ("math", r"\boxed{x = 5, 6}", "5", WRONG, None),
    ("math", r"\boxed{x > 5}", "5", WRONG, None),
    ("math", r"\boxed{5^2}", "5", WRONG, None),
    ("math", r"\boxed{5!}", "5", WRONG, None),
    ("math", r"\boxed{−15}", "15", WRONG, None),
    ("math", r"\boxed{2x + 1}", "1", WRONG, None),  # stray numbers in expressions
    ("math", r"\boxed{x - 1}", "-1", WRONG, None),
    ("math", r"\boxed{3(4)}", "7", WRONG, None),
    ("math", r"so \boxed{1} wait, \boxed{2}", "1", WRONG, None),  # several boxes
    ("math", r"so \boxed{1} wait, \boxed{2}", "2", WRONG, "one-answer"),
    ("math", r"The answer is 5. \boxed{6}", "5", WRONG, None),  # reasoning vs box
    # --- math: malformed --------------------------------------------------------------------------------------
    ("math", r"\boxed{x**2 - 1}", "1", BAD, None),  # Python operators
    ("math", r"\boxed{2**3 - 1}", "1", BAD, None),
    ("math", r"\boxed{2**3 - 1}", "7", BAD, "python"),
    ("math", r"\boxed{x**2 - 1}", "x^2 - 1", BAD, "python"),
    ("math", r"\boxed{7//2}", "7", BAD, None),
    ("math", r"\boxed{7 % 3}", "7", BAD, None),
    ("math", r"\boxed{1e0}", "0", BAD, "python"),
    ("math", r"\boxed{3 4}", "7", BAD, None),  # numbers side by side
    ("math", r"\boxed{3 4}", "34", BAD, "side-by-side"),
    ("math", r"\boxed{5 \quad 6}", "11", BAD, None),
    ("math", r"\boxed{5\ 6}", "11", BAD, None),
    ("math", r"\boxed{3 \phantom{0} 4}", "7", BAD, None),
    ("math", r"\boxed{3 \displaystyle 4}", "7", BAD, None),
    ("math", r"\boxed{5 \text{ dollars and } 6 \text{ cents}}", "5", BAD, "side-by-side"),
    ("math", r"\boxed{6 \text{ or 7}}", "6", BAD, "text-number"),  # numbers hidden in text
    ("math", r"\boxed{331\text{1}}", "331", BAD, "text-number"),
    ("math", r"\boxed{5'7}", "5", BAD, None),
    ("math", r"\boxed{1,2}", "12", BAD, "comma"),
    ("math", r"\boxed{1,00}", "100", BAD, "comma"),
    ("math", r"\boxed{1.5.3}", "1.5", BAD, None),
    ("math", r"\boxed{x+}", "x", BAD, None),  # partial expressions
    ("math", r"\boxed{2-}", "2", BAD, None),
    ("math", r"\boxed{= 5}", "5", BAD, "equation"),
    ("math", r"\boxed{5=}", "5", BAD, None),
    ("math", r"\boxed{x = 6 = 5}", "5", BAD, None),
    ("math", r"\boxed{\frac{1}{}}", "1", BAD, None),
    ("math", r"\boxed{\sqrt{}}", "0", BAD, None),
    ("math", r"\boxed{15 \mbox{ cm}^2\sqrt{}}", "15", BAD, None),
    ("math", r"\boxed{(1,2}", "(1,2)", BAD, "unbalanced"),  # unbalanced brackets
    ("math", r"\boxed{\frac{1}{2}", "0.5", BAD, "unbalanced"),
    ("math", r"\boxed{5} so \boxed{5", "5", BAD, "unbalanced"),
    ("math", r"\boxed{5$ and $6}", "5", BAD, None),
    ("math", r"\boxed{5 \text{ (or } 6)}", "6", BAD, None),
    ("math", r"\boxed{}", "2", BAD, None),  # empty or no answer
    ("math", r"\boxed{ }", "2", BAD, None),
    ("math", r"\boxed{", "2", BAD, None),
    ("math", r"\boxed{%$#@!}", "2", BAD, None),
    ("math", "", "2", BAD, None),
    ("math", "the answer is 2", "2", BAD, "box"),
    ("math", "no box 3", "3", BAD, "box"),
    # --- gsm8k_strict -----------------------------------------------------------------------------------------
    ("gsm8k_strict", "#### 72", "72", OK, None),
    ("gsm8k_strict", "so the total is #### 72", "72", OK, None),
    ("gsm8k_strict", "#### 1,234", "1234", OK, None),
    ("gsm8k_strict", "#### 1,000", "1000", OK, None),
    ("gsm8k_strict", "#### $18", "18", OK, "value"),
    ("gsm8k_strict", "#### $5", "5", OK, "value"),
    ("gsm8k_strict", r"#### \$18", "18", OK, "value"),
    ("gsm8k_strict", "#### -5", "-5", OK, None),
    ("gsm8k_strict", "#### −15", "-15", OK, "unicode-minus"),
    ("gsm8k_strict", "#### 3.50", "3.5", OK, "value"),
    ("gsm8k_strict", "#### 5.00", "5", OK, "value"),
    ("gsm8k_strict", "#### 72.", "72", OK, "value"),
    ("gsm8k_strict", "####72", "72", OK, "value"),
    ("gsm8k_strict", "#### 7 then #### 8", "8", OK, None),
    ("gsm8k_strict", "#### 72 apples", "72", OK, None),
    ("gsm8k_strict", "#### 72\nI checked it twice, in 2 ways.", "72", OK, None),
    ("gsm8k_strict", "#### Step 1\n3 boxes of 24\n#### 72", "72", OK, None),
    ("gsm8k_strict", "#### 7 then #### 8", "7", WRONG, None),
    ("gsm8k_strict", "the answer is 72", "72", WRONG, None),
    ("gsm8k_strict", "72", "72", WRONG, None),
    ("gsm8k_strict", "#### five", "5", WRONG, None),
    ("gsm8k_strict", "#### -72", "72", WRONG, None),
    ("gsm8k_strict", "#### 72", "-72", WRONG, None),
    ("gsm8k_strict", "#### −15", "15", WRONG, None),
    ("gsm8k_strict", "#### 7.2", "72", WRONG, None),
    ("gsm8k_strict", "#### 720", "72", WRONG, None),
    ("gsm8k_strict", "#### 2**3", "2", BAD, "one-number"),
    ("gsm8k_strict", "#### 7//2", "7", BAD, "one-number"),
    ("gsm8k_strict", "#### 5-3", "5", BAD, "one-number"),
    ("gsm8k_strict", "#### 5 or 6", "5", BAD, "one-number"),
    ("gsm8k_strict", "#### 3/4", "3", BAD, "one-number"),
    ("gsm8k_strict", "#### 1,2", "12", BAD, "comma"),
    ("gsm8k_strict", "####", "72", BAD, None),
    ("gsm8k_strict", "", "72", BAD, None),
    # --- gsm8k_flexible ---------------------------------------------------------------------------------------
    ("gsm8k_flexible", "7 + 8 = 15", "15", OK, None),
    ("gsm8k_flexible", "15.", "15", OK, "value"),
    ("gsm8k_flexible", "The answer is 1,000", "1000", OK, "value"),
    ("gsm8k_flexible", "so she has 72 apples", "72", OK, None),
    ("gsm8k_flexible", "-3 degrees", "-3", OK, None),
    ("gsm8k_flexible", "so x = -3", "-3", OK, None),
    ("gsm8k_flexible", "It fell to −15", "-15", OK, "unicode-minus"),
    ("gsm8k_flexible", "The answer is **15**.", "15", OK, None),
    ("gsm8k_flexible", "It costs $18.00", "18", OK, "value"),
    ("gsm8k_flexible", "15, I am sure", "15", OK, "value"),
    ("gsm8k_flexible", "That is 15 liters of H2O", "15", OK, "name-digits"),
    ("gsm8k_flexible", "She is 15-year-old", "15", OK, None),
    ("gsm8k_flexible", "15 apples, no 16", "15", WRONG, None),
    ("gsm8k_flexible", "no numbers here", "15", WRONG, None),
    ("gsm8k_flexible", "garbage ~~~", "3", WRONG, None),
    ("gsm8k_flexible", "8", "-8", WRONG, None),
    ("gsm8k_flexible", "about 15 or 16", "15", WRONG, None),
    ("gsm8k_flexible", "It fell to −15", "15", WRONG, "unicode-minus"),
    ("gsm8k_flexible", "5-3", "-3", BAD, "operand"),
    ("gsm8k_flexible", "2 + 3", "3", BAD, "operand"),
    ("gsm8k_flexible", "x**2", "2", BAD, "operand"),
    ("gsm8k_flexible", "7//2", "2", BAD, "operand"),
    ("gsm8k_flexible", "The result is 2^3", "3", BAD, "operand"),
    ("gsm8k_flexible", "The area is 3²", "3", BAD, "operand"),
    ("gsm8k_flexible", r"\frac{1}{2}", "2", BAD, "operand"),
    ("gsm8k_flexible", "The numbers are 1,2", "12", BAD, None),
    ("gsm8k_flexible", "version 1.5.3", "3", BAD, None),
    ("gsm8k_flexible", "a 3-4 hour trip", "4", BAD, None),
    # --- choice -----------------------------------------------------------------------------------------------
    ("choice", r"\boxed{B}", "B", OK, None),
    ("choice", r"\boxed{(C)}", "C", OK, None),
    ("choice", r"\boxed{\text{D}}", "D", OK, None),
    ("choice", r"\boxed{\textbf{(A)}}", "A", OK, None),
    ("choice", r"\boxed{b}", "B", OK, None),
    ("choice", r"\boxed{B) 42}", "B", OK, None),
    ("choice", r"\boxed{A} and again \boxed{A}", "A", OK, None),
    ("choice", "The answer is (A).", "A", OK, None),
    ("choice", "Answer: c", "C", OK, None),
    ("choice", "the answer is (b)", "B", OK, None),
    ("choice", "The answer is B because A is wrong.", "B", OK, None),
    ("choice", "**Answer:** B", "B", OK, None),
    ("choice", "The correct answer is option D", "D", OK, None),
    ("choice", r"The answer is $\text{(B)}$.", "B", OK, None),
    ("choice", "The answer is A. Wait, no: the answer is B.", "B", OK, None),
    ("choice", r"the answer is A, but \boxed{B}", "B", OK, "box-decides"),
    ("choice", r"\boxed{B}", "A", WRONG, None),
    ("choice", "", "A", WRONG, None),
    ("choice", "I think A or B", "A", WRONG, None),
    ("choice", "I think A or B", "B", WRONG, "hedge"),
    ("choice", r"the answer is A, but \boxed{B}", "A", WRONG, "box-decides"),
    ("choice", r"\boxed{A} first, then \boxed{B}", "B", WRONG, "one-answer"),
    ("choice", r"\boxed{42}", "A", WRONG, None),
    ("choice", "The answer is a tricky one.", "A", WRONG, "article"),
    ("choice", r"\boxed{AB}", "A", BAD, None),
    ("choice", r"\boxed{A and B}", "A", BAD, None),
    ("choice", r"\boxed{A and B}", "B", BAD, "hedge"),
    ("choice", r"\boxed{A, B}", "B", BAD, "hedge"),
    ("choice", "The answer is A or B", "A", BAD, "hedge"),
    ("choice", "The answer is A/B", "A", BAD, "hedge"),
    ("choice", r"\boxed{(A) or (B)}", "B", BAD, "hedge"),
    ("choice", r"\boxed{}", "A", BAD, None),
    ("choice", r"\boxed{A", "A", BAD, "unbalanced"),
    ("choice", "Answer:", "A", BAD, None),
]

_IDS = [f"{verifier}-{i}" for i, (verifier, *_rest) in enumerate(CASES)]


@pytest.mark.parametrize("verifier,response,answer,kind,rule", CASES, ids=_IDS)
def test_verifier_decides_as_written(verifier, response, answer, kind, rule):
    assert resolve(verifier)(response, answer) == (1.0 if kind == OK else 0.0)


# --- second graders -----------------------------------------------------------------------------------------------


def _verl_gsm8k(response: str, answer: str, method: str) -> float:
    """verl's reward_score/gsm8k.py: the last `#### <digits>` (strict) or last digit run (flexible), as strings."""
    if method == "strict":
        found = re.findall(r"#### (\-?[0-9\.\,]+)", response)
        extracted = found[-1].replace(",", "").replace("$", "") if found else None
    else:
        found = [f for f in re.findall(r"(\-?[0-9\.\,]+)", response) if f not in ("", ".")]
        extracted = found[-1] if found else None
    return float(extracted == answer)


def _qwen_choice(response: str, answer: str) -> float:
    """Qwen2.5-Math's choice_answer_clean: the first letter after the last 'answer is', else the last letter."""
    pred = response.strip("\n")
    if any(pred.count(t) > 1 for t in ("choice is", "answer is")):
        pred = pred.split("\n\n")[0]
    parts = re.split("choice is|answer is", pred)
    pred = (parts[-1] if len(parts) > 1 else pred).strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", pred.upper())
    if letters:
        pred = letters[0] if len(parts) > 1 else letters[-1]
    return float(pred.rstrip(".").rstrip("/") == answer)


def _qwen_extract(response: str) -> str:
    """Qwen's extract_answer (math): the last box, else after 'he answer is', else the last number."""
    if "boxed" in response:
        tail = response.split("boxed")[-1]
        if not tail.startswith("{"):
            return tail.split("$")[0].strip()
        depth, out = 1, ""
        for ch in tail[1:]:
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                break
            out += ch
        return out
    if "he answer is" in response:
        return response.split("he answer is")[-1].strip()
    numbers = re.findall(r"-?\d*\.?\d+", response.replace(",", ""))
    return numbers[-1] if numbers else ""


def _qwen_strip(text: str) -> str:
    """The parts of Qwen's strip_string that these cases reach."""
    s = text.strip().replace("\n", "").rstrip(".").replace("\\!", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("\\{", "{").replace("\\}", "}")
    unitless = re.sub(r"\\text{.*?}$", "", s).strip()
    s = unitless if unitless and unitless != s else s
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "").replace("$", "")
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in"):
        s = s.replace(key, "")
    s = s.replace("\\emptyset", "{}").replace("\\varnothing", "{}").replace("\\%", "").replace("%", "")
    s = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", s)
    s = re.sub(r"(\d+)\.0*$", r"\1", s)
    if s.startswith("."):
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    return s.replace(" ", "")


_TOKEN = re.compile(r"\d+\.?\d*|\.\d+|\\[a-zA-Z]+|\*\*|[a-zA-Z]|[-+*/^!(){}\[\]_]")


class _Latex:
    """A LaTeX-subset reader for the reference grader: tokens -> sympy objects (numbers, letters, + - * / ^ **,
    \\frac, \\sqrt, \\log_b, \\pi, \\infty, \\cdot, \\times, !, implicit products). Raises ValueError on anything
    else."""

    def __init__(self, text: str) -> None:
        self.tokens = _TOKEN.findall(text)
        if "".join(self.tokens) != re.sub(r"\s+", "", text):
            raise ValueError(text)
        self.pos = 0

    def parse(self):
        node = self.sum()
        if self.pos != len(self.tokens):
            raise ValueError("trailing tokens")
        return node

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected}")
        self.pos += 1
        return token

    def sum(self):
        node = self.product()
        while self.peek() in ("+", "-"):
            node = node + self.product() if self.take() == "+" else node - self.product()
        return node

    def product(self):
        node = self.signed()
        while True:
            token = self.peek()
            if token in ("*", "/", "\\cdot", "\\times", "\\div"):
                self.take()
                node = node / self.signed() if token in ("/", "\\div") else node * self.signed()
            elif token is not None and (token[0].isalnum() or token in ("(", "{", "\\frac", "\\sqrt", "\\pi")):
                node = node * self.power()
            else:
                return node

    def signed(self):
        if self.peek() in ("-", "+"):
            return -self.signed() if self.take() == "-" else self.signed()
        return self.power()

    def power(self):
        base = self.atom()
        while self.peek() == "!":
            self.take()
            base = sympy.factorial(base)
        if self.peek() == "^":
            self.take()
            return base ** self.group()
        if self.peek() == "**":
            self.take()
            return base ** self.signed()
        return base

    def group(self):
        if self.peek() == "{":
            self.take()
            node = self.sum()
            self.take("}")
            return node
        token = self.peek()
        if token is not None and token[0].isdigit() and len(token) > 1:  # \frac34, x^23: one digit
            self.tokens[self.pos] = token[1:]
            return sympy.Integer(int(token[0]))
        return self.atom()

    def atom(self):
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            value = Fraction(token)
            return sympy.Rational(value.numerator, value.denominator)
        if token.isalpha() and len(token) == 1:
            return sympy.Symbol(token)
        if token in ("(", "{"):
            node = self.sum()
            self.take(")" if token == "(" else "}")
            return node
        if token == "\\frac":
            return self.group() / self.group()
        if token == "\\sqrt":
            if self.peek() == "[":
                self.take()
                index = self.sum()
                self.take("]")
                return sympy.root(self.group(), index)
            return sympy.sqrt(self.group())
        if token == "\\log":
            self.take("_")
            base = self.group()
            return sympy.log(self.power(), base)
        if token == "\\pi":
            return sympy.pi
        if token == "\\infty":
            return sympy.oo
        raise ValueError(token)


def _digits(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _symbolic_equal(a: str, b: str) -> bool:
    try:
        x, y = _Latex(a).parse(), _Latex(b).parse()
    except (ValueError, ZeroDivisionError):
        return False
    if x == y or sympy.simplify(x - y) == 0:
        return True
    try:
        return isclose(float(sympy.N(x)), float(sympy.N(y)), rel_tol=1e-4)
    except TypeError:
        return False


def _qwen_math_equal(pred: str, ref: str) -> bool:
    """Qwen's math_equal, minimal: string, numeric (×100, ÷100, rel 1e-4), brackets, lists, equations, symbolic."""
    if pred.lower() == ref.lower():
        return True
    p, r = _digits(pred), _digits(ref)
    if p is not None and r is not None and any(isclose(p, x, rel_tol=1e-4) for x in (r / 100, r, r * 100)):
        return True
    if not pred:
        return False
    ps, rs = pred, ref
    if (ps[:1] + ps[-1:] == "[]" and rs[:1] + rs[-1:] != "()") or (
        ps[:1] + ps[-1:] == "()" and rs[:1] + rs[-1:] != "[]"
    ):
        ps, rs = ps.strip("[]()"), rs.strip("[]()")
    if re.sub(r"[{}()]", "", ps).lower() == re.sub(r"[{}()]", "", rs).lower():
        return True
    listed = re.compile(r"(\(|\[).+(\)|\])")
    if listed.match(pred) and listed.match(ref):
        items_p, items_r = pred[1:-1].split(","), ref[1:-1].split(",")
        return len(items_p) == len(items_r) and all(map(_qwen_math_equal, items_p, items_r))
    if pred.count("=") == 1 and ref.count("=") == 1:
        lp, rp = pred.split("=")
        lr, rr = ref.split("=")
        return _symbolic_equal(f"{lp}-({rp})", f"{lr}-({rr})")
    if pred.count("=") == 1 and len(pred.split("=")[0].strip()) <= 2 and "=" not in ref:  # a simple equation
        return _qwen_math_equal(pred.split("=")[1], ref)
    return _symbolic_equal(pred, ref)


def _qwen_math(response: str, answer: str) -> float:
    pred = _qwen_extract(response)
    pred = re.sub(r"\n\s*", "", pred).lstrip(":").rstrip(".").rstrip("/")
    return float(_qwen_math_equal(_qwen_strip(pred), _qwen_strip(answer)))


SECOND_GRADER = {
    "math": _qwen_math,
    "gsm8k_strict": lambda response, answer: _verl_gsm8k(response, answer, "strict"),
    "gsm8k_flexible": lambda response, answer: _verl_gsm8k(response, answer, "flexible"),
    "choice": _qwen_choice,
}


@pytest.mark.parametrize("verifier,response,answer,kind,rule", CASES, ids=_IDS)
def test_each_disagreement_with_the_second_grader_names_its_rule(verifier, response, answer, kind, rule):
    """A rule is named exactly where the second grader decides otherwise: no disagreement is left to chance."""
    second = SECOND_GRADER[verifier](response, answer)
    decided = 1.0 if kind == OK else 0.0
    if rule is None:
        assert second == decided, "the second grader disagrees: decide by a rule in RULES"
    else:
        assert rule in RULES and second != decided, f"{rule!r} is named but the second grader agrees"


def test_every_rule_decides_some_case():
    assert {rule for *_rest, rule in CASES if rule} == set(RULES)


def test_suite_covers_every_verifier_with_each_kind():
    counts = Counter((verifier, kind) for verifier, _r, _a, kind, _rule in CASES)
    assert all(counts[(verifier, kind)] >= 5 for verifier in SECOND_GRADER for kind in (OK, WRONG, BAD)), counts


def test_second_graders_reproduce_their_sources_on_known_cases():
    """The reimplementations keep their sources' behaviour, holes included (the reason rules exist)."""
    assert _qwen_math(r"\boxed{10\%}", "0.1") and _qwen_math(r"\boxed{1000}", "10")  # include_percentage
    assert _qwen_math(r"\boxed{x**2-1}", "x^2-1")  # parse_expr fallback
    assert _qwen_math(r"\boxed{\frac{x}{7}+\frac{2}{7}}", r"\frac{x+2}{7}")  # symbolic
    assert not _qwen_math(r"\boxed{\frac{1}{3}}", "0.33")  # rel 1e-4
    assert _verl_gsm8k("#### 5-3", "5", "strict") and not _verl_gsm8k("#### 18.00", "18", "strict")
    assert _qwen_choice("The answer is A or B", "A") and _qwen_choice("I think A or B", "B")


@pytest.mark.parametrize(
    "text",
    [
        " " * 20000 + "x",
        "1" + " " * 20000 + "x",
        "answer" + " " * 20000 + "x",
        "1" * 20000,
        "." + "1" * 20000,
        "1 \\quad " * 4000,
        "#### " * 5000,
    ],
)
def test_answer_checks_take_linear_time_on_pathological_text(text):
    """Regexes without nested or adjacent unbounded repeats: 20,000 characters take milliseconds, not minutes."""
    start = time.perf_counter()
    math_forms(text), gsm8k_strict(text, "1"), gsm8k_flexible(text, "1"), extract_choice(text)
    assert time.perf_counter() - start < 1.0


def test_last_boxed_balances_braces():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}") == r"\frac{a}{b}"
    assert last_boxed(r"\boxed{unclosed") is None


def test_boxed_all_lists_every_box_and_rejects_an_unclosed_one():
    assert boxed_all(r"\boxed{1} and \fbox{\frac{a}{b}}, $\boxed 3$, \boxed{}") == ["1", r"\frac{a}{b}", "3"]
    assert boxed_all(r"\boxed{1} then \boxed{2") is None


def test_unknown_verifier_lists_valid_ones():
    with pytest.raises(KeyError, match="gsm8k_strict"):
        resolve("nope")


# (verifier, gold answer, a response that scores 1 on it, or None where the gold is one no response can match)
GOLDS = [
    ("gsm8k_strict", "1,234", "#### 1234"),
    ("gsm8k_strict", "$18", "#### 18"),
    ("gsm8k_strict", "-3.50", "#### -3.5"),
    ("gsm8k_strict", "many", None),
    ("gsm8k_strict", "5-3", None),
    ("gsm8k_strict", "1e3", None),
    ("gsm8k_flexible", "72", "So 72."),
    ("gsm8k_flexible", "72 apples", None),
    ("choice", " b ", r"\boxed{B}"),
    ("choice", "E", None),
    ("choice", "(A)", None),
    ("math", r"\frac{1}{2}", r"\boxed{\frac12}"),
    ("math", "many", r"\boxed{many}"),
    ("math", "3 4", r"\boxed{7}"),  # math_forms rejects it, math-verify reads it (as 7)
    ("math", r"\text{(E)},", None),
    ("math", r"\frac{1}{", None),
    ("math", "x+", None),
]


@pytest.mark.parametrize("verifier,gold,scores", GOLDS)
def test_a_gold_reads_as_scorable_exactly_when_a_response_can_score_on_it(verifier, gold, scores):
    assert GOLD_FORMS[verifier][1]([gold]) == [scores is not None]
    if scores is not None:
        assert resolve(verifier)(scores, gold) == 1.0


def test_math_verify_reads_a_bounded_number_of_golds(monkeypatch):
    """Past the bound, golds math_forms rejects count as readable (prose golds would cost seconds at start-up)."""
    monkeypatch.setattr(verifiers, "_MATH_VERIFY_CHECKS", 1)
    assert GOLD_FORMS["math"][1](["x+", "1", r"\frac{1}{"]) == [False, True, True]
