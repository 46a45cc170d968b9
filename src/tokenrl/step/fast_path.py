"""`fast_path`: the update's exact shortcuts (docs/algorithms.md §12), each on by default and taken only where it is
exact; `GRPOModule` says once per run which were taken and why not the others."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class FastPath:
    """shared_prefix: each group's prompt encoded once (models/response_forward.py); fused_statistics: π_old's
    statistics from the update's own forward (step/update.py); pack: micro-batches of similar lengths, each
    forward cut to its own longest prompt and response (step/micro_batches.py)."""

    shared_prefix: bool = True
    fused_statistics: bool = True
    pack: bool = True

    @classmethod
    def from_node(cls, node: Mapping[str, Any] | None) -> "FastPath":
        """The record of the `fast_path` node (None: every shortcut on); ValueError names an unknown or non-boolean key."""
        node = dict(node or {})
        names = [field.name for field in dataclasses.fields(cls)]
        for key, value in node.items():
            if key not in names:
                raise ValueError(f"fast_path.{key} is not a setting (settings: {names})")
            if not isinstance(value, bool):
                raise ValueError(f"fast_path.{key}={value!r} must be true or false")
        return cls(**node)
