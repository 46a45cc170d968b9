"""Read a boxed math answer as LaTeX a grader can trust: reject malformed text, normalise legitimate variants. Regex
only: nothing here evaluates the text; the cases: tests/rewards/test_verifiers.py.

`math_forms(text)` returns the LaTeX readings of an answer (two for a percentage: N and N/100), or None when it is
malformed: Python syntax (`**`, `//`, `1e3`), a stray `$` or `%`, unbalanced brackets, a dangling operator, an empty
group, a malformed number (`1.5.3`), numbers side by side (`3 4`: the LaTeX parser adds them), text holding a number
beside other content (`6 \\text{ or 7}`: the parser drops it as a unit), a chained equation, or, against a gold that is
not an equation, an equation whose left side is not a name (`1+1=6`). It rewrites thousands separators, unit words,
unbraced fractions, a leading `\\approx`, a trailing percent and `3(4)` as a product.
"""

from __future__ import annotations

import re

_PYTHON = re.compile(r"\*\*|//|(?<![\\\w.])\d+(?:\.\d+)?[eE][+-]?\d")
_BAD_NUMBER = re.compile(r"\.\d+\.\d|'\s*\d")
_EMPTY_GROUP = re.compile(r"(?<!\\)\{\s*\}")
_DANGLING = re.compile(r"^\s*(?:[*/^_=,]|\\cdot|\\times|\\div)|(?:[-+*/^_=,]|\\cdot|\\times|\\div|\\pm|\\mp)\s*$")

# Between two numbers only these commands may stand (operators, relations, functions, a mixed number's \frac);
# anything else (spacing, \phantom{0}, \displaystyle, \text{ apples }) the parser drops, and then adds the numbers.
_MEANINGFUL = (
    "cdot|times|div|pm|mp|frac|dfrac|tfrac|sqrt|pi|infty|le|ge|leq|geq|lt|gt|ne|neq|approx|equiv|in|cup|"
    "cap|to|sin|cos|tan|sec|csc|cot|log|ln|exp|binom|over|choose|pmod|bmod|mod|circ|left|right|dots|ldots|"
    "cdots"
)
_CONJUNCTION = r"\\(?:text|textrm|mathrm|mbox)\{\s*,?\s*(?:and|or)\s*\}"  # `1 \text{ or } 2` is a list
_IGNORED = (
    rf"(?:\s|~|\\[,:;! ]|(?!{_CONJUNCTION})"
    rf"\\(?!(?:{_MEANINGFUL})(?![a-zA-Z]))[a-zA-Z]+\*?(?:\[[^\]]*\])?(?:\{{[^{{}}]*\}})*)"
)
_SIDE_BY_SIDE = re.compile(rf"(?<![_^])\d{_IGNORED}+\.?\d")  # a script digit (`\log_2 8`) is not one
_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_NAME = re.compile(
    r"^\s*(?:\\(?!pi\b|infty\b)[A-Za-z]+\s*\{?[A-Za-z]*\}?|[A-Za-z]+)(?:_\{?\w+\}?)?(?:\([^()]*\))?'*"
    r"\s*$"
)

_LATEX_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3})((?:(?:\\,|\{,\}|,\\!|\\ |~)\d{3})+)(?!\d)")
_SPACED_THOUSANDS = re.compile(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_UNIT_WORDS = re.compile(r"^(-?[\d,.]*\d)\s+[A-Za-z]{3,}(?:\s+[A-Za-z]{3,})*$")
_BARE_FRAC = re.compile(r"\\[dt]?frac\s*(\d|[a-zA-Z]|\\[a-zA-Z]+)\s*(\d|[a-zA-Z]|\\[a-zA-Z]+)")
_PERCENT = re.compile(r"(?:\\%|%|\\text\{\s*percent\s*\}|\bpercent)$")
_BASE = re.compile(r"(?<=\d)_\{?(\d+)\}?")


def _split_top(text: str) -> list[str]:
    """Split at commas outside (), [], {}."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _balanced(text: str) -> bool:
    plain = text.replace("\\{", "").replace("\\}", "")
    return (
        plain.count("{") == plain.count("}")
        and text.count("\\{") == text.count("\\}")
        and plain.count("(") + plain.count("[") == plain.count(")") + plain.count("]")
    )


def _text_ok(text: str) -> bool:
    """Text holding a digit is part of the answer, not a unit: only the whole answer may be such text (a base
    subscript aside: `\\text{A5}_{11}`)."""
    whole = re.sub(r"_\{?\d+\}?$", "", text)
    return all(found.group(0) == whole or not re.search(r"\d", found.group(1)) for found in _TEXT.finditer(text))


def _equations_ok(text: str, gold_is_equation: bool) -> bool:
    for part in _split_top(re.sub(_CONJUNCTION, ",", text)):
        sides = re.split(r"=|\\approx(?![a-zA-Z])", part)
        if len(sides) > 2 or (len(sides) == 2 and not gold_is_equation and not _NAME.match(sides[0])):
            return False
    return True


def math_forms(text: str, gold_is_equation: bool = False) -> list[str] | None:
    """LaTeX readings of a boxed answer, or None if it is malformed (see the module docstring)."""
    text = text.strip().rstrip(".").replace("\\$", "").replace("\\varnothing", "\\emptyset").strip()
    text = re.sub(r"^\\(?:approx|sim)(?![a-zA-Z])\s*", "", text)  # `\approx 8.24` states 8.24
    text = _BARE_FRAC.sub(r"\\frac{\1}{\2}", text)
    percent = _PERCENT.search(text)
    if percent:
        text = text[: percent.start()].strip()
    malformed = (_PYTHON, _BAD_NUMBER, _EMPTY_GROUP, _DANGLING)
    if not text or "$" in text or "%" in text or any(p.search(text) for p in malformed) or not _balanced(text):
        return None
    text = _LATEX_THOUSANDS.sub(lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)), text)
    if _SPACED_THOUSANDS.fullmatch(text):
        text = text.replace(" ", "")
    units = _UNIT_WORDS.match(text)
    if units:
        text = units.group(1)
    if _SIDE_BY_SIDE.search(text) or not _text_ok(text) or not _equations_ok(text, gold_is_equation):
        return None
    text = re.sub(r"(\d)\s*\(", r"\1 \\cdot (", text)  # 3(4) is a product (the parser reads it as 3 + 4)
    return [text, f"\\frac{{{text}}}{{100}}"] if percent else [text]


def number_bases(text: str) -> set[str]:
    """Base subscripts on numbers: {'8'} for `2516_8`."""
    return set(_BASE.findall(text))


def bracket_kind(text: str) -> str | None:
    """'set' for an answer written in \\{...\\}, 'paren' for (...) / [...] (interval, tuple), else None."""
    text = re.sub(r"\\left|\\right", "", text).strip()
    if text.startswith("\\{"):
        return "set"
    if text[:1] in "([" and text[-1:] in ")]":
        return "paren"
    return None
