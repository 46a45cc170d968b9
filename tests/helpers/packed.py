"""Test-only views of models/packed.py's layout."""

from __future__ import annotations

import torch

from tokenrl.models.packed import PackedLayout


def dense_mask(layout: PackedLayout) -> torch.Tensor:
    """(L, L) boolean: query t may attend to key s (the rule of models/packed.py's module docstring)."""
    t = torch.arange(layout.length, device=layout.group.device)
    same = layout.group[:, None] == layout.group[None, :]
    mine = layout.is_prompt[None, :] | (layout.response[:, None] == layout.response[None, :])
    return same & mine & (t[None, :] <= t[:, None])
