"""The passes a rollout step runs over its policy and reference: the no-grad statistics pass (statistics.py), the
reference's log-probs, and the update's forward with gradient, each right for a plain, LoRA or FSDP-sharded model, in
the layout `fast_path` asks for (models/response_forward.py) where the model allows it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.algorithms.token_stats import stats_from_logits
from tokenrl.models.response_forward import forward_response_logits, response_logits, response_logprobs, shannon_entropy
from tokenrl.models.sharding import gathered_root, is_sharded
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.step.statistics import compute_token_stats


@dataclass
class UpdateForward:
    """The update's forward of a micro-batch: log π_θ(o_t) with gradient, (b, T), and, when asked, the detached
    statistics of the same logits and the entropy H_t with gradient (the entropy bonus)."""

    logprobs: torch.Tensor
    stats: TokenStats | None = None
    entropy: torch.Tensor | None = None


def shared_prefix_blocker(model: nn.Module, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot run the shared-prefix layout (None: it can): FSDP runs every pass through the
    root's single forward; gradient checkpointing turns transformers' KV cache off, but only in the update
    (`with_grad`): the no-grad passes pause it (`checkpointing_paused`)."""
    if is_sharded(model):
        return "FSDP updates through the root module's own forward"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if with_grad and getattr(base, "is_gradient_checkpointing", False):
        return "gradient checkpointing turns transformers' KV cache off in the update"
    return None


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
    share_prefix (the no-grad passes) / share_prefix_update / trim: the layouts of models/response_forward.py (callers
    pass them only where the model allows: `shared_prefix_blocker`)."""

    policy: nn.Module
    reference: nn.Module | None
    temperature: float
    micro_batch_size: int
    stats_chunk_size: int
    with_js: bool
    js_peers: str
    share_prefix: bool = False
    share_prefix_update: bool = False
    trim: bool = False

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
                share_prefix=self.share_prefix,
                trim=self.trim,
            )

    @torch.no_grad()
    def reference_logprobs(self, rollouts: RolloutBatch) -> torch.Tensor:
        """(B, T) log π_ref(o_t) on the host, micro-batch by micro-batch."""
        model = self.reference if self.reference is not None else self.policy
        adapters_off = self.policy.disable_adapter() if self.reference is None else nullcontext()
        out = torch.zeros(rollouts.response_ids.shape)
        with gathered_root(model), adapters_off, checkpointing_paused(model):
            for rows in torch.arange(rollouts.response_ids.shape[0]).split(self.micro_batch_size):
                out[rows] = (
                    response_logprobs(model, rollouts.rows(rows), self.temperature, self.share_prefix, self.trim)
                    .float()
                    .cpu()
                )
        return out

    def update_forward(self, part: RolloutBatch, with_stats: bool, with_entropy: bool = False) -> UpdateForward:
        """log π_θ(o_t) of a micro-batch with gradient and, with `with_stats`, its statistics from the same logits
        (JS over the micro-batch's groups, which must be whole); with `with_entropy`, H_t with gradient."""
        if is_sharded(self.policy):
            logits = forward_response_logits(self.policy, part)
        else:
            logits = response_logits(self.policy, part, self.share_prefix_update, self.trim)
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
