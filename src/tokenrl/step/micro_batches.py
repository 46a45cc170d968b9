"""How a mini-batch's rows are cut into micro-batches (one forward and backward each).

Rows stay with their group (a group's rows share one prompt encoding in the shared-prefix layout, and JS compares a
group's rows). With `by_length` the groups are ordered by their longest response, so that each micro-batch, cut to
its own longest prompt and response (models/response_forward.py: `trim`), spends little compute on padding — the
effect of verl's length-balanced dynamic batches, at a fixed row count. The loss is a sum over micro-batches, so the
order changes nothing but rounding.

With `max_tokens` (`algorithm.micro_batch_tokens`) the cut is by a token budget instead of a row count
(docs/algorithms.md §12.4): a micro-batch takes groups (or rows) in order while its tokens stay within the budget,
counted as its forward will run them (models/response_forward.py's layouts) — `packed` (each group's prompt once, plus
every response's tokens), `shared_prefix` (each group's prompt once at the micro-batch's longest prompt, plus rows ×
longest response) or `padded` (rows × (longest prompt + longest response)), each forward trimmed to its own widths or,
with `full_widths`, at the batch's full widths. A unit (a group with `whole_groups`, else a row) larger than the
budget is a micro-batch of its own. A group split over two micro-batches pays its prompt in each, so `whole_groups`
keeps the prompt once.
"""

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
    `max_rows`: at most that many tokens by `cost` (one of models/response_forward.py's `LAYOUTS`; module docstring),
    or one unit that alone exceeds it.

    group_ids / response_lengths / prompt_lengths (real tokens; needed with `max_tokens`): per row of the full batch;
    full_widths: (prompt, response) columns of an untrimmed forward (None: trimmed to the micro-batch's own).
    """
    ids = group_ids[rows]
    groups = [(ids == g).nonzero().squeeze(1) for g in torch.unique(ids)]
    if by_length:
        longest = torch.tensor([int(response_lengths[rows[group]].max()) for group in groups])
        groups = [groups[i] for i in torch.sort(longest, descending=True, stable=True).indices.tolist()]
    if (max_rows is None) == (max_tokens is None):
        raise ValueError("micro-batches need max_rows or max_tokens, one of them")
    if max_tokens is not None:
        if prompt_lengths is None:
            raise ValueError("a token budget needs the rows' prompt lengths")
        return by_tokens(
            groups, rows, ids, response_lengths, prompt_lengths, max_tokens, whole_groups, cost, full_widths
        )
    assert max_rows is not None  # one of the two (checked above)
    if not whole_groups:
        return list(torch.cat(groups).split(max_rows)) if groups else []
    chunks: list[torch.Tensor] = []
    pending: list[torch.Tensor] = []
    for group in groups:
        if pending and sum(map(len, pending)) + len(group) > max_rows:
            chunks.append(torch.cat(pending))
            pending = []
        pending.append(group)
    if pending:
        chunks.append(torch.cat(pending))
    return chunks


@dataclass
class TokenCount:
    """A growing micro-batch's tokens by `cost` (module docstring), counted unit by unit: (group, prompt length,
    response length) per row."""

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


def by_tokens(
    groups: list[torch.Tensor],
    rows: torch.Tensor,
    ids: torch.Tensor,
    response_lengths: torch.Tensor,
    prompt_lengths: torch.Tensor,
    max_tokens: int,
    whole_groups: bool,
    cost: str,
    full_widths: tuple[int, int] | None = None,
) -> list[torch.Tensor]:
    """The greedy cut of `micro_batches` by a token budget: units (groups or rows) in order, a new micro-batch when
    the next unit would overflow `max_tokens`."""
    if cost not in LAYOUTS:
        raise ValueError(f"micro-batch cost {cost!r} is not one of {LAYOUTS}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be positive")
    row = list(zip(ids.tolist(), prompt_lengths[rows].tolist(), response_lengths[rows].tolist()))
    units = [group.tolist() for group in groups] if whole_groups else [[p] for g in groups for p in g.tolist()]
    chunks: list[list[int]] = []
    count = TokenCount(cost, full_widths)
    for unit in units:
        items = [row[p] for p in unit]
        if count.rows and count.tokens(items) > max_tokens:
            count = TokenCount(cost, full_widths)
            chunks.append([])
        elif not chunks:
            chunks.append([])
        count.add(items)
        chunks[-1].extend(unit)
    return [torch.tensor(chunk, dtype=torch.long) for chunk in chunks]


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
