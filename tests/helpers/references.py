"""Float64 loop references shared by several test modules."""

from __future__ import annotations

import math

import torch


def grpo_advantages(rewards, group_ids):
    """(r − group mean) / (unbiased group std + 1e-6); a group of one has mean 0 and std 1 (verl's rule, as
    grpo.group_advantages); Python loops."""
    out = [0.0] * len(rewards)
    for g in set(group_ids):
        members = [i for i in range(len(rewards)) if group_ids[i] == g]
        mean, std = 0.0, 1.0
        if len(members) > 1:
            mean = sum(rewards[i] for i in members) / len(members)
            std = math.sqrt(sum((rewards[i] - mean) ** 2 for i in members) / (len(members) - 1))
        for i in members:
            out[i] = (rewards[i] - mean) / (std + 1e-6)
    return torch.tensor(out, dtype=torch.float64)
