"""The passes a rollout step runs over its policy and reference: the no-grad statistics pass (statistics.py), the
reference's log-probs, and the update's forward with gradient, each right for a plain, LoRA or FSDP-sharded model, in
the layout `fast_path.layout` asks for (models/response_forward.py) where the model allows it (`layout_blocker`), and
with the head either materialising the (tokens × vocabulary) logits or fused and chunked over the vocabulary
(models/lm_head.py, `fast_path.fused_head`, docs/algorithms.md §12.5) where the head allows it
(`fused_head_blocker`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.algorithms.logit_statistics import check_js_peers, stats_from_logits
from tokenrl.models.lm_head import HeadOutput, fusable_head, fused_head, response_slots
from tokenrl.models.packed import packed_blocker
from tokenrl.models.response_forward import (
    decoder_and_head,
    forward_response_logits,
    response_hidden,
    response_logits,
    response_logprobs,
    shannon_entropy,
)
from tokenrl.models.sharding import gathered_root, is_sharded
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.step.micro_batches import MicroBatchCut
from tokenrl.step.statistics import compute_token_stats


@dataclass
class UpdateForward:
    """The update's forward of a micro-batch: log π_θ(o_t) with gradient, (b, T), and, when asked, the detached
    statistics of the same logits and the entropy H_t with gradient (the entropy bonus)."""

    logprobs: torch.Tensor
    stats: TokenStats | None = None
    entropy: torch.Tensor | None = None


def layout_blocker(model: nn.Module, layout: str, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot run `layout` (None: it can; the padded layout always can): FSDP runs every pass
    through the root's single forward; in the update (`with_grad`), gradient checkpointing turns transformers' KV cache
    off (the shared prefix) and recomputes the layers outside the packed attention (the no-grad passes pause it:
    `checkpointing_paused`); the packed layout needs full attention in every layer (`packed_blocker`)."""
    if layout == "padded":
        return None
    if is_sharded(model):
        return "FSDP updates through the root module's own forward"
    if layout == "packed":
        return packed_blocker(model, with_grad)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if with_grad and getattr(base, "is_gradient_checkpointing", False):
        return "gradient checkpointing turns transformers' KV cache off in the update"
    return None


def fused_head_blocker(model: nn.Module, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot take the fused head (None: it can): FSDP runs the update through the root's
    own forward, which applies the head itself; an adapter-wrapped (or otherwise not plain linear) head."""
    if with_grad and is_sharded(model):
        return "FSDP updates through the root module's own forward"
    _, head = decoder_and_head(model)
    if not fusable_head(head):
        return f"the output head is a {type(head).__name__}, not a plain nn.Linear"
    return None


def fused_response_head(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    layout: str,
    trim: bool,
    with_js: bool = False,
    js_peers: str = "all",
) -> tuple[HeadOutput, RolloutBatch]:
    """The fused head (models/lm_head.py) over every (row, position) of `batch`'s response grid, flattened row-major:
    ((b·T') per-token outputs, the batch they belong to: trimmed to T' with `trim`); with `with_js`, JS over the
    batch's groups (whole groups: the caller's)."""
    hidden, batch = response_hidden(model, batch, trim=trim, layout=layout)
    rows, width, _ = hidden.shape
    _, head = decoder_and_head(model)
    groups = response_slots(batch.group_ids, width, batch.response_mask, js_peers) if with_js else None
    out = fused_head(
        hidden.reshape(rows * width, -1),
        head.weight,
        batch.response_ids.reshape(-1),
        temperature,
        head.bias,
        groups=groups,
    )
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


@contextmanager
def checkpointing_paused(model: nn.Module) -> Iterator[None]:
    """Gradient checkpointing off for a no-grad pass: it saves nothing without gradients, and transformers' layers drop
    the KV cache (the shared prompt) while it is on in training mode (`GradientCheckpointingLayer.__call__`)."""
    layers = [module for module in model.modules() if getattr(module, "gradient_checkpointing", False) is True]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True


@dataclass
class PolicyPasses:
    """`reference` is the frozen copy (None: a LoRA policy, whose reference is itself with adapters off). Under FSDP
    (models/sharding.py) passes with gradients go through the root's forward; passes without run with it gathered.
    layout (the no-grad passes) / update_layout / trim: models/response_forward.py's `LAYOUTS` and trimming (callers
    pass a layout only where the model allows it: `layout_blocker`). fused_head: the head fused and chunked over the
    vocabulary (models/lm_head.py) in every pass where the head allows it (`fused_head_blocker`). micro_batch_size /
    micro_batch_tokens / by_length: how each pass cuts its rows (`cut`)."""

    policy: nn.Module
    reference: nn.Module | None
    temperature: float
    micro_batch_size: int
    stats_chunk_size: int
    with_js: bool
    js_peers: str
    layout: str = "padded"
    update_layout: str = "padded"
    trim: bool = False
    fused_head: bool = False
    micro_batch_tokens: int | None = None
    by_length: bool = False

    def cut(self, with_grad: bool) -> MicroBatchCut:
        """How the update's forward (`with_grad`) or a pass without gradient cuts its rows into micro-batches, the
        token budget counted in that pass's layout (a budget is refused under FSDP: config/check.py)."""
        layout = self.update_layout if with_grad else self.layout
        return MicroBatchCut(self.micro_batch_size, self.micro_batch_tokens, layout, self.trim, self.by_length)

    def fuses(self, model: nn.Module, with_grad: bool) -> bool:
        return self.fused_head and fused_head_blocker(model, with_grad) is None

    @torch.no_grad()
    def statistics(self, rollouts: RolloutBatch, with_js: bool | None = None) -> TokenStats:
        """log π, entropy, Rényi-2 (and JS when asked) of every response token under the current policy."""
        with gathered_root(self.policy), checkpointing_paused(self.policy):
            return compute_token_stats(
                self.policy,
                rollouts,
                self.temperature,
                self.micro_batch_size,
                self.stats_chunk_size,
                with_js=self.with_js if with_js is None else with_js,
                js_peers=self.js_peers,
                layout=self.layout,
                trim=self.trim,
                fused_head=self.fuses(self.policy, with_grad=False),
                micro_batch_tokens=self.micro_batch_tokens,
                by_length=self.by_length,
            )

    @torch.no_grad()
    def reference_logprobs(self, rollouts: RolloutBatch) -> torch.Tensor:
        """(B, T) log π_ref(o_t) on the host, micro-batch by micro-batch."""
        model = self.reference if self.reference is not None else self.policy
        adapters_off = self.policy.disable_adapter() if self.reference is None else nullcontext()
        out = torch.zeros(rollouts.response_ids.shape)
        with gathered_root(model), adapters_off, checkpointing_paused(model):
            fused = self.fuses(model, with_grad=False)
            for rows in self.cut(with_grad=False)(rollouts, torch.arange(rollouts.response_ids.shape[0])):
                if fused:
                    head, batch = fused_response_head(
                        model, rollouts.rows(rows), self.temperature, self.layout, self.trim
                    )
                    width = batch.response_ids.shape[1]
                    out[rows, :width] = head.logprobs.reshape(len(rows), width).float().cpu()
                    continue
                out[rows] = (
                    response_logprobs(model, rollouts.rows(rows), self.temperature, trim=self.trim, layout=self.layout)
                    .float()
                    .cpu()
                )
        return out

    def update_forward(self, part: RolloutBatch, with_stats: bool, with_entropy: bool = False) -> UpdateForward:
        """log π_θ(o_t) of a micro-batch with gradient and, with `with_stats`, its statistics from the same logits
        (JS over the micro-batch's groups, which must be whole); with `with_entropy`, H_t with gradient."""
        if self.fuses(self.policy, with_grad=True):
            return self.fused_update_forward(part, with_stats, with_entropy)
        if is_sharded(self.policy):
            logits = forward_response_logits(self.policy, part)
        else:
            logits = response_logits(self.policy, part, trim=self.trim, layout=self.update_layout)
        width = logits.shape[1]
        log_pi = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # shared by log π(o_t) and H_t
        logp = log_pi.gather(-1, part.response_ids[:, :width, None].to(logits.device)).squeeze(-1)
        logp = nn.functional.pad(logp, (0, part.response_ids.shape[1] - width))
        stats = None
        if with_stats:
            stats = stats_from_logits(
                logits.detach(),
                part.response_ids,
                part.response_mask,
                part.group_ids,
                self.temperature,
                self.stats_chunk_size,
                self.with_js,
                self.js_peers,
            )
        entropy = None
        if with_entropy:
            entropy = nn.functional.pad(shannon_entropy(log_pi), (0, part.response_ids.shape[1] - width))
        return UpdateForward(logp, stats, entropy)

    def fused_update_forward(self, part: RolloutBatch, with_stats: bool, with_entropy: bool) -> UpdateForward:
        """`update_forward` through the fused head: the same log π_θ(o_t), statistics and H_t, without the logits."""
        if with_stats and self.with_js:
            check_js_peers(self.js_peers)
        out, batch = fused_response_head(
            self.policy,
            part,
            self.temperature,
            self.update_layout,
            self.trim,
            with_js=with_stats and self.with_js,
            js_peers=self.js_peers,
        )
        rows, width = batch.response_ids.shape
        pad = (0, part.response_ids.shape[1] - width)
        logp = nn.functional.pad(out.logprobs.reshape(rows, width), pad)
        entropy = nn.functional.pad(out.entropy.reshape(rows, width), pad) if with_entropy else None
        stats = head_statistics(out, batch, part.response_ids.shape[1]) if with_stats else None
        return UpdateForward(logp, stats, entropy)
