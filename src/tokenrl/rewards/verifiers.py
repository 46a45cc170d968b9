"""Answer verifiers: (response text, reference answer) -> score in [0, 1]; they only parse, nothing executes model text.
`gsm8k_strict`: verl's strict `#### <number>` reward, made sound (`#### 5-3`, `#### 5 or 6` do not score);
`gsm8k_flexible`: the last number, not part of a name nor an operand; `math`: every non-empty `\\boxed{...}` equal to
the answer by math-verify's LaTeX parser, with no fallback to a number picked out of unparsable text (malformed boxes:
`normalize.math_forms`); `choice`: the option letter the boxes or a last "answer is X" commit to, without a hedge. A
verifier may also be named as `package.module:function`. What each accepts: docs/algorithms.md §6; the rules, case by
case: tests/rewards/test_verifiers.py. `check_golds` reports, at load time, the gold answers a verifier could never
match."""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from tokenrl.rewards.normalize import bracket_kind, math_forms, number_bases

if TYPE_CHECKING:
    from tokenrl.records.problem import Problem

log = logging.getLogger(__name__)

Verifier = Callable[[str, str], float]

_PLAIN_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_STRICT_MARKER = re.compile(r"####[ \t]*(?:\\?\$[ \t]*)?(?=-?\d)")
_STRICT_LINE = re.compile(r"(-?" + _PLAIN_NUMBER.pattern + r")(?!\d|,\d)([^\n]*)")
_OPERATOR_NEXT = re.compile(r"[ \t]*(?:[+*/^×÷=²³]|-(?![A-Za-z]))")
_NUMBER_BLOB = re.compile(r"\d[\d.,]*")
_SIGN = re.compile(r"(?:^|[^\w)\]}])-$")
_EMPHASIS = re.compile(r"(?<![\w)\]}*])\*{1,2}(?=[^\s*])|(?<=[^\s*])\*{1,2}(?![\w({*])")


def _number(text: str) -> Fraction | None:
    """Parse '1,234', '-5', '3.50', '$18' exactly (no float rounding); None if it is not a plain number."""
    cleaned = text.replace("$", "").strip().rstrip(".")
    sign = cleaned.startswith("-")
    if not _PLAIN_NUMBER.fullmatch(cleaned[sign:]):
        return None
    try:
        return Fraction(cleaned.replace(",", ""))
    except ValueError:  # over Python's 4,300-digit limit for int()
        return None


def _equal_numbers(candidate: str, answer: str) -> float:
    got, want = _number(candidate), _number(answer)
    return float(got is not None and want is not None and got == want)


def gsm8k_strict(response: str, answer: str) -> float:
    response = response.replace("\u2212", "-")
    markers = list(_STRICT_MARKER.finditer(response))
    if not markers:
        return 0.0
    line = _STRICT_LINE.match(response, markers[-1].end())
    if line is None:
        return 0.0
    number, rest = line.groups()
    if re.search(r"\d", rest) or _OPERATOR_NEXT.match(rest):  # `#### 5 or 6`, `#### 5-3`, `#### 2**3`
        return 0.0
    return _equal_numbers(number, answer)


def strip_emphasis(text: str) -> str:
    """Drop markdown bold/italic markers (`**15**`), leaving `x**2` and `2*3` alone."""
    return _EMPHASIS.sub("", text)


def last_number(text: str) -> str | None:
    """The last number in `text` as written (sign included), or None when it is missing, malformed
    ('1,2', '1.5.3') or an operand of an arithmetic operator; digits inside names (H2O, x2) are skipped."""
    text = strip_emphasis(text).replace("\u2212", "-")
    for blob in reversed(list(_NUMBER_BLOB.finditer(text))):
        start = blob.start()
        if start and (text[start - 1].isalpha() or text[start - 1] == "_"):
            continue
        token = blob.group(0).rstrip(".,")
        if not _PLAIN_NUMBER.fullmatch(token):
            return None
        before = text[:start]
        signed = _SIGN.search(before) is not None
        lead = before[:-1] if signed else before
        opened = lead.rstrip("{")
        if (opened != lead and opened.endswith("}")) or opened.rstrip(" \t")[-1:] in tuple("+-*/^×÷"):
            return None  # a denominator (\frac{1}{2}), an exponent (2^{3}, x**2) or another operand (5-3)
        if token == blob.group(0) and _OPERATOR_NEXT.match(text, blob.end()):
            return None
        return ("-" if signed else "") + token
    return None


def gsm8k_flexible(response: str, answer: str) -> float:
    found = last_number(response)
    return _equal_numbers(found, answer) if found is not None else 0.0


_BOX = re.compile(r"\\(?:boxed|fbox)")
_BOX_TOKEN = re.compile(r" +([^\s$]+)")


def _box_at(text: str, pos: int) -> tuple[str | None, int]:
    """(content, end) of the box whose command ends at `pos`: `{...}` with balanced braces (None if unclosed)
    or `\\boxed 2`; ('', pos) when the command is only mentioned."""
    if text.startswith(" ", pos):
        token = _BOX_TOKEN.match(text, pos)
        return (token.group(1), token.end()) if token else ("", pos)
    if not text.startswith("{", pos):
        return "", pos
    depth = 0
    for end in range(pos, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : end], end + 1
    return None, len(text)


def boxed_all(text: str) -> list[str] | None:
    """Contents of every non-empty \\boxed{...} / \\fbox{...} / `\\boxed 2`, in order; None if a box is unclosed."""
    out, pos = [], 0
    while (command := _BOX.search(text, pos)) is not None:
        content, pos = _box_at(text, command.end())
        if content is None:
            return None
        if content.strip():
            out.append(content)
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces) or `\\boxed 2` (no braces), else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    content, _ = _box_at(text, start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox")))
    return content or None


def _parse_forms(forms: list[str], trusted: bool) -> list:
    """math-verify parses of each LaTeX reading; the model's text gets the LaTeX parser only, with no fallback
    to picking a number out of it (that fallback is what scored `x**2 - 1` as 1)."""
    from math_verify import LatexExtractionConfig, parse

    options = {} if trusted else {"extraction_config": [LatexExtractionConfig()], "fallback_mode": "no_fallback"}
    return [value for form in forms for value in parse(f"${form}$", **options)]


def _gold(answer: str) -> tuple[str, bool]:
    """A math gold as the checks read it, and whether it is an equation."""
    answer = re.sub(r"(?<!\\)\$", " ", answer)  # OlympiadBench joins several answers as `69$,$84`
    return answer, re.search(r"=|\\approx(?![a-zA-Z])", answer) is not None


def _math_equal(box: str, answer: str) -> bool:
    from math_verify import verify

    answer, gold_is_equation = _gold(answer)
    forms = math_forms(box, gold_is_equation)
    if forms is None:
        return False
    gold_forms = math_forms(answer, gold_is_equation) or [answer]
    if re.sub(r"\s+", "", forms[0]) == re.sub(r"\s+", "", gold_forms[0]):
        return True  # the gold's own text, even where the parser cannot read it (`05\!:\!00`)
    if {bracket_kind(forms[0]), bracket_kind(answer)} == {"set", "paren"}:
        return False
    bases, gold_bases = number_bases(forms[0]), number_bases(gold_forms[0])
    if bases and bases != (gold_bases or {"10"}):  # 2516_9 is not 2516_8 nor 2516 (the parser drops subscripts)
        return False
    gold = _parse_forms(gold_forms, trusted=True)
    pred = _parse_forms(forms, trusted=False)
    return bool(gold) and bool(pred) and verify(gold, pred)


def math_boxed(response: str, answer: str) -> float:
    boxes = boxed_all(response)
    if not boxes:
        return 0.0
    return float(all(_math_equal(box, answer) for box in dict.fromkeys(boxes)))


_UNWRAP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm)\s*\{([^{}]*)\}")
_BOXED_LETTER = re.compile(r"\(?([A-Da-d])\)?\.?|\(?([A-Da-d])[).:]\s*(.+)")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z])[A-D](?![A-Za-z])")
_STATED_LETTER = re.compile(
    r"(?i:answer)(?:\s+is)?[\s:]*(?i:option\s*)?(?:\$|\\(?:text|textbf|mathrm|mathbf)\{)*"
    r"(?:\(([A-Da-d])\)|([A-D])(?![A-Za-z])|([a-d])(?=\s*(?:[.,;:!)}$]|$)))"
)
_HEDGE = re.compile(r"\s*(?:(?i:or|and)\b|[/,&+])\s*\(?[A-D](?![A-Za-z])")


def _box_letter(box: str) -> str | None:
    while _UNWRAP.search(box):
        box = _UNWRAP.sub(r"\1", box)
    found = _BOXED_LETTER.fullmatch(box.strip())
    if found is None:
        return None
    letter = (found.group(1) or found.group(2)).upper()
    others = set(_STANDALONE_LETTER.findall(found.group(3) or "")) - {letter}
    return None if others else letter


def extract_choice(response: str) -> str | None:
    """The option letter a response commits to, or None."""
    boxes = boxed_all(response)
    if boxes is None:
        return None
    if boxes:
        letters = {_box_letter(box) for box in boxes}
        return letters.pop() if len(letters) == 1 else None
    text = strip_emphasis(response)
    stated = list(_STATED_LETTER.finditer(text))
    if not stated or _HEDGE.match(text, stated[-1].end()):
        return None
    last = stated[-1]
    return (last.group(1) or last.group(2) or last.group(3)).upper()


def choice(response: str, answer: str) -> float:
    return float(extract_choice(response) == answer.strip().upper())


def _golds_number(answers: list[str]) -> list[bool]:
    return [_number(answer) is not None for answer in answers]


def _golds_letter(answers: list[str]) -> list[bool]:
    return [answer.strip().upper() in ("A", "B", "C", "D") for answer in answers]


_MATH_VERIFY_CHECKS = 200  # golds math_forms rejects that math-verify then reads, at most (each a parse)


def _golds_math(answers: list[str]) -> list[bool]:
    """A boxed copy of the gold scores when `math_forms` reads it; else only a box math-verify finds equal can, so
    math-verify must read the gold as an expression, not leave it as text (`\\text{(E)},`). It reads the first
    _MATH_VERIFY_CHECKS such golds; later ones count as readable (prose golds, which its fallback reads, would
    otherwise cost seconds at start-up)."""
    out, left = [], _MATH_VERIFY_CHECKS
    for answer in answers:
        text, is_equation = _gold(answer)
        readable = math_forms(text, is_equation) is not None or left <= 0
        if not readable:
            left -= 1
            readable = any(not isinstance(form, str) for form in _parse_forms([text], trusted=True))
        out.append(readable)
    return out


# What a gold answer must be for its verifier ever to score 1 (the verifier's own reading of the gold): gsm8k_* compare
# plain numbers, so `many` or `5-3` never scores; choice compares the letter A-D a response commits to; math reads
# free-form LaTeX, so only golds that no box can equal are caught (_golds_math).
GOLD_FORMS: dict[str, tuple[str, Callable[[list[str]], list[bool]]]] = {
    "gsm8k_strict": ("a plain number", _golds_number),
    "gsm8k_flexible": ("a plain number", _golds_number),
    "math": ("LaTeX the math verifier reads", _golds_math),
    "choice": ("an option letter A-D", _golds_letter),
}


def check_golds(problems: Sequence[Problem], split: str, where: Sequence[str] | None = None, fix: str = "") -> None:
    """Warn, with examples, about problems whose gold answer their verifier can never match (GOLD_FORMS); raise
    ValueError when none of a verifier's problems can be scored. `split` names the rows, `where[i]` problem i (else
    its id), `fix` ends the error. Verifiers named as `module:function` are not checked."""
    groups: dict[str, list[int]] = {}
    for index, problem in enumerate(problems):
        if problem.verifier in GOLD_FORMS:
            groups.setdefault(problem.verifier, []).append(index)
    for name, indices in groups.items():
        form, readable = GOLD_FORMS[name]
        bad = [i for i, ok in zip(indices, readable([problems[i].answer for i in indices])) if not ok]
        if not bad:
            continue
        examples = ", ".join(f"{where[i] if where else problems[i].id}: {problems[i].answer!r}" for i in bad[:5])
        examples += ", ..." if len(bad) > 5 else ""
        if len(bad) == len(indices):
            raise ValueError(
                f"none of the {len(indices)} rows of {split} can be scored by verifier {name!r}: no "
                f"gold answer is {form} ({examples}). {fix}".rstrip()
            )
        log.warning(
            "%d of %d rows of %s cannot be scored by verifier %r (their gold answers are not %s, so they "
            "always score 0): %s",
            len(bad),
            len(indices),
            split,
            name,
            form,
            examples,
        )


VERIFIERS: dict[str, Verifier] = {
    "gsm8k_strict": gsm8k_strict,
    "gsm8k_flexible": gsm8k_flexible,
    "math": math_boxed,
    "choice": choice,
}


def preload() -> None:
    """Import the parsers up front so their import time never counts against an answer's time limit."""
    import math_verify  # noqa: F401


def resolve(name: str) -> Verifier:
    """A verifier by registry name or `module:function` path; unknown names list the valid ones."""
    if name in VERIFIERS:
        return VERIFIERS[name]
    if ":" in name:
        module, attr = name.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    raise KeyError(f"unknown verifier {name!r}; valid: {sorted(VERIFIERS)} or 'package.module:function'")
