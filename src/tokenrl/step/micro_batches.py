"""How a mini-batch's rows are cut into micro-batches (one forward and backward each).

Rows stay with their group (a group's rows share one prompt encoding in the shared-prefix layout, and JS compares a
group's rows). With `by_length` the groups are ordered by their longest response, so that each micro-batch, cut to
its own longest prompt and response (models/response_forward.py: `trim`), spends little compute on padding — the
effect of verl's length-balanced dynamic batches, at a fixed row count. The loss is a sum over micro-batches, so the
order changes nothing but rounding.

With `max_tokens` the cut is by a token budget instead of a row count (docs/algorithms.md §12.4): a micro-batch takes
groups (or rows) in order while its tokens stay within the budget, counted as its forward will run them — `packed`
(models/packed.py: each group's prompt once, plus every response's tokens) or `padded` (rows × (longest prompt +
longest response), the trimmed padded forward). A unit (a group with `whole_groups`, else a row) larger than the budget
is a micro-batch of its own. In the packed count a group split over two micro-batches pays its prompt in each, so
`whole_groups` keeps the prompt once.
"""

from __future__ import annotations

import torch

COSTS = ("packed", "padded")


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
) -> list[torch.Tensor]:
    """Positions into `rows` (a mini-batch's row ids, sorted) of each micro-batch: at most `max_rows` rows, or whole
    groups of at most max(`max_rows`, the group's size) rows with `whole_groups`. With `max_tokens`: at most that
    many tokens by `cost` (module docstring; `max_rows`, if not None, caps the rows too), or one unit that alone
    exceeds it.

    group_ids / response_lengths / prompt_lengths (real tokens; needed with `max_tokens`): per row of the full batch.
    """
    ids = group_ids[rows]
    groups = [(ids == g).nonzero().squeeze(1) for g in torch.unique(ids)]
    if by_length:
        longest = torch.tensor([int(response_lengths[rows[group]].max()) for group in groups])
        groups = [groups[i] for i in torch.sort(longest, descending=True, stable=True).indices.tolist()]
    if max_tokens is not None:
        if prompt_lengths is None:
            raise ValueError("a token budget needs the rows' prompt lengths")
        return by_tokens(groups, rows, ids, response_lengths, prompt_lengths, max_tokens, max_rows, whole_groups, cost)
    if max_rows is None:
        raise ValueError("micro-batches need max_rows or max_tokens")
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


def tokens_of(positions: list[int], rows, ids, response_lengths, prompt_lengths, cost: str) -> int:
    """Tokens of a micro-batch of these positions into `rows` by `cost` (module docstring)."""
    if not positions:
        return 0
    index = rows[torch.tensor(positions)]
    if cost == "padded":
        return len(positions) * (int(prompt_lengths[index].max()) + int(response_lengths[index].max()))
    prompts = {int(g): int(p) for g, p in zip(ids[torch.tensor(positions)], prompt_lengths[index])}
    return sum(prompts.values()) + int(response_lengths[index].sum())


def by_tokens(
    groups: list[torch.Tensor],
    rows: torch.Tensor,
    ids: torch.Tensor,
    response_lengths: torch.Tensor,
    prompt_lengths: torch.Tensor,
    max_tokens: int,
    max_rows: int | None,
    whole_groups: bool,
    cost: str,
) -> list[torch.Tensor]:
    """The greedy cut of `micro_batches` by a token budget: units (groups or rows) in order, a new micro-batch when
    the next unit would overflow `max_tokens` (or `max_rows`)."""
    if cost not in COSTS:
        raise ValueError(f"micro-batch cost {cost!r} is not one of {COSTS}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be positive")
    units = [group.tolist() for group in groups] if whole_groups else [[p] for g in groups for p in g.tolist()]
    chunks: list[list[int]] = []
    pending: list[int] = []
    for unit in units:
        grown = pending + unit
        over = tokens_of(grown, rows, ids, response_lengths, prompt_lengths, cost) > max_tokens
        if pending and (over or (max_rows is not None and len(grown) > max(max_rows, len(unit)))):
            chunks.append(pending)
            grown = list(unit)
        pending = grown
    if pending:
        chunks.append(pending)
    return [torch.tensor(chunk, dtype=torch.long) for chunk in chunks]
