"""How a mini-batch's rows are cut into micro-batches (one forward and backward each): greedily, unit by unit (a
group with `whole_groups`, else a row), at most `max_rows` rows or, with `max_tokens` (`algorithm.micro_batch_tokens`),
at most that many tokens counted as the forward runs them (docs/algorithms.md §12.3, §12.4); a unit larger than the
budget is a micro-batch of its own. Whole groups pay their prompt once (shared-prefix and packed layouts) and hold what
JS compares. With `by_length` the groups are ordered by their longest response, so that each micro-batch, cut to its
own widths, spends little on padding (verl's length-balanced dynamic batches, at a fixed row count). The loss is a sum
over micro-batches, so the cut changes nothing but rounding."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenrl.models.response_forward import LAYOUTS
from tokenrl.records.rollout_batch import RolloutBatch

Row = tuple[int, int, int]  # a row's group id, prompt length and response length (real tokens)


def row_lengths(rollouts: RolloutBatch, rows: torch.Tensor) -> list[Row]:
    """The `Row` of each of `rows` (row ids of `rollouts`)."""
    lengths = rollouts.prompt_mask[rows].sum(1).tolist(), rollouts.response_mask[rows].sum(1).tolist()
    return list(zip(rollouts.group_ids[rows].tolist(), *lengths))


@dataclass
class TokenCount:
    """A growing micro-batch's tokens by `cost`, counted unit by unit from (group, prompt length, response length) per
    row: `packed`, each group's prompt once plus every response token; `shared_prefix`, each group's prompt once at
    the longest prompt plus rows × the longest response; `padded`, rows × (longest prompt + longest response); at
    `full_widths` where the forward is not trimmed."""

    cost: str
    full_widths: tuple[int, int] | None = None
    groups: set[int] = field(default_factory=set)
    rows: int = 0
    prompts: int = 0  # each group's prompt once
    longest_prompt: int = 0
    responses: int = 0
    longest_response: int = 0

    def tokens(self, unit: list[Row]) -> int:
        """The tokens with `unit`'s rows added (the count itself does not change)."""
        new = {group: prompt for group, prompt, _ in unit if group not in self.groups}
        rows = self.rows + len(unit)
        if not rows:
            return 0
        if self.cost == "packed":
            return self.prompts + sum(new.values()) + self.responses + sum(r for _, _, r in unit)
        prompt, response = self.full_widths or (
            max([self.longest_prompt, *(p for _, p, _ in unit)]),
            max([self.longest_response, *(r for _, _, r in unit)]),
        )
        prompt_rows = len(self.groups) + len(new) if self.cost == "shared_prefix" else rows
        return prompt_rows * prompt + rows * response

    def add(self, unit: list[Row]) -> None:
        """Add `unit`'s rows."""
        for group, prompt, response in unit:
            if group not in self.groups:
                self.groups.add(group)
                self.prompts += prompt
            self.rows += 1
            self.longest_prompt = max(self.longest_prompt, prompt)
            self.responses += response
            self.longest_response = max(self.longest_response, response)


@dataclass(frozen=True)
class MicroBatchCut:
    """How one pass cuts rows into micro-batches: `max_rows` rows (`algorithm.micro_batch_size`) or, with
    `max_tokens` (`algorithm.micro_batch_tokens`), at most that many tokens as the pass's forward runs them (`layout`,
    trimmed to its own widths with `trim`); `by_length`: groups ordered by their longest response (`fast_path.pack`)."""

    max_rows: int
    max_tokens: int | None = None
    layout: str = "padded"
    trim: bool = False
    by_length: bool = False

    def __call__(self, rollouts: RolloutBatch, rows: torch.Tensor, whole_groups: bool = False) -> list[torch.Tensor]:
        """Positions into `rows` (row ids of `rollouts`, sorted) of each micro-batch (`split`)."""
        return self.split(row_lengths(rollouts, rows), whole_groups, self.full_widths(rollouts))

    def split(
        self, rows: list[Row], whole_groups: bool = False, full_widths: tuple[int, int] | None = None
    ) -> list[torch.Tensor]:
        """Positions into `rows` of each micro-batch: at most `max_rows` rows, or whole groups of at most
        max(`max_rows`, the group's size) rows with `whole_groups`. Or, with `max_tokens`: at most that many tokens
        in `layout` (`TokenCount`, at `full_widths` where the forward is not trimmed), or one unit that alone exceeds
        it."""
        if self.layout not in LAYOUTS:
            raise ValueError(f"micro-batch cost {self.layout!r} is not one of {LAYOUTS}")
        members: dict[int, list[int]] = {}
        for position, (group, _, _) in enumerate(rows):
            members.setdefault(group, []).append(position)
        groups = [members[group] for group in sorted(members)]
        if self.by_length:  # a stable sort: ties keep group order
            groups.sort(key=lambda group: -max(rows[p][2] for p in group))
        units = groups if whole_groups else [[p] for group in groups for p in group]
        limit = self.max_rows if self.max_tokens is None else self.max_tokens
        chunks: list[list[int]] = []
        count = TokenCount(self.layout, full_widths)
        for unit in units:
            items = [rows[p] for p in unit]
            size = count.rows + len(items) if self.max_tokens is None else count.tokens(items)
            if not chunks or (count.rows and size > limit):
                count = TokenCount(self.layout, full_widths)
                chunks.append([])
            count.add(items)
            chunks[-1].extend(unit)
        return [torch.tensor(chunk, dtype=torch.long) for chunk in chunks]

    def full_widths(self, rollouts: RolloutBatch) -> tuple[int, int] | None:
        """The untrimmed forward's (prompt, response) columns; None where the forward is trimmed or packed."""
        if self.trim or self.layout == "packed":
            return None
        return rollouts.prompt_ids.shape[1], rollouts.response_ids.shape[1]

    def tokens(self, rollouts: RolloutBatch, rows: torch.Tensor) -> int:
        """The tokens of one micro-batch of `rows` (row ids of `rollouts`) as the forward runs them."""
        return TokenCount(self.layout, self.full_widths(rollouts)).tokens(row_lengths(rollouts, rows))
