"""The true forks of sampled responses, token by token, for tasks that can name them (`Task.forks_of`), and with them
the decisions, where a path leaves the graph and how each response fails (records/marks.py). A token carries a mark
when any character it decodes to does (spans from decoding each prefix of the ids, so any tokenizer maps exactly), the
end-of-sequence token when the stop decision does."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from tokenrl.records.marks import FAILURES, POSITION_MARKS, CharMarks, ForkMarks
from tokenrl.records.problem import Problem

MarksOf = Callable[[Problem, str, bool], "CharMarks | None"]


def token_marks(char_marks: list[bool], ids: list[int], tokenizer: PreTrainedTokenizerBase, ended: bool) -> list[bool]:
    """Per token of `ids` (the response, its end-of-sequence token last when `ended`): whether it covers a marked
    character; `char_marks[len(text)]` marks the end-of-sequence token."""
    content = ids[:-1] if ended else ids
    marks, start = [], 0
    for t in range(len(content)):
        end = len(tokenizer.decode(content[: t + 1], skip_special_tokens=True))
        marks.append(any(char_marks[start:end]))
        start = max(start, end)
    if ended:
        marks.append(char_marks[start] if start < len(char_marks) else False)
    return marks


class ForkMarker:
    """The `ForkMarks` of a rollout batch's responses, from each row's problem."""

    def __init__(self, forks_of: MarksOf, tokenizer: PreTrainedTokenizerBase) -> None:
        self.forks_of, self.tokenizer = forks_of, tokenizer

    def __call__(
        self, problems: list[Problem], response_ids: torch.Tensor, response_mask: torch.Tensor, texts: list[str]
    ) -> ForkMarks | None:
        """`texts`: the responses decoded without special tokens (what the verifier scored); None when the task
        cannot name the forks of some row."""
        out = {name: torch.zeros(response_ids.shape, dtype=torch.bool) for name in POSITION_MARKS}
        failure = torch.zeros(response_ids.shape[0], dtype=torch.long)
        for row, (problem, text) in enumerate(zip(problems, texts)):
            ids = response_ids[row, : int(response_mask[row].sum())].tolist()
            ended = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
            chars = self.forks_of(problem, text, ended)
            if chars is None:
                return None
            for name, marks in chars.positions().items():
                out[name][row, : len(ids)] = torch.tensor(token_marks(marks, ids, self.tokenizer, ended))
            failure[row] = FAILURES.index(chars.failure)
        return ForkMarks(**out, failure=failure)
