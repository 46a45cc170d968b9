"""Answer verifiers: (response text, reference answer) -> score in [0, 1]. None executes model text.

- `gsm8k_strict`: the last `#### <number>` in the response equals the answer (verl's GSM8K reward).
- `gsm8k_flexible`: the last number anywhere in the response equals the answer (verl's "flexible" mode).
- `math`: the last `\\boxed{...}` is symbolically equal to the answer (math-verify's parser; no eval).
- `choice`: the chosen letter (last `\\boxed{X}`, else the last "answer is X" / "Answer: X") equals the answer.
A verifier may also be named as `package.module:function`.
"""
from __future__ import annotations

import importlib
import re
from fractions import Fraction
from typing import Callable

Verifier = Callable[[str, str], float]

_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def _number(text: str) -> Fraction | None:
    """Parse '1,234', '-5', '3.50' exactly (no float rounding); None if it is not a plain number."""
    cleaned = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _equal_numbers(candidate: str, answer: str) -> float:
    got, want = _number(candidate), _number(answer)
    return float(got is not None and want is not None and got == want)


def gsm8k_strict(response: str, answer: str) -> float:
    matches = _STRICT.findall(response)
    return _equal_numbers(matches[-1], answer) if matches else 0.0


def gsm8k_flexible(response: str, answer: str) -> float:
    matches = _NUMBER.findall(response)
    return _equal_numbers(matches[-1], answer) if matches else 0.0


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces) or `\\boxed 2` (no braces), else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    pos = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if pos < len(text) and text[pos] == " ":
        rest = text[pos:].lstrip(" ")
        token = re.match(r"[^\s$]+", rest)
        return token.group(0) if token else None
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    for end in range(pos, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1:end]
    return None


def math_boxed(response: str, answer: str) -> float:
    from math_verify import parse, verify

    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    gold = parse(f"${answer}$")
    pred = parse(f"${boxed}$")
    return float(bool(gold) and bool(pred) and verify(gold, pred))


_LETTER = r"\(?\s*([A-D])\s*\)?"
_BOXED_LETTER = re.compile(r"^\s*(?:\\text\{|\\mathrm\{)?" + _LETTER + r"\}?\s*$")
_STATED_LETTER = re.compile(r"answer\s*(?:is|:)\s*(?:option\s*)?" + _LETTER + r"(?![A-Za-z])", re.IGNORECASE)


def extract_choice(response: str) -> str | None:
    """The option letter a response commits to, or None."""
    boxed = last_boxed(response)
    if boxed is not None:
        found = _BOXED_LETTER.match(boxed)
        return found.group(1) if found else None
    stated = _STATED_LETTER.findall(response)
    return stated[-1].upper() if stated else None


def choice(response: str, answer: str) -> float:
    return float(extract_choice(response) == answer.strip().upper())


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
