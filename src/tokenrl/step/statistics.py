"""The statistics pass: one no-grad forward of the policy over a rollout batch, whole groups per forward, and the
statistics of every response token from its logits (the math: algorithms/logit_statistics.py; the layouts of the
forward: models/response_forward.py).

Each forward holds whole groups, at most max(micro_batch_size, G) rows of hidden states or, with `micro_batch_tokens`,
at most that many tokens (a group larger runs alone: step/micro_batches.py), in the layout of the run's `ForwardPlan`
(step/fast_path.py); the head turns them into logits chunk by chunk inside `group_statistics`, so at most
`stats_chunk_size` response tokens have logits at a time. Where the plan fuses the head (`fast_path.fused_head`,
docs/algorithms.md §12.5) the fused head of models/lm_head.py computes the same statistics from the hidden states
vocabulary chunk by vocabulary chunk, all of a forward's tokens at once, without logits."""

from __future__ import annotations

import torch
from torch import nn

from tokenrl.algorithms.logit_statistics import check_js_peers, group_rows, group_statistics
from tokenrl.models.lm_head import fused_head as fused_lm_head
from tokenrl.models.lm_head import response_slots
from tokenrl.models.response_forward import decoder_and_head, response_hidden
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats, zero_statistics
from tokenrl.step.fast_path import ForwardPlan


@torch.no_grad()
def compute_token_stats(
    model: nn.Module, batch: RolloutBatch, plan: ForwardPlan, with_js: bool | None = None
) -> TokenStats:
    """Statistics of every response token, JS where `with_js` (None: the plan's) asks; each forward holds whole groups,
    cut as the plan cuts a pass without gradient (`ForwardPlan.cut`; layouts: models/response_forward.py)."""
    with_js = plan.with_js if with_js is None else with_js
    js_peers, temperature, layout = plan.js_peers, plan.temperature, plan.layout(with_grad=False)
    check_js_peers(js_peers)
    device = next(model.parameters()).device
    _, head = decoder_and_head(model)
    out = zero_statistics(batch.response_ids.shape, with_js)
    local = torch.full((batch.response_ids.shape[0],), -1, dtype=torch.long)

    def flush(rows: torch.Tensor) -> None:
        local[rows] = torch.arange(len(rows))
        hidden, sub = response_hidden(model, batch.rows(rows), trim=plan.trim, layout=layout)
        if plan.fuses_head(with_grad=False):
            fused_statistics(hidden, sub, rows)
            return
        for group in group_rows(batch.group_ids[rows]):
            group_statistics(
                lambda row, pos: head(hidden[local[row].to(device), pos.to(device)]),
                rows[group],
                batch.response_ids,
                batch.response_mask,
                temperature,
                plan.stats_chunk_size,
                with_js,
                out,
                js_peers,
            )

    def fused_statistics(hidden: torch.Tensor, sub: RolloutBatch, rows: torch.Tensor) -> None:
        assert isinstance(head, nn.Linear)  # the plan fuses only a plain linear head (`fusable_head`)
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

    every = torch.arange(batch.response_ids.shape[0])
    for rows in plan.cut(with_grad=False)(batch, every, whole_groups=True):
        flush(rows)
    return TokenStats(**out)
