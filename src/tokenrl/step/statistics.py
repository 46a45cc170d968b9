"""The statistics pass: one no-grad forward of the policy over a rollout batch, whole groups per forward, and the
statistics of every response token (the math: algorithms/logit_statistics.py; the layouts: models/response_forward.py).
The head turns the hidden states into logits chunk by chunk inside `LogitStatistics.group` (at most `stats_chunk_size`
tokens at a time) or, where the plan fuses it (docs/algorithms.md §12.5), models/lm_head.py computes the same
statistics from the hidden states without logits."""

from __future__ import annotations

import torch
from torch import nn

from tokenrl.algorithms.logit_statistics import LogitStatistics, group_rows
from tokenrl.models.lm_head import ChunkedHead, HeadOutput, fused_head, response_slots
from tokenrl.models.response_forward import decoder_and_head, response_hidden
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats, zero_statistics
from tokenrl.step.fast_path import ForwardPlan


def fused_response_head(
    model: nn.Module, batch: RolloutBatch, plan: ForwardPlan, with_grad: bool, with_js: bool = False
) -> tuple[HeadOutput, RolloutBatch]:
    """The fused head (models/lm_head.py) over every (row, position) of `batch`'s response grid in the plan's layout
    for the pass (`with_grad`), flattened row-major: ((b·T') per-token outputs, the batch they belong to: trimmed to
    T' with the plan's `trim`); with `with_js`, JS over the batch's groups (whole groups: the caller's)."""
    hidden, batch = response_hidden(model, batch, trim=plan.trim, layout=plan.layout(with_grad))
    rows, width, _ = hidden.shape
    _, head = decoder_and_head(model)
    assert isinstance(head, nn.Linear)  # the plan fuses only a plain linear head (`fusable_head`)
    groups = response_slots(batch.group_ids, width, batch.response_mask, plan.js_peers) if with_js else None
    chunked = ChunkedHead(head.weight, plan.temperature, head.bias)
    out = fused_head(hidden.reshape(rows * width, -1), chunked, batch.response_ids.reshape(-1), groups)
    return out, batch


def head_statistics(out: HeadOutput, batch: RolloutBatch, length: int) -> TokenStats:
    """The (b, length) float32 host `TokenStats` of the fused head's detached outputs over `batch`'s (b, T') grid (0 on
    padding and beyond T')."""
    rows, width = batch.response_ids.shape
    mask = batch.response_mask.bool()

    def grid(values: torch.Tensor) -> torch.Tensor:
        values = values.detach().reshape(rows, width).float().cpu()
        return nn.functional.pad(torch.where(mask, values, torch.zeros_like(values)), (0, length - width))

    return TokenStats(grid(out.logprobs), grid(out.entropy), grid(out.renyi2), None if out.js is None else grid(out.js))


@torch.no_grad()
def compute_token_stats(
    model: nn.Module, batch: RolloutBatch, plan: ForwardPlan, with_js: bool | None = None
) -> TokenStats:
    """Statistics of every response token, JS where `with_js` (None: the plan's) asks; each forward holds whole groups,
    cut as the plan cuts a pass without gradient (`ForwardPlan.cut`)."""
    with_js = plan.with_js if with_js is None else with_js
    statistics = LogitStatistics(plan.temperature, plan.stats_chunk_size, plan.js_peers)
    device = next(model.parameters()).device
    _, head = decoder_and_head(model)
    out = zero_statistics(batch.response_ids.shape, with_js)
    local = torch.full((batch.response_ids.shape[0],), -1, dtype=torch.long)

    def flush(rows: torch.Tensor) -> None:
        local[rows] = torch.arange(len(rows))
        hidden, _ = response_hidden(model, batch.rows(rows), trim=plan.trim, layout=plan.layout(with_grad=False))
        for group in group_rows(batch.group_ids[rows]):
            statistics.group(
                lambda row, pos: head(hidden[local[row].to(device), pos.to(device)]),
                rows[group],
                batch.response_ids,
                batch.response_mask,
                out,
            )

    every = torch.arange(batch.response_ids.shape[0])
    for rows in plan.cut(with_grad=False)(batch, every, whole_groups=True):
        if not plan.fuses_head(with_grad=False):
            flush(rows)
            continue
        head_out, sub = fused_response_head(model, batch.rows(rows), plan, with_grad=False, with_js=with_js)
        fused = head_statistics(head_out, sub, batch.response_ids.shape[1])
        for name, whole in out.items():
            whole[rows] = getattr(fused, name)
    return TokenStats(**out)
