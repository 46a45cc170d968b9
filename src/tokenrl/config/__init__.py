"""What a composed config must satisfy before anything loads: the rule of every setting (`known_settings.py`), the
start-up check that applies them and each component's own rules (`check.py`), and what a plain command line adds for
its machine (`command_line.py`); `as_dict`, the plain mapping of a config node."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf


def as_dict(node: Any, *, resolve: bool = True) -> dict[str, Any]:
    """`OmegaConf.to_container(node)` of a mapping node (its keys as strings), its interpolations resolved unless
    `resolve=False`; TypeError for a node that is not a mapping."""
    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a config mapping, got {type(plain).__name__}: {plain!r}")
    return {str(key): value for key, value in plain.items()}
