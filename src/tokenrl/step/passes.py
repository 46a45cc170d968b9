"""The passes a rollout step runs over its policy and reference: the no-grad statistics pass (statistics.py), the
reference's log-probs, and the update's forward with gradient, each right for a plain, LoRA or FSDP-sharded model, in
the layout and with the head the run's `ForwardPlan` resolved (step/fast_path.py): the head either materialising the
(tokens × vocabulary) logits or fused and chunked over the vocabulary (models/lm_head.py, docs/algorithms.md §12.5)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.algorithms.logit_statistics import LogitStatistics, check_js_peers
from tokenrl.models.response_forward import forward_response_logits, response_logits, response_logprobs, shannon_entropy
from tokenrl.models.sharding import gathered_root, is_sharded
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.step.fast_path import ForwardPlan
from tokenrl.step.statistics import compute_token_stats, fused_response_head, head_statistics


@dataclass
class UpdateForward:
    """The update's forward of a micro-batch: log π_θ(o_t) with gradient, (b, T), and, when asked, the detached
    statistics of the same logits and the entropy H_t with gradient (the entropy bonus)."""

    logprobs: torch.Tensor
    stats: TokenStats | None = None
    entropy: torch.Tensor | None = None


@contextmanager
def checkpointing_paused(model: nn.Module) -> Iterator[None]:
    """Gradient checkpointing off for a no-grad pass: it saves nothing without gradients, and transformers' layers drop
    the KV cache (the shared prompt) while it is on in training mode (`GradientCheckpointingLayer.__call__`)."""
    layers = [module for module in model.modules() if getattr(module, "gradient_checkpointing", False) is True]
    for layer in layers:  # torch types Module.__setattr__ for tensors and modules only; a flag is set as well
        layer.gradient_checkpointing = False  # type: ignore[assignment]
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True  # type: ignore[assignment]


@dataclass
class PolicyPasses:
    """The passes over `policy` and its `reference` (the frozen copy; None: a LoRA policy, whose reference is itself
    with adapters off), each as the run's `plan` says. Under FSDP (models/sharding.py) passes with gradients go through
    the root's forward; passes without run with it gathered."""

    policy: nn.Module
    reference: nn.Module | None
    plan: ForwardPlan

    @torch.no_grad()
    def statistics(self, rollouts: RolloutBatch, with_js: bool | None = None) -> TokenStats:
        """log π, entropy, Rényi-2 (and JS when the plan, or `with_js`, asks) of every response token under the current
        policy."""
        with gathered_root(self.policy), checkpointing_paused(self.policy):
            return compute_token_stats(self.policy, rollouts, self.plan, with_js)

    @torch.no_grad()
    def reference_logprobs(self, rollouts: RolloutBatch) -> torch.Tensor:
        """(B, T) log π_ref(o_t) on the host, micro-batch by micro-batch."""
        model = self.reference if self.reference is not None else self.policy
        # disable_adapter is the PEFT model's method, which torch types as a module's attribute: Tensor | Module
        adapters_off = self.policy.disable_adapter() if self.reference is None else nullcontext()  # type: ignore[operator]
        out = torch.zeros(rollouts.response_ids.shape)
        plan = self.plan
        with gathered_root(model), adapters_off, checkpointing_paused(model):
            for rows in plan.cut(with_grad=False)(rollouts, torch.arange(rollouts.response_ids.shape[0])):
                if plan.fuses_head(with_grad=False):
                    head, batch = fused_response_head(model, rollouts.rows(rows), plan, with_grad=False)
                    width = batch.response_ids.shape[1]
                    out[rows, :width] = head.logprobs.reshape(len(rows), width).float().cpu()
                    continue
                logprobs = response_logprobs(
                    model, rollouts.rows(rows), plan.temperature, trim=plan.trim, layout=plan.layout(with_grad=False)
                )
                out[rows] = logprobs.float().cpu()
        return out

    def update_forward(self, part: RolloutBatch, with_stats: bool, with_entropy: bool = False) -> UpdateForward:
        """log π_θ(o_t) of a micro-batch with gradient and, with `with_stats`, its statistics from the same logits
        (JS over the micro-batch's groups, which must be whole); with `with_entropy`, H_t with gradient."""
        plan = self.plan
        if plan.fuses_head(with_grad=True):
            return self.fused_update_forward(part, with_stats, with_entropy)
        if is_sharded(self.policy):
            logits = forward_response_logits(self.policy, part)
        else:
            logits = response_logits(self.policy, part, trim=plan.trim, layout=plan.layout(with_grad=True))
        width = logits.shape[1]
        pad = (0, part.response_ids.shape[1] - width)
        log_pi = torch.log_softmax(logits.float() / plan.temperature, dim=-1)  # shared by log π(o_t) and H_t
        logp = log_pi.gather(-1, part.response_ids[:, :width, None].to(logits.device)).squeeze(-1)
        entropy = nn.functional.pad(shannon_entropy(log_pi), pad) if with_entropy else None
        stats = None
        if with_stats:
            statistics = LogitStatistics(plan.temperature, plan.stats_chunk_size, plan.js_peers)
            stats = statistics.of_logits(
                logits.detach(), part.response_ids, part.response_mask, part.group_ids, plan.with_js
            )
        return UpdateForward(nn.functional.pad(logp, pad), stats, entropy)

    def fused_update_forward(self, part: RolloutBatch, with_stats: bool, with_entropy: bool) -> UpdateForward:
        """`update_forward` through the fused head: the same log π_θ(o_t), statistics and H_t, without the logits."""
        with_js = with_stats and self.plan.with_js
        if with_js:
            check_js_peers(self.plan.js_peers)
        out, batch = fused_response_head(self.policy, part, self.plan, with_grad=True, with_js=with_js)
        rows, width = batch.response_ids.shape
        pad = (0, part.response_ids.shape[1] - width)
        logp = nn.functional.pad(out.logprobs.reshape(rows, width), pad)
        entropy = nn.functional.pad(out.entropy.reshape(rows, width), pad) if with_entropy else None
        stats = head_statistics(out, batch, part.response_ids.shape[1]) if with_stats else None
        return UpdateForward(logp, stats, entropy)
