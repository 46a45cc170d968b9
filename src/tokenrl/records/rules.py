"""The contract of a setting: a `Rule` says which values a config key accepts, in words the error repeats. Components
built from a config node declare theirs beside their keywords (`Configurable.config_rules`); the start-up check
(config/check.py) checks the composed config with every rule before anything loads."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Rule:
    """accepts: value → whether it is allowed; allowed: what is, in words ("an integer >= 1"); free: no constraint
    (free text: names, instructions, paths read elsewhere)."""

    accepts: Callable[[Any], bool]
    allowed: str
    free: bool = False
    fields: Mapping[str, Rule] | None = None  # a mapping's keys and their rules (`mapping_of`)

    def problems(self, key: str, value: Any) -> list[str]:
        """`key=value: must be <allowed>` (a mapping: one line per bad or unknown field), or [] when allowed."""
        if self.fields is not None and isinstance(value, Mapping):
            return [
                f"{key}.{name}: no such setting (settings: {', '.join(self.fields)})"
                for name in value
                if name not in self.fields
            ] + keyword_problems(self.fields, value, key)
        return [] if self.accepts(value) else [f"{key}={value!r}: must be {self.allowed}"]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int | None = None, high: int | None = None) -> Rule:
    """An integer in [low, high] (either bound may be absent)."""
    if low is None and high is None:
        words = "an integer"
    elif high is None:
        words = f"an integer >= {low}"
    elif low is None:
        words = f"an integer <= {high}"
    else:
        words = f"an integer in [{low}, {high}]"
    return Rule(lambda v: is_int(v) and (low is None or v >= low) and (high is None or v <= high), words)


def number(low: float = -math.inf, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> Rule:
    """A finite number between `low` and `high`, each bound closed unless marked open."""

    def accepts(v: Any) -> bool:
        return is_number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    if high == math.inf:
        words = "a number" if low == -math.inf else f"a number {'>' if low_open else '>='} {low:g}"
    else:
        words = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return Rule(accepts, words)


def one_of(*choices: Any) -> Rule:
    return Rule(
        lambda v: any(v == c and type(v) is type(c) for c in choices),
        "one of " + ", ".join(str(c) if c is not None else "null" for c in choices),
    )


def optional(rule: Rule, meaning: str = "") -> Rule:
    """`rule` or null (`meaning`: what null does, e.g. "off")."""
    return Rule(
        lambda v: v is None or rule.accepts(v), f"{rule.allowed} or null{f' ({meaning})' if meaning else ''}", rule.free
    )


def list_of(rule: Rule, non_empty: bool = True) -> Rule:
    return Rule(
        lambda v: (
            isinstance(v, Sequence)
            and not isinstance(v, str)
            and (len(v) > 0 or not non_empty)
            and all(rule.accepts(x) for x in v)
        ),
        f"a {'non-empty ' if non_empty else ''}list, each {rule.allowed}",
    )


def mapping_of(fields: Mapping[str, Rule], nullable: bool = True) -> Rule:
    """A mapping whose keys are among `fields`, each checked by its rule (or null, when `nullable`)."""
    return Rule(
        lambda v: (v is None and nullable) or isinstance(v, Mapping),
        f"a mapping of {', '.join(fields)}{' or null' if nullable else ''}",
        fields=dict(fields),
    )


BOOLEAN = Rule(lambda v: isinstance(v, bool), "true or false")
TEXT = Rule(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")
FREE_TEXT = Rule(lambda v: v is None or isinstance(v, (str, int, float)), "text", free=True)


def keyword_problems(rules: Mapping[str, Rule], values: Mapping[str, Any], node: str) -> list[str]:
    """One line per value of `values` that its rule rejects, naming `<node>.<keyword>`."""
    found: list[str] = []
    for name, value in values.items():
        if name in rules:
            found += rules[name].problems(f"{node}.{name}", value)
    return found


class Configurable:
    """A component built from one config node (`config_node`: "selector", "task"): each keyword of its constructor
    has a rule in `config_rules`, checked on every construction before `__init__` runs (a Python caller and Hydra's
    instantiate alike) and by the start-up check before anything loads. Relations between keywords stay in
    `__init__`."""

    config_node: ClassVar[str]
    config_rules: ClassVar[dict[str, Rule]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def checked(self: Any, *args: Any, **kw: Any) -> None:
            bound = signature.bind(self, *args, **kw)
            bound.apply_defaults()
            values = {name: value for name, value in bound.arguments.items() if name != "self"}
            problems = keyword_problems(type(self).config_rules, values, cls.config_node)
            if problems:
                raise ValueError(problems[0])
            init(self, *args, **kw)

        cls.__init__ = checked  # type: ignore[method-assign]  # the point: every construction checks its keywords
