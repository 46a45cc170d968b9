"""The `TokenSelector` interface: statistics + advantages + response mask + step -> token mask M.

Every strategy of ALGORITHMS.md is (how M is computed) + (which loss normaliser it wants). A subclass
names itself with `name = "..."` and is registered automatically; its YAML points `_target_` at it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from tokenrl.algorithms.grpo import NORMALIZERS
from tokenrl.algorithms.token_stats import TokenStats

SELECTORS: dict[str, type["TokenSelector"]] = {}


@dataclass
class Selection:
    """mask: (B, T) float {0, 1}, zero outside the response; normalizer: `selected` or `all` (ALGORITHMS.md §1.4)."""

    mask: torch.Tensor
    normalizer: str


class TokenSelector(ABC):
    """Chooses the tokens that the policy-gradient loss is applied to."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()   # TokenStats fields the selector reads

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            SELECTORS[cls.name] = cls

    def __init__(self, normalizer: str = "selected") -> None:
        if normalizer not in NORMALIZERS:
            raise ValueError(f"selector.normalizer={normalizer!r} is not one of {NORMALIZERS}")
        self.normalizer = normalizer

    @abstractmethod
    def mask(self, stats: TokenStats, advantages: torch.Tensor, response_mask: torch.Tensor,
             group_ids: torch.Tensor, step: int) -> torch.Tensor:
        """(B, T) {0, 1} mask of selected response tokens."""

    def select(self, stats: TokenStats, advantages: torch.Tensor, response_mask: torch.Tensor,
               group_ids: torch.Tensor, step: int) -> Selection:
        chosen = self.mask(stats, advantages, response_mask, group_ids, step).float() * response_mask.float()
        return Selection(chosen, self.normalizer)
