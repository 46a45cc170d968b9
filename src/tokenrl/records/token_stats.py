"""`TokenStats`: per-response-token statistics of a policy (log-prob, entropy, Rényi-2, JS to the group) that the
selectors read; computed by algorithms/logit_statistics.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

BASE_STATISTICS = frozenset({"logprobs", "entropy", "renyi2"})
ALL_STATISTICS = BASE_STATISTICS | {"js"}


@dataclass
class TokenStats:
    """(B, T) float32 per response token, 0 on padding; `js` is None unless it was asked for."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    renyi2: torch.Tensor
    js: torch.Tensor | None = None

    def rows(self, index: torch.Tensor) -> TokenStats:
        return TokenStats(
            self.logprobs[index], self.entropy[index], self.renyi2[index], None if self.js is None else self.js[index]
        )

    @staticmethod
    def scatter(shape: torch.Size, rows: list[torch.Tensor], parts: list[TokenStats]) -> TokenStats:
        """The (B, T) statistics whose rows `rows[k]` are `parts[k]` (zero elsewhere)."""
        with_js = bool(parts) and parts[0].js is not None
        out = zero_statistics(shape, with_js)
        for index, part in zip(rows, parts):
            for name, values in out.items():
                values[index] = getattr(part, name)
        return TokenStats(**out)


def zero_statistics(shape: torch.Size, with_js: bool) -> dict[str, torch.Tensor]:
    """Zero (B, T) tensors for each statistic, keyed by `TokenStats` field."""
    names = sorted(BASE_STATISTICS | ({"js"} if with_js else set()))
    return {name: torch.zeros(shape, dtype=torch.float32) for name in names}
