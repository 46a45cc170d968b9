"""A fused, chunked LM head (docs/algorithms.md §12.5): log π(o_t), Shannon entropy, Rényi-2 and ICT's JS to the
group's mean distribution from the final hidden states and the head's weight, one vocabulary chunk at a time, so the
(tokens × vocabulary) logits never exist at once. With z = (h Wᵀ + b) / T, π = softmax(z), per token n:
  log π(o_n) = z_{n,o_n} − log Z_n,  log Z_n = m_n + log s_n,  s_n = Σ_v e^{z_{n,v} − m_n};
  H_n = −Σ_v π log π = log s_n − a_n / s_n,  a_n = Σ_v e^{z_{n,v} − m_n} (z_{n,v} − m_n);
  H₂_n = −log Σ_v π² = 2 log s_n − log q_n,  q_n = Σ_v e^{2(z_{n,v} − m_n)};  m_n the running maximum (online
  log-sum-exp): a chunk that raises m to m' rescales s ← e^{m−m'} s, a ← e^{m−m'}(a + (m − m')s), q ← e^{2(m−m')} q.
JS (detached) needs each member's log Z, hence a second pass per chunk: π̄ over the token's slot (a group's rollouts at
one position; `peers="all"`, or `"others"` clamped at 0), log M = log max(½(π + π̄), 1e-30),
  JS_n = ½ Σ_v π (log π − log M) + ½ Σ_v (π̄ log π̄ − π̄ log M), clamped at 0; 0 where fewer than 2 are active.
Backward (log π and H carry gradient), chunk by chunk from the saved log Z and H:
  ∂L/∂z_{n,v} = g^{logp}_n (δ_{v,o_n} − π_{n,v}) − g^{H}_n π_{n,v} (log π_{n,v} + H_n),
  ∂L/∂h = Σ_chunks (∂L/∂z / T) W_c,  ∂L/∂W_c = (∂L/∂z / T)ᵀ h,  ∂L/∂b_c = Σ_n ∂L/∂z / T.
No step reads a value on the host. Liger-Kernel's fused linear cross-entropy and TRL's chunked log-prob head use the
same online log-sum-exp for the log-probability alone."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

PEERS = ("all", "others")
CHUNK_ELEMENTS = 1 << 23  # elements of one (tokens × chunk) buffer that `vocab_chunk` aims for (32 MiB in fp32)


def vocab_chunk(tokens: int, vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Vocabulary columns per chunk so that one (tokens × chunk) buffer holds about `elements` values (at least 64
    columns, at most the vocabulary, a multiple of 64 below it)."""
    columns = max(64, (elements // max(tokens, 1)) // 64 * 64)
    return min(columns, vocab)


@dataclass
class GroupSlots:
    """Which tokens share a group mean for JS: `slot[n]` ∈ [0, slots) names token n's (group, response position);
    `active[n]` whether it is a response token (the mean runs over a slot's active tokens); `peers`: all | others."""

    slot: torch.Tensor
    active: torch.Tensor
    slots: int
    peers: str = "all"


@dataclass(frozen=True)
class ChunkedHead:
    """The head z = (h Wᵀ + b) / T as the fused pass reads it: `weight` (V, d) and `bias` (None: none) at the sampling
    `temperature`, `chunk` vocabulary columns at a time (None: `vocab_chunk`)."""

    weight: torch.Tensor
    temperature: float
    bias: torch.Tensor | None = None
    chunk: int | None = None


@dataclass
class HeadOutput:
    """(N,) per token, in float32 (float64 for float64 inputs): `logprobs` and `entropy` with gradient, `renyi2` and
    `js` (None unless asked) detached."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    renyi2: torch.Tensor
    js: torch.Tensor | None


def _logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, columns: slice, temperature: float
) -> torch.Tensor:
    """z = (h W[columns]ᵀ + b[columns]) / T, (N, C), in the product's dtype (under autocast autocast's) promoted to at
    least float32: the pass's accumulation dtype."""
    if bias is None:
        u = hidden @ weight[columns].t()
    else:
        u = nn.functional.linear(hidden, weight[columns], bias[columns])
    return u.to(torch.promote_types(u.dtype, torch.float32)).div_(temperature)


def _target_logit(z: torch.Tensor, targets: torch.Tensor, start: int) -> torch.Tensor:
    """z_{n, o_n} where o_n falls in this chunk, else 0 (no host sync: a clamped gather, masked)."""
    local = targets - start
    inside = (local >= 0) & (local < z.shape[1])
    picked = z.gather(1, local.clamp(0, z.shape[1] - 1)[:, None]).squeeze(1)
    return torch.where(inside, picked, torch.zeros_like(picked))


def _group_sum(slot: torch.Tensor, active: torch.Tensor, slots: int):
    """x (N, C) ↦ (slots, C) sums of the active tokens' rows per slot: an index-add on a GPU; on the CPU, where
    index-add runs ~4x slower than a sparse product, a (slots × N) CSR matrix of the active indicators times x."""
    if slot.device.type != "cpu":
        return lambda x: torch.zeros(slots, x.shape[1], dtype=x.dtype, device=x.device).index_add_(
            0, slot, x * active[:, None]
        )
    order = torch.argsort(slot, stable=True)
    rows = torch.zeros(slots + 1, dtype=torch.long).index_add_(0, slot + 1, torch.ones_like(slot)).cumsum(0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is long-standing
        warnings.simplefilter("ignore", UserWarning)
        members = torch.sparse_csr_tensor(rows, order, active[order], (slots, slot.shape[0]), check_invariants=False)
    return lambda x: members @ x


def _js(hidden: torch.Tensor, head: ChunkedHead, log_z: torch.Tensor, groups: GroupSlots) -> torch.Tensor:
    """The second pass: JS(π_n ‖ π̄_slot(n)) chunk by chunk (module docstring), 0 where inactive or alone; in
    `log_z`'s dtype, the first pass's accumulation dtype."""
    acc, weight, chunk = log_z.dtype, head.weight, head.chunk or head.weight.shape[0]
    active = groups.active.to(acc)
    slot = groups.slot
    counts = torch.zeros(groups.slots, dtype=acc, device=hidden.device).index_add_(0, slot, active)
    count_at = counts[slot]
    divisor = (count_at if groups.peers == "all" else count_at - 1).clamp_min(1)[:, None]
    group_sum = _group_sum(slot, active, groups.slots)
    kl_p = torch.zeros_like(log_z)
    kl_mean = torch.zeros_like(log_z)
    for start in range(0, weight.shape[0], chunk):
        log_pi = _logits(hidden, weight, head.bias, slice(start, start + chunk), head.temperature).sub_(log_z[:, None])
        p = log_pi.exp()
        mean = group_sum(p)[slot]
        if groups.peers == "all":
            mean.div_(divisor)
        else:  # leave-one-out, clamped: the subtraction can leave −1e-8 where π_n holds all the mass
            mean.sub_(p).div_(divisor).clamp_min_(0.0)
        log_mid = (p + mean).mul_(0.5).clamp_min_(1e-30).log_()
        kl_p += torch.einsum("nc,nc->n", p, log_pi.sub_(log_mid))
        kl_mean += torch.xlogy(mean, mean).sum(1) - torch.einsum("nc,nc->n", mean, log_mid)
    js = (0.5 * (kl_p + kl_mean)).clamp_min(0.0)
    return torch.where((count_at > 1) & groups.active.bool(), js, torch.zeros_like(js))


class FusedHead(torch.autograd.Function):
    """log π(o), H (with gradient), H₂, JS (detached) of N tokens from hidden (N, d) and the head's weight (V, d);
    `fused_head` is the entry point."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, groups):
        mm_dtype = (hidden[:1] @ weight[:1].t()).dtype  # the product's dtype under the ambient autocast
        acc = torch.promote_types(mm_dtype, torch.float32)
        m = s = a = q = target = None
        for start in range(0, weight.shape[0], chunk):
            z = _logits(hidden, weight, bias, slice(start, start + chunk), temperature)
            picked = _target_logit(z, targets, start)
            top = z.amax(1)
            if m is None:
                m, target = top, picked
                d = z.sub_(m[:, None])
                e = d.exp()
                s, a, q = e.sum(1), torch.einsum("nc,nc->n", e, d), torch.einsum("nc,nc->n", e, e)
                continue
            target = target + picked
            new = torch.maximum(m, top)
            scale = (m - new).exp()
            d = z.sub_(new[:, None])
            e = d.exp()
            a = scale * (a + (m - new) * s) + torch.einsum("nc,nc->n", e, d)
            s = scale * s + e.sum(1)
            q = scale * scale * q + torch.einsum("nc,nc->n", e, e)
            m = new
        log_s = s.log()
        log_z = m + log_s
        logprobs = target - log_z
        entropy = log_s - a / s
        renyi2 = 2 * log_s - q.log()
        js = (
            _js(hidden, ChunkedHead(weight, temperature, bias, chunk), log_z, groups)
            if groups is not None
            else torch.zeros_like(log_z)
        )
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, entropy)
        ctx.temperature, ctx.chunk, ctx.mm_dtype, ctx.acc = temperature, chunk, mm_dtype, acc
        ctx.mark_non_differentiable(renyi2, js)
        ctx.set_materialize_grads(False)
        return logprobs, entropy, renyi2, js

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_entropy, _grad_renyi2, _grad_js):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return (None,) * 7
        needs_h, needs_w, needs_b = ctx.needs_input_grad[:3]
        acc, mm_dtype, temperature = ctx.acc, ctx.mm_dtype, ctx.temperature
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if needs_h else None
        grad_w = torch.empty_like(weight) if needs_w else None
        grad_b = torch.empty_like(bias) if needs_b else None
        h_mm = hidden.to(mm_dtype)
        for start in range(0, weight.shape[0], ctx.chunk):
            stop = min(start + ctx.chunk, weight.shape[0])
            log_pi = _logits(hidden, weight, bias, slice(start, stop), temperature).sub_(log_z[:, None])
            p = log_pi.exp()
            if grad_entropy is None:
                dz = p.mul_(-grad_logp[:, None])
            else:
                dz = log_pi.add_(entropy[:, None]).mul_(grad_entropy[:, None])
                if grad_logp is not None:
                    dz.add_(grad_logp[:, None])
                dz = dz.mul_(p).neg_()
            if grad_logp is not None:
                local = targets - start
                inside = (local >= 0) & (local < stop - start)
                dz.scatter_add_(1, local.clamp(0, stop - start - 1)[:, None], (grad_logp * inside)[:, None])
            du = dz.div_(temperature).to(mm_dtype)
            if grad_h is not None:
                grad_h += du @ weight[start:stop].to(mm_dtype)
            if grad_w is not None:
                grad_w[start:stop] = du.t() @ h_mm
            if grad_b is not None:
                grad_b[start:stop] = dz.sum(0)
        return (None if grad_h is None else grad_h.to(hidden.dtype), grad_w, grad_b, None, None, None, None)


def fused_head(
    hidden: torch.Tensor, head: ChunkedHead, targets: torch.Tensor, groups: GroupSlots | None = None
) -> HeadOutput:
    """log π(o_n), H_n (with gradient), H₂_n and, with `groups`, JS_n (detached) of the N tokens whose final hidden
    states are `hidden` (N, d), for `head`, targets o (N,)."""
    if groups is not None and groups.peers not in PEERS:
        raise ValueError(f"js peers={groups.peers!r} is not one of {PEERS}")
    chunk = head.chunk or vocab_chunk(hidden.shape[0], head.weight.shape[0])
    if groups is not None:
        device = hidden.device
        groups = GroupSlots(groups.slot.to(device), groups.active.to(device), groups.slots, groups.peers)
    logprobs, entropy, renyi2, js = FusedHead.apply(
        hidden, head.weight, head.bias, targets.to(hidden.device), head.temperature, chunk, groups
    )
    return HeadOutput(logprobs, entropy, renyi2, js if groups is not None else None)


def fusable_head(head: nn.Module) -> bool:
    """Whether the fused head can stand in for `head`: a plain linear projection (not an adapter-wrapped one)."""
    return type(head) is nn.Linear


def response_slots(group_ids: torch.Tensor, width: int, response_mask: torch.Tensor, peers: str) -> GroupSlots:
    """The JS slots of a (b, width) grid of response tokens flattened row-major: token (i, t) is in slot
    (index of row i's group among the rows' groups) × width + t; active where `response_mask` is 1. `group_ids` and
    `response_mask` on the host (the group count is a Python int from them)."""
    _, owner = torch.unique(group_ids, return_inverse=True)
    groups = int(owner.max()) + 1 if owner.numel() else 0
    slot = (owner[:, None] * width + torch.arange(width)[None]).reshape(-1)
    return GroupSlots(slot, response_mask[:, :width].reshape(-1).bool(), groups * width, peers)
