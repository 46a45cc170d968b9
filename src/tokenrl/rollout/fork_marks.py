"""The true forks of sampled responses, token by token, for tasks that can name them (`Task.forks_of`).

A task marks characters of the response text (and its end, the stop decision); a token is a fork when any character
it decodes to is one, and the end-of-sequence token when the stop decision is. Character spans come from decoding
each prefix of the response's ids, so any tokenizer maps exactly (a token that decodes to nothing marks nothing
unless it ends the response).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from tokenrl.records.problem import Problem

CharMarks = Callable[[Problem, str], "list[bool] | None"]


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
    """(B, T) booleans of the true forks of a rollout batch's responses, from each row's problem."""

    def __init__(self, forks_of: CharMarks, tokenizer: PreTrainedTokenizerBase) -> None:
        self.forks_of, self.tokenizer = forks_of, tokenizer

    def __call__(
        self, problems: list[Problem], response_ids: torch.Tensor, response_mask: torch.Tensor, texts: list[str]
    ) -> torch.Tensor | None:
        """`texts`: the responses decoded without special tokens (what the verifier scored); None when the task
        cannot name the forks of some row."""
        out = torch.zeros(response_ids.shape, dtype=torch.bool)
        for row, (problem, text) in enumerate(zip(problems, texts)):
            chars = self.forks_of(problem, text)
            if chars is None:
                return None
            ids = response_ids[row, : int(response_mask[row].sum())].tolist()
            ended = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
            marks = token_marks(chars, ids, self.tokenizer, ended)
            out[row, : len(ids)] = torch.tensor(marks, dtype=torch.bool)
        return out
