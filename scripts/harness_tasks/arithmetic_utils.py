"""process_results of tokenrl_arithmetic.yaml: two scorers of a response to `What is a + b?` on the harness's side.

- exact_match: the check of tokenrl's `gsm8k_flexible` verifier (the arithmetic task's reward), reimplemented here
  without importing tokenrl, so the harness task stands alone: the last number of the response (markdown emphasis
  dropped, the Unicode minus read as `-`), skipped when it is part of a name (`H2O`, `x_2`), refused (score 0) when
  it is malformed (`1,2`, `1.5.3`), an operand of an arithmetic operator (`5-3`, `2 + 3`), a denominator
  (`\\frac{1}{2}`) or an exponent (`x**2`, `2^{3}`); then compared with the answer as an exact number (`7.0` = `7`,
  `1,234` = `1234`). tests/scripts/test_compare_harness.py holds it to tokenrl's verifier on a table of responses.
- flexible_extract: lm-eval's stock GSM8K flexible scorer, from lm-eval itself: the `flexible-extract` regex filter
  (the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`) and exact_match with gsm8k's regexes_to_ignore.
"""

from __future__ import annotations

import re
from fractions import Fraction

PLAIN_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
OPERATOR_NEXT = re.compile(r"[ \t]*(?:[+*/^×÷=²³]|-(?![A-Za-z]))")
NUMBER_BLOB = re.compile(r"\d[\d.,]*")
SIGN = re.compile(r"(?:^|[^\w)\]}])-$")
EMPHASIS = re.compile(r"(?<![\w)\]}*])\*{1,2}(?=[^\s*])|(?<=[^\s*])\*{1,2}(?![\w({*])")
FLEXIBLE_PATTERN = "(-?[$0-9.,]{2,})|(-?[0-9]+)"  # lm-eval gsm8k's flexible-extract
GSM8K_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]  # lm-eval gsm8k exact_match's regexes_to_ignore


def last_number(text: str) -> str | None:
    """The last number of `text` as written (sign included), or None where tokenrl's verifier reads none."""
    text = EMPHASIS.sub("", text).replace("\u2212", "-")
    for blob in reversed(list(NUMBER_BLOB.finditer(text))):
        start = blob.start()
        if start and (text[start - 1].isalpha() or text[start - 1] == "_"):
            continue  # digits of a name
        token = blob.group(0).rstrip(".,")
        if not PLAIN_NUMBER.fullmatch(token):
            return None  # malformed: 1,2 or 1.5.3
        before = text[:start]
        signed = SIGN.search(before) is not None
        lead = before[:-1] if signed else before
        opened = lead.rstrip("{")
        if (opened != lead and opened.endswith("}")) or opened.rstrip(" \t")[-1:] in tuple("+-*/^×÷"):
            return None  # a denominator, an exponent or the right operand
        if token == blob.group(0) and OPERATOR_NEXT.match(text, blob.end()):
            return None  # the left operand
        return ("-" if signed else "") + token
    return None


def number(text: str | None) -> Fraction | None:
    if text is None:
        return None
    cleaned = text.replace("$", "").strip().rstrip(".")
    sign = cleaned.startswith("-")
    if not PLAIN_NUMBER.fullmatch(cleaned[sign:]):
        return None
    return Fraction(cleaned.replace(",", ""))


def flexible_pick(response: str) -> str:
    """What lm-eval's flexible-extract filter passes to exact_match ('[invalid]' where its regex finds nothing)."""
    from lm_eval.filters.extraction import RegexFilter

    return list(RegexFilter(regex_pattern=FLEXIBLE_PATTERN, group_select=-1).apply([[response]], [{}]))[0][0]


def process_results(doc: dict, results: list[str]) -> dict[str, int]:
    from lm_eval.api.metrics import exact_match_hf_evaluate

    response, gold = results[0], str(doc["answer"])
    found, want = number(last_number(response)), number(gold)
    exact = int(found is not None and want is not None and found == want)
    flexible = exact_match_hf_evaluate(
        predictions=[flexible_pick(response)],
        references=[gold],
        ignore_case=True,
        ignore_punctuation=False,
        regexes_to_ignore=GSM8K_IGNORE,
    )["exact_match"]
    return {"exact_match": exact, "flexible_extract": int(flexible)}
