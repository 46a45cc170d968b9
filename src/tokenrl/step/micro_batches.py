"""How a mini-batch's rows are cut into micro-batches (one forward and backward each).

Rows stay with their group (a group's rows share one prompt encoding in the shared-prefix layout, and JS compares a
group's rows). With `by_length` the groups are ordered by their longest response, so that each micro-batch, cut to
its own longest prompt and response (models/response_forward.py: `trim`), spends little compute on padding — the
effect of verl's length-balanced dynamic batches, at a fixed row count. The loss is a sum over micro-batches, so the
order changes nothing but rounding.
"""

from __future__ import annotations

import torch


def micro_batches(
    rows: torch.Tensor,
    group_ids: torch.Tensor,
    response_lengths: torch.Tensor,
    max_rows: int,
    whole_groups: bool = False,
    by_length: bool = False,
) -> list[torch.Tensor]:
    """Positions into `rows` (a mini-batch's row ids, sorted) of each micro-batch: at most `max_rows` rows, or whole
    groups of at most max(`max_rows`, the group's size) rows with `whole_groups`.

    group_ids / response_lengths: per row of the full batch.
    """
    ids = group_ids[rows]
    groups = [(ids == g).nonzero().squeeze(1) for g in torch.unique(ids)]
    if by_length:
        longest = torch.tensor([int(response_lengths[rows[group]].max()) for group in groups])
        groups = [groups[i] for i in torch.sort(longest, descending=True, stable=True).indices.tolist()]
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
