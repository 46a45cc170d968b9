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


def micro_batches(
    rows: torch.Tensor,
    group_ids: torch.Tensor,
    response_lengths: torch.Tensor,
    max_rows: int | None,
    whole_groups: bool = False,
    by_length: bool = False,
    max_tokens: int | None = None,
    prompt_lengths: torch.Tensor | None = None,
    cost: str = "packed",
    full_widths: tuple[int, int] | None = None,
) -> list[torch.Tensor]:
    """Positions into `rows` (a mini-batch's row ids, sorted) of each micro-batch: at most `max_rows` rows, or whole
    groups of at most max(`max_rows`, the group's size) rows with `whole_groups`. Or, with `max_tokens` instead of
    `max_rows`: at most that many tokens by `cost` (one of models/response_forward.py's `LAYOUTS`: `TokenCount`), or
    one unit that alone exceeds it.

    group_ids / response_lengths / prompt_lengths (real tokens; needed with `max_tokens`): per row of the full batch;
    full_widths: (prompt, response) columns of an untrimmed forward (None: trimmed to the micro-batch's own).
    """
    if (max_rows is None) == (max_tokens is None):
        raise ValueError("micro-batches need max_rows or max_tokens, one of them")
    if max_tokens is not None and prompt_lengths is None:
        raise ValueError("a token budget needs the rows' prompt lengths")
    if cost not in LAYOUTS:
        raise ValueError(f"micro-batch cost {cost!r} is not one of {LAYOUTS}")
    ids = group_ids[rows]
    groups = [(ids == g).nonzero().squeeze(1) for g in torch.unique(ids)]
    if by_length:
        longest = torch.tensor([int(response_lengths[rows[group]].max()) for group in groups])
        groups = [groups[i] for i in torch.sort(longest, descending=True, stable=True).indices.tolist()]
    prompts = (torch.zeros_like(response_lengths) if prompt_lengths is None else prompt_lengths)[rows]
    row = list(zip(ids.tolist(), prompts.tolist(), response_lengths[rows].tolist()))
    units = [group.tolist() for group in groups] if whole_groups else [[p] for g in groups for p in g.tolist()]
    limit = max_tokens if max_tokens is not None else max_rows
    assert limit is not None  # one of the two (checked above)
    chunks: list[list[int]] = []
    count = TokenCount(cost, full_widths)
    for unit in units:
        items = [row[p] for p in unit]
        size = count.tokens(items) if max_tokens is not None else count.rows + len(items)
        if not chunks or (count.rows and size > limit):
            count = TokenCount(cost, full_widths)
            chunks.append([])
        count.add(items)
        chunks[-1].extend(unit)
    return [torch.tensor(chunk, dtype=torch.long) for chunk in chunks]


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

    def tokens(self, unit: list[tuple[int, int, int]]) -> int:
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

    def add(self, unit: list[tuple[int, int, int]]) -> None:
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
        """Positions into `rows` (row ids of `rollouts`, sorted) of each micro-batch (`micro_batches`)."""
        return micro_batches(
            rows,
            rollouts.group_ids,
            rollouts.response_mask.sum(1),
            max_rows=self.max_rows if self.max_tokens is None else None,
            whole_groups=whole_groups,
            by_length=self.by_length,
            max_tokens=self.max_tokens,
            prompt_lengths=rollouts.prompt_mask.sum(1),
            cost=self.layout,
            full_widths=self.full_widths(rollouts),
        )

    def full_widths(self, rollouts: RolloutBatch) -> tuple[int, int] | None:
        """The untrimmed forward's (prompt, response) columns; None where the forward is trimmed or packed."""
        if self.trim or self.layout == "packed":
            return None
        return rollouts.prompt_ids.shape[1], rollouts.response_ids.shape[1]

    def tokens(self, rollouts: RolloutBatch, rows: torch.Tensor) -> int:
        """The tokens of one micro-batch of `rows` (row ids of `rollouts`) as the forward runs them."""
        unit = zip(
            rollouts.group_ids[rows].tolist(),
            rollouts.prompt_mask[rows].sum(1).tolist(),
            rollouts.response_mask[rows].sum(1).tolist(),
        )
        return TokenCount(self.layout, self.full_widths(rollouts)).tokens(list(unit))
