"""The statistics pass: one no-grad forward of the policy over a rollout batch, whole groups per forward, and the
statistics of every response token from its logits (the math: algorithms/logit_statistics.py; the layouts of the
forward: models/response_forward.py).

Each forward holds whole groups, at most max(micro_batch_size, G) rows of hidden states or, with `micro_batch_tokens`,
at most that many tokens (a group larger runs alone: step/micro_batches.py); the head turns them into logits chunk by
chunk inside `group_statistics`, so at most `chunk_size` response tokens have logits at a time. With `fused_head`
(`fast_path.fused_head`, docs/algorithms.md §12.5) the fused head of models/lm_head.py computes the same statistics
from the hidden states vocabulary chunk by vocabulary chunk, all of a forward's tokens at once, without logits."""

from __future__ import annotations

import torch
from torch import nn

from tokenrl.algorithms.logit_statistics import check_js_peers, group_rows, group_statistics
from tokenrl.models.lm_head import fused_head as fused_lm_head
from tokenrl.models.lm_head import response_slots
from tokenrl.models.response_forward import decoder_and_head, response_hidden
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats, zero_statistics
from tokenrl.step.micro_batches import MicroBatchCut


@torch.no_grad()
def compute_token_stats(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    micro_batch_size: int,
    chunk_size: int,
    with_js: bool = False,
    js_peers: str = "all",
    layout: str = "padded",
    trim: bool = False,
    fused_head: bool = False,
    micro_batch_tokens: int | None = None,
    by_length: bool = False,
) -> TokenStats:
    """Statistics of every response token; each forward holds whole groups, at most max(micro_batch_size, G) rows or
    `micro_batch_tokens` tokens, groups ordered by length with `by_length` (`MicroBatchCut`; layouts:
    models/response_forward.py); `fused_head`: through models/lm_head.py (the head a plain nn.Linear)."""
    check_js_peers(js_peers)
    device = next(model.parameters()).device
    _, head = decoder_and_head(model)
    out = zero_statistics(batch.response_ids.shape, with_js)
    local = torch.full((batch.response_ids.shape[0],), -1, dtype=torch.long)

    def flush(rows: torch.Tensor) -> None:
        local[rows] = torch.arange(len(rows))
        hidden, sub = response_hidden(model, batch.rows(rows), trim=trim, layout=layout)
        if fused_head:
            fused_statistics(hidden, sub, rows)
            return
        for group in group_rows(batch.group_ids[rows]):
            group_statistics(
                lambda row, pos: head(hidden[local[row].to(device), pos.to(device)]),
                rows[group],
                batch.response_ids,
                batch.response_mask,
                temperature,
                chunk_size,
                with_js,
                out,
                js_peers,
            )

    def fused_statistics(hidden: torch.Tensor, sub: RolloutBatch, rows: torch.Tensor) -> None:
        count, width, _ = hidden.shape
        head_out = fused_lm_head(
            hidden.reshape(count * width, -1),
            head.weight,
            sub.response_ids.reshape(-1),
            temperature,
            head.bias,
            groups=response_slots(sub.group_ids, width, sub.response_mask, js_peers) if with_js else None,
        )
        mask = sub.response_mask.bool()
        for name, whole in out.items():
            values = getattr(head_out, name).reshape(count, width).float().cpu()
            whole[rows, :width] = torch.where(mask, values, torch.zeros_like(values))

    cut = MicroBatchCut(micro_batch_size, micro_batch_tokens, layout, trim, by_length)
    every = torch.arange(batch.response_ids.shape[0])
    for rows in cut(batch, every, whole_groups=True):
        flush(rows)
    return TokenStats(**out)
