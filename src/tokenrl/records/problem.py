"""`Problem`: the one record shape every task and benchmark yields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A verifiable problem: `question` is shown to the model, `answer` is checked by `verifier`."""

    id: str
    question: str
    answer: str
    verifier: str
