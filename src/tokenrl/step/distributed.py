"""Collectives for selection thresholds and loss normalisers that must be counted over all ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tokenrl.algorithms.grpo import LossNormalizer


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_variable(tensor: torch.Tensor, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Every rank's 1-D `tensor` (lengths may differ), in rank order; `device` is where the collective runs
    (CUDA for NCCL, CPU for gloo). Results come back on the input's device."""
    rank, size = world()
    if size == 1:
        return [tensor]
    flat = tensor.reshape(-1).to(device)
    length = torch.tensor([flat.numel()], device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length)
    longest = int(max(lengths))
    padded = torch.zeros(longest, dtype=flat.dtype, device=device)
    padded[: flat.numel()] = flat
    parts = [torch.zeros_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded)
    return [part[: int(n)].to(tensor.device) for part, n in zip(parts, lengths)]


def all_reduce_sum(values: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Element-wise sum over ranks (identity on one process)."""
    if world()[1] == 1:
        return values
    reduced = values.to(device).clone()
    dist.all_reduce(reduced)
    return reduced.to(values.device)


def global_loss_normalizer(local: LossNormalizer, device: torch.device | str = "cpu") -> LossNormalizer:
    """The mini-batch's loss divisors summed over every rank (tokens or kept sequences, docs/algorithms.md §1.4)."""
    total = all_reduce_sum(torch.tensor([local.pg, local.kl, local.entropy], dtype=torch.float64), device=device)
    return LossNormalizer(*(float(value) for value in total))
