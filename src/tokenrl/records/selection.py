"""What a selector sees (`SelectionBatch`) and what it returns (`Selection`): docs/algorithms.md §11.1."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenrl.records.marks import ForkMarks
from tokenrl.records.token_stats import TokenStats

# What a selector's `requires` may name beside `TokenStats` fields: `SelectionBatch` fields a task fills
# (`forks`: the true forks, on a task that names them: task=forks).
TASK_MARKS = frozenset({"forks"})


def single_process(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [tensor]


@dataclass
class SelectionBatch:
    """What a selector sees: one mini-batch of b rows (sorted by row id) on this rank.

    row_ids: index of each row in the global rollout batch (seeds row-wise random choices);
    gather: 1-D tensor -> every rank's tensor in rank order (for `global` scopes); rank: this rank's index;
    forks: the rows' true forks, decisions and failures (records/marks.py) where the task names them, else None.
    """

    stats: TokenStats
    advantages: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    row_ids: torch.Tensor
    step: int
    gather: Callable[[torch.Tensor], list[torch.Tensor]] = field(default=single_process)
    rank: int = 0
    forks: ForkMarks | None = None


@dataclass
class Selection:
    """What the loss does with each response token of b rows (docs/algorithms.md §11.1); every tensor is (b, T).

    weights: the token's multiplier of its policy-gradient term, ≥ 0 and zero outside the response (0/1: a mask);
    normalizer: `selected` (the tokens of non-zero weight) or `all`, the loss divisor the update counts (§1.4);
    clip_low / clip_high: per-token ε of the ratio clip (None: the algorithm's); kl_weights: multiplier of the token's
    KL term (None: 1); advantages: per-token advantages replacing the row's Â_i (None: Â_i); drift_coef: β_t of a
    penalty β_t·|log π_θ − log π_old| on the token (KL-Cov; None: none).
    """

    weights: torch.Tensor
    normalizer: str
    clip_low: torch.Tensor | None = None
    clip_high: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    drift_coef: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:
        """(b, T) float {0, 1}: the tokens whose weight is not zero (the selected tokens)."""
        return (self.weights != 0).float()

    def rows(self, index: torch.Tensor) -> Selection:
        """The selection of rows `index` (positions into this selection's rows)."""
        rows = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(rows, name, value[index])
        return rows
