"""Answer verifiers: (response text, reference answer) -> score in [0, 1]. None executes model text.

- `gsm8k_strict`: the last `#### <number>` in the response equals the answer (verl's GSM8K reward).
- `gsm8k_flexible`: the last number anywhere in the response equals the answer (verl's "flexible" mode).
- `math`: the last `\\boxed{...}` is symbolically equal to the answer (math-verify's parser; no eval).
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
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces, else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for pos in range(brace, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1:pos]
    return None


def math_boxed(response: str, answer: str) -> float:
    from math_verify import parse, verify

    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    gold = parse(f"${answer}$")
    pred = parse(f"${boxed}$")
    return float(bool(gold) and bool(pred) and verify(gold, pred))


VERIFIERS: dict[str, Verifier] = {
    "gsm8k_strict": gsm8k_strict,
    "gsm8k_flexible": gsm8k_flexible,
    "math": math_boxed,
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
